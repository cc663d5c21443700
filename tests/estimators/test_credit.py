"""Turn-level credit estimators (agent_lab.estimators.credit) and explained variance: worked examples computed
by hand, the exact facts they are built on, and their bad-input messages."""

import math

import pytest
import torch

import agent_lab.estimators as E
from estimator_cases import DTYPE

T = lambda *rows: torch.tensor(rows, dtype=DTYPE)  # noqa: E731
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)


# turn_to_tokens ----------------------------------------------------------------------------------------

def test_turn_values_go_to_every_token_of_their_turn_and_nowhere_else():
    values = T([0.5, -1.0, 0.0], [2.0, 3.0, 4.0])
    turn_ids = torch.tensor([[-1, 0, 0, -1, 1, 1, -1], [-1, 0, -1, 1, -1, 2, 2]])
    got = E.turn_to_tokens(values, turn_ids, MASK)
    assert got.tolist() == [[0.0, 0.5, 0.5, 0.0, -1.0, -1.0, 0.0], [0.0, 2.0, 0.0, 3.0, 0.0, 4.0, 4.0]]


def test_a_token_of_a_padded_turn_is_refused():
    values = T([0.5, -1.0, 0.0], [2.0, 3.0, 4.0])
    turn_ids = torch.tensor([[-1, 0, 2], [0, 1, 2]])  # row 0 has two real turns; turn 2 is padding
    with pytest.raises(ValueError, match=r"turn_ids\[0, 2\] = 2 points at a padded turn"):
        E.turn_to_tokens(values, turn_ids, MASK)
    assert E.turn_to_tokens(values, turn_ids)[0].tolist() == [0.0, 0.5, 0.0]  # without turn_mask: padding's 0


# the critic: GAE targets, value loss, explained variance ------------------------------------------------

def test_gae_targets_are_lambda_returns_and_equal_discounted_returns_at_lambda_one():
    rewards, values = T([0.0, 1.0, 0.0], [1.0, 0.0, 2.0]), T([0.5, 0.5, 9.0], [0.2, 0.1, 0.3])
    done = torch.tensor([True, False])
    adv, targets = E.gae_targets(rewards, values, MASK, 0.9, 0.95, done, T(0.0, 2.0))
    assert torch.equal(adv, E.gae(rewards, values, MASK, 0.9, 0.95, done, T(0.0, 2.0)))
    assert targets[0].tolist() == pytest.approx([0.5 + adv[0, 0].item(), 1.0, 0.0])  # padding target 0
    _, at_one = E.gae_targets(rewards, values, MASK, 0.9, 1.0, done, T(0.0, 2.0))
    assert torch.allclose(at_one, E.discounted_returns(rewards, MASK, 0.9, done, T(0.0, 2.0)))


def test_value_loss_is_half_the_mean_squared_error_over_real_turns_with_its_gradient():
    values = T([1.0, 2.0, 100.0], [0.0, 0.0, 3.0]).requires_grad_()
    targets = T([0.0, 0.0, 0.0], [1.0, 1.0, 1.0])
    num, den = E.value_loss(values, targets, MASK)
    assert den.item() == 5 and num.item() == pytest.approx(0.5 * (1 + 4 + 1 + 1 + 4))
    E.reduce_loss(num, den).backward()
    assert values.grad.flatten().tolist() == pytest.approx([0.2, 0.4, 0.0, -0.2, -0.2, 0.4])  # (V - y) / 5


def test_clipped_value_loss_takes_the_larger_error_of_the_clipped_and_raw_values():
    values, old, targets = T([1.0], [0.0]), T([0.0], [0.0]), T([2.0], [-1.0])
    num, den = E.value_loss(values, targets, torch.ones(2, 1), old_values=old, clip_range=0.5)
    # row 0: raw error 1, clipped V = 0.5 has error 1.5 -> 1.5^2; row 1: V = old, both errors 1
    assert (num / den).item() == pytest.approx(0.5 * (2.25 + 1.0) / 2)


def test_value_loss_of_an_empty_batch_reduces_to_zero():
    num, den = E.value_loss(T([1.0]), T([3.0]), torch.zeros(1, 1))
    assert num.item() == 0.0 and den.item() == 0.0 and E.reduce_loss(num, den).item() == 0.0


