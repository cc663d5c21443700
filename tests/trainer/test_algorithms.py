"""Each algorithm's loss is the estimator library's, and each runs end to end (seed 004 §10-§13)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import FAST, tiny_policy

from agent_lab.algorithms import ALGORITHMS, AlgoState, make_algorithm
from agent_lab.envs import make_env
from agent_lab.estimators.advantages import group_centered_advantages, group_standardized_advantages, rloo_advantages
from agent_lab.estimators.aggregation import aggregate
from agent_lab.estimators.logprobs import token_logprobs
from agent_lab.estimators.policy_gradient import ppo_clipped_surrogate, reinforce_surrogate
from agent_lab.policy import WordTokenizer
from agent_lab.rollout import SamplingConfig, collect_rollouts
from agent_lab.trainer import TrainConfig, loss_and_stats, max_action_tokens, policy_logits, train

G = 4


@pytest.fixture(scope="module")
def setup():
    torch.set_num_threads(1)
    env = make_env("number-search", mask_actions=True)
    tok = WordTokenizer.from_env(env)
    model = tiny_policy(tok, seed=1)
    tasks = [t for t in env.sample_tasks(0, 8) for _ in range(G)]
    b = collect_rollouts(model, tok, env, tasks, SamplingConfig(temperature=0.9, candidate_mask=True),
                         torch.Generator().manual_seed(0))
    assert 0 < float(b.success.float().mean()) < 1, "need mixed outcomes for a meaningful comparison"
    return env, tok, model, b


def _neg(num, den):
    return -num, den


def _expected(name, lp, b, max_tokens):
    """The same loss written directly against the estimator library (the reference)."""
    R, m = b.episode_return, b.action_mask
    if name == "reinforce":
        return _neg(*aggregate(reinforce_surrogate(lp, R), m, "constant", max_tokens=max_tokens))
    if name == "rloo":
        return _neg(*aggregate(reinforce_surrogate(lp, rloo_advantages(R, G)), m, "constant", max_tokens=max_tokens))
    if name == "grpo":
        return _neg(*aggregate(reinforce_surrogate(lp, group_standardized_advantages(R, G)), m, "seq_mean_token_mean"))
    if name == "dr_grpo":
        return _neg(*aggregate(reinforce_surrogate(lp, group_centered_advantages(R, G)), m, "constant", max_tokens=max_tokens))
    if name == "rest_em":
        keep = R >= 1.0
        return _neg(*aggregate(lp, m & keep[:, None], "token_mean"))
    if name == "ppo":
        s, _ = ppo_clipped_surrogate(lp, b.old_logprobs, group_centered_advantages(R, G), m, clip_eps=0.2)
        return _neg(*aggregate(s, m, "constant", max_tokens=max_tokens))
    if name == "sft":
        return _neg(*aggregate(lp, m, "token_mean"))
    raise AssertionError(name)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_trainer_loss_equals_the_estimator_library_loss(setup, name):
    env, tok, model, b = setup
    cfg = TrainConfig(algo=name, group_size=G)
    mt = max_action_tokens(env)
    algo = make_algorithm(name, group_size=G, max_tokens=mt, clip_eps=0.2)
    adv = algo.advantages(b, AlgoState())
    loss, stats = loss_and_stats(model, b, adv, algo, cfg)
    lp = token_logprobs(policy_logits(model, b, b.temperature), b.input_ids[:, 1:])
    num, den = _expected(name, lp, b, mt)
    torch.testing.assert_close(loss, num / den)
    if name != "sft":
        assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5), "theta = theta_old: every ratio is one"


def test_student_hooks_replace_advantage_and_loss(setup):
    env, tok, model, b = setup
    algo = make_algorithm("dr_grpo", group_size=G, max_tokens=max_action_tokens(env))
    calls = {}

    def loss_fn(logprobs, action_mask, advantages, max_tokens):
        calls["shape"] = (tuple(logprobs.shape), tuple(advantages.shape), max_tokens)
        return -(logprobs * action_mask * advantages[:, None]).sum() / (len(advantages) * max_tokens)

    adv = group_centered_advantages(b.episode_return, G)
    loss, _ = loss_and_stats(model, b, adv, algo, TrainConfig(), loss_fn=loss_fn)
    ref, _ = loss_and_stats(model, b, adv, algo, TrainConfig())
    torch.testing.assert_close(loss, ref)
    assert calls["shape"][1] == (len(b),)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_each_algorithm_runs_a_few_steps_and_writes_its_run_directory(tmp_path, name):
    extra = {"sft_steps": 1} if name != "sft" else {}
    if name == "ppo":
        extra.update(ppo_epochs=2, minibatches=2, kl_coef=0.05)
    if name == "reinforce":
        extra.update(baseline="running_mean", reward_to_go=True)
    r = train(TrainConfig(**{**FAST, "algo": name, "run_dir": str(tmp_path), **extra}), progress=False)
    assert len(r.history) == r.history[-1]["step"] + 1 == FAST["steps"] + extra.get("sft_steps", 0)
    last = r.history[-1]
    assert torch.isfinite(torch.tensor(last["loss"]))
    for f in ("config.json", "loss.txt", "metrics.jsonl", "metrics.csv", "curves.png", "checkpoint.pt"):
        assert (tmp_path / f).exists(), f
    desc = (tmp_path / "loss.txt").read_text()
    assert "loss =" in desc and "action_mask" in desc
    assert json.loads((tmp_path / "config.json").read_text())["algo"] == name
    if name != "sft":
        assert last["ratio_first_epoch"] == pytest.approx(1.0, abs=1e-5)
        for k in ("degenerate_fraction", "entropy", "kl_behaviour", "grad_norm_before", "grad_norm_after",
                  "ess_fraction", "episode_turns", "success", "reward_mean"):
            assert k in last, k
    if name == "ppo":
        assert "clip_fraction" in last and "kl_reference" in last


def test_ppo_later_epochs_move_off_policy_and_report_it(tmp_path):
    # the candidate mask gives mixed outcomes from random weights, so advantages are non-zero
    r = train(TrainConfig(**{**FAST, "algo": "ppo", "steps": 2, "ppo_epochs": 4, "lr": 1e-2, "candidate_mask": True}),
              run_dir=str(tmp_path), progress=False)
    rl = [h for h in r.history if h["phase"] == "ppo"]
    assert all(h["ratio_first_epoch"] == pytest.approx(1.0, abs=1e-5) for h in rl)
    assert any(abs(h["ratio_mean"] - 1.0) > 1e-4 or h["kl_behaviour"] > 1e-6 for h in rl)


def test_loss_under_bf16_autocast_is_close_to_float32(setup):
    # the CUDA path wraps the same loss in torch.autocast(bfloat16); check it on the CPU
    from agent_lab.trainer import _autocast

    env, tok, model, b = setup
    algo = make_algorithm("dr_grpo", group_size=G, max_tokens=max_action_tokens(env))
    adv = algo.advantages(b, AlgoState())
    ref, _ = loss_and_stats(model, b, adv, algo, TrainConfig())
    with _autocast(torch.device("cpu"), torch.bfloat16):
        low, _ = loss_and_stats(model, b, adv, algo, TrainConfig())
    assert low.dtype == torch.float32
    torch.testing.assert_close(low, ref, atol=5e-3, rtol=5e-2)


def test_sft_observation_weight_adds_the_mean_nll_of_the_environment_tokens(setup):
    env, tok, model, _ = setup
    from agent_lab.rollout import demonstration_batch

    demo = demonstration_batch(env, tok, env.sample_tasks(3, 6))
    algo = make_algorithm("sft", group_size=1, max_tokens=max_action_tokens(env))
    adv = algo.advantages(demo, AlgoState())
    plain, _ = loss_and_stats(model, demo, adv, algo, TrainConfig())
    mixed, stats = loss_and_stats(model, demo, adv, algo, TrainConfig(sft_observation_weight=0.5))
    # by hand: log-softmax of the raw logits at every real, non-action position
    with torch.no_grad():
        lp = torch.log_softmax(model(demo.input_ids, demo.attention_mask)[:, :-1].float(), -1)
    lp = lp.gather(-1, demo.input_ids[:, 1:, None]).squeeze(-1)
    env_tok = demo.attention_mask[:, 1:] & ~demo.action_mask
    assert int(env_tok.sum()) > int(demo.action_mask.sum()) > 0, "prompts and observations outnumber actions"
    nll = float(-(lp * env_tok).sum() / env_tok.sum())
    assert stats["observation_nll"] == pytest.approx(nll, rel=1e-5)
    assert float(mixed.detach()) == pytest.approx(float(plain.detach()) + 0.5 * nll, rel=1e-5)
    # RL losses are untouched by the SFT-only weight
    rl = make_algorithm("dr_grpo", group_size=G, max_tokens=max_action_tokens(env))
    b = setup[3]
    a0 = rl.advantages(b, AlgoState())
    l0, _ = loss_and_stats(model, b, a0, rl, TrainConfig())
    l1, s1 = loss_and_stats(model, b, a0, rl, TrainConfig(sft_observation_weight=0.5))
    assert torch.equal(l0, l1) and "observation_nll" not in s1
    with pytest.raises(ValueError, match="sft_observation_weight"):
        TrainConfig(sft_observation_weight=-1.0).validate()


def test_sft_probe_weight_adds_the_probes_cross_entropy_at_the_base_items(tmp_path):
    from agent_lab.evaluation import load_checkpoint
    from agent_lab.rollout import demonstration_batch
    from agent_lab.trainer import demonstration_probe_targets

    env = make_env("crafting")
    tok = WordTokenizer.from_env(env)
    model = tiny_policy(tok, seed=2, probe=True)
    tasks = env.sample_tasks(4, 6)
    demo = demonstration_batch(env, tok, tasks)
    algo = make_algorithm("sft", group_size=1, max_tokens=max_action_tokens(env))
    adv = algo.advantages(demo, AlgoState())
    with torch.no_grad():
        probe = model(demo.input_ids, demo.attention_mask, with_probe=True)[..., -1]
    n_targets = {}
    for scope in ("base", "prefix"):
        targets = demonstration_probe_targets(env, tasks, tuple(demo.input_ids.shape), "cpu", scope)
        cfg = TrainConfig(env="crafting", sft_steps=1, sft_probe_weight=0.5, sft_probe_scope=scope)
        plain, _ = loss_and_stats(model, demo, adv, algo, cfg)
        mixed, stats = loss_and_stats(model, demo, adv, algo, cfg, probe_targets=targets)
        # by hand: the probe logit is the last channel, read at the prompt's targeted items (after <bos>)
        logit, y = [], []
        for b, task in enumerate(tasks):
            for j, label in enumerate(env.probe_labels(task, scope)):
                if label >= 0:
                    logit.append(probe[b, 1 + j]), y.append(float(label))
        bce = float(torch.nn.functional.binary_cross_entropy_with_logits(torch.stack(logit), torch.tensor(y)))
        assert stats["probe_loss"] == pytest.approx(bce, rel=1e-5)
        assert float(mixed.detach()) == pytest.approx(float(plain.detach()) + 0.5 * bce, rel=1e-5)
        n_targets[scope] = int((targets >= 0).sum())
        assert n_targets[scope] == len(y) > len(tasks)
    assert n_targets["prefix"] > 2 * n_targets["base"]  # every recipe line's items too
    # a run trains the probe in its SFT steps, logs it and saves it; RL steps leave it alone
    res = train(TrainConfig(env="crafting", d_model=32, n_layers=1, n_heads=2, max_len=512, sft_steps=8, steps=1,
                            batch_size=8, group_size=4, sft_batch_size=8, lr=3e-3, eval_every=0,
                            sft_probe_weight=1.0, sft_probe_scope="prefix", sft_probe_layer=1,
                            run_dir=str(tmp_path)), progress=False)
    sft_rows = [h for h in res.history if h["phase"] == "sft"]
    assert len(sft_rows) == 8 and all(0.0 <= h["probe_accuracy"] <= 1.0 for h in sft_rows)
    assert "probe_loss" not in res.history[-1]
    loaded, _, _ = load_checkpoint(tmp_path / "checkpoint.pt", "cpu")
    assert torch.equal(loaded.probe.weight, res.policy.probe.weight) and loaded.cfg.probe_layer == 1
    for bad, match in ((dict(sft_probe_weight=-1.0), "finite number"), (dict(sft_probe_weight=1.0), "only crafting"),
                       (dict(env="crafting", sft_probe_weight=1.0), "without SFT steps"),
                       (dict(env="crafting", sft_steps=1, sft_probe_weight=1.0, sft_probe_scope="all"), "sft_probe_scope"),
                       (dict(env="crafting", sft_steps=1, sft_probe_layer=1), "without the probe"),
                       (dict(env="crafting", sft_steps=1, sft_probe_weight=1.0, sft_probe_layer=3), "1..n_layers")):
        with pytest.raises(ValueError, match=match):
            TrainConfig(**bad).validate()
