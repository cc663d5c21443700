"""Resume equals an uninterrupted run; bad configurations fail before any work; training improves success."""

from __future__ import annotations

import pytest
import torch
from conftest import FAST

import agent_lab.envs
import agent_lab.evaluation
import agent_lab.trainer as trainer_mod
from agent_lab.checkpoints import save_checkpoint
from agent_lab.cli import main as cli_main
from agent_lab.config import OptimizerConfig
from agent_lab.preflight import check_config
from agent_lab.trainer import TrainConfig, train


class Crash(Exception):
    """Raised in place of a machine failure after a step's checkpoint."""


def crash_after(monkeypatch, steps: int) -> None:
    """Make the next run die right after step ``steps`` (and its checkpoint) is finished."""
    real = trainer_mod.finish_step

    def finish_then_crash(run, row, t, last):
        real(run, row, t, last)
        if run.step == steps:
            raise Crash

    monkeypatch.setattr(trainer_mod, "finish_step", finish_then_crash)


def interrupted(monkeypatch, cfg, run_dir, steps: int) -> None:
    """Run ``cfg`` in ``run_dir`` until it dies after ``steps`` steps, as an interrupted run would."""
    with monkeypatch.context() as m:
        crash_after(m, steps)
        with pytest.raises(Crash):
            train(cfg, run_dir=str(run_dir), progress=False)


@pytest.mark.parametrize("algo", ["dr_grpo", "ppo_gae"])  # ppo_gae: its critic must come back too
def test_interrupted_and_resumed_run_equals_uninterrupted_run(tmp_path, monkeypatch, algo):
    cfg = TrainConfig(**{**FAST, "algo": algo, "sft_steps": 2, "steps": 3, "candidate_mask": True,
                         "checkpoint_every": 1})
    full = train(cfg, run_dir=str(tmp_path / "a"), progress=False)
    interrupted(monkeypatch, cfg, tmp_path / "b", 3)
    assert len((tmp_path / "b" / "metrics.jsonl").read_text().splitlines()) == 3
    resumed = train(cfg, run_dir=str(tmp_path / "b"), resume=True, progress=False)
    for k, v in full.policy.state_dict().items():
        assert torch.equal(v, resumed.policy.state_dict()[k]), f"parameter {k} differs after resume"
    keys = ("loss", "success", "reward_mean", "grad_norm_before")
    assert [[h.get(k) for k in keys] for h in full.history] == [[h.get(k) for k in keys] for h in resumed.history]
    assert full.episodes == resumed.episodes
    rows = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 5, "the resumed run's metrics file has each step exactly once"


