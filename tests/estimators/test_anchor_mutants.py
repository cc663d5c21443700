"""Exact checks of GiGPO's anchor-state estimators (anchor_state_ids / _baselines / _advantages): hand-computed
values, an independent plain-Python reference, output dtypes and the exact wording of every bad-input message.

Values are dyadic (multiples of 1/8, weights 1/4 .. 2, gamma 1/2) so every sum is exact and each baseline is one
correctly rounded division: the reference loop must agree bit for bit."""

import pytest
import torch

import agent_lab.estimators as E

F64 = torch.float64


def f64(*rows):
    return torch.tensor(rows, dtype=F64)


def _message(fn):
    with pytest.raises(ValueError) as excinfo:
        fn()
    return str(excinfo.value)


# an independent reference: the docstrings' formulas as plain loops ---------------------------------------------

def reference_baselines(returns, ids, mask, group_size, weights=None, leave_one_out=False):
    """b_it = sum_{S} w_j G_jt' / sum_{S} w_j over the real turns of i's group with i's state (S minus (i, t)
    with leave-one-out); a turn alone in its set, or a set of zero weight, keeps its own return."""
    rows, cols = len(returns), len(returns[0])
    w = [1.0] * rows if weights is None else list(weights)
    out = [[0.0] * cols for _ in range(rows)]
    for i in range(rows):
        for t in range(cols):
            if not mask[i][t]:
                continue
            start = i // group_size * group_size
            members = [(j, u) for j in range(start, start + group_size) for u in range(cols)
                       if mask[j][u] and ids[j][u] == ids[i][t]]
            others = [m for m in members if m != (i, t)] if leave_one_out else members
            mass = sum(w[j] for j, _ in others)
            if len(members) <= 1 or mass <= 0:
                out[i][t] = returns[i][t]
            else:
                out[i][t] = sum(w[j] * returns[j][u] for j, u in others) / mass
    return out


def reference_advantages(rewards, ids, mask, group_size, gamma, omega, weights=None, leave_one_out=False):
    rows, cols = len(rewards), len(rewards[0])
    to_go = [[0.0] * cols for _ in range(rows)]
    for i in range(rows):
        running = 0.0
        for t in reversed(range(cols)):
            if mask[i][t]:  # padded rewards count as 0
                running = rewards[i][t] + gamma * running
                to_go[i][t] = running
    base = reference_baselines(to_go, ids, mask, group_size, weights, leave_one_out)
    episode = [[sum(r for r, m in zip(rewards[i], mask[i]) if m)] for i in range(rows)]
    centre = reference_baselines(episode, [[0]] * rows, [[True]] * rows, group_size, weights, leave_one_out)
    return [[(episode[i][0] - centre[i][0]) + omega * (to_go[i][t] - base[i][t]) if mask[i][t] else 0.0
             for t in range(cols)] for i in range(rows)]


# Two groups of two episodes, T = 3. Group 1 reuses group 0's state ids: groups must not share baselines.
# Episode 1 is padded at t = 2 and carries a non-zero reward there that must be ignored.
REWARDS = [[1.0, 0.5, 2.0], [0.25, 1.5, 8.0], [0.0, 1.0, 0.5], [2.0, 0.0, 1.0]]
IDS = [[0, 1, 2], [0, 2, -1], [0, 1, 1], [0, 3, 1]]
MASK = [[True, True, True], [True, True, False], [True, True, True], [True, True, True]]
WEIGHTS = [0.5, 2.0, 0.25, 1.0]


# anchor_state_ids ---------------------------------------------------------------------------------------------

def test_anchor_state_ids_turns_widens_the_grid_with_minus_one_padding():
    ids = E.anchor_state_ids([["s", "t"], ["t"]], turns=4)
    assert ids.dtype == torch.long
    assert ids.tolist() == [[0, 1, -1, -1], [1, -1, -1, -1]]


def test_anchor_state_ids_refuses_a_string_as_the_list_of_episodes():
    # a str is a Sequence of one-character rows: it must be refused, not read as two episodes
    expected = "keys must be a non-empty list with one list of per-turn state keys per episode"
    assert _message(lambda: E.anchor_state_ids("ab")) == expected
    assert _message(lambda: E.anchor_state_ids([])) == expected