def test_explained_variance_is_one_minus_residual_over_target_variance_on_the_mask():
    y, y_hat = T(1.0, 2.0, 3.0, 10.0), T(1.5, 2.0, 2.5, 0.0)
    mask = torch.tensor([True, True, True, False])
    # residuals (-0.5, 0, 0.5): population variance 1/6; targets (1, 2, 3): 2/3 -> 1 - 1/4
    assert E.explained_variance(y_hat, y, mask).item() == pytest.approx(0.75, abs=1e-15)
    assert E.explained_variance(y, y).item() == 1.0
    shifted = E.explained_variance(y + 5.0, y)  # a constant offset is not a variance
    assert shifted.item() == pytest.approx(1.0, abs=1e-15)
    assert E.explained_variance(torch.zeros(4, dtype=DTYPE), y).item() == pytest.approx(0.0, abs=1e-15)
    assert math.isnan(E.explained_variance(y, T(2.0, 2.0, 2.0, 2.0)).item())  # nothing to explain


# branching -------------------------------------------------------------------------------------------

def test_branching_values_average_the_continuations_and_advantages_are_td_residuals_on_them():
    nan = float("nan")
    conts = T([[1.0, 0.0], [1.0, 1.0], [nan, nan]], [[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    values = E.branching_values(conts, MASK)
    assert values.tolist() == [[0.5, 1.0, 0.0], [0.0, 0.5, 0.5]]
    rewards, done = T([0.0, 1.0, 0.0], [0.0, 0.0, 1.0]), torch.tensor([True, True])
    adv = E.branching_advantages(rewards, conts, MASK, 1.0, done)
    assert adv.tolist() == [[0.5, 0.0, 0.0], [0.5, 0.0, 0.5]]  # r_t + V(t+1) - V(t), 0 after the end


def test_branching_cost_counts_k_continuations_per_real_turn_and_their_steps():
    steps = torch.tensor([[[3, 2], [1, 1], [0, 0]], [[2, 3], [2, 2], [1, 1]]])
    assert E.branching_cost(MASK, 2, steps) == {"branch_points": 5, "extra_episodes": 10, "extra_turns": 18}
    assert E.branching_cost(MASK, 4) == {"branch_points": 5, "extra_episodes": 20}


# anchor-state groups -----------------------------------------------------------------------------------

def test_anchor_state_ids_number_keys_by_first_appearance_and_pad_with_minus_one():
    ids = E.anchor_state_ids([["a", ("b", 1)], ["a"], [("b", 1), "c", "a"]])
    assert ids.tolist() == [[0, 1, -1], [0, -1, -1], [1, 2, 0]]


def test_anchor_baselines_share_a_state_within_a_group_only_and_singletons_keep_their_own_return():
    returns = T([1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 5.0])
    ids = torch.tensor([[0, 1], [0, 2], [0, 1], [0, 1]])
    mask = torch.ones(4, 2, dtype=torch.bool)
    base, counts = E.anchor_state_baselines(returns, ids, mask, group_size=2)
    # group 0: state 0 shared (mean 0.5), states 1 and 2 alone; group 1: state 0 shared, state 1 shared
    assert base.tolist() == [[0.5, 1.0], [0.5, 0.0], [0.5, 2.5], [0.5, 2.5]]
    assert counts.tolist() == [[2, 1], [2, 1], [2, 2], [2, 2]]
    loo, _ = E.anchor_state_baselines(returns, ids, mask, group_size=2, leave_one_out=True)
    assert loo.tolist() == [[0.0, 1.0], [1.0, 0.0], [0.0, 5.0], [1.0, 0.0]]


def test_weighted_anchor_baselines_are_weighted_means():
    returns, ids = T([1.0], [0.0], [0.0]), torch.zeros(3, 1, dtype=torch.long)
    base, _ = E.anchor_state_baselines(returns, ids, torch.ones(3, 1), 3, weights=T(0.5, 0.25, 0.25))
    assert base.flatten().tolist() == [0.5, 0.5, 0.5]


def test_gigpo_advantage_is_the_episode_term_plus_the_weighted_step_term():
    rewards = T([0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [1.0, 0.0])
    ids = torch.tensor([[0, 1], [0, 1], [0, 2], [0, 3]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 1], [1, 0]], dtype=torch.bool)
    adv = E.anchor_state_advantages(rewards, ids, mask, group_size=4, step_weight=0.5)
    # episode term R - mean R = R - 0.5; step term: state 0 (t=0) shared by all four, returns (1, 0, 0, 1) ->
    # G - 0.5; state 1 shared by episodes 0 and 1 -> G - 0.5; state 2 alone -> 0; padding 0
    assert adv.tolist() == [[0.5 + 0.25, 0.5 + 0.25], [-0.5 - 0.25, -0.5 - 0.25], [-0.5 - 0.25, -0.5], [0.75, 0.0]]
    episode_only = E.anchor_state_advantages(rewards, ids, mask, group_size=4, step_weight=0.0)
    dr_grpo = E.group_centered_advantages(rewards.sum(1), 4)[:, None] * mask
    assert torch.equal(episode_only, dr_grpo)


# bad input -----------------------------------------------------------------------------------------------

BAD = {
    "turn ids float": (lambda: E.turn_to_tokens(T([1.0]), torch.zeros(1, 2)), "turn_ids must be an integer"),
    "turn ids 1-D": (lambda: E.turn_to_tokens(T([1.0]), torch.zeros(2, dtype=torch.long)),
                     "turn_ids must be an integer torch.Tensor of shape [B, L-1], got (2,)"),
    "turn values 1-D": (lambda: E.turn_to_tokens(T(1.0), torch.zeros(1, 2, dtype=torch.long)),
                        "turn_values must have shape [B, T]"),
    "turn id beyond": (lambda: E.turn_to_tokens(T([1.0]), torch.ones(1, 2, dtype=torch.long)),
                       "turn_ids must lie in [-1, 1) for turn_values with 1 turns"),
    "targets shape": (lambda: E.value_loss(T([1.0, 2.0]), T([1.0]), torch.ones(1, 2)),
                      "targets must have the shape of values (1, 2), got (1, 1)"),
    "clip alone": (lambda: E.value_loss(T([1.0]), T([1.0]), torch.ones(1, 1), clip_range=0.2),
                   "old_values and clip_range go together"),
    "clip negative": (lambda: E.value_loss(T([1.0]), T([1.0]), torch.ones(1, 1), old_values=T([1.0]), clip_range=-1),
                      "clip_range must be a positive number, got -1"),
    "value mask hole": (lambda: E.value_loss(T([1.0, 2.0]), T([1.0, 2.0]), torch.tensor([[0, 1]])),
                        "turn_mask must mark real steps as a prefix"),
    "continuations 2-D": (lambda: E.branching_values(T([1.0]), torch.ones(1, 1)),
                          "continuation_returns must have shape [B, T, K]"),
    "continuation nan": (lambda: E.branching_values(T([[float("nan")]]), torch.ones(1, 1)),
                         "continuation_returns (at real turns) must be finite"),
    "branch k": (lambda: E.branching_cost(torch.ones(1, 1), 0), "k must be a positive integer, got 0"),
    "branch steps": (lambda: E.branching_cost(torch.ones(1, 1), 2, torch.ones(1, 1, 3)),
                     "continuation_turns must have shape (1, 1, 2), got (1, 1, 3)"),
    "keys empty": (lambda: E.anchor_state_ids([]), "keys must be a non-empty list"),
    "keys unhashable": (lambda: E.anchor_state_ids([[["a"]]]), "keys[0][0] must be hashable, got list"),
    "state ids float": (lambda: E.anchor_state_baselines(T([1.0]), T([0.0]), torch.ones(1, 1), 1),
                        "state_ids must be an integer torch.Tensor"),
    "state id padding": (lambda: E.anchor_state_baselines(T([1.0]), torch.tensor([[-1]]), torch.ones(1, 1), 1),
                         "state_ids must be >= 0 at every real turn"),
    "anchor group": (lambda: E.anchor_state_baselines(T([1.0], [1.0]), torch.zeros(2, 1, dtype=torch.long),
                                                      torch.ones(2, 1), 3),
                     "group_size 3 does not divide the batch size 2"),
    "anchor weights": (lambda: E.anchor_state_baselines(T([1.0]), torch.zeros(1, 1, dtype=torch.long),
                                                        torch.ones(1, 1), 1, weights=T(-1.0)),
                       "weights must be non-negative"),
    "step weight": (lambda: E.anchor_state_advantages(T([1.0]), torch.zeros(1, 1, dtype=torch.long),
                                                      torch.ones(1, 1), 1, step_weight=float("inf")),
                    "step_weight must be a finite number, got inf"),
    "ev shapes": (lambda: E.explained_variance(T(1.0, 2.0), T(1.0)),
                  "targets has shape (1,) but predictions has shape (2,)"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_names_the_argument(case):
    call, message = BAD[case]
    with pytest.raises(ValueError) as info:
        call()
    assert message in str(info.value), f"expected {message!r} in {str(info.value)!r}"
