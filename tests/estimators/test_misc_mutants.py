"""Exact checks that pin argument names, error texts, output dtypes and edge cases of several estimators.

Each test asserts a documented behaviour exactly (whole error message, exact value and dtype), so that a
changed argument name, message, dtype cast or boundary in the implementation is caught.
"""

import pytest
import torch

import agent_lab.estimators as E

F32, F64 = torch.float32, torch.float64
PADDING_MESSAGE = (
    "{} must mark real steps as a prefix of each row (1...1 0...0, padding at the end); "
    "got a row with a real step after a padded one"
)


def _raises(fn, message, error=ValueError):
    with pytest.raises(error) as excinfo:
        fn()
    assert str(excinfo.value) == message


# --- explained_variance -------------------------------------------------------------------------------------------


def test_explained_variance_names_empty_predictions():
    _raises(
        lambda: E.explained_variance([], [1.0]),
        "predictions must not be empty, got shape (0,); pass at least one value",
    )


def test_explained_variance_names_empty_targets():
    _raises(
        lambda: E.explained_variance([1.0], []),
        "targets must not be empty, got shape (0,); pass at least one value",
    )


def test_explained_variance_shape_mismatch_message():
    _raises(
        lambda: E.explained_variance([1.0, 2.0], [1.0, 2.0, 3.0]),
        "targets has shape (3,) but predictions has shape (2,); they must match",
    )


def test_explained_variance_names_bad_mask():
    _raises(
        lambda: E.explained_variance([1.0, 2.0], [1.0, 2.0], mask=torch.tensor([1, 2])),
        "mask must hold only 0 and 1 (or be bool), got 2 at index (1,)",
    )


def test_explained_variance_float64_targets_follow_float32_predictions():
    # Targets are cast to the predictions' dtype: float32 predictions give a float32 result.
    predictions = torch.tensor([0.0, 1.0, 2.0, 2.0], dtype=F32)
    targets = torch.tensor([0.0, 0.0, 2.0, 2.0], dtype=F64)
    ev = E.explained_variance(predictions, targets)
    assert ev.dtype == F32
    assert ev.item() == 0.8125  # 1 - Var[r] / Var[y] = 1 - 0.1875 / 1


def test_explained_variance_empty_mask_gives_nan_in_the_predictions_dtype():
    predictions = torch.tensor([1.0, 2.0], dtype=F64)
    ev = E.explained_variance(predictions, predictions.clone(), mask=torch.zeros(2, dtype=torch.bool))
    assert ev.dtype == F64
    assert ev.shape == ()
    assert torch.isnan(ev)


# --- effective_sample_size -----------------------------------------------------------------------------------------


def test_effective_sample_size_log_space_nan_message():
    _raises(
        lambda: E.effective_sample_size([0.0, float("nan")], log_weights=True),
        "weights (log space) must not hold NaN or +inf",
    )


def test_effective_sample_size_log_space_all_minus_inf_message():
    _raises(
        lambda: E.effective_sample_size([float("-inf"), float("-inf")], log_weights=True),
        "weights must not be all zero (all log-weights -inf) along the last dimension",
    )


def test_effective_sample_size_all_zero_message():
    _raises(lambda: E.effective_sample_size([0.0, 0.0]), "weights must not be all zero along the last dimension")


def test_effective_sample_size_log_space_accepts_minus_inf():
    # log w = -inf is a zero weight: one weight left, ESS 1.
    assert E.effective_sample_size([0.0, float("-inf")], log_weights=True).item() == 1.0


# --- returns: reward_to_go, discounted_returns, final_values ---------------------------------------------------------


def test_reward_to_go_default_gamma_is_one():
    assert torch.equal(E.reward_to_go([1.0, 2.0, 3.0]), torch.tensor([6.0, 5.0, 3.0]))


def test_reward_to_go_takes_any_number_of_leading_dimensions_but_not_a_scalar():
    # "[..., T] with at least one dimension": torch's own limit of 64 dimensions is the only cap.
    assert torch.equal(E.reward_to_go(torch.ones([1] * 64)), torch.ones([1] * 64))
    _raises(lambda: E.reward_to_go(torch.tensor(1.0)),
            "rewards must have shape [..., T] with at least one dimension, got shape ()")


def test_reward_to_go_one_dimensional_mask():
    # A [T] trajectory with a [T] mask: padded step gets return 0.
    out = E.reward_to_go([1.0, 2.0, 3.0], 0.5, mask=torch.tensor([1, 1, 0]))
    assert torch.equal(out, torch.tensor([2.0, 2.0, 0.0]))


