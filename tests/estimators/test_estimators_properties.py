"""Property-based tests (hypothesis) of the estimators' algebra."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import agent_lab.estimators as E

DTYPE = torch.float64
FAST = settings(max_examples=40, deadline=None)
reward = st.floats(-10, 10, allow_nan=False, width=64)
unit = st.floats(0, 1)


@st.composite
def grouped_rewards(draw, min_size=1):
    size = draw(st.integers(min_size, 5))
    groups = draw(st.integers(1, 4))
    values = draw(st.lists(reward, min_size=size * groups, max_size=size * groups))
    return torch.tensor(values, dtype=DTYPE), size


@st.composite
def turn_batch(draw):
    batch, turns = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    lengths = draw(st.lists(st.integers(0, turns), min_size=batch, max_size=batch))
    rewards = torch.tensor(draw(st.lists(reward, min_size=batch * turns, max_size=batch * turns)), dtype=DTYPE)
    values = torch.tensor(draw(st.lists(reward, min_size=batch * turns, max_size=batch * turns)), dtype=DTYPE)
    mask = torch.arange(turns)[None, :] < torch.tensor(lengths)[:, None]
    done = torch.tensor(draw(st.lists(st.booleans(), min_size=batch, max_size=batch)))
    boot = torch.tensor(draw(st.lists(reward, min_size=batch, max_size=batch)), dtype=DTYPE)
    return rewards.reshape(batch, turns), values.reshape(batch, turns), mask, done, boot


@FAST
@given(grouped_rewards(), reward)
def test_shifting_all_rewards_leaves_centered_advantages_unchanged(case, shift):
    rewards, size = case
    assert torch.allclose(E.group_centered_advantages(rewards + shift, size), E.group_centered_advantages(rewards, size), atol=1e-9)


@FAST
@given(grouped_rewards())
def test_centered_advantages_sum_to_zero_per_group(case):
    rewards, size = case
    sums = E.group_centered_advantages(rewards, size).reshape(-1, size).sum(dim=1)
    assert torch.allclose(sums, torch.zeros_like(sums), atol=1e-9)


@FAST
@given(grouped_rewards(min_size=2))
def test_rloo_is_g_over_g_minus_one_times_centered(case):
    rewards, size = case
    assert torch.allclose(E.rloo_advantages(rewards, size), E.group_centered_advantages(rewards, size) * size / (size - 1), atol=1e-9)
    assert torch.allclose(E.rloo_advantages(rewards, size), rewards - E.leave_one_out_baseline(rewards, size), atol=1e-9)


@FAST
@given(grouped_rewards(min_size=2), reward, st.floats(0.1, 10), st.booleans())
def test_standardized_advantages_are_affine_invariant_with_zero_eps(case, shift, scale, unbiased):
    rewards, size = case
    base = E.group_standardized_advantages(rewards, size, eps=0.0, unbiased=unbiased)
    moved = E.group_standardized_advantages(rewards * scale + shift, size, eps=0.0, unbiased=unbiased)
    spread = rewards.reshape(-1, size).std(dim=1)
    keep = (spread > 1e-3).repeat_interleave(size)  # groups far from degenerate, where rounding is harmless
    assert torch.allclose(moved[keep], base[keep], atol=1e-6)


@FAST
@given(grouped_rewards())
def test_standardized_advantages_have_unit_population_std_or_are_zero(case):
    rewards, size = case
    adv = E.group_standardized_advantages(rewards, size, eps=0.0).reshape(-1, size)
    for row, raw in zip(adv, rewards.reshape(-1, size)):
        if bool((raw == raw[0]).all()):
            assert torch.equal(row, torch.zeros_like(row))
        elif raw.std(unbiased=False) > 1e-6:
            assert math.isclose(row.pow(2).mean().item(), 1.0, rel_tol=1e-6)


@FAST
@given(turn_batch(), unit)
def test_gae_with_lambda_zero_equals_td_residual(case, gamma):
    rewards, values, mask, done, boot = case
    want = E.td_residuals(rewards, values, mask, gamma, done, boot)
    assert torch.allclose(E.gae(rewards, values, mask, gamma, 0.0, done, boot), want, atol=1e-9)


@FAST
@given(turn_batch(), unit)
def test_gae_with_lambda_one_equals_return_minus_value(case, gamma):
    rewards, values, mask, done, boot = case
    returns = E.discounted_returns(rewards, mask, gamma, done, boot)
    want = torch.where(mask, returns - values, torch.zeros_like(values))
    assert torch.allclose(E.gae(rewards, values, mask, gamma, 1.0, done, boot), want, atol=1e-8)


@FAST
@given(turn_batch(), unit)
def test_reward_to_go_matches_explicit_discounted_sum(case, gamma):
    rewards, _, mask, _, _ = case
    got = E.reward_to_go(rewards, gamma, mask)
    batch, turns = rewards.shape
    for i in range(batch):
        for t in range(turns):
            want = sum(gamma ** (k - t) * rewards[i, k].item() for k in range(t, turns) if mask[i, k]) if mask[i, t] else 0.0
            assert math.isclose(got[i, t].item(), want, rel_tol=1e-9, abs_tol=1e-9)


@FAST
@given(turn_batch(), unit)
def test_terminated_returns_equal_reward_to_go(case, gamma):
    rewards, _, mask, _, boot = case
    done = torch.ones(rewards.shape[0], dtype=torch.bool)
    assert torch.equal(E.discounted_returns(rewards, mask, gamma, done, boot), E.reward_to_go(rewards, gamma, mask))


@FAST
@given(turn_batch(), unit, st.lists(reward, min_size=6, max_size=6))
def test_potential_shaping_shifts_every_terminated_return_by_minus_initial_potential(case, gamma, phi_values):
    rewards, _, mask, _, _ = case
    batch, turns = rewards.shape
    potentials = torch.tensor((phi_values * 5)[: batch * (turns + 1)], dtype=DTYPE).reshape(batch, turns + 1)
    done = torch.ones(batch, dtype=torch.bool)
    shaped = E.potential_based_shaping(rewards, potentials, gamma, mask, done)
    discount = gamma ** torch.arange(turns, dtype=DTYPE)
    before = (rewards * mask * discount).sum(dim=1)
    after = (shaped * discount).sum(dim=1)
    has_turns = mask.any(dim=1)
    want = torch.where(has_turns, before - potentials[:, 0], torch.zeros_like(before))
    assert torch.allclose(after, want, atol=1e-8)


@st.composite
def token_batch(draw):
    batch, length = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    per_token = torch.randn(batch, length, generator=generator, dtype=DTYPE)
    mask = torch.rand(batch, length, generator=generator) < 0.7
    turn_ids = torch.where(mask, torch.arange(length)[None, :] // 2, torch.tensor(-1))
    return per_token, mask, turn_ids


@FAST
@given(token_batch(), st.sampled_from(E.OBJECTIVES), st.integers(0, 3), st.randoms(use_true_random=False))
def test_aggregation_is_invariant_to_padding_and_row_order(case, objective, pad, rng):
    per_token, mask, turn_ids = case
    kw = {"max_tokens": 10}
    whole = E.reduce_loss(*E.aggregate(per_token, mask, objective, turn_ids=turn_ids, **kw))
    order = list(range(per_token.shape[0]))
    rng.shuffle(order)
    extend = lambda x, v: torch.cat([x[order], torch.full_like(x[:, :1], v).expand(-1, pad)], dim=1)  # noqa: E731
    other = E.reduce_loss(*E.aggregate(extend(per_token, -5.0), extend(mask, False), objective, turn_ids=extend(turn_ids, -1), **kw))
    assert torch.allclose(other, whole, atol=1e-12)


@FAST
@given(token_batch())
def test_token_mean_weights_every_token_equally_and_seq_mean_every_row(case):
    per_token, mask, turn_ids = case
    num, den = E.aggregate(per_token, mask, "token_mean")
    assert torch.allclose(num, per_token[mask].sum()) and den == mask.sum()
    num, den = E.aggregate(per_token, mask, "seq_mean_token_mean")
    rows = [per_token[i][mask[i]].mean() if mask[i].any() else torch.tensor(0.0, dtype=DTYPE) for i in range(len(mask))]
    assert torch.allclose(num / den, torch.stack(rows).mean())


@FAST
@given(st.lists(st.floats(-3, 3), min_size=1, max_size=8), st.lists(st.floats(-3, 3), min_size=8, max_size=8),
       st.lists(reward, min_size=8, max_size=8), st.floats(0.01, 0.5))
def test_ppo_surrogate_never_exceeds_the_unclipped_objective(new, old, adv, eps):
    n = len(new)
    logprobs, old_t = torch.tensor(new, dtype=DTYPE)[None] - 4, torch.tensor(old[:n], dtype=DTYPE)[None] - 4
    advantages = torch.tensor(adv[:n], dtype=DTYPE)[None]
    mask = torch.ones(1, n, dtype=torch.bool)
    surrogate, stats = E.ppo_clipped_surrogate(logprobs, old_t, advantages, mask, eps)
    unclipped = torch.exp(logprobs - old_t) * advantages
    assert bool((surrogate <= unclipped + 1e-12).all())
    ratio = torch.exp(logprobs - old_t)
    pos, neg = advantages > 0, advantages < 0
    assert stats["clip_frac_pos"].item() == (ratio[pos] > 1 + eps).sum().item() / max(int(pos.sum()), 1)
    assert stats["clip_frac_neg"].item() == (ratio[neg] < 1 - eps).sum().item() / max(int(neg.sum()), 1)
    k3 = [(r - 1) - math.log(r) for r in ratio[0].tolist()]
    assert math.isclose(stats[E.KL_OLD_NEW].item(), math.fsum(k3) / n, rel_tol=1e-9, abs_tol=1e-12)


@FAST
@given(st.lists(st.floats(-20, 20), min_size=2, max_size=9), st.lists(st.floats(-20, 20), min_size=9, max_size=9))
def test_kl_estimators_k2_k3_are_non_negative_and_k1_is_the_log_ratio(lp, ref):
    logprobs = torch.tensor(lp, dtype=DTYPE)
    ref_lp = torch.tensor(ref[: len(lp)], dtype=DTYPE)
    assert bool((E.kl_estimate(logprobs, ref_lp, "k2") >= 0).all())
    assert bool((E.kl_estimate(logprobs, ref_lp, "k3") >= 0).all())
    assert torch.equal(E.kl_estimate(logprobs, ref_lp, "k1"), logprobs - ref_lp)


@FAST
@given(st.lists(st.floats(-50, 50), min_size=1, max_size=10), st.floats(-1e4, 1e4))
def test_entropy_lies_between_zero_and_log_vocab_and_ignores_a_logit_shift(logits, shift):
    z = torch.tensor(logits, dtype=DTYPE)
    h = E.entropy_from_logits(z)
    assert -1e-12 <= h.item() <= math.log(len(logits)) + 1e-12
    assert math.isclose(E.entropy_from_logits(z + shift).item(), h.item(), abs_tol=1e-9)


@FAST
@given(st.lists(st.floats(0, 100), min_size=1, max_size=12).filter(lambda w: sum(w) > 1e-3), st.floats(0.01, 100))
def test_effective_sample_size_lies_in_one_to_n_and_is_scale_free(weights, scale):
    w = torch.tensor(weights, dtype=DTYPE)
    ess = E.effective_sample_size(w)
    assert 1 - 1e-9 <= ess.item() <= len(weights) + 1e-9
    assert math.isclose(E.effective_sample_size(w * scale).item(), ess.item(), rel_tol=1e-9)
    positive = w[w > 0]
    assert math.isclose(E.effective_sample_size(positive.log(), log_weights=True).item(), ess.item(), rel_tol=1e-9)


@FAST
@given(unit, st.integers(1, 200))
def test_prob_at_least_one_success_is_one_minus_all_fail_and_grows_with_n(p, n):
    got = E.prob_at_least_one_success(p, n).item()
    assert math.isclose(got, 1 - (1 - p) ** n, abs_tol=1e-12)
    assert E.prob_at_least_one_success(p, n + 1).item() >= got - 1e-15
