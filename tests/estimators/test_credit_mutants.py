"""Exact checks on agent_lab.estimators.credit that mutation testing asked for: hand-computed values and
gradients, output dtypes under mixed-precision inputs, and the exact text of the bad-input messages."""

import pytest
import torch

import agent_lab.estimators as E

F64 = torch.float64
F32 = torch.float32


def _message(excinfo) -> str:
    return str(excinfo.value)


# _turn_mask (reached through the public functions) -----------------------------------------------------

def test_a_turn_mask_of_the_wrong_shape_is_named_turn_mask_in_the_message():
    values = torch.zeros(1, 2, dtype=F64)
    with pytest.raises(ValueError) as excinfo:
        E.value_loss(values, values, torch.ones(2, dtype=torch.bool))
    assert _message(excinfo) == "turn_mask must have shape (1, 2), got shape (2,)"
    with pytest.raises(ValueError) as excinfo:
        E.turn_to_tokens(values, torch.tensor([[0, 1]]), torch.ones(3, dtype=torch.bool))
    assert _message(excinfo) == "turn_mask must have shape (1, 2), got shape (3,)"


# turn_to_tokens -----------------------------------------------------------------------------------------

def test_turn_to_tokens_names_non_finite_turn_values():
    values = torch.tensor([[1.0, float("nan")]], dtype=F64)
    with pytest.raises(ValueError) as excinfo:
        E.turn_to_tokens(values, torch.tensor([[0, 1]]))
    assert _message(excinfo) == "turn_values must be finite, got nan at index (0, 1); drop or fix NaN/inf entries"


def test_turn_to_tokens_refuses_one_dimensional_turn_values_with_the_exact_message():
    with pytest.raises(ValueError) as excinfo:
        E.turn_to_tokens(torch.zeros(3, dtype=F64), torch.tensor([[0, 1]]))
    assert _message(excinfo) == "turn_values must have shape [B, T] (one value per turn), got shape (3,)"


def test_turn_to_tokens_names_the_type_of_turn_ids_that_are_not_a_tensor():
    # A list has no .shape: the message must fall back to the type's name, not crash or say NoneType.
    with pytest.raises(ValueError) as excinfo:
        E.turn_to_tokens(torch.zeros(1, 2, dtype=F64), [[0, 1]])
    assert _message(excinfo) == "turn_ids must be an integer torch.Tensor of shape [B, L-1], got list"
    with pytest.raises(ValueError) as excinfo:
        E.turn_to_tokens(torch.zeros(1, 2, dtype=F64), torch.tensor([0, 1]))
    assert _message(excinfo) == "turn_ids must be an integer torch.Tensor of shape [B, L-1], got (2,)"


def test_a_token_of_turn_zero_in_an_all_padded_row_is_refused():
    # Turn 0 is padding only in a row with no real turn; its tokens must still be caught (turn id 0 >= 0).
    values = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=F64)
    mask = torch.tensor([[True, True], [False, False]])
    turn_ids = torch.tensor([[0, 1, -1], [-1, 0, -1]])
    with pytest.raises(ValueError) as excinfo:
        E.turn_to_tokens(values, turn_ids, mask)
    assert _message(excinfo) == ("turn_ids[1, 1] = 0 points at a padded turn (turn_mask is 0 there); "
                                 "every action token must belong to a real turn")


def test_turn_zero_tokens_are_accepted_when_only_later_turns_are_padded():
    # Turn 0 real, turn 1 padded: tokens of turn 0 look up turn 0's mask entry, not turn 1's.
    values = torch.tensor([[1.5, 2.0]], dtype=F64)
    got = E.turn_to_tokens(values, torch.tensor([[-1, 0, 0, -1]]), torch.tensor([[True, False]]))
    assert got.dtype == F64
    assert got.tolist() == [[0.0, 1.5, 1.5, 0.0]]


# gae_targets --------------------------------------------------------------------------------------------

def test_gae_targets_exact_values_and_dtype_follow_the_rewards():
    # rewards float32, values float64: advantages are float32 (gae casts values to the rewards' dtype),
    # and the targets A + V must stay float32 too.
    rewards = torch.tensor([[1.0, 0.0]], dtype=F32)
    values = torch.tensor([[0.5, 0.25]], dtype=F64)
    adv, targets = E.gae_targets(rewards, values, torch.tensor([[True, True]]), 0.5, 0.5, torch.tensor([True]))
    # delta_1 = 0 - 0.25 = -0.25; delta_0 = 1 + 0.5*0.25 - 0.5 = 0.625; A_0 = 0.625 + 0.25*(-0.25) = 0.5625
    assert adv.dtype == F32 and targets.dtype == F32
    assert adv.tolist() == [[0.5625, -0.25]]
    assert targets.tolist() == [[1.0625, 0.0]]