def test_reward_to_go_refuses_a_gap_in_the_mask():
    # 1 0 1: the third step is real after a padded one (only visible when comparing step t with step t-1).
    _raises(lambda: E.reward_to_go([1.0, 2.0, 3.0], 0.5, mask=torch.tensor([1, 0, 1])), PADDING_MESSAGE.format("mask"))


def test_discounted_returns_names_empty_rewards():
    _raises(
        lambda: E.discounted_returns([], torch.ones(1, 1, dtype=torch.bool), 0.5, torch.tensor([True])),
        "rewards must not be empty, got shape (0,); pass at least one value",
    )


def test_discounted_returns_one_dimensional_rewards_message():
    _raises(
        lambda: E.discounted_returns([1.0, 2.0], torch.ones(2, dtype=torch.bool), 0.5, torch.tensor([True])),
        "rewards must have shape [B, T] (one reward per turn), got shape (2,)",
    )


def test_final_values_without_bootstrap_are_zeros_of_like_dtype():
    out = E.final_values(torch.tensor([False, True]), None, torch.ones(2, 3, dtype=F64))
    assert out.dtype == F64
    assert torch.equal(out, torch.zeros(2, dtype=F64))


def test_final_values_cast_bootstrap_to_like_dtype():
    out = E.final_values(torch.tensor([False, True]), torch.tensor([0.5, 0.25], dtype=F32), torch.ones(2, 3, dtype=F64))
    assert out.dtype == F64
    assert torch.equal(out, torch.tensor([0.5, 0.0], dtype=F64))


# --- shaping --------------------------------------------------------------------------------------------------------


def test_potential_based_shaping_keeps_the_rewards_dtype():
    rewards = torch.tensor([[1.0, 2.0]], dtype=F32)
    potentials = torch.tensor([[0.5, 1.0, 2.0]], dtype=F64)
    out = E.potential_based_shaping(rewards, potentials, 0.5)
    assert out.dtype == F32
    assert torch.equal(out, torch.tensor([[1.0, 2.0]], dtype=F32))  # r + 0.5 Phi(s') - Phi(s)


def test_potential_based_shaping_names_a_gapped_turn_mask():
    _raises(
        lambda: E.potential_based_shaping([[1.0, 2.0]], [[0.0, 0.0, 0.0]], 0.5, turn_mask=torch.tensor([[0, 1]])),
        PADDING_MESSAGE.format("turn_mask"),
    )


# --- advantages ----------------------------------------------------------------------------------------------------


def test_unbiased_group_std_needs_groups_of_two():
    _raises(
        lambda: E.group_standardized_advantages([1.0, 2.0], 1, unbiased=True),
        "group_size must be at least 2 for this estimator, got 1",
    )


def test_td_residuals_keep_the_rewards_dtype():
    rewards = torch.tensor([[1.0, 2.0]], dtype=F32)
    values = torch.tensor([[0.5, 0.25]], dtype=F64)
    out = E.td_residuals(rewards, values, torch.ones(1, 2, dtype=torch.bool), 0.5, torch.tensor([True]))
    assert out.dtype == F32
    assert torch.equal(out, torch.tensor([[0.625, 1.75]], dtype=F32))


def test_td_residuals_shape_mismatch_message():
    _raises(
        lambda: E.td_residuals([[1.0, 2.0]], [[1.0, 2.0, 3.0]], torch.ones(1, 2), 0.5, torch.tensor([True])),
        "values has shape (1, 3) but rewards has shape (1, 2); they must match",
    )


# --- baselines ------------------------------------------------------------------------------------------------------


def test_optimal_constant_baseline_of_constant_rewards_near_float32_max():
    # Uniform weights 1/N keep the weighted sums in range: b* of a constant reward is that reward.
    rewards = torch.tensor([3e38, 3e38], dtype=F32)
    b = E.optimal_constant_baseline(rewards, torch.ones(2, dtype=F32))
    assert torch.equal(b, rewards[0])


# --- filtering ------------------------------------------------------------------------------------------------------


def test_rest_em_cap_needs_group_size_message():
    _raises(
        lambda: E.rest_em_filter([1.0, 0.0], max_per_group=1),
        "group_size is required with max_per_group (the cap is per task group)",
    )


def test_rest_em_keep_marks_successes():
    selection = E.rest_em_filter([1.0, 0.0, 2.0])
    assert torch.equal(selection.keep, torch.tensor([True, False, True]))


# --- aggregation ----------------------------------------------------------------------------------------------------


def test_aggregate_names_empty_per_token():
    _raises(
        lambda: E.aggregate(torch.empty(0, 2), torch.ones(0, 2, dtype=torch.bool), "token_mean"),
        "per_token must not be empty, got shape (0, 2); pass at least one value",
    )


