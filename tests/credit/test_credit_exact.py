"""The exact credit of number search, and the facts that hold by construction: the table agrees with the exact
policy evaluation and its gradient is the derivative of J; branching from a replayed state is unbiased for the
state's and the history's value; lambda = 1 GAE with the exact values is Monte Carlo minus the value; anchor
groups keyed by the whole history collapse to the exact state baseline; the comparison recovers the gains
that follow from them."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from agent_lab.credit_exact import (
    ESTIMATORS,
    compare,
    enumerate_episodes,
    exact_values,
    lm_policy,
    sample_batch,
    state_keys,
)
from agent_lab.envs import (
    NumberSearchDP,
    history_from_log,
    make_env,
    median_policy,
    replay_prefix,
    uniform_consistent_policy,
    uniform_optimal_policy,
)
from agent_lab.envs.number_search_dp import candidates_after
from agent_lab.estimators import anchor_state_baselines, anchor_state_ids, gae, reward_to_go, td_residuals
from agent_lab.policy import ModelConfig, TinyTransformer, WordTokenizer
from agent_lab.rollout import SamplingConfig, collect_rollouts


def sticky_policy(n: int = 16):
    """Prefers candidates near its previous guess: depends on the history beyond the candidate interval."""

    def policy(history):
        lo, hi = candidates_after(history, n)
        last = history[-1][0] if history and history[-1][0] is not None else (n + 1) // 2
        w = np.exp(-np.abs(np.arange(lo, hi + 1) - last) / 2.0)
        return {a: float(p) for a, p in zip(range(lo, hi + 1), w / w.sum())}

    return policy


def texts_policy(history):
    """Mixes guess texts (two spellings may name one guess) with invalid ones (the invalid rule decides)."""
    lo, hi = candidates_after(history, 16)
    return {f"guess {(lo + hi) // 2}": 0.6, "guess 99": 0.2, f" GUESS {lo} ": 0.1, "pass": 0.1}


@pytest.mark.parametrize("policy, options", [
    (uniform_consistent_policy(16), {}), (median_policy(16), {}), (sticky_policy(), {"reward": "length"}),
    (texts_policy, {"invalid_action": "spend_turn"}), (texts_policy, {"invalid_action": "end_episode"}),
])
def test_the_table_agrees_with_the_exact_evaluation_and_the_bellman_equations(policy, options):
    dp = NumberSearchDP(16, 4, **options)
    table, evaluation = dp.policy_table(policy), dp.evaluate_policy(policy)
    assert table.values[0] == pytest.approx(evaluation.expected_return, abs=1e-12)
    assert table.target_values[0] == pytest.approx(evaluation.per_target_return, abs=1e-12)
    assert table.occupancy.sum() == pytest.approx(evaluation.expected_guesses, abs=1e-12)  # one turn per visit
    assert np.allclose((table.probs * np.nan_to_num(table.q)).sum(1), table.values, atol=1e-12)  # V = sum pi Q
    assert np.allclose([v.mean() for v in table.target_values], table.values, atol=1e-12)
    assert np.allclose(np.nansum(table.probs * table.advantages, axis=1), 0.0, atol=1e-12)  # E_a[A] = 0
    assert np.allclose(table.probs.sum(1), 1.0) and table.turn.max() == 3


def test_the_exact_gradient_is_the_derivative_of_j_with_respect_to_each_historys_logits():
    n, k = 6, 3
    dp = NumberSearchDP(n, k)
    rng = np.random.default_rng(0)
    logits: dict = {}

    def policy(history, bump=None):
        z = logits.setdefault(history, rng.normal(size=n + 1)).copy()
        if bump is not None and bump[0] == history:
            z[bump[1]] += bump[2]
        p = np.exp(z - z.max())
        p /= p.sum()
        return {(a if a else "oops"): float(q) for a, q in enumerate(p)}  # column 0: an invalid text

    table = dp.policy_table(policy)
    grad = table.gradient()
    for row, col in [(0, 3), (0, 0), (1, 2), (len(table) - 1, 5), (len(table) // 2, 1)]:
        h, eps = table.histories[row], 1e-6
        up = dp.evaluate_policy(lambda x: policy(x, (h, col, eps))).expected_return
        down = dp.evaluate_policy(lambda x: policy(x, (h, col, -eps))).expected_return
        assert grad[row, col] == pytest.approx((up - down) / (2 * eps), abs=1e-8)


def continuation_value(log: dict, t: int, table) -> float:
    """E[return from turn t on | the state saved before turn t], every choice of the policy played in a copy
    of the replayed environment (no DP involved)."""
    row = table.row(history_from_log(log)[:t])
    total = 0.0
    for col in np.flatnonzero(table.probs[row]):
        env = replay_prefix(log, t)
        step = env.step([f"guess {col}"])
        later = 0.0 if step.done[0] else continuation_value(env.episode_logs()[0], t + 1, table)
        total += table.probs[row, col] * (float(step.rewards[0]) + later)
    return total


@pytest.mark.parametrize("policy", [uniform_consistent_policy(16), sticky_policy()])
def test_branching_from_a_replayed_state_is_unbiased_for_the_state_and_the_history_value(policy):
    dp = NumberSearchDP(16, 4)
    table = dp.policy_table(policy)
    batch = sample_batch(table, dp, 16, 1, np.random.default_rng(1))
    checked = 0
    for log in batch.logs:
        for t in range(1, len(log["turns"])):
            row = table.row(history_from_log(log)[:t])
            state_value = continuation_value(log, t, table)
            z = log["task"]
            assert state_value == pytest.approx(table.target_values[row][z - table.lo[row]], abs=1e-12)
            checked += 1
    assert checked >= 10
    # averaged over the hidden numbers the history allows (uniform posterior), the history's value
    log = next(log for log in batch.logs if len(log["turns"]) >= 2)
    h = history_from_log(log)[:1]
    lo, hi = candidates_after(h, 16)
    per_state = [continuation_value({**log, "task": z}, 1, table) for z in range(lo, hi + 1)]
    assert np.mean(per_state) == pytest.approx(table.values[table.row(h)], abs=1e-12)


@pytest.mark.parametrize("policy", [uniform_consistent_policy(16), sticky_policy()])
def test_gae_with_the_exact_values_is_monte_carlo_minus_the_value_at_lambda_one(policy):
    dp = NumberSearchDP(16, 4)
    table = dp.policy_table(policy)
    b = sample_batch(table, dp, 64, 8, np.random.default_rng(2))
    v = exact_values(b, table)
    at_one = gae(b.rewards, v, b.turn_mask, 1.0, 1.0, b.terminated)
    assert torch.allclose(at_one, (reward_to_go(b.rewards, 1.0, b.turn_mask) - v) * b.turn_mask, atol=1e-12)
    assert torch.equal(gae(b.rewards, v, b.turn_mask, 1.0, 0.0, b.terminated),
                       td_residuals(b.rewards, v, b.turn_mask, 1.0, b.terminated))


@pytest.mark.parametrize("target", [5, 8, 13])
def test_anchor_groups_keyed_by_the_history_collapse_to_the_exact_state_baseline(target):
    dp = NumberSearchDP(16, 4)
    for policy, state_is_enough in ((uniform_consistent_policy(16), True), (sticky_policy(), False)):
        table = dp.policy_table(policy)
        b, probs = enumerate_episodes(table, dp, target)  # one group: every episode, weighted by its probability
        assert float(probs.sum()) == pytest.approx(1.0, abs=1e-12)
        real = b.turn_mask
        exact = torch.tensor([table.target_values[r][target - table.lo[r]] for r in b.rows[real.numpy()]])
        to_go = reward_to_go(b.rewards, 1.0, real)
        gaps = {}
        for key in ("history", "state"):
            ids = anchor_state_ids(state_keys(b, table, key), b.rewards.shape[1])
            base, _ = anchor_state_baselines(to_go, ids, real, len(b), weights=probs)
            gaps[key] = float((base[real] - exact).abs().max())
        assert gaps["history"] < 1e-12
        # the environment's state (lo, hi, t) merges histories; enough only when the policy reads nothing else
        assert (gaps["state"] < 1e-12) is state_is_enough


def test_lm_policy_is_the_rollouts_candidate_masked_sampling_distribution():
    env = make_env("number-search", mask_actions=True)
    tok = WordTokenizer.from_env(env)
    torch.manual_seed(0)
    model = TinyTransformer(ModelConfig(len(tok), d_model=32, n_layers=1, n_heads=2, max_len=64))
    policy = lm_policy(model, tok)
    batch = collect_rollouts(model, tok, env, env.sample_tasks(0, 16), SamplingConfig(candidate_mask=True),
                             generator=torch.Generator().manual_seed(0))
    for b, log in enumerate(batch.episode_logs):
        history = history_from_log(log)
        # per turn, the sum of the action's token log-probs ("guess", the number, the newline)
        for t, turn in enumerate(log["turns"]):
            recorded = float(batch.old_logprobs[b][(batch.turn_ids[b] == t) & batch.action_mask[b]].sum())
            assert recorded == pytest.approx(math.log(policy(history[:t])[turn["action"]]), abs=1e-5)
    with pytest.raises(ValueError, match="outside its candidates"):
        policy(((3, "lower"), (9, "higher")))


def test_the_comparison_recovers_the_gains_that_hold_by_construction():
    dp = NumberSearchDP(16, 4)
    table = dp.policy_table(uniform_consistent_policy(16))
    names = ["episode (Dr.GRPO)", "branching", "MC - exact V (oracle)", "TD, exact V (oracle)"]
    out = compare(table, dp, budget=32, group_size=8, k=2, replicates=120, seed=0,
                  estimators={n: ESTIMATORS[n] for n in names})
    r = out.results
    for name, gain in (("episode (Dr.GRPO)", 7 / 8), ("branching", 1.0), ("MC - exact V (oracle)", 1.0),
                       ("TD, exact V (oracle)", 1.0)):
        assert abs(r[name]["grad_gain"] - gain) < 4 * r[name]["grad_gain_se"], (name, r[name]["grad_gain"])
    # the oracles are unbiased turn by turn: their squared bias is noise around 0, far below their variance
    for name in ("MC - exact V (oracle)", "TD, exact V (oracle)"):
        assert abs(r[name]["turn"]["bias_sq"]) < 0.1 * r[name]["turn"]["variance"]
    # Dr.GRPO credits every turn with the episode's advantage, which is not the turn's
    assert r["episode (Dr.GRPO)"]["turn"]["bias_sq"] > 0.05 * r["episode (Dr.GRPO)"]["turn"]["variance"]
    assert out.settings["branch_episodes"] == round(32 / (1 + 2 * table.occupancy.sum()))
    assert abs(r["branching"]["episodes_per_estimate"] - 32) < 0.15 * 32
    assert r["branching"]["extra_turns_per_estimate"] > r["branching"]["episodes_per_estimate"]


def test_an_optimal_policy_has_zero_advantage_and_zero_gradient_on_its_support():
    dp = NumberSearchDP(16, 4)
    table = dp.policy_table(uniform_optimal_policy(dp))
    assert table.values[0] == pytest.approx(15 / 16, abs=1e-12)
    assert np.nanmax(np.abs(table.advantages)) < 1e-12 and np.abs(table.gradient()).max() < 1e-12
    assert (table.probs > 0).sum(1).max() > 1  # several optimal guesses somewhere: a stochastic policy
