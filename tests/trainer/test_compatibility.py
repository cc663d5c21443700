"""What the trainer wrote and computed before its redesign still loads and computes the same: the assignment's
grader-side training run, and runs stopped mid-way by the old code resumed by today's (fixtures/README.md says
how the files were made). On one CPU the old and the new code agree bit for bit; float32 kernels round
differently on different CPUs (AVX2, AVX-512, AMX), so the logged numbers are compared to a tolerance that such
rounding keeps and any change of formula breaks, and the weights by a fingerprint (sum and norm per tensor)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from agent_lab.cli import main as cli_main
from agent_lab.config import TrainConfig
from agent_lab.envs import make_env
from agent_lab.evaluation import evaluate, load_checkpoint
from agent_lab.trainer import train
from fixtures.make_fixtures import KEYS, dr_grpo_advantages, dr_grpo_loss, fingerprint

FIXTURES = Path(__file__).parent / "fixtures"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())


#: What two CPUs' float32 rounding leaves between the same computations (the fixtures' second CPU differed by at
#: most 2.6e-4 relative in a logged entropy, 1.3e-6 absolute; a loss of 4e-11 on one was -0.0 on the other).
REL, ABS = 1e-3, 1e-6
#: A tensor's entries largely cancel in its sum, so rounding that moves each entry by a tiny share of the tensor's
#: scale moves the sum by a large share of itself: a sum is held to this share of the tensor's norm (a third CPU,
#: AVX2 only, moved a bias's sum by 1.3e-3 of its norm while every norm agreed to 1.2e-5).
SUM_OF_NORM = 1e-2


def logged(history: list[dict]) -> list[dict]:
    return [{k: r[k] for k in KEYS if k in r} for r in history]


def assert_same_run(history: list[dict], policy, want: dict) -> None:
    """``history`` logged what the old run logged, and ``policy`` ended with its weights, to float32 rounding."""
    expected = [{k: r[k] for k in KEYS if k in r} for r in want["history"]]
    got = logged(history)
    assert [sorted(r) for r in got] == [sorted(r) for r in expected]
    for step, (g, e) in enumerate(zip(got, expected)):
        assert g == pytest.approx(e, rel=REL, abs=ABS), f"step {step}: logged {g}, the old run logged {e}"
    mine = fingerprint(policy)
    assert list(mine) == list(want["weights_fingerprint"])
    for name, (old_sum, old_norm) in want["weights_fingerprint"].items():
        total, norm = mine[name]
        assert norm == pytest.approx(old_norm, rel=REL, abs=ABS), f"{name}: norm {norm}, old {old_norm}"
        assert abs(total - old_sum) <= SUM_OF_NORM * old_norm + ABS, f"{name}: sum {total}, old {old_sum}"


class _Elsewhere(torch.autograd.Function):
    """A loss whose value and gradient with respect to the log-probs are computed outside autograd (as the
    grader's proxy computes them in another process): the trainer sees only a 0-dim tensor with a backward."""

    @staticmethod
    def forward(ctx, logprobs, action_mask, advantages, max_tokens):
        lp = logprobs.detach().clone().requires_grad_(True)
        with torch.enable_grad():
            value = dr_grpo_loss(lp, action_mask, advantages, max_tokens)
            (grad,) = torch.autograd.grad(value, lp)
        ctx.save_for_backward(grad)
        return value.detach()

    @staticmethod
    def backward(ctx, g):
        (grad,) = ctx.saved_tensors
        return g * grad, None, None, None


@pytest.mark.slow
def test_the_assignments_training_run_gives_todays_numbers_for_the_same_seed():
    budget = EXPECTED["assignment"]["train_budget"]
    result = train(TrainConfig(**budget), advantage_fn=dr_grpo_advantages, loss_fn=dr_grpo_loss, progress=False)
    report = evaluate(result.policy, make_env("number-search", mask_actions=True), "test", "greedy",
                      tokenizer=result.tokenizer, candidate_mask=True)
    want = EXPECTED["assignment"]
    assert_same_run(result.history, result.policy, want)
    assert report.success == want["greedy_success"] == 14 / 16


def test_a_loss_computed_outside_autograd_trains_like_the_same_loss_in_autograd():
    budget = {**EXPECTED["assignment"]["train_budget"], "steps": 2, "batch_size": 32}
    plain = train(TrainConfig(**budget), advantage_fn=dr_grpo_advantages, loss_fn=dr_grpo_loss, progress=False)
    proxy = train(TrainConfig(**budget), advantage_fn=dr_grpo_advantages, progress=False,
                  loss_fn=lambda lp, m, a, t: _Elsewhere.apply(lp, m, a, t))
    for k, v in plain.policy.state_dict().items():
        torch.testing.assert_close(proxy.policy.state_dict()[k], v, atol=1e-7, rtol=1e-6)
    assert [h["loss"] for h in proxy.history] == pytest.approx([h["loss"] for h in plain.history], abs=1e-7)


@pytest.mark.parametrize("name", ["old_run", "old_ppo_run"])
def test_a_run_stopped_by_the_old_trainer_resumes_into_the_uninterrupted_runs_weights(tmp_path, name):
    run_dir = tmp_path / name
    shutil.copytree(FIXTURES / name, run_dir)
    cfg = TrainConfig.from_dict(json.loads((run_dir / "config.json").read_text()))  # flat, with stop_after
    resumed = train(cfg, run_dir=str(run_dir), resume=True, progress=False)
    want = EXPECTED[name]
    assert_same_run(resumed.history, resumed.policy, want)
    assert resumed.episodes == want["episodes"]
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == len(want["history"])
    # the new config.json is nested and loads back to the same settings
    again = TrainConfig.from_dict(json.loads((run_dir / "config.json").read_text()))
    assert again == cfg.replace(run_dir=str(run_dir), resume=True)


def test_an_old_checkpoint_loads_and_evaluates_from_the_command_line(capsys):
    policy, tok, state = load_checkpoint(FIXTURES / "old_run")
    assert "probe" not in policy.cfg.to_dict() and state["step"] == 3
    assert cli_main(["eval", str(FIXTURES / "old_run")]) == 0
    out = capsys.readouterr().out
    assert "number-search/test greedy" in out and "planner 0.938" in out


def test_removed_settings_load_from_old_files_at_their_default_and_are_refused_otherwise():
    old = json.loads((FIXTURES / "old_run" / "config.json").read_text())
    assert TrainConfig.from_dict(old).sft.steps == 2
    with pytest.raises(ValueError, match="goal-tree probe was removed"):
        TrainConfig.from_dict({**old, "sft_probe_weight": 1.0})
    with pytest.raises(ValueError, match=r"train_sft\(config\), then train_rl"):
        TrainConfig(stop_after=3)


def test_a_nested_config_with_an_unknown_section_names_it():
    nested = TrainConfig().to_dict()
    nested["sampler"] = {"temperature": 1.0}
    with pytest.raises(ValueError, match="unknown config section 'sampler'"):
        TrainConfig.from_dict(nested)