def test_aggregate_row_count_has_per_token_dtype():
    per_token = torch.tensor([[1.0, 3.0], [2.0, 0.0]], dtype=F64)
    num, den = E.aggregate(per_token, torch.tensor([[1, 1], [1, 0]]), "seq_mean_token_mean")
    assert num.dtype == F64 and den.dtype == F64
    assert num.item() == 4.0 and den.item() == 2.0


def test_aggregate_turn_ids_must_be_a_tensor():
    _raises(
        lambda: E.aggregate(torch.zeros(1, 2), torch.ones(1, 2), "turn_then_trajectory", turn_ids=[[0, 0]]),
        "turn_ids must be an integer torch.Tensor, got list",
    )


def test_turn_then_trajectory_without_action_tokens():
    # Every turn id -1 (no action token anywhere): numerator 0, denominator B.
    num, den = E.aggregate(
        torch.ones(2, 3), torch.zeros(2, 3), "turn_then_trajectory", turn_ids=torch.full((2, 3), -1)
    )
    assert num.item() == 0.0 and den.item() == 2.0


def test_turn_then_trajectory_more_rows_than_tokens():
    # B = 3 > L-1 = 2: the per-turn sums have one row per sample.
    per_token = torch.tensor([[1.0, 3.0], [2.0, 4.0], [5.0, 7.0]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 0]])
    turn_ids = torch.tensor([[0, 1], [0, 0], [0, -1]])
    num, den = E.aggregate(per_token, mask, "turn_then_trajectory", turn_ids=turn_ids)
    assert num.item() == 10.0 and den.item() == 3.0  # (1 + 3) / 2 + 3 + 5


# --- group_count via degenerate_group_fraction ----------------------------------------------------------------------


def test_degenerate_group_fraction_groups_of_one_are_all_degenerate():
    assert E.degenerate_group_fraction([1.0, 2.0], 1).item() == 1.0


def test_degenerate_group_fraction_two_dimensional_rewards_message():
    _raises(
        lambda: E.degenerate_group_fraction([[1.0]], 1),
        "rewards must have shape [B] (one return per sample), got shape (1, 1)",
    )


def test_integer_tensors_become_floating_tensors_of_the_default_dtype_or_the_one_asked_for():
    # as_float_tensor converts a non-floating tensor once; estimators never compute in integers.
    out = E.reward_to_go(torch.tensor([1, 2, 3]))
    assert out.dtype == torch.get_default_dtype() and torch.equal(out, torch.tensor([6.0, 5.0, 3.0]))
    returns = torch.tensor([[1.0], [0.0]], dtype=F64)
    ids, mask = torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1, dtype=torch.bool)
    base = E.anchor_state_baselines(returns, ids, mask, 2, weights=torch.tensor([1, 3]))[0]
    assert base.dtype == F64 and torch.equal(base, torch.full((2, 1), 0.25, dtype=F64))


@pytest.mark.parametrize("objective, kwargs, message", [
    ("constant", {}, "max_tokens is required for objective 'constant' (Dr.GRPO divides by B * max_tokens)"),
    ("turn_then_trajectory", {}, "turn_ids [B, L-1] is required for objective 'turn_then_trajectory'"),
    ("turn_then_trajectory", {"turn_ids": torch.tensor([[0, -1]])},
     "turn_ids must be >= 0 on every token in action_mask (got -1 on an action token)"),
])
def test_aggregate_names_what_its_objective_is_missing(objective, kwargs, message):
    mask = torch.ones(1, 2, dtype=torch.bool)
    _raises(lambda: E.aggregate(torch.ones(1, 2), mask, objective, **kwargs), message)


@pytest.mark.parametrize("call, numbers", [
    (lambda v, like: E.td_residuals(like, v, torch.ones(1, 2, dtype=torch.bool), 0.5, torch.tensor([True])),
     [[0.1, 0.3]]),
    (lambda v, like: E.potential_based_shaping(like, v, 0.5), [[0.1, 0.3, 0.7]]),
    (lambda v, like: E.explained_variance(like, v), [[0.1, 0.3]]),
])
def test_a_list_beside_a_float64_tensor_is_read_in_float64_not_rounded_through_float32(call, numbers):
    # 0.1, 0.3 and 0.7 are not float32 numbers: a list must give exactly what the same float64 tensor gives.
    like = torch.tensor([[1.0, 0.5]], dtype=F64)
    from_list, from_tensor = call(numbers, like), call(torch.tensor(numbers, dtype=F64), like)
    assert from_list.dtype == F64 and torch.equal(from_list, from_tensor)


def test_a_probability_of_exactly_one_is_accepted():
    # [0, 1] is closed: p = 1 makes every group of 4 degenerate (all successes).
    assert E.degenerate_group_probability(1.0, 4).item() == 1.0
