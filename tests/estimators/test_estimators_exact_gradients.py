"""Exact-gradient checks: each estimator's expectation, by enumerating a small finite action set, against
the true gradient (autograd of the exact expected reward)."""

import pytest
import torch

from agent_lab.estimators import (
    aggregate,
    constant_baseline,
    group_centered_advantages,
    group_mean_baseline,
    group_standardized_advantages,
    leave_one_out_baseline,
    optimal_constant_baseline,
    ppo_clipped_surrogate,
    reinforce_surrogate,
    reward_to_go,
    rloo_advantages,
    token_logprobs,
)
from estimator_cases import DTYPE, expected_group_gradient, softmax_policy, true_gradient, two_turn_batch

THETA = [0.3, -0.7, 1.1]
REWARDS = torch.tensor([1.0, 0.0, 0.4], dtype=DTYPE)


def _close(got, want, atol=1e-12):
    assert torch.allclose(got, want, atol=atol, rtol=0), f"expected {want.tolist()}, got {got.tolist()}"


@pytest.mark.parametrize("group_size", [2, 3])
def test_plain_reinforce_expectation_equals_true_gradient(group_size):
    theta = softmax_policy(THETA)
    got = expected_group_gradient(theta, REWARDS, group_size, lambda r: r)
    _close(got, true_gradient(theta, REWARDS))


@pytest.mark.parametrize("group_size", [2, 3, 4])
def test_leave_one_out_advantages_are_unbiased(group_size):
    theta = softmax_policy(THETA)
    want = true_gradient(theta, REWARDS)
    _close(expected_group_gradient(theta, REWARDS, group_size, lambda r: rloo_advantages(r, group_size)), want)
    baseline_form = expected_group_gradient(theta, REWARDS, group_size, lambda r: r - leave_one_out_baseline(r, group_size))
    _close(baseline_form, want)


@pytest.mark.parametrize("group_size", [2, 3, 4])
def test_group_mean_including_own_reward_gives_g_minus_one_over_g_of_true_gradient(group_size):
    theta = softmax_policy(THETA)
    want = true_gradient(theta, REWARDS) * (group_size - 1) / group_size
    _close(expected_group_gradient(theta, REWARDS, group_size, lambda r: group_centered_advantages(r, group_size)), want)
    _close(expected_group_gradient(theta, REWARDS, group_size, lambda r: r - group_mean_baseline(r, group_size)), want)


def test_group_standardized_advantages_are_not_a_multiple_of_the_true_gradient():
    # Dividing by a sample-dependent std couples samples: the expectation is a biased direction, here
    # visibly not parallel to the true gradient (the cosine is below 1).
    theta = softmax_policy(THETA)
    rewards = torch.tensor([1.0, 0.0, 0.9], dtype=DTYPE)
    want = true_gradient(theta, rewards)
    got = expected_group_gradient(theta, rewards, 3, lambda r: group_standardized_advantages(r, 3))
    cosine = torch.dot(got, want) / (got.norm() * want.norm())
    assert cosine < 1 - 1e-3, f"expected a direction bias, got cosine {cosine.item()}"


def test_constant_baseline_leaves_expected_gradient_unchanged():
    theta = softmax_policy(THETA)
    got = expected_group_gradient(theta, REWARDS, 1, lambda r: r - constant_baseline(r, 0.37))
    _close(got, true_gradient(theta, REWARDS))


def test_lecture_two_action_example_with_half_baseline_has_zero_variance():
    # Seed 000 section 4: p = sigmoid(theta) = 0.5, r(A) = 1, r(B) = 0, b = 0.5: both samples give 0.25.
    theta = torch.zeros(1, dtype=DTYPE, requires_grad=True)
    logits = torch.stack([theta, torch.zeros(1, dtype=DTYPE)], dim=-1)  # softmax([theta, 0])_0 = sigmoid(theta)
    estimates = []
    for action, reward in ((0, 1.0), (1, 0.0)):
        lp = token_logprobs(logits[None], torch.tensor([[action]]))
        surrogate = reinforce_surrogate(lp, torch.tensor([reward], dtype=DTYPE), baseline=torch.tensor([0.5], dtype=DTYPE))
        (grad,) = torch.autograd.grad(surrogate.sum(), theta)
        estimates.append(grad.item())
    assert estimates == pytest.approx([0.25, 0.25], abs=1e-15)


