"""The lecture notes' four agent_lab.training examples (lecture notes sections 4-6), verbatim."""

import pytest

from agent_lab import training


def test_lecture_example_reinforce_estimate_verbatim():
    from agent_lab.training import reinforce_estimate

    estimate = reinforce_estimate(
        score_gradients=[(0.5,), (-0.5,)],
        rewards=[1.0, 0.0],
        baselines=[0.5, 0.5],
    )
    assert estimate == (0.25,)


def test_lecture_example_reward_to_go_verbatim():
    from agent_lab.training import reward_to_go

    returns = reward_to_go([0.2, 1.0], gamma=0.9)
    assert returns == (1.1, 1.0)


def test_lecture_example_centered_group_advantages_verbatim():
    from agent_lab.training import centered_group_advantages

    advantages = centered_group_advantages([1.0, 0.0, 0.0, 1.0])
    assert advantages == (0.5, -0.5, -0.5, 0.5)


def test_lecture_example_degenerate_group_probability_verbatim():
    from agent_lab.training import degenerate_binary_group_probability

    probability = degenerate_binary_group_probability(0.01, group_size=8)
    assert probability > 0.92


def test_exercise_centered_advantages_of_11000():
    assert training.centered_group_advantages([1, 1, 0, 0, 0]) == (0.6, 0.6, -0.4, -0.4, -0.4)


def test_reinforce_estimate_without_baseline_is_reward_weighted_score_mean():
    assert training.reinforce_estimate([(1.0, 2.0), (3.0, -1.0)], [1.0, 0.5]) == (1.25, 0.75)


@pytest.mark.parametrize(
    "call, fragment",
    [
        (lambda: training.reward_to_go([], gamma=0.9), "rewards must not be empty"),
        (lambda: training.reward_to_go([1.0], gamma=1.5), "gamma must lie in [0, 1]"),
        (lambda: training.reward_to_go([float("nan")], gamma=0.5), "rewards must be finite"),
        (lambda: training.centered_group_advantages([1.0, float("inf")]), "rewards must be finite"),
        (lambda: training.reinforce_estimate([(1.0,)], [1.0, 2.0]), "score_gradients has 1 entries but rewards has 2"),
        (lambda: training.reinforce_estimate([(1.0,), (1.0,)], [1.0, 2.0], [0.0]), "baselines has 1 entries"),
        (lambda: training.reinforce_estimate([(1.0,), (1.0, 2.0)], [1.0, 2.0]), "same dimension"),
        (lambda: training.degenerate_binary_group_probability(1.2, group_size=2), "p must lie in [0, 1]"),
        (lambda: training.degenerate_binary_group_probability(0.5, group_size=0), "group_size must be a positive"),
        (lambda: training.reward_to_go(["a"], gamma=0.5), "sequence of real numbers"),
    ],
)
def test_bad_input_names_the_problem(call, fragment):
    with pytest.raises(ValueError) as info:
        call()
    assert fragment in str(info.value)
