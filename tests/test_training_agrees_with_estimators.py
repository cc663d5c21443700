"""The batched estimators agree with the lecture's scalar API (agent_lab.training) wherever both apply."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import agent_lab.estimators as E
from agent_lab import training

FAST = settings(max_examples=40, deadline=None)
reward = st.floats(-10, 10, allow_nan=False, width=64)


@FAST
@given(st.lists(st.lists(reward, min_size=3, max_size=3), min_size=1, max_size=4), st.floats(0, 1))
def test_batched_reward_to_go_equals_scalar_per_row_bit_for_bit(rows, gamma):
    batched = E.reward_to_go(torch.tensor(rows, dtype=torch.float64), gamma)
    for row, got in zip(rows, batched.tolist()):
        assert tuple(got) == training.reward_to_go(row, gamma)


@FAST
@given(st.integers(1, 5), st.integers(1, 4), st.data())
def test_batched_centered_advantages_equal_scalar_per_group(size, groups, data):
    rewards = data.draw(st.lists(reward, min_size=size * groups, max_size=size * groups))
    batched = E.group_centered_advantages(torch.tensor(rewards, dtype=torch.float64), size).tolist()
    for g in range(groups):
        want = training.centered_group_advantages(rewards[g * size:(g + 1) * size])
        assert batched[g * size:(g + 1) * size] == pytest.approx(want, abs=1e-12)


def test_lecture_centered_example_is_exact_in_both():
    assert tuple(E.group_centered_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64), 4).tolist()) == \
        training.centered_group_advantages([1.0, 0.0, 0.0, 1.0]) == (0.5, -0.5, -0.5, 0.5)


@FAST
@given(st.floats(0, 1), st.integers(1, 64))
def test_degenerate_group_probability_agrees(p, size):
    assert math.isclose(E.degenerate_group_probability(p, size).item(),
                        training.degenerate_binary_group_probability(p, size), rel_tol=1e-12, abs_tol=1e-300)


@FAST
@given(st.integers(1, 6), st.integers(1, 3), st.booleans(), st.data())
def test_reinforce_surrogate_gradient_equals_scalar_reinforce_estimate(n, dim, with_baseline, data):
    # log p_theta(tau_i) = <z_i, theta>, so the score of sample i is z_i and the batched surrogate's gradient,
    # averaged per sequence, must be the lecture's (1/N) sum_i (R_i - b_i) z_i.
    scores = data.draw(st.lists(st.lists(st.floats(-3, 3), min_size=dim, max_size=dim), min_size=n, max_size=n))
    rewards = data.draw(st.lists(reward, min_size=n, max_size=n))
    baselines = data.draw(st.lists(reward, min_size=n, max_size=n)) if with_baseline else None
    theta = torch.zeros(dim, dtype=torch.float64, requires_grad=True)
    logprobs = (torch.tensor(scores, dtype=torch.float64) @ theta)[:, None]  # [N, 1]: one action token each
    surrogate = E.reinforce_surrogate(
        logprobs, torch.tensor(rewards, dtype=torch.float64),
        baseline=None if baselines is None else torch.tensor(baselines, dtype=torch.float64),
    )
    numerator, denominator = E.aggregate(surrogate, torch.ones(n, 1, dtype=torch.bool), "seq_mean_token_mean")
    (grad,) = torch.autograd.grad(E.reduce_loss(numerator, denominator), theta)
    want = training.reinforce_estimate(scores, rewards, baselines)
    assert grad.tolist() == pytest.approx(list(want), abs=1e-9)


def test_lecture_reinforce_example_through_the_batched_path():
    theta = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    logprobs = (torch.tensor([[0.5], [-0.5]], dtype=torch.float64) @ theta)[:, None]
    surrogate = E.reinforce_surrogate(logprobs, torch.tensor([1.0, 0.0], dtype=torch.float64),
                                      baseline=torch.tensor([0.5, 0.5], dtype=torch.float64))
    (grad,) = torch.autograd.grad(E.reduce_loss(*E.aggregate(surrogate, torch.ones(2, 1), "token_mean")), theta)
    assert tuple(grad.tolist()) == training.reinforce_estimate([(0.5,), (-0.5,)], [1.0, 0.0], [0.5, 0.5]) == (0.25,)


@pytest.mark.parametrize(
    "batched, scalar",
    [
        (lambda: E.reward_to_go([], 0.9), lambda: training.reward_to_go([], 0.9)),
        (lambda: E.reward_to_go([1.0], 1.5), lambda: training.reward_to_go([1.0], 1.5)),
        (lambda: E.group_centered_advantages([1.0, float("nan")], 2), lambda: training.centered_group_advantages([1.0, float("nan")])),
        (lambda: E.degenerate_group_probability(1.2, 2), lambda: training.degenerate_binary_group_probability(1.2, 2)),
        (lambda: E.degenerate_group_probability(0.5, 0), lambda: training.degenerate_binary_group_probability(0.5, 0)),
    ],
)
def test_both_apis_refuse_the_same_bad_input_with_the_same_argument_named(batched, scalar):
    messages = []
    for call in (batched, scalar):
        with pytest.raises(ValueError) as info:
            call()
        messages.append(str(info.value))
    name = messages[1].split()[0]
    assert messages[0].startswith(name), f"both should name {name!r}: {messages}"
