"""What each algorithm promises, checked exactly: its options' bounds and messages, REINFORCE's credit for every
baseline, the printed loss word for word, PPO's surrogate outside the mask, and the student's loss_fn contract.
(Written against the mutants that `make mutation` found alive in agent_lab.algorithms and agent_lab.update.)"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from types import SimpleNamespace
from typing import ClassVar

import pytest
import torch
from exact_batches import one_token_batch

from agent_lab.algorithms import Algorithm, AlgoState, DrGRPO, make_algorithm, register
from agent_lab.config import declared
from agent_lab.update import KL_NEW_REF, kl_to_reference, step_statistics, student_loss

F64 = torch.float64


@pytest.mark.parametrize(("name", "options", "message"), [
    ("reinforce", {"baseline": "median"},
     "baseline must be one of ('none', 'constant', 'running_mean'), got 'median'"),
    ("reinforce", {"gamma": 0.0}, "gamma must be in (0, 1], got 0.0"),
    ("reinforce", {"gamma": 1.5}, "gamma must be in (0, 1], got 1.5"),
    ("ppo", {"epochs": 0}, "ppo_epochs must be a positive int, got 0"),
    ("ppo", {"minibatches": True}, "minibatches must be a positive int, got True"),
    ("ppo", {"clip_eps": 0.0}, "clip_eps must be in (0, 1), got 0.0"),
    ("ppo", {"clip_eps": 1.0}, "clip_eps must be in (0, 1), got 1.0"),
    ("ppo", {"kl_coef": -0.1}, "kl_coef must be >= 0, got -0.1"),
    ("ppo", {"kl_kind": "k4"}, "kl_kind must be one of ('k1', 'k2', 'k3'), got 'k4'"),
    ("rest_em", {"epochs": 0}, "rest_em_epochs must be a positive int, got 0"),
    ("rest_em", {"threshold": float("inf")}, "rest_em_threshold must be a finite number, got inf"),
])
def test_each_algorithm_option_is_refused_outside_its_range_with_a_message_naming_it(name, options, message):
    with pytest.raises(ValueError) as err:
        make_algorithm(name, group_size=2, max_tokens=1, **options)
    assert str(err.value) == message


@pytest.mark.parametrize(("name", "options"), [
    ("reinforce", {"gamma": 1.0}), ("reinforce", {"gamma": 1e-9}), ("ppo", {"clip_eps": 0.999}),
    ("ppo", {"kl_coef": 0.0}), ("ppo", {"epochs": 1, "minibatches": 1}), ("rest_em", {"epochs": 1}),
])
def test_the_edges_of_each_range_are_accepted(name, options):
    algo = make_algorithm(name, group_size=2, max_tokens=1, **options)
    assert all(getattr(algo, k) == v for k, v in options.items())


def _turn_batch():
    # row 1's third turn is padding (turn_mask 0) but holds a reward, so a reward-to-go that ignores the mask differs
    rewards = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 5.0]], dtype=F64)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    return SimpleNamespace(rewards=rewards, turn_mask=mask, episode_return=torch.tensor([3.0, 1.0], dtype=F64))


@pytest.mark.parametrize(("baseline", "first", "second"), [
    ("none", [3.0, 1.0], [3.0, 1.0]),
    ("constant", [2.5, 0.5], [2.5, 0.5]),  # baseline_value 0.5
    ("running_mean", [3.0, 1.0], [1.0, -1.0]),  # b = 0 before any return is seen, then the mean 2 of the first batch
])
def test_reinforce_credits_the_episode_return_minus_each_baseline(baseline, first, second):
    algo = make_algorithm("reinforce", group_size=1, max_tokens=1, baseline=baseline, baseline_value=0.5)
    state, batch = AlgoState(), _turn_batch()
    assert algo.advantages(batch, state).tolist() == first
    assert algo.advantages(batch, state).tolist() == second
    if baseline == "running_mean":
        assert (state.baseline_mean, state.baseline_count) == (2.0, 4)
    else:
        assert (state.baseline_mean, state.baseline_count) == (0.0, 0)


def test_reinforce_reward_to_go_discounts_within_each_episodes_real_turns():
    algo = make_algorithm("reinforce", group_size=1, max_tokens=1, reward_to_go=True, gamma=0.5)
    # G_t = sum_{t' >= t} 0.5^(t' - t) r_t' over real turns: row 0 [1 + 0.5 * 2 * 0.5, 0 + 0.5 * 2, 2]
    want = [[1.5, 1.0, 2.0], [1.5, 3.0, 0.0]]
    assert algo.advantages(_turn_batch(), AlgoState()).tolist() == want
    running = make_algorithm("reinforce", group_size=1, max_tokens=1, reward_to_go=True, gamma=0.5,
                             baseline="running_mean")
    state = AlgoState(baseline_mean=1.0, baseline_count=2)
    # minus the running mean of earlier episode returns (1.0), zero on padding turns
    assert running.advantages(_turn_batch(), state).tolist() == [[0.5, 0.0, 1.0], [0.5, 2.0, 0.0]]


MASK = ("m_ij = action_mask: 1 on policy-sampled target tokens (action words and the newline ending each action), "
        "0 on prompt, observations and padding; normalisers are global sums over all workers and micro-batches")


@pytest.mark.parametrize(("options", "credit"), [
    ({}, "A = episode return R_i on every action token, minus no baseline"),
    ({"baseline": "constant", "baseline_value": 0.25}, "A = episode return R_i on every action token, minus "
                                                       "constant baseline b = 0.25"),
    ({"baseline": "running_mean", "reward_to_go": True, "gamma": 0.9},
     "A = reward-to-go G_t = sum_{t'>=t} gamma^(t'-t) r_t' per turn, placed on that turn's tokens, minus "
     "running-mean baseline b = mean of all earlier episode returns"),
])
def test_reinforce_prints_its_exact_loss_word_for_word(options, credit):
    algo = make_algorithm("reinforce", group_size=1, max_tokens=7, **options)
    assert algo.describe() == (f"REINFORCE: {credit}; s_ij = sg[A] * log pi(x_ij | x_<ij); loss = -sum_ij m_ij s_ij "
                               f"/ (B * max_tokens), max_tokens = 7 (a constant: no length weighting); {MASK}")


def test_ppo_prints_its_exact_loss_word_for_word():
    algo = make_algorithm("ppo", group_size=4, max_tokens=9, clip_eps=0.3, kl_coef=0.05, epochs=3, minibatches=2)
    assert algo.describe() == (
        "PPO: A_i = R_i - mean_group R (group_size G = 4, contiguous rows; no critic); rho_ij = exp(log pi(x_ij) - "
        "log mu(x_ij)) with mu the behaviour log-probs recorded at sampling; s_ij = min(rho A_i, clip(rho, 1-0.3, "
        "1+0.3) A_i) minus 0.05 * k3(pi, pi_ref) per token of mu's samples, pi_ref = frozen policy when RL starts "
        "(r - 1 - log r, r = pi_ref / pi: value KL(pi || pi_ref), expected gradient grad KL(pi_ref || pi)); 3 epochs "
        f"x 2 minibatches per rollout batch; loss = -sum_ij m_ij s_ij / (B * max_tokens), max_tokens = 9 (a "
        f"constant: no length weighting); {MASK}")
    plain = make_algorithm("ppo", group_size=4, max_tokens=9).describe()
    assert "1-0.2, 1+0.2) A_i) no KL penalty; 4 epochs x 1 minibatches" in plain
    assert plain.count("KL") == 1 and not make_algorithm("ppo", group_size=4, max_tokens=9).needs_reference()


def _padded_batch():
    # two episodes; the second's second target position is padding (action_mask 0) with nonzero log-probs there
    b = one_token_batch([0, 1], [0.5, 0.25])
    b.input_ids = torch.tensor([[0, 0, 2], [0, 1, 0]])
    b.attention_mask = torch.tensor([[True, True, True], [True, True, False]])
    b.action_mask = torch.tensor([[True, True], [True, False]])
    b.turn_ids = torch.zeros(2, 2, dtype=torch.long)
    b.allowed_tokens = torch.ones(2, 2, 3, dtype=torch.bool)
    b.old_logprobs = torch.log(torch.tensor([[0.5, 0.25], [0.25, 0.9]], dtype=F64))
    return b


def test_ppo_surrogate_and_the_reference_kl_leave_padding_out():
    b = _padded_batch()
    lp = torch.log(torch.tensor([[0.3, 0.35], [0.4, 0.1]], dtype=F64))
    ref = torch.log(torch.tensor([[0.6, 0.25], [0.2, 0.7]], dtype=F64))
    algo = make_algorithm("ppo", group_size=2, max_tokens=2, kl_coef=0.5)
    s, _ = algo.surrogate(lp, b, torch.tensor([1.0, -1.0], dtype=F64), ref)
    assert s[1, 1] == 0.0, "the surrogate, KL penalty included, is exactly 0 outside action_mask"
    rho = (lp.exp() / b.old_logprobs.exp())
    r = (ref - lp).exp()
    k3 = r - 1 - r.log()
    want = float((rho * k3)[b.action_mask].sum() / 3)
    assert kl_to_reference(lp, b.old_logprobs, ref, b.action_mask) == pytest.approx(want, rel=1e-12)
    stats = step_statistics(algo, b, torch.tensor([1.0, -1.0], dtype=F64), lp, torch.zeros(2, 2, dtype=F64), ref)
    assert stats[KL_NEW_REF] == pytest.approx(want, rel=1e-12)
    one = torch.tensor([[True, False], [False, False]])  # a single policy token: divided by 1
    assert kl_to_reference(lp, b.old_logprobs, ref, one) == pytest.approx(float((rho * k3)[0, 0]), rel=1e-12)


def test_a_students_loss_fn_returns_a_scalar_or_a_numerator_denominator_pair():
    lp = torch.tensor([[-1.0, -2.0]], dtype=F64, requires_grad=True)
    mask, adv = torch.tensor([[True, False]]), torch.tensor([2.0], dtype=F64)
    scalar = student_loss((lambda a, m, A, n: -(a * m * A[:, None]).sum() / n)(lp, mask, adv, 4))
    assert float(scalar.detach()) == 0.5
    pair = student_loss((lambda a, m, A, n: (-(a * m * A[:, None]).sum(), m.sum().to(a.dtype)))(lp, mask, adv, 4))
    assert float(pair.detach()) == 2.0  # numerator 2 over denominator 1, reduced over the (single) worker
    bad = [(lambda *_: [1.0], "list ()"), (lambda *_: torch.ones(2), "Tensor (2,)"),
           (lambda *_: (torch.tensor(1.0), torch.tensor(2.0), torch.tensor(3.0)), "tuple ()"),
           (lambda *_: (torch.ones(1), torch.tensor(2.0)), "tuple ()")]
    for fn, got in bad:
        with pytest.raises(ValueError) as err:
            student_loss(fn(lp, mask, adv, 4))
        assert str(err.value) == ("loss_fn must return a 0-dim tensor or a pair (numerator, denominator) of 0-dim "
                                  f"tensors, got {got}")


@pytest.mark.parametrize(("objective", "text"), [
    ("constant", "loss = -sum_ij m_ij s_ij / (B * max_tokens), max_tokens = 5 (a constant: no length weighting)"),
    ("token_mean", "loss = -sum_ij m_ij s_ij / sum_ij m_ij (token mean over the batch)"),
    ("seq_mean_token_mean", "loss = -(1/B) sum_i [sum_j m_ij s_ij / sum_j m_ij] (sequence mean of token means)"),
    ("turn_then_trajectory", "loss = mean over tokens of each turn, then turns, then sequences"),
])
def test_each_objective_prints_its_normaliser_word_for_word(objective, text):
    algo = make_algorithm("dr_grpo", group_size=2, max_tokens=5, objective=objective)
    assert algo._normaliser() == text and f"; {text}; " in algo.describe()


def test_only_ppo_with_a_kl_penalty_needs_a_frozen_reference_and_the_state_round_trips():
    from agent_lab.algorithms import ALGORITHMS

    needs = {n: make_algorithm(n, group_size=2, max_tokens=1).needs_reference() for n in ALGORITHMS}
    assert not any(needs.values()), needs
    assert make_algorithm("ppo", group_size=2, max_tokens=1, kl_coef=0.01).needs_reference()
    state = AlgoState(baseline_mean=0.25, baseline_count=3)
    assert state.to_dict() == {"baseline_mean": 0.25, "baseline_count": 3}
    assert AlgoState(**state.to_dict()) == state


def test_rest_em_keeps_episodes_at_its_own_threshold():
    batch = SimpleNamespace(episode_return=torch.tensor([0.4, 0.5, 0.9, 1.0], dtype=F64))
    algo = make_algorithm("rest_em", group_size=1, max_tokens=1, threshold=0.5)
    assert algo.advantages(batch, AlgoState()).tolist() == [0.0, 1.0, 1.0, 1.0]


def test_micro_batches_are_consecutive_slices_and_take_trims_the_reference_to_the_rows():
    from agent_lab.update import micro_batches, take

    assert micro_batches(5, 0) == [slice(0, 5)] and micro_batches(5, 5) == [slice(0, 5)]
    assert micro_batches(5, 1) == [slice(i, i + 1) for i in range(5)]
    assert micro_batches(5, 2) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    b = _padded_batch()  # row 1 is one token shorter: alone it trims to width 2 (one target position)
    ref = torch.arange(4, dtype=F64).reshape(2, 2)
    part, adv, part_ref = take(b, torch.tensor([1.0, -1.0], dtype=F64), ref, slice(1, 2))
    assert part.input_ids.tolist() == [[0, 1]] and adv.tolist() == [-1.0] and part_ref.tolist() == [[2.0]]


def test_a_non_finite_gradient_norm_is_reported_and_not_clipped_to_a_number():
    from agent_lab.update import clip_and_step

    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.tensor([float("inf"), 1.0])
    holder = torch.nn.Module()
    holder.w = p
    norms = clip_and_step(holder, torch.optim.SGD([p], lr=0.0), 1.0)
    assert norms["grad_norm_before"] == float("inf")
    assert norms["grad_norm_after"] != norms["grad_norm_after"], "after clipping an infinite norm: NaN, not 1.0"


def test_the_running_mean_baseline_is_zero_until_a_return_is_seen_then_the_mean_from_one_return_on():
    algo = make_algorithm("reinforce", group_size=1, max_tokens=1, baseline="running_mean")
    # a count of 0 means no return seen yet, whatever the stored mean says
    assert algo.advantages(_turn_batch(), AlgoState(baseline_mean=7.0, baseline_count=0)).tolist() == [3.0, 1.0]
    assert algo.advantages(_turn_batch(), AlgoState(baseline_mean=0.5, baseline_count=1)).tolist() == [2.5, 0.5]


def test_grpo_divides_by_the_std_plus_the_eps_it_prints(monkeypatch):
    from agent_lab.algorithms import GRPO

    monkeypatch.setattr(GRPO, "EPS", 1e-3)
    batch = SimpleNamespace(episode_return=torch.tensor([0.0, 2e-3], dtype=F64))  # std 1e-3: A = +-1e-3 / 2e-3
    assert make_algorithm("grpo", group_size=2, max_tokens=1).advantages(batch, AlgoState()).tolist() == pytest.approx(
        [-0.5, 0.5], rel=1e-12)


def test_a_loss_fn_takes_one_micro_batch_and_refuses_two_with_the_fix_in_the_message():
    from exact_batches import MU, TOKENS, FixedLogits

    from agent_lab.update import gradient_step

    batch = one_token_batch(TOKENS, [MU[t] for t in TOKENS])
    model, algo = FixedLogits([MU] * 4), make_algorithm("dr_grpo", group_size=2, max_tokens=1)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=F64)

    def loss_fn(lp, m, a, t):
        return -(lp * m * a[:, None]).sum() / t

    out = gradient_step(model, torch.optim.SGD(model.parameters(), lr=0.0), batch, adv, algo, grad_clip=1e9,
                        loss_fn=loss_fn)
    assert out["loss"] == pytest.approx(float(loss_fn(batch.old_logprobs, batch.action_mask, adv, 1)), rel=1e-12)
    assert "logprob_gap_max" not in out, "the sampler-trainer gap is computed only when asked (first update)"
    with pytest.raises(ValueError) as err:
        gradient_step(model, torch.optim.SGD(model.parameters(), lr=0.0), batch, adv, algo, grad_clip=1e9,
                      micro_batch_size=2, loss_fn=loss_fn)
    assert str(err.value) == ("micro_batch_size splits the loss's normaliser, which a loss_fn keeps to itself: "
                              "set micro_batch_size=0 with loss_fn")


def test_an_unknown_algorithm_or_option_is_named_with_the_choices():
    from agent_lab.algorithms import ALGORITHMS

    with pytest.raises(ValueError) as err:
        make_algorithm("a2c", group_size=2, max_tokens=1)
    assert str(err.value) == f"algo must be one of {list(ALGORITHMS)}, got 'a2c'"
    with pytest.raises(ValueError) as err:
        make_algorithm("ppo", group_size=2, max_tokens=1, zeta=1, beta=2)  # the first unknown in sorted order
    assert str(err.value) == ("algo 'ppo' has no option 'beta'; its options are ['epochs', 'minibatches', 'clip_eps', "
                              "'kl_coef', 'kl_kind']")


@pytest.mark.parametrize("name", sorted(declared("algorithm")))
def test_every_registered_algorithms_advantages_take_batch_state_and_features(name):
    params = list(inspect.signature(declared("algorithm")[name].advantages).parameters)
    assert params[:4] == ["self", "batch", "state", "features"]
    assert list(inspect.signature(Algorithm.advantages).parameters) == ["self", "batch", "state", "features"]


def test_registering_an_algorithm_whose_advantages_cannot_take_features_is_refused_with_the_fix():
    @dataclass
    class TwoArguments(DrGRPO):
        name: ClassVar[str] = "two_arguments"

        def advantages(self, batch, state):
            return super().advantages(batch, state)

    @dataclass
    class FeaturesRequired(DrGRPO):
        name: ClassVar[str] = "features_required"

        def advantages(self, batch, state, features):
            return super().advantages(batch, state, features)

    for cls in (TwoArguments, FeaturesRequired):
        with pytest.raises(TypeError, match=rf"{cls.__name__}.advantages must accept \(batch, state, features=None\)"):
            register(cls)
        assert cls.name not in declared("algorithm")


def test_continuations_say_how_many_and_the_discount_of_their_returns():
    assert make_algorithm("dr_grpo", group_size=2, max_tokens=1).continuations() == (0, 1.0)
    vine = make_algorithm("vineppo", group_size=1, max_tokens=1, branches=3, gamma=0.9)
    assert vine.continuations() == (3, 0.9)