def test_anchor_state_ids_turns_must_be_a_positive_integer():
    assert _message(lambda: E.anchor_state_ids([["a"]], turns=0)) == "turns must be a positive integer, got 0"


def test_anchor_state_ids_refuses_a_row_longer_than_turns():
    msg = _message(lambda: E.anchor_state_ids([["a"], ["a", "b", "c"]], turns=2))
    assert msg == "keys[1] has 3 turns, more than turns=2"


# anchor_state_baselines: values ---------------------------------------------------------------------------------

def test_anchor_baselines_match_the_reference_in_float64_for_every_option():
    returns = f64(*REWARDS)
    ids, mask = torch.tensor(IDS), torch.tensor(MASK)
    for weights in (None, WEIGHTS):
        for loo in (False, True):
            w = None if weights is None else f64(*weights)
            base, counts = E.anchor_state_baselines(returns, ids, mask, 2, weights=w, leave_one_out=loo)
            assert base.dtype == F64
            assert base.tolist() == reference_baselines(REWARDS, IDS, MASK, 2, weights, loo), (weights, loo)
            assert counts.tolist() == [[2, 1, 2], [2, 2, 0], [2, 3, 3], [2, 1, 3]]


def test_anchor_baselines_by_hand_weighted_and_leave_one_out():
    returns = f64([1.0, 3.0], [5.0, 0.0])
    ids = torch.tensor([[0, 1], [0, 1]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    w = f64(0.25, 0.75)
    base, _ = E.anchor_state_baselines(returns, ids, mask, 2, weights=w)
    # state 0: 0.25*1 + 0.75*5 = 4; state 1: 0.25*3 + 0 = 0.75 (masses are 1)
    assert base.tolist() == [[4.0, 0.75], [4.0, 0.75]]
    loo, _ = E.anchor_state_baselines(returns, ids, mask, 2, weights=w, leave_one_out=True)
    assert loo.tolist() == [[5.0, 0.0], [1.0, 3.0]]  # each turn sees only the other episode


def test_a_singleton_keeps_its_own_return_exactly_even_with_a_weight():
    # 3 * 0.1 / 3 != 0.1 in float64: a singleton must take its own value, not the weighted quotient
    returns = f64([0.1, 0.7], [0.2, 0.7])
    ids = torch.tensor([[0, 2], [1, 2]])
    base, counts = E.anchor_state_baselines(returns, ids, torch.ones(2, 2), 2, weights=f64(3.0, 1.0))
    assert base[:, 0].tolist() == [0.1, 0.2]
    assert base[0, 1].item() == (3.0 * 0.7 + 0.7) / 4.0
    assert counts.tolist() == [[1, 2], [1, 2]]


def test_a_shared_state_of_zero_total_weight_keeps_each_own_return():
    # n = 2 but mass 0: there is nothing to average, so no 0/0 NaN either
    returns = f64([1.0], [3.0])
    ids = torch.zeros(2, 1, dtype=torch.long)
    base, counts = E.anchor_state_baselines(returns, ids, torch.ones(2, 1), 2, weights=f64(0.0, 0.0))
    assert base.tolist() == [[1.0], [3.0]]
    assert counts.tolist() == [[2], [2]]
    # leave-one-out against a zero-weight partner: mass 0 again
    loo, _ = E.anchor_state_baselines(returns, ids, torch.ones(2, 1), 2, weights=f64(1.0, 0.0), leave_one_out=True)
    assert loo.tolist() == [[1.0], [1.0]]  # episode 0 alone (mass 0) keeps 1; episode 1 sees episode 0


def test_zero_weights_are_allowed():
    returns = f64([2.0], [6.0], [4.0])
    ids = torch.zeros(3, 1, dtype=torch.long)
    base, _ = E.anchor_state_baselines(returns, ids, torch.ones(3, 1), 3, weights=f64(0.0, 1.0, 1.0))
    assert base.flatten().tolist() == [5.0, 5.0, 5.0]


def test_half_precision_returns_keep_their_dtype_with_default_weights():
    # the default weights take the returns' dtype (float32 ones would not scatter into a float16 sum)
    returns = torch.tensor([[1.0, 2.0], [3.0, 2.0]], dtype=torch.float16)
    ids = torch.tensor([[0, 1], [0, 2]])
    base, _ = E.anchor_state_baselines(returns, ids, torch.ones(2, 2), 2)
    assert base.dtype == torch.float16
    assert base.tolist() == [[2.0, 2.0], [2.0, 2.0]]


def test_weights_are_cast_to_the_returns_dtype():
    returns = torch.tensor([[1.0], [3.0]], dtype=torch.float32)
    ids = torch.zeros(2, 1, dtype=torch.long)
    base, _ = E.anchor_state_baselines(returns, ids, torch.ones(2, 1), 2, weights=f64(0.25, 0.75))
    assert base.dtype == torch.float32
    assert base.tolist() == [[2.5], [2.5]]


# anchor_state_baselines: bad input -------------------------------------------------------------------------------

def _baselines(returns=None, state_ids=None, mask=None, group_size=2, weights=None):
    returns = f64([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]) if returns is None else returns
    state_ids = torch.zeros(2, 3, dtype=torch.long) if state_ids is None else state_ids
    mask = torch.ones(2, 3, dtype=torch.bool) if mask is None else mask
    return E.anchor_state_baselines(returns, state_ids, mask, group_size, weights=weights)


def test_state_ids_must_be_an_integer_tensor_and_the_message_names_what_came():
    assert _message(lambda: _baselines(state_ids=torch.zeros(2, 3, dtype=F64))) == (
        "state_ids must be an integer torch.Tensor, got torch.float64")
    assert _message(lambda: _baselines(state_ids=[[0, 0, 0], [0, 0, 0]])) == (
        "state_ids must be an integer torch.Tensor, got list")


def test_state_ids_shape_message():
    msg = _message(lambda: _baselines(state_ids=torch.zeros(2, 2, dtype=torch.long)))
    assert msg == "state_ids must have shape (2, 3), got (2, 2)"


def test_negative_state_id_on_a_real_turn_message():
    ids = torch.tensor([[0, 0, -1], [0, 0, 0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    assert _baselines(state_ids=ids, mask=mask)[0][0].tolist() == [18 / 5, 18 / 5, 0.0]  # -1 on padding is fine
    mask = torch.ones(2, 3, dtype=torch.bool)
    assert _message(lambda: _baselines(state_ids=ids, mask=mask)) == (
        "state_ids must be >= 0 at every real turn (-1 only on padded turns)")


def test_group_size_message():
    assert _message(lambda: _baselines(group_size=0)) == "group_size must be a positive integer, got 0"


def test_weights_messages():
    assert _message(lambda: _baselines(weights=[1.0, float("nan")])) == (
        "weights must be finite, got nan at index (1,); drop or fix NaN/inf entries")
    # B = 2, T = 3: the message must quote the batch size, not the number of turns
    assert _message(lambda: _baselines(weights=[1.0, 1.0, 1.0])) == (
        "weights must have shape (2,) (one per episode), got (3,)")
    assert _message(lambda: _baselines(weights=[1.0, -0.5])) == "weights must be non-negative"


def test_returns_messages():
    assert _message(lambda: _baselines(returns=f64([1.0, float("nan"), 0.0], [0.0, 0.0, 0.0]))) == (
        "returns must be finite, got nan at index (0, 1); drop or fix NaN/inf entries")
    assert _message(lambda: _baselines(returns=f64(1.0, 2.0, 3.0))) == (
        "returns must have shape [B, T] (one return per turn), got shape (3,)")


# anchor_state_advantages -----------------------------------------------------------------------------------------

def test_gigpo_advantages_by_hand_with_discount_padding_and_step_weight():
    # one group of two episodes; episode 1 ends after t = 0 and its padded reward 9 must be ignored
    rewards = f64([1.0, 2.0], [3.0, 9.0])
    ids = torch.tensor([[0, 1], [0, -1]])
    mask = torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    adv = E.anchor_state_advantages(rewards, ids, mask, 2, gamma=0.5, step_weight=0.5)
    # R = (3, 3): episode term 0. G = (1 + 0.5 * 2, 2) and (3,): state 0 shared, b = (2 + 3) / 2 = 2.5;
    # state 1 alone. A = 0.5 * (G - b): (2 - 2.5) / 2 = -0.25 and (3 - 2.5) / 2 = 0.25
    assert adv.dtype == F64
    assert adv.tolist() == [[-0.25, 0.0], [0.25, 0.0]]


def test_gigpo_advantages_match_the_reference_for_weights_and_leave_one_out():
    rewards = f64(*REWARDS)
    ids, mask = torch.tensor(IDS), torch.tensor(MASK)
    for weights in (None, WEIGHTS):
        for loo in (False, True):
            w = None if weights is None else f64(*weights)
            adv = E.anchor_state_advantages(rewards, ids, mask, 2, 0.5, step_weight=0.5, weights=w,
                                            leave_one_out=loo)
            assert adv.dtype == F64
            expected = reference_advantages(REWARDS, IDS, MASK, 2, 0.5, 0.5, weights, loo)
            assert adv.tolist() == expected, (weights, loo)


def test_gigpo_weights_reach_both_the_episode_centre_and_the_step_baseline():
    # one group, one shared state at t = 0 and singletons after it, so each term is separately visible
    rewards = f64([4.0, 0.0], [0.0, 0.0])
    ids = torch.tensor([[0, 1], [0, 2]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    w = f64(0.25, 0.75)
    episode_only = E.anchor_state_advantages(rewards, ids, mask, 2, step_weight=0.0, weights=w)
    # weighted mean return 0.25 * 4 = 1: episode terms 3 and -1 on every turn
    assert episode_only.tolist() == [[3.0, 3.0], [-1.0, -1.0]]
    step_only = E.anchor_state_advantages(rewards, ids, mask, 2, step_weight=1.0, weights=w) - episode_only
    # t = 0: G = (4, 0), weighted baseline 1 -> (3, -1); t = 1 singletons -> 0
    assert step_only.tolist() == [[3.0, 0.0], [-1.0, 0.0]]


def test_gigpo_leave_one_out_reaches_both_terms():
    rewards = f64([4.0, 0.0], [0.0, 0.0])
    ids = torch.tensor([[0, 1], [0, 2]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    episode_only = E.anchor_state_advantages(rewards, ids, mask, 2, step_weight=0.0, leave_one_out=True)
    assert episode_only.tolist() == [[4.0, 4.0], [-4.0, -4.0]]  # R_i minus the other episode's R
    full = E.anchor_state_advantages(rewards, ids, mask, 2, step_weight=1.0, leave_one_out=True)
    assert (full - episode_only).tolist() == [[4.0, 0.0], [-4.0, 0.0]]


def test_gigpo_rewards_messages():
    ids, mask = torch.zeros(2, 2, dtype=torch.long), torch.ones(2, 2, dtype=torch.bool)
    assert _message(lambda: E.anchor_state_advantages(f64([0.0, float("nan")], [0.0, 0.0]), ids, mask, 2)) == (
        "rewards must be finite, got nan at index (0, 1); drop or fix NaN/inf entries")
    assert _message(lambda: E.anchor_state_advantages(f64(1.0, 2.0, 3.0), ids, mask, 2)) == (
        "rewards must have shape [B, T] (one reward per turn), got shape (3,)")


def test_weights_given_as_a_list_are_read_in_the_returns_dtype_not_rounded_through_float32_first():
    # Exact episode probabilities as weights make the baseline the exact state value (the docstring).
    returns = torch.tensor([[1.0], [0.0]], dtype=torch.float64)
    ids, mask = torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1, dtype=torch.bool)
    from_list = E.anchor_state_baselines(returns, ids, mask, 2, weights=[0.1, 0.3])[0]
    from_tensor = E.anchor_state_baselines(returns, ids, mask, 2,
                                           weights=torch.tensor([0.1, 0.3], dtype=torch.float64))[0]
    assert torch.equal(from_list, from_tensor) and from_list.dtype == torch.float64
