"""Each algorithm's loss is the estimator library's, and each runs end to end (foundations chapter sections 10-13); exact values: test_ppo_exact.py."""

from __future__ import annotations

from types import SimpleNamespace

import dataclasses
import json

import pytest
import torch
from conftest import FAST, grouped_number_search_batch
from exact_batches import number_search_states

from agent_lab.algorithms import ALGORITHMS, AlgoState, make_algorithm
from agent_lab.critic import policy_features
from agent_lab.estimators.advantages import group_centered_advantages, group_standardized_advantages, rloo_advantages
from agent_lab.estimators import KL_OLD_NEW
from agent_lab.estimators.aggregation import aggregate
from agent_lab.branching import continuation_returns
from agent_lab.estimators.credit import anchor_state_advantages, anchor_state_ids, branching_advantages
from agent_lab.estimators.logprobs import token_logprobs
from agent_lab.estimators.policy_gradient import ppo_clipped_surrogate, reinforce_surrogate
from agent_lab.preflight import check_config
from agent_lab.trainer import TrainConfig, loss_and_stats, max_action_tokens, policy_logits, train
from agent_lab.rollout import SamplingConfig
from agent_lab.update import KL_NEW_REF

G = 4


@pytest.fixture(scope="module")
def setup():
    torch.set_num_threads(1)
    env, tok, model, b = grouped_number_search_batch(1, 8, G, temperature=0.9)
    assert 0 < float(b.success.float().mean()) < 1, "need mixed outcomes for a meaningful comparison"
    returns, _ = continuation_returns(model, tok, b, 2, SamplingConfig(temperature=0.9, candidate_mask=True),
                                      torch.Generator().manual_seed(1))
    return env, tok, model, dataclasses.replace(b, continuation_returns=returns)


def _neg(num, den):
    return -num, den


def _expected(name, lp, b, max_tokens, adv):
    """The same loss written directly against the estimator library (the reference); ``adv``: the algorithm's
    advantages, needed only where they come from a critic (their own test: test_ppo_gae.py)."""
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
    if name == "vineppo":
        ended = torch.ones(len(b), dtype=torch.bool)
        want = branching_advantages(b.rewards, b.continuation_returns, b.turn_mask, 1.0, ended)
        torch.testing.assert_close(adv, want)
        s, _ = ppo_clipped_surrogate(lp, b.old_logprobs, want, m, clip_eps=0.2, turn_ids=b.turn_ids)
        return _neg(*aggregate(s, m, "constant", max_tokens=max_tokens))
    if name == "ppo_gae":
        s, _ = ppo_clipped_surrogate(lp, b.old_logprobs, adv, m, clip_eps=0.2, turn_ids=b.turn_ids)
        return _neg(*aggregate(s, m, "constant", max_tokens=max_tokens))
    if name == "sft":
        return _neg(*aggregate(lp, m, "token_mean"))
    if name == "gigpo":
        ids = anchor_state_ids(number_search_states(b.episode_logs, 16), b.rewards.shape[1])
        adv = anchor_state_advantages(b.rewards, ids, b.turn_mask, G)
        return _neg(*aggregate(reinforce_surrogate(lp, adv, turn_ids=b.turn_ids), m, "constant", max_tokens=max_tokens))
    raise AssertionError(name)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_trainer_loss_equals_the_estimator_library_loss(setup, name):
    env, tok, model, b = setup
    mt = max_action_tokens(env)
    algo = make_algorithm(name, group_size=G, max_tokens=mt)
    if algo.needs_decision_states:
        with torch.no_grad():
            adv = algo.advantages(b, AlgoState(), policy_features(model, b))
        assert adv.shape == b.rewards.shape
    else:
        adv = algo.advantages(b, AlgoState())
    loss, stats = loss_and_stats(model, b, adv, algo)
    lp = token_logprobs(policy_logits(model, b, b.temperature), b.input_ids[:, 1:])
    num, den = _expected(name, lp, b, mt, adv)
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
    loss, _ = loss_and_stats(model, b, adv, algo, loss_fn=loss_fn)
    ref, _ = loss_and_stats(model, b, adv, algo)
    torch.testing.assert_close(loss, ref)
    assert calls["shape"][1] == (len(b),)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_each_algorithm_runs_a_few_steps_and_writes_its_run_directory(tmp_path, name):
    extra = {"sft_steps": 1} if name != "sft" else {}
    if name in ("ppo", "ppo_gae", "vineppo"):
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
    saved = json.loads((tmp_path / "config.json").read_text())
    assert (saved["algorithm"]["name"], saved["algorithm"]["steps"]) == ((name, 2) if name != "sft" else ("dr_grpo", 0))
    if name != "sft":
        assert last["ratio_first_epoch"] == pytest.approx(1.0, abs=1e-5)
        for k in ("degenerate_fraction", "entropy", KL_OLD_NEW, "grad_norm_before", "grad_norm_after",
                  "ess_fraction", "episode_turns", "success", "reward_mean", "logprob_gap_max", "logprob_gap_mean"):
            assert k in last, k
    if name in ("ppo", "ppo_gae", "vineppo"):
        assert {"clip_fraction", "clip_frac_pos", "clip_frac_neg", KL_NEW_REF} <= set(last)