# value_loss ---------------------------------------------------------------------------------------------

def test_value_loss_exact_value_gradient_and_denominator_dtype():
    values = torch.tensor([[1.0, 2.0, 5.0], [0.5, 0.0, 0.0]], dtype=F64, requires_grad=True)
    targets = torch.tensor([[0.5, 3.0, 5.0], [1.5, 9.0, 9.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    num, den = E.value_loss(values, targets, mask)
    assert num.dtype == F64 and den.dtype == F64
    assert num.item() == pytest.approx(0.5 * (0.25 + 1.0 + 0.0 + 1.0), rel=1e-12)
    assert den.item() == 4.0
    num.backward()
    assert values.grad.tolist() == [[0.5, -1.0, 0.0], [-1.0, 0.0, 0.0]]  # m * (V - y)


def test_value_loss_detaches_targets_and_gives_zero_over_zero_without_real_turns():
    values = torch.ones(1, 2, dtype=F64, requires_grad=True)
    targets = torch.zeros(1, 2, dtype=F64, requires_grad=True)
    num, den = E.value_loss(values, targets, torch.zeros(1, 2, dtype=torch.bool))
    assert (num.item(), den.item()) == (0.0, 0.0) and den.dtype == F64
    num, _ = E.value_loss(values, targets, torch.ones(1, 2, dtype=torch.bool))
    num.backward()
    assert values.grad.tolist() == [[1.0, 1.0]] and targets.grad is None  # targets are detached


def test_value_loss_casts_targets_to_the_dtype_of_values():
    values = torch.tensor([[1.0, 2.0]], dtype=F32)
    num, den = E.value_loss(values, torch.tensor([[0.5, 3.0]], dtype=F64), torch.tensor([[True, True]]))
    assert num.dtype == F32 and den.dtype == F32
    assert num.item() == 0.625 and den.item() == 2.0


def test_value_loss_names_a_one_dimensional_values_with_the_exact_message():
    with pytest.raises(ValueError) as excinfo:
        E.value_loss(torch.zeros(3, dtype=F64), torch.zeros(3, dtype=F64), torch.ones(3, dtype=torch.bool))
    assert _message(excinfo) == "values must have shape [B, T] (one value per turn), got shape (3,)"


def test_value_loss_names_non_finite_values_targets_and_old_values():
    good = torch.zeros(1, 2, dtype=F64)
    bad = torch.tensor([[0.0, float("inf")]], dtype=F64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    tail = "must be finite, got inf at index (0, 1); drop or fix NaN/inf entries"
    with pytest.raises(ValueError) as excinfo:
        E.value_loss(bad, good, mask)
    assert _message(excinfo) == f"values {tail}"
    with pytest.raises(ValueError) as excinfo:
        E.value_loss(good, bad, mask)
    assert _message(excinfo) == f"targets {tail}"
    with pytest.raises(ValueError) as excinfo:
        E.value_loss(good, good, mask, old_values=bad, clip_range=0.5)
    assert _message(excinfo) == f"old_values {tail}"


def test_value_loss_old_values_and_clip_range_must_come_together():
    values = torch.zeros(1, 2, dtype=F64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    text = "old_values and clip_range go together: pass both for clipped value loss, or neither"
    with pytest.raises(ValueError) as excinfo:
        E.value_loss(values, values, mask, old_values=values)
    assert _message(excinfo) == text
    with pytest.raises(ValueError) as excinfo:
        E.value_loss(values, values, mask, clip_range=0.5)
    assert _message(excinfo) == text


def test_value_loss_refuses_a_zero_clip_range():
    values = torch.zeros(1, 2, dtype=F64)
    with pytest.raises(ValueError) as excinfo:
        E.value_loss(values, values, torch.ones(1, 2, dtype=torch.bool), old_values=values, clip_range=0.0)
    assert _message(excinfo) == "clip_range must be a positive number, got 0.0"


def test_value_loss_old_values_of_the_wrong_shape_are_refused_with_both_shapes():
    values = torch.zeros(1, 2, dtype=F64)
    with pytest.raises(ValueError) as excinfo:
        E.value_loss(values, values, torch.ones(1, 2, dtype=torch.bool), old_values=torch.zeros(2, dtype=F64),
                     clip_range=0.5)
    assert _message(excinfo) == "old_values must have the shape of values (1, 2), got (2,)"


def test_clipped_value_loss_exact_value_and_gradient():
    # c = 0.5; per turn 1/2 max((V - y)^2, (V_old + clip(V - V_old, -c, c) - y)^2), all numbers exact in binary.
    values = torch.tensor([[-2.0, 0.25, 1.25], [3.0, 3.0, 7.0]], dtype=F64, requires_grad=True)
    old = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]], dtype=F64)
    targets = torch.tensor([[-3.0, -1.0, 0.0], [4.0, 0.0, 100.0]], dtype=F64)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    num, den = E.value_loss(values, targets, mask, old_values=old, clip_range=0.5)
    # (0,0): lower clip active, clipped term wins: max(1, 2.5^2 = 6.25)
    # (0,1): inside the clip range: 1.25^2 = 1.5625 both ways
    # (0,2): inside the clip range around V_old = 1: 1.25^2 = 1.5625 both ways
    # (1,0): upper clip active, clipped term wins: max(1, 3.5^2 = 12.25)
    # (1,1): upper clip active, unclipped term wins: max(9, 0.25)
    assert num.dtype == F64 and den.dtype == F64
    assert num.item() == pytest.approx(0.5 * (6.25 + 1.5625 + 1.5625 + 12.25 + 9.0), rel=1e-12)
    assert den.item() == 5.0
    num.backward()
    # Where the clipped term wins (and the clip is active) the gradient is 0; elsewhere V - y.
    assert values.grad.tolist() == [[0.0, 1.25, 1.25], [0.0, 3.0, 0.0]]  # exact: every number is a dyadic


def test_clipped_value_loss_keeps_the_dtype_of_values():
    # float32 values with float64 targets and old_values: everything is computed in float32.
    values = torch.tensor([[3.0]], dtype=F32)
    num, den = E.value_loss(values, torch.tensor([[4.0]], dtype=F64), torch.tensor([[True]]),
                            old_values=torch.tensor([[0.0]], dtype=F64), clip_range=0.5)
    assert num.dtype == F32 and den.dtype == F32
    assert num.item() == 0.5 * 12.25 and den.item() == 1.0


# branching ----------------------------------------------------------------------------------------------

def test_branching_values_names_empty_or_unconvertible_continuation_returns():
    mask = torch.ones(1, 1, dtype=torch.bool)
    with pytest.raises(ValueError) as excinfo:
        E.branching_values(torch.empty(0, dtype=F64), mask)
    assert _message(excinfo) == "continuation_returns must not be empty, got shape (0,); pass at least one value"
    with pytest.raises(ValueError) as excinfo:
        E.branching_values("abc", mask)
    assert _message(excinfo) == "continuation_returns must be a tensor or a sequence of real numbers, got 'abc'"


def test_branching_values_refuses_two_dimensional_returns_with_the_exact_message():
    with pytest.raises(ValueError) as excinfo:
        E.branching_values(torch.zeros(1, 2, dtype=F64), torch.ones(1, 2, dtype=torch.bool))
    assert _message(excinfo) == ("continuation_returns must have shape [B, T, K] (K continuation returns per turn), "
                                 "got shape (1, 2)")


def test_branching_advantages_bootstrap_a_truncated_row():
    rewards = torch.tensor([[1.0, 2.0, 0.0]], dtype=F64)
    returns = torch.tensor([[[3.0, 5.0], [1.0, 3.0], [float("nan"), float("nan")]]], dtype=F64)  # NaN on padding
    mask = torch.tensor([[True, True, False]])
    adv = E.branching_advantages(rewards, returns, mask, 0.5, torch.tensor([False]), torch.tensor([8.0], dtype=F64))
    # V = (4, 2); A_0 = 1 + 0.5*2 - 4 = -2; A_1 = 2 + 0.5*8 - 2 = 4 (truncated: bootstrap 8); padding 0
    assert adv.dtype == F64
    assert adv.tolist() == [[-2.0, 4.0, 0.0]]


def test_branching_cost_names_a_turn_mask_that_is_not_a_tensor():
    with pytest.raises(ValueError) as excinfo:
        E.branching_cost([[1, 1]], 2)
    assert _message(excinfo) == "turn_mask must be a torch.Tensor of 0/1 or bool values, got list"


def test_branching_cost_names_bad_continuation_turns():
    mask = torch.tensor([[True, False]])
    with pytest.raises(ValueError) as excinfo:
        E.branching_cost(mask, 1, torch.tensor([[[float("nan")], [1.0]]], dtype=F64))
    assert _message(excinfo) == ("continuation_turns must be finite, got nan at index (0, 0, 0); "
                                 "drop or fix NaN/inf entries")
    with pytest.raises(ValueError) as excinfo:
        E.branching_cost(mask, 1, "abc")
    assert _message(excinfo) == "continuation_turns must be a tensor or a sequence of real numbers, got 'abc'"
    assert E.branching_cost(mask, 2, [[[3, 4], [100, 100]]]) == {"branch_points": 1, "extra_episodes": 2,
                                                                  "extra_turns": 7}