def test_optimal_constant_baseline_minimizes_exact_estimator_variance():
    theta = softmax_policy(THETA)
    probs = torch.softmax(theta.detach(), 0)
    k = len(THETA)
    rewards = torch.tensor([1.0, 0.0, 3.0], dtype=DTYPE)
    logprobs = token_logprobs(theta.expand(k, 1, k), torch.arange(k)[:, None])[:, 0]
    scores = torch.stack([torch.autograd.grad(logprobs[a], theta, retain_graph=True)[0] for a in range(k)])  # [K, D]
    z = scores[:, 0]  # one parameter direction
    b_star = optimal_constant_baseline(rewards, z, weights=probs)

    def variance(b):
        g = (rewards - b) * z
        return (probs * g.square()).sum() - (probs * g).sum().square()

    grid = torch.linspace(float(b_star) - 1, float(b_star) + 1, 201, dtype=DTYPE)
    assert all(variance(b_star) <= variance(b) + 1e-15 for b in grid)
    mean_reward = (probs * rewards).sum()
    assert variance(b_star) < variance(mean_reward), "b* should beat E[R] when Z^2 correlates with R"
    # The whole-vector version minimises the trace of the covariance.
    b_trace = optimal_constant_baseline(rewards, scores, weights=probs)

    def trace(b):
        g = (rewards - b)[:, None] * scores
        return ((probs[:, None] * g.square()).sum(0) - (probs[:, None] * g).sum(0).square()).sum()

    assert all(trace(b_trace) <= trace(b) + 1e-15 for b in grid + float(b_trace - b_star))


def _two_turn_setup():
    torch.manual_seed(3)
    theta0 = torch.randn(3, dtype=DTYPE, requires_grad=True)
    theta1 = torch.randn(3, 3, dtype=DTYPE, requires_grad=True)
    r0 = torch.tensor([0.5, -0.2, 0.1], dtype=DTYPE)  # reward after turn 0, by a0
    r1 = torch.randn(3, 3, dtype=DTYPE)  # reward after turn 1, by (a0, a1)
    return theta0, theta1, r0, r1


def _two_turn_true_gradient(theta0, theta1, r0, r1):
    p0 = torch.softmax(theta0, 0)
    p1 = torch.softmax(theta1, 1)
    objective = (p0[:, None] * p1 * (r0[:, None] + r1)).sum()
    return torch.autograd.grad(objective, (theta0, theta1))


def _two_turn_expected_gradient(coefficients_fn, baseline_fn=None):
    theta0, theta1, r0, r1 = _two_turn_setup()
    a0, a1, logprobs, mask, turn_ids, prob = two_turn_batch(theta0, theta1)
    rewards = torch.stack([r0[a0], r1[a0, a1]], dim=1)  # [N, T=2]
    coefficients = coefficients_fn(rewards, mask)
    baseline = None if baseline_fn is None else baseline_fn(a0, rewards)
    per_turn = coefficients.ndim == 2
    surrogate = reinforce_surrogate(logprobs, coefficients, baseline=baseline, turn_ids=turn_ids if per_turn else None)
    numerator, _ = aggregate(surrogate * prob[:, None], mask, "token_mean")
    got = torch.autograd.grad(numerator, (theta0, theta1))
    return got, _two_turn_true_gradient(theta0, theta1, r0, r1)


def test_total_return_on_every_action_token_is_unbiased_over_two_turns():
    got, want = _two_turn_expected_gradient(lambda rewards, mask: rewards.sum(dim=1))
    for g, w in zip(got, want):
        _close(g, w)


def test_reward_to_go_on_each_turn_is_unbiased_over_two_turns():
    got, want = _two_turn_expected_gradient(lambda rewards, mask: reward_to_go(rewards, gamma=1.0))
    for g, w in zip(got, want):
        _close(g, w)


def test_history_dependent_baseline_is_unbiased_but_action_dependent_baseline_is_not():
    history = torch.tensor([0.3, -1.0, 2.0], dtype=DTYPE)  # b(h_1) depends on a0 only: allowed for turn 1

    def history_baseline(a0, rewards):
        return torch.stack([torch.full_like(rewards[:, 0], 0.7), history[a0]], dim=1)

    rtg = lambda rewards, mask: reward_to_go(rewards, gamma=1.0)  # noqa: E731
    got, want = _two_turn_expected_gradient(rtg, history_baseline)
    for g, w in zip(got, want):
        _close(g, w)
    # Subtracting the turn's own reward-to-go (it depends on the sampled a1) removes real signal.
    got_bad, _ = _two_turn_expected_gradient(rtg, lambda a0, rewards: 0.5 * reward_to_go(rewards, gamma=1.0))
    assert not torch.allclose(got_bad[1], want[1], atol=1e-6)


def test_ppo_surrogate_at_old_policy_has_the_reinforce_gradient():
    # At theta = theta_old every ratio is 1, the clip is inactive and grad rho = grad log pi.
    theta0, theta1, r0, r1 = _two_turn_setup()
    a0, a1, logprobs, mask, turn_ids, prob = two_turn_batch(theta0, theta1)
    returns = r0[a0] + r1[a0, a1]
    surrogate, stats = ppo_clipped_surrogate(logprobs, logprobs.detach(), returns, mask, 0.2)
    numerator, _ = aggregate(surrogate * prob[:, None], mask, "token_mean")
    got = torch.autograd.grad(numerator, (theta0, theta1))
    for g, w in zip(got, _two_turn_true_gradient(theta0, theta1, r0, r1)):
        _close(g, w)
    assert stats["clip_frac_pos"] == 0 and stats["clip_frac_neg"] == 0