def test_loss_under_bf16_autocast_is_close_to_float32(setup):
    # the CUDA path wraps the same loss in torch.autocast(bfloat16); check it on the CPU
    env, tok, model, b = setup
    algo = make_algorithm("dr_grpo", group_size=G, max_tokens=max_action_tokens(env))
    adv = algo.advantages(b, AlgoState())
    ref, _ = loss_and_stats(model, b, adv, algo)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low, _ = loss_and_stats(model, b, adv, algo)
    assert low.dtype == torch.float32
    torch.testing.assert_close(low, ref, atol=5e-3, rtol=5e-2)


def test_the_observation_loss_plugin_adds_the_mean_nll_of_the_environment_tokens(setup, tmp_path):
    from agent_lab.plugins.losses import ObservationLoss
    from agent_lab.rollout import demonstration_batch

    env, tok, model, _ = setup
    demo = demonstration_batch(env, tok, env.sample_tasks(3, 6))
    lp = token_logprobs(policy_logits(model, demo, demo.temperature), demo.input_ids[:, 1:])
    causal_run = SimpleNamespace(cfg=TrainConfig())
    term, stats = ObservationLoss(weight=0.5).term(causal_run, demo, lp, demo, True)
    # by hand: log-softmax of the raw logits at every real, non-action position
    with torch.no_grad():
        raw = torch.log_softmax(model(demo.input_ids, demo.attention_mask)[:, :-1].float(), -1)
    raw = raw.gather(-1, demo.input_ids[:, 1:, None]).squeeze(-1)
    env_tok = demo.attention_mask[:, 1:] & ~demo.action_mask
    assert int(env_tok.sum()) > int(demo.action_mask.sum()) > 0, "prompts and observations outnumber actions"
    nll = float(-(raw * env_tok).sum() / env_tok.sum())
    assert stats["observation_nll"] == pytest.approx(nll, rel=1e-5)
    assert float(term.detach()) == pytest.approx(0.5 * nll, rel=1e-5)
    # in a run: the first step's loss (same weights) is the plain SFT loss plus the weighted term, logged
    base = {**FAST, "algo": "sft", "steps": 1}
    plain = train(TrainConfig(**base), run_dir=str(tmp_path / "p"), progress=False).history[0]
    mixed = train(TrainConfig(**base, sft_observation_weight=0.5), run_dir=str(tmp_path / "m"), progress=False)
    row = mixed.history[0]
    assert row["loss"] == pytest.approx(plain["loss"] + 0.5 * row["observation_nll"], rel=1e-5)
    assert "+ 0.5 * mean NLL of the environment's tokens" in (tmp_path / "m" / "loss.txt").read_text()
    with pytest.raises(ValueError, match="sft_observation_weight"):
        check_config(TrainConfig(sft_observation_weight=-1.0))