def test_sft_then_rl_from_its_result_equals_one_run(tmp_path):
    cfg = TrainConfig(**{**FAST, "algo": "dr_grpo", "sft_steps": 2, "steps": 2, "candidate_mask": True})
    whole = train(cfg, run_dir=str(tmp_path / "whole"), progress=False)
    cold = trainer_mod.train_sft(cfg, run_dir=str(tmp_path / "sft"), progress=False)
    assert [h["phase"] for h in cold.history] == ["sft", "sft"] and cold.final_eval is not None
    rl = trainer_mod.train_rl(cfg, init=cold, run_dir=str(tmp_path / "rl"), progress=False)
    for k, v in whole.policy.state_dict().items():
        assert torch.equal(v, rl.policy.state_dict()[k]), f"parameter {k} differs"
    assert [h["loss"] for h in rl.history] == [h["loss"] for h in whole.history]
    assert [h["step"] for h in rl.history] == [0, 1, 2, 3] and rl.episodes == whole.episodes
    # the RL run's folder holds the whole run: both phases' metrics; its loss.txt describes its own phase
    assert len((tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()) == 4
    assert "RL (2 steps" in rl.loss_description and "SFT (" not in rl.loss_description
    # from a checkpoint path too, and from a bare policy (fresh optimizer: a different run)
    again = trainer_mod.train_rl(cfg, init=tmp_path / "sft", run_dir=str(tmp_path / "rl2"), progress=False)
    assert [h["loss"] for h in again.history] == [h["loss"] for h in whole.history]
    bare = trainer_mod.train_rl(cfg, init=cold.policy, run_dir=str(tmp_path / "rl3"), progress=False)
    assert [h["step"] for h in bare.history] == [2, 3]
    with pytest.raises(ValueError, match="pass init=train_sft"):
        trainer_mod.train_rl(cfg, run_dir=str(tmp_path / "rl4"), progress=False)
    # a policy exported alone (save_checkpoint, as bench/results/crafting-full holds) starts RL as the bare policy
    export = save_checkpoint(tmp_path / "policy.pt", cold.policy, cold.tokenizer)
    exported = trainer_mod.train_rl(cfg, init=export, run_dir=str(tmp_path / "rl5"), progress=False)
    assert [h["loss"] for h in exported.history] == [h["loss"] for h in bare.history]
    (tmp_path / "rl6").mkdir()
    (tmp_path / "rl6" / "checkpoint.pt").write_bytes(export.read_bytes())
    with pytest.raises(ValueError, match="holds a policy alone .* pass it as init="):
        trainer_mod.train_rl(cfg, run_dir=str(tmp_path / "rl6"), resume=True, progress=False)


def test_dynamic_sampling_fills_the_update_with_disagreeing_groups_and_resumes_exactly(tmp_path, monkeypatch):
    cfg = TrainConfig(**{**FAST, "algo": "dr_grpo", "steps": 4, "candidate_mask": True, "resample_rounds": 3,
                         "checkpoint_every": 1})
    full = train(cfg, run_dir=str(tmp_path / "a"), progress=False)
    rl = [h for h in full.history if h["phase"] == "dr_grpo"]
    assert all(1 <= h["rollout_rounds"] <= 4 for h in rl)
    assert any(h["rollout_rounds"] > 1 for h in rl), "an untrained policy leaves groups all-equal: it must resample"
    assert all(h["update_degenerate_fraction"] <= h["degenerate_fraction"] for h in rl)
    assert full.episodes == sum(h["rollout_rounds"] for h in rl) * cfg.algorithm.batch_size, "every episode counts"
    assert "dynamic sampling: up to 3 more rounds" in (tmp_path / "a" / "loss.txt").read_text()
    plain = train(cfg.replace(resample_rounds=0), run_dir=str(tmp_path / "p"), progress=False)
    # its first round draws what the plain run draws; the update can only have fewer all-equal groups
    assert plain.history[0]["degenerate_fraction"] >= rl[0]["update_degenerate_fraction"]
    interrupted(monkeypatch, cfg, tmp_path / "b", 2)
    resumed = train(cfg, run_dir=str(tmp_path / "b"), resume=True, progress=False)
    for k, v in full.policy.state_dict().items():
        assert torch.equal(v, resumed.policy.state_dict()[k]), f"parameter {k} differs after resume"
    assert full.episodes == resumed.episodes


def test_planner_guidance_adds_the_sft_loss_of_unsolved_groups_and_resumes_exactly(tmp_path, monkeypatch):
    cfg = TrainConfig(**{**FAST, "algo": "dr_grpo", "steps": 3, "guide_coef": 0.5, "checkpoint_every": 1})
    guided = train(cfg, run_dir=str(tmp_path / "g"), progress=False)
    plain = train(cfg.replace(guide_coef=0.0), run_dir=str(tmp_path / "p"), progress=False)
    g0, p0 = guided.history[0], plain.history[0]
    assert g0["guided_groups"] > 0, "an untrained policy leaves some groups unsolved"
    assert g0["success"] == p0["success"], "step 0 samples the same episodes with the same initial weights"
    # the loss is the plain group loss plus guide_coef times the demonstrations' token-mean NLL
    assert g0["loss"] == pytest.approx(p0["loss"] + 0.5 * g0["guide_nll"], abs=1e-5)
    assert g0["guide_nll"] > 0.1 and "guide_nll" not in p0
    assert "planner guidance: loss += 0.5" in (tmp_path / "g" / "loss.txt").read_text()
    interrupted(monkeypatch, cfg, tmp_path / "b", 1)
    resumed = train(cfg, run_dir=str(tmp_path / "b"), resume=True, progress=False)
    for k, v in guided.policy.state_dict().items():
        assert torch.equal(v, resumed.policy.state_dict()[k]), f"parameter {k} differs after resume"


def test_planner_guidance_needs_one_process():
    with pytest.raises(ValueError, match=r"planner_guidance \(guide_coef\) runs in one process"):
        check_config(TrainConfig(guide_coef=0.1), world_size=2)  # where the run is prepared


def test_recovery_demonstrations_start_at_sft_slip_from(tmp_path):
    base = {**FAST, "env": "crafting", "max_len": 320, "algo": "sft", "steps": 4, "sft_batch_size": 8}
    plain = train(TrainConfig(**base), run_dir=str(tmp_path / "plain"), progress=False)
    late = train(TrainConfig(**base, sft_slip_prob=1.0, sft_slip_from=2), run_dir=str(tmp_path / "late"), progress=False)
    loss = lambda r: [h["loss"] for h in r.history]  # noqa: E731
    assert loss(late)[:2] == loss(plain)[:2], "steps before sft_slip_from must see plain demonstrations"
    assert loss(late)[2] != loss(plain)[2], "from sft_slip_from on, demonstrations contain slips"
    assert "from SFT step 2 on" in (tmp_path / "late" / "loss.txt").read_text()


def test_a_plugin_keyword_at_its_default_still_replaces_the_recipe_option():
    """``sft_slip_from=0`` on a recipe whose slips start at step 1200 starts them at once; it used to be read as
    "not given" (it equals the keyword's default) and the recipe's 1200 stayed."""
    from agent_lab.recipes import recipe

    cfg = recipe("crafting-quick")
    assert cfg.plugins["recovery_demonstrations"]["from_step"] == 1200
    assert cfg.replace(sft_slip_from=0).plugins["recovery_demonstrations"] == {"prob": 0.5, "from_step": 0}
    assert recipe("crafting-quick", sft_slip_from=0).plugins["recovery_demonstrations"]["from_step"] == 0
    assert "recovery_demonstrations" not in cfg.replace(sft_slip_prob=0.0).plugins  # the switch at 0: off
    assert TrainConfig(env="crafting", sft_steps=4, sft_slip_from=0).plugins == {}  # a default turns nothing on


def test_dagger_demonstrations_start_at_sft_dagger_from_and_resume_exactly(tmp_path, monkeypatch):
    base = {**FAST, "env": "crafting", "max_len": 320, "algo": "sft", "steps": 4, "sft_batch_size": 8,
            "candidate_mask": True, "checkpoint_every": 1}
    plain = train(TrainConfig(**base), run_dir=str(tmp_path / "plain"), progress=False)
    cfg = TrainConfig(**base, sft_dagger_prob=0.5, sft_dagger_from=2)
    late = train(cfg, run_dir=str(tmp_path / "late"), progress=False)
    loss = lambda r: [h["loss"] for h in r.history]  # noqa: E731
    assert loss(late)[:2] == loss(plain)[:2], "steps before sft_dagger_from must see plain demonstrations"
    assert loss(late)[2:] != loss(plain)[2:], "from sft_dagger_from on, some demonstrations start from the policy's"
    assert [h.get("dagger_episodes", 0) for h in late.history][:2] == [0, 0]
    assert all(0 < h["dagger_episodes"] < 8 and 0 <= h["dagger_success"] <= 1 for h in late.history[2:])
    assert "SFT DAgger demonstrations: 50%" in (tmp_path / "late" / "loss.txt").read_text()
    interrupted(monkeypatch, cfg, tmp_path / "b", 3)  # stopped mid-DAgger, then resumed
    resumed = train(cfg, run_dir=str(tmp_path / "b"), resume=True, progress=False)
    assert loss(resumed) == loss(late)
    for k, v in late.policy.state_dict().items():
        assert torch.equal(v, resumed.policy.state_dict()[k]), f"parameter {k} differs after resume"


def test_sft_learning_rate_is_constant_then_decays_linearly_over_the_last_steps(tmp_path):
    cfg = TrainConfig(**{**FAST, "algo": "dr_grpo", "sft_steps": 5, "steps": 2, "sft_lr": 1e-3, "lr": 5e-4,
                         "sft_lr_decay_steps": 4})
    want = [1e-3, 1e-3 * 4 / 4, 1e-3 * 3 / 4, 1e-3 * 2 / 4, 1e-3 * 1 / 4, 5e-4, 5e-4]  # SFT steps 0-4, then RL
    assert [trainer_mod.sft_lr_at(cfg, s) for s in range(5)] == pytest.approx(want[:5])
    run = train(cfg, run_dir=str(tmp_path / "r"), progress=False)
    assert [h["lr"] for h in run.history] == pytest.approx(want), "the training loop must follow the schedule"
    assert "linear to 0 over the last 4" in (tmp_path / "r" / "loss.txt").read_text()
    flat = TrainConfig(**{**FAST, "algo": "dr_grpo", "sft_steps": 5, "steps": 2, "sft_lr": 1e-3, "lr": 5e-4})
    assert [trainer_mod.sft_lr_at(flat, s) for s in range(5)] == [1e-3] * 5



@pytest.mark.parametrize("fresh", [False, True])
def test_rl_fresh_optimizer_clears_adams_moments_when_rl_takes_over(tmp_path, fresh):
    cfg = TrainConfig(**{**FAST, "algo": "dr_grpo", "sft_steps": 3, "steps": 2, "candidate_mask": True,
                         "rl_fresh_optimizer": fresh})
    train(cfg, run_dir=str(tmp_path / "r"), progress=False)
    saved = torch.load(tmp_path / "r" / "checkpoint.pt", weights_only=False)["optimizer"]
    counts = {int(state["step"]) for state in saved["state"].values()}
    # Adam counts its own steps per parameter: 3 SFT + 2 RL, or the 2 RL steps alone after the reset
    assert counts == ({2} if fresh else {5})
    described = (tmp_path / "r" / "loss.txt").read_text()
    assert ("moments cleared when RL takes over" in described) == fresh
    with pytest.raises(ValueError, match="rl_fresh_optimizer must be True or False"):
        TrainConfig(rl_fresh_optimizer="yes")

def test_sft_learning_rate_warms_up_linearly_then_holds_then_decays():
    cfg = TrainConfig(**{**FAST, "algo": "dr_grpo", "sft_steps": 6, "sft_lr": 1e-3, "sft_warmup_steps": 2,
                         "sft_lr_decay_steps": 2})
    want = [1e-3 / 2, 1e-3, 1e-3, 1e-3, 1e-3 * 2 / 2, 1e-3 * 1 / 2]
    assert [trainer_mod.sft_lr_at(cfg, s) for s in range(6)] == pytest.approx(want)
    with pytest.raises(ValueError, match="sft_warmup_steps=5 and sft_lr_decay_steps=2 overlap"):
        TrainConfig(**{**FAST, "sft_steps": 6, "sft_warmup_steps": 5, "sft_lr_decay_steps": 2})


BAD = [
    ({"algo": "a2c"}, "algo must be one of"),
    ({"env": "chess"}, "env must be one of"),
    ({"batch_size": 30, "group_size": 4}, "group_size must divide batch_size"),
    ({"algo": "grpo", "group_size": 1, "batch_size": 8}, "group_size must be >= 2"),
    ({"steps": 0, "sft_steps": 0}, "budget is empty"),
    ({"lr": -1.0}, "lr must be a finite number > 0"),
    ({"objective": "median"}, "objective must be one of"),
    ({"device": "tpu"}, "device must be one of"),
    ({"top_p": 0.0}, "top_p must be in"),
    ({"resume": True}, "resume=True needs run_dir"),
    ({"algo": "ppo", "batch_size": 32, "group_size": 4, "minibatches": 3}, "minibatches=3 must divide"),
    ({"minibatches": 2}, "minibatches=2 is an option of algo 'ppo', 'ppo_gae' or 'vineppo', not of 'dr_grpo'"),
    ({"algo": "ppo", "clip_eps": 1.5}, "clip_eps must be in"),
    ({"algo": "reinforce", "baseline": "median"}, "baseline must be one of"),
    ({"algo": "ppo", "kl_kind": "k4"}, "kl_kind must be one of"),
    ({"bogus": 1}, "unknown TrainConfig field 'bogus'"),
    ({"plugins": {"bogus": {}}}, "unknown plug-in 'bogus'"),
    ({"plugins": {"dagger": {"rate": 1}}}, "plug-in 'dagger'"),
    ({"sft_steps": 2, "sft_slip_prob": 1.5}, "sft_slip_prob\\) must lie in"),
    ({"sft_steps": 2, "sft_slip_prob": 0.5}, "crafting has"),
    ({"env": "crafting", "sft_slip_from": -1, "sft_slip_prob": 0.5}, "sft_slip_from\\) must be an int >= 0"),
    ({"env": "crafting", "sft_steps": 4, "sft_slip_from": 2}, "sft_slip_from=2 has no effect without sft_slip_prob"),
    ({"env": "crafting", "sft_steps": 4, "sft_slip_prob": 0.5, "sft_slip_from": 4}, "fewer than the 4 SFT steps"),
    ({"env": "crafting", "algo": "sft", "sft_steps": 2, "steps": 3, "sft_slip_prob": 0.5, "sft_slip_from": 5},
     "fewer than the 5 SFT steps"),
    ({"env": "crafting", "sft_slip_prob": 0.5}, "set sft_steps >= 1"),
    ({"env": "crafting", "sft_steps": 2, "sft_dagger_prob": -0.1}, "sft_dagger_prob\\) must lie in"),
    ({"sft_steps": 2, "sft_dagger_prob": 0.5}, "crafting has"),
    ({"env": "crafting", "sft_steps": 4, "sft_dagger_from": 2}, "sft_dagger_from=2 has no effect without"),
    ({"env": "crafting", "sft_steps": 4, "sft_dagger_prob": 0.5, "sft_dagger_from": 4}, "fewer than the 4 SFT steps"),
    ({"positions": "alibi"}, "positions must be one of"),
    ({"sft_steps": 3, "sft_lr_decay_steps": 4}, "sft_lr_decay_steps=4 is more than the 3 SFT steps"),
    ({"sft_lr_decay_steps": -1}, "sft_lr_decay_steps must be a non-negative int"),
    ({"resample_rounds": -1}, "resample_rounds\\) must be an int >= 1"),
    ({"algo": "reinforce", "resample_rounds": 2}, "only group algorithms"),
    ({"guide_coef": -0.1}, "guide_coef\\) must be a finite number > 0"),
    ({"algo": "ppo", "guide_coef": 0.1}, "one update per rollout batch; algo 'ppo'"),
    ({"algo": "reinforce", "guide_coef": 0.1}, "planner_guidance \\(guide_coef\\) adds demonstrations"),
    ({"sft_probe_weight": 1.0}, "goal-tree probe was removed"),
    ({"stop_after": 2}, "a cold start is now a run of its own"),
    ({"n_heads": 3}, "d_model must be divisible by n_heads"),
    ({"temperature": 0.0}, "temperature must be > 0"),
    ({"micro_batch_size": -1}, "micro_batch_size must be a non-negative int"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD)
def test_bad_configuration_raises_before_any_work(monkeypatch, overrides, message):
    def no_work(*a, **k):
        raise AssertionError("work started before the configuration was checked")

    monkeypatch.setattr(trainer_mod, "build_env", no_work)
    monkeypatch.setattr(trainer_mod, "TinyTransformer", no_work)
    with pytest.raises(ValueError, match=message):
        train(TrainConfig(**overrides), progress=False)
    with pytest.raises(ValueError, match=message):  # the same check through the keyword overrides
        train(progress=False, **overrides)


def test_cli_reports_bad_configuration_in_one_line_with_exit_code_2(capsys):
    assert cli_main(["train", "--algo", "dr_grpo", "--batch-size", "10", "--group-size", "3"]) == 2
    err = capsys.readouterr().err
    assert "group_size must divide batch_size" in err and "Traceback" not in err


def test_cli_train_prints_summary_and_eval_reads_the_checkpoint(tmp_path, capsys):
    rc = cli_main(["train", "--recipe", "number-search/plain", "--algo", "sft", "--steps", "2", "--d-model", "32",
                   "--n-layers", "1",
                   "--sft-batch-size", "8", "--eval-every", "0", "--run-dir", str(tmp_path), "--quiet"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "greedy success" in out and "planner" in out and "0.938" in out
    assert cli_main(["eval", str(tmp_path), "--decoding", "sampled", "--samples-per-task", "2"]) == 0
    out = capsys.readouterr().out
    assert "number-search/test sampled" in out and "on 32 tasks" in out


def test_cli_eval_overrides_the_checkpoints_environment_options_and_mask(tmp_path, capsys):
    rc = cli_main(["train", "--recipe", "number-search/plain", "--env", "crafting", "--algo", "sft", "--steps", "1",
                   "--d-model", "16", "--n-layers", "1",
                   "--n-heads", "2", "--sft-batch-size", "4", "--eval-every", "0", "--candidate-mask",
                   "--env-option", "reread=true", "--run-dir", str(tmp_path), "--quiet"])
    assert rc == 0
    capsys.readouterr()
    made, calls = [], []
    real_make, real_eval = agent_lab.envs.make_env, agent_lab.evaluation.evaluate
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(agent_lab.envs, "make_env", lambda *a, **kw: made.append(kw) or real_make(*a, **kw))
        mp.setattr(agent_lab.evaluation, "evaluate",
                   lambda *a, **kw: calls.append(kw["candidate_mask"]) or real_eval(*a, **kw))
        assert cli_main(["eval", str(tmp_path), "--split", "deeper", "--env-option", "eval_size=6"]) == 0
        assert "on 6 tasks" in capsys.readouterr().out
        assert cli_main(["eval", str(tmp_path), "--no-mask", "--env-option", "eval_size=3"]) == 0
        assert cli_main(["eval", str(tmp_path), "--env-option", "eval_size=oops"]) == 2
        assert "eval_size" in capsys.readouterr().err
        assert cli_main(["eval", str(tmp_path), "--split", "train"]) == 2
        assert "split" in capsys.readouterr().err
    assert made[0]["reread"] is True and made[0]["eval_size"] == 6 and made[0]["mask_actions"] is True
    assert "mask_actions" not in made[1] and calls[:2] == [True, False]  # --no-mask: neither env nor decoder masks


@pytest.mark.slow
def test_sft_on_demonstrations_reaches_the_planner_optimum_on_number_search(tmp_path):
    r = train(TrainConfig(algo="sft", steps=150, eval_every=5, stop_at_optimum=True, run_dir=str(tmp_path)),
              progress=False)
    assert r.reached_optimum_at is not None, f"greedy success stayed at {r.final_eval.success}"
    assert r.final_eval.success == pytest.approx(15 / 16)
    assert r.final_eval.gap == pytest.approx(0.0, abs=1e-9)


def test_weight_decay_is_decoupled_from_adams_normalisation():
    # With no gradient, decoupled decay scales every weight by 1 - lr * wd (0.95 here); an L2 term in the gradient
    # (torch's Adam(weight_decay=...)) would instead pass through Adam's normalisation and move each weight by lr.
    w = torch.nn.Parameter(torch.full((3,), 2.0))
    opt = trainer_mod.make_optimizer([w], OptimizerConfig(lr=0.1, weight_decay=0.25))
    w.grad = torch.zeros(3)
    opt.step()
    assert torch.allclose(w.detach(), torch.full((3,), 2.0 * (1 - 0.1 * 0.25)))
    still = torch.nn.Parameter(torch.full((3,), 2.0))
    opt = trainer_mod.make_optimizer([still], OptimizerConfig(lr=0.1))  # no decay: a zero gradient leaves them
    still.grad = torch.zeros(3)
    opt.step()
    assert torch.equal(still.detach(), torch.full((3,), 2.0))