def test_the_observation_loss_leaves_a_bidirectional_prompt_out_since_its_positions_read_their_targets(setup):
    from agent_lab.plugins.losses import environment_targets
    from agent_lab.rollout import demonstration_batch

    env, tok, _, _ = setup
    demo = demonstration_batch(env, tok, env.sample_tasks(3, 6))
    causal, both_ways = environment_targets(demo), environment_targets(demo, bidirectional_prompt=True)
    # every prompt token after <bos> is a target the bidirectional prompt's positions already read
    assert int(causal.sum() - both_ways.sum()) == int((demo.prompt_lengths - 1).sum()) > 0
    assert bool((both_ways <= causal).all()) and int(both_ways.sum()) > 0
    for row, p in enumerate(demo.prompt_lengths.tolist()):
        assert not both_ways[row, : p - 1].any() and bool(causal[row, : p - 1].all())


def _user_ppo_loss(logprobs, old_logprobs, advantages, action_mask, clip_eps, ref_logprobs, kl_coef):
    """A user's whole PPO loss, written out (the crafting assignment's ppo_loss): token mean of
    -min(rho A, clip(rho) A) + kl_coef * k3(pi || ref)."""
    mask = action_mask.bool()
    adv = advantages[:, None].to(logprobs.dtype)
    ratio = torch.exp(logprobs - old_logprobs)
    s = torch.min(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    log_r = ref_logprobs - logprobs
    k3 = torch.expm1(log_r) - log_r
    n = mask.sum()
    loss = torch.where(mask, -s + kl_coef * k3, torch.zeros_like(s)).sum() / n
    return loss, {"kl_ref": float((k3.detach() * mask).sum() / n), "tokens": int(n)}


def test_ppo_takes_a_users_whole_loss_and_trains_exactly_like_its_own(tmp_path):
    """Several epochs and minibatches (so ratios leave 1 and the clip acts), a KL penalty to the reference: the
    user's loss must see the behaviour log-probs, clip_eps, the reference and kl_coef, in that order."""
    cfg = {**FAST, "algo": "ppo", "sft_steps": 2, "steps": 3, "ppo_epochs": 3, "minibatches": 2, "kl_coef": 0.1,
           "clip_eps": 0.1, "objective": "token_mean", "lr": 3e-2}
    own = train(TrainConfig(**cfg, run_dir=str(tmp_path / "own")), progress=False)
    user = train(TrainConfig(**cfg, run_dir=str(tmp_path / "user")), loss_fn=_user_ppo_loss, progress=False)
    for k, v in own.policy.state_dict().items():
        torch.testing.assert_close(user.policy.state_dict()[k], v, atol=1e-6, rtol=1e-5)
    rl = [h for h in own.history if h["phase"] == "ppo"]
    assert max(h["ratio_max"] for h in rl) > 1.1, "the clip range must be left for the test to see the clip"
    for a, b in zip(rl, [h for h in user.history if h["phase"] == "ppo"]):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-6)
        assert b["user_kl_ref"] >= 0 and b["user_tokens"] > 0
    assert "loss_fn(logprobs, old_logprobs, advantages, action_mask, clip_eps" in (tmp_path / "user" /
                                                                                 "loss.txt").read_text()


def test_a_ppo_loss_fn_must_return_loss_and_stats(tmp_path):
    cfg = {**FAST, "algo": "ppo", "sft_steps": 1, "steps": 1, "run_dir": str(tmp_path)}
    with pytest.raises(ValueError, match=r"must return a pair \(loss, stats dict\)"):
        train(TrainConfig(**cfg), loss_fn=lambda *args: _user_ppo_loss(*args)[0], progress=False)
