"""Worked examples for each estimator: lecture numbers and hand-computed cases."""

import math

import pytest
import torch

import agent_lab.estimators as E
from estimator_cases import DTYPE

T = lambda *rows: torch.tensor(rows, dtype=DTYPE)  # noqa: E731


# returns ---------------------------------------------------------------------------------------------

def test_reward_to_go_reproduces_lecture_exercise_and_zeroes_padding():
    got = E.reward_to_go(T([0.2, 1.0], [1.0, 0.0]), 0.9, torch.tensor([[1, 1], [1, 0]]))
    assert got.tolist() == [[1.1, 1.0], [1.0, 0.0]]
    assert E.reward_to_go([0.2, 1.0], 0.9).tolist() == pytest.approx([1.1, 1.0])


def test_discounted_returns_bootstrap_truncated_row_from_its_own_last_turn():
    rewards = T([1.0, 0.0, 0.0], [1.0, 2.0, 9.0])
    mask = torch.tensor([[1, 0, 0], [1, 1, 0]])
    got = E.discounted_returns(rewards, mask, 0.5, torch.tensor([False, False]), T(4.0, 8.0))
    # row 0: one turn, G_0 = 1 + 0.5*4; row 1: two turns, G_1 = 2 + 0.5*8, G_0 = 1 + 0.5*G_1; padding 0
    assert got.tolist() == [[3.0, 0.0, 0.0], [4.0, 6.0, 0.0]]
    assert E.discounted_returns(rewards, mask, 0.5, torch.tensor([False, False])).tolist() == [[1.0, 0.0, 0.0], [2.0, 2.0, 0.0]]


def test_gae_worked_example_with_termination_and_truncation():
    got = E.gae(T([0.0, 1.0], [1.0, 0.0]), T([0.5, 0.5], [0.2, 0.0]), torch.tensor([[1, 1], [1, 0]]), 0.9, 0.95,
                torch.tensor([True, False]), T(0.0, 2.0))
    # row 0: delta_1 = 1 - 0.5, delta_0 = 0.9*0.5 - 0.5, A_0 = delta_0 + 0.855*delta_1; row 1: 1 + 0.9*2 - 0.2
    assert got.flatten().tolist() == pytest.approx([-0.05 + 0.855 * 0.5, 0.5, 2.6, 0.0])


# baselines -------------------------------------------------------------------------------------------

def test_running_mean_update_equals_mean_of_everything_seen():
    mean, count = E.running_mean_update(123.0, 0, T(1.0, 2.0))  # count 0: the old mean is ignored
    mean, count = E.running_mean_update(mean, count, T(3.0, 4.0, 5.0))
    assert count == 5 and mean.item() == pytest.approx(3.0)


def test_constant_and_group_baselines():
    rewards = T(1.0, 0.0, 0.0, 1.0, 3.0, 3.0)
    assert E.constant_baseline(rewards, 0.25).tolist() == [0.25] * 6
    assert E.group_mean_baseline(rewards, 3).tolist() == pytest.approx([1 / 3] * 3 + [7 / 3] * 3)
    assert E.leave_one_out_baseline(rewards, 3).tolist() == pytest.approx([0.0, 0.5, 0.5, 3.0, 2.0, 2.0])


def test_optimal_constant_baseline_weights_rewards_by_squared_score():
    rewards, scores = T(1.0, 0.0, 2.0), T(1.0, 2.0, 0.0)
    assert E.optimal_constant_baseline(rewards, scores).item() == pytest.approx((1 * 1 + 0 * 4 + 0) / (1 + 4 + 0))
    vectors = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=DTYPE)
    assert E.optimal_constant_baseline(rewards, vectors, per_dimension=True).tolist() == pytest.approx([1.5, 1.0])
    assert E.optimal_constant_baseline(rewards, vectors).item() == pytest.approx((1 + 0 + 4) / 4)
    assert E.optimal_constant_baseline(rewards, scores, per_dimension=True).shape == (1,)


# advantages ------------------------------------------------------------------------------------------

def test_group_advantages_of_lecture_exercise_11000():
    assert E.group_centered_advantages(T(1, 1, 0, 0, 0), 5).tolist() == pytest.approx([0.6, 0.6, -0.4, -0.4, -0.4])
    assert E.rloo_advantages(T(1, 1, 0, 0, 0), 5).tolist() == pytest.approx([0.75, 0.75, -0.5, -0.5, -0.5])


def test_group_standardized_uses_population_std_by_default_and_sample_std_on_request():
    rewards = T(1.0, 0.0, 0.0, 1.0, 0.3, 0.3, 0.3, 0.3)
    pop = E.group_standardized_advantages(rewards, 4)
    unit = 0.5 / (0.5 + 1e-6)  # population std of (1, 0, 0, 1) is 0.5; eps 1e-6 is added to the std
    assert pop[:4].tolist() == pytest.approx([unit, -unit, -unit, unit], rel=1e-12)
    assert torch.equal(pop[4:], torch.zeros(4, dtype=DTYPE)), "an all-equal group must give exact zeros"
    sample = E.group_standardized_advantages(rewards, 4, eps=0.0, unbiased=True)[:4]
    want = (rewards[:4] - rewards[:4].mean()) / rewards[:4].std()
    assert torch.allclose(sample, want)


# log-probs, entropy, ratios, KL ------------------------------------------------------------------------

def test_token_logprobs_equal_log_softmax_gather_and_upcast_half_precision():
    logits = torch.randn(2, 3, 7, dtype=DTYPE)
    targets = torch.randint(0, 7, (2, 3))
    want = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]
    assert torch.allclose(E.token_logprobs(logits, targets), want, atol=1e-12)
    half_logits = logits.to(torch.bfloat16)
    half = E.token_logprobs(half_logits, targets)
    assert half.dtype == torch.float32
    # Upcast first, then log-softmax in float32: the same bf16 inputs give the float32 result to rounding.
    in_float32 = torch.log_softmax(half_logits.float(), -1).gather(-1, targets[..., None])[..., 0]
    assert torch.allclose(half, in_float32, atol=1e-6, rtol=0), (half - in_float32).abs().max()


def test_entropy_is_stable_for_huge_and_masked_logits():
    logits = torch.tensor([[1e4, 1e4, -float("inf")], [0.0, 0.0, 0.0], [5.0, -float("inf"), -float("inf")]],
                          dtype=DTYPE, requires_grad=True)
    h = E.entropy_from_logits(logits)
    assert h.tolist() == pytest.approx([math.log(2), math.log(3), 0.0])
    h.sum().backward()
    assert bool(torch.isfinite(logits.grad).all())
    z = torch.randn(4, 6, dtype=DTYPE)
    p = torch.softmax(z, -1)
    assert torch.allclose(E.entropy_from_logits(z), -(p * p.log()).sum(-1))


def test_sequence_log_ratio_sums_or_averages_masked_tokens():
    lp, old = T([0.0, -1.0, -2.0]), T([-0.5, -1.5, 0.0])
    mask = torch.tensor([[1, 1, 0]])
    assert E.sequence_log_ratios(lp, old, mask).tolist() == [1.0]
    assert E.sequence_log_ratios(lp, old, mask, "mean").tolist() == [0.5]
    assert E.token_log_ratios(lp, old).tolist() == [[0.5, 0.5, -2.0]]


def test_k1_and_k3_are_unbiased_for_forward_kl_and_k2_is_not():
    theta, ref = torch.tensor([0.5, -1.0, 2.0], dtype=DTYPE), torch.tensor([0.0, 0.3, 0.1], dtype=DTYPE)
    log_p, log_ref = torch.log_softmax(theta, 0), torch.log_softmax(ref, 0)
    p = log_p.exp()
    kl = (p * (log_p - log_ref)).sum()
    expect = {kind: (p * E.kl_estimate(log_p, log_ref, kind)).sum() for kind in E.KL_KINDS}
    assert expect["k1"].item() == pytest.approx(kl.item(), abs=1e-12)
    assert expect["k3"].item() == pytest.approx(kl.item(), abs=1e-12)
    assert abs(expect["k2"].item() - kl.item()) > 1e-3
    masked = E.kl_estimate(log_p[None], log_ref[None], "k3", torch.tensor([[1, 0, 1]]))
    assert masked[0, 1] == 0


# surrogates -------------------------------------------------------------------------------------------

def test_ppo_clip_fractions_count_positive_and_negative_advantages_separately():
    log_ratio = torch.log(T([1.5, 1.1, 0.5, 0.9, 0.7, 1.0]))
    old = torch.zeros_like(log_ratio)
    adv = T([1.0, 1.0, -1.0, -1.0, 1.0, 0.0])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    surrogate, stats = E.ppo_clipped_surrogate(log_ratio, old, adv, mask, 0.2)
    # tokens: +A ratio 1.5 clipped; +A 1.1 not; -A 0.5 clipped; -A 0.9 not; +A 0.7 not (below 1-eps is
    # only clipped for negative advantages); masked token ignored.
    assert stats["clip_frac_pos"].item() == pytest.approx(1 / 3)
    assert stats["clip_frac_neg"].item() == pytest.approx(1 / 2)
    assert stats["ratio_max"].item() == pytest.approx(1.5) and stats["ratio_min"].item() == pytest.approx(0.5)
    assert stats["ratio_mean"].item() == pytest.approx((1.5 + 1.1 + 0.5 + 0.9 + 0.7) / 5)
    assert surrogate[0].tolist() == pytest.approx([1.2, 1.1, -0.8, -0.9, 0.7, 0.0])
    assert int(stats["n_pos"]) == 3 and int(stats["n_neg"]) == 2 and int(stats["n_tokens"]) == 5
    _, wide = E.ppo_clipped_surrogate(log_ratio, old, adv, mask, 0.2, clip_eps_high=0.6)
    assert wide["clip_frac_pos"] == 0 and wide["clip_frac_neg"].item() == pytest.approx(1 / 2)


def test_ppo_stats_are_nan_without_action_tokens_and_sequence_ratio_is_shared():
    lp = T([0.0, -1.0])
    surrogate, stats = E.ppo_clipped_surrogate(lp, lp, T(1.0), torch.zeros(1, 2), 0.2)
    assert torch.equal(surrogate, torch.zeros_like(lp)) and math.isnan(stats["ratio_mean"]) and stats["clip_frac_pos"] == 0
    new, old = T([0.2, 0.0, 5.0]), T([0.0, 0.0, 0.0])
    surrogate, stats = E.ppo_clipped_surrogate(new, old, T(1.0), torch.tensor([[1, 1, 0]]), 0.2, ratio_level="sequence")
    assert surrogate[0].tolist() == pytest.approx([math.exp(0.1), math.exp(0.1), 0.0])


def test_reinforce_surrogate_places_reward_to_go_on_each_turns_tokens():
    logprobs = T([-1.0, -2.0, -3.0, -4.0])
    turn_ids = torch.tensor([[0, -1, 1, 1]])
    rtg = E.reward_to_go(T([1.0, 2.0]), 1.0)
    assert E.reinforce_surrogate(logprobs, rtg, turn_ids=turn_ids).tolist() == [[-3.0, 0.0, -6.0, -8.0]]
    assert E.reinforce_surrogate(logprobs, T(2.0), baseline=T(0.5)).tolist() == [[-1.5, -3.0, -4.5, -6.0]]
    lp = logprobs.clone().requires_grad_(True)
    coefficients = T(3.0).requires_grad_(True)
    E.reinforce_surrogate(lp, coefficients).sum().backward()
    assert coefficients.grad is None, "coefficients must be treated as constants (stop-gradient)"


# aggregation ------------------------------------------------------------------------------------------

def test_aggregate_objectives_on_a_worked_example():
    s = T([1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    turn_ids = torch.tensor([[0, 0, 1, -1], [0, -1, -1, -1]])
    ratio = lambda o, **kw: (lambda n, d: (n / d).item())(*E.aggregate(s, mask, o, **kw))  # noqa: E731
    assert ratio("token_mean") == pytest.approx(10 / 4)
    assert ratio("seq_mean_token_mean") == pytest.approx((2.0 + 4.0) / 2)
    assert ratio("constant", max_tokens=5) == pytest.approx(10 / (2 * 5))
    assert ratio("turn_then_trajectory", turn_ids=turn_ids) == pytest.approx(((1.5 + 3.0) / 2 + 4.0) / 2)


def test_reduce_loss_with_no_action_tokens_is_zero_with_zero_gradient():
    s = torch.randn(2, 3, dtype=DTYPE, requires_grad=True)
    loss = E.reduce_loss(*E.aggregate(s, torch.zeros(2, 3), "token_mean"))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(s.grad, torch.zeros_like(s))
    assert E.local_loss(torch.tensor(3.0), torch.tensor(2.0)).item() == 1.5


# filtering, shaping ------------------------------------------------------------------------------------

def test_rest_em_filter_keeps_successes_and_records_failures():
    rewards = T(1.0, 0.0, 1.0, 1.0, 0.0, 0.0)
    selection = E.rest_em_filter(rewards)
    assert selection.kept.tolist() == [0, 2, 3] and selection.rejected.tolist() == [1, 4, 5]
    assert selection.scores.tolist() == rewards.tolist() and selection.success_rate.item() == 0.5
    assert selection.weights.tolist() == [1.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    capped = E.rest_em_filter(rewards, group_size=3, max_per_group=1)
    assert capped.kept.tolist() == [0, 3] and capped.success.tolist() == selection.success.tolist()
    assert E.rest_em_filter(T(0.0, 0.2), group_size=2).kept.numel() == 0


def test_mixed_group_rows_takes_disagreeing_groups_first_then_tops_up_in_order():
    # groups of 2: [1, 1] equal, [0, 1] mixed, [0, 0] equal, [0.5, 0] mixed
    rewards = T(1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.0)
    assert E.mixed_group_rows(rewards, 2, 2).tolist() == [2, 3, 6, 7]
    assert E.mixed_group_rows(rewards, 2, 3).tolist() == [2, 3, 6, 7, 0, 1], "then all-equal groups, in order"
    assert E.mixed_group_rows(rewards, 2, 4).tolist() == [2, 3, 6, 7, 0, 1, 4, 5]
    assert E.mixed_group_rows(T(0.0, 0.0, 1.0, 1.0), 2, 1).tolist() == [0, 1], "no mixed group: the first group"
    with pytest.raises(ValueError, match="n_groups=5 is more than the 4 groups"):
        E.mixed_group_rows(rewards, 2, 5)
    with pytest.raises(ValueError, match="does not divide"):
        E.mixed_group_rows(rewards, 3, 1)


def test_unsolved_groups_marks_groups_where_no_sample_reaches_the_threshold():
    rewards = T(0.0, 0.0, 0.0, 1.0, 0.5, 0.2, 1.0, 1.0)  # groups of 2
    assert E.unsolved_groups(rewards, 2).tolist() == [True, False, True, False]
    assert E.unsolved_groups(rewards, 2, threshold=0.5).tolist() == [True, False, False, False]
    assert E.unsolved_groups(rewards, 4).tolist() == [False, False]
    with pytest.raises(ValueError, match="does not divide"):
        E.unsolved_groups(rewards, 3)


def test_potential_shaping_uses_final_potential_only_for_truncated_rows():
    rewards = T([0.0, 1.0], [0.0, 0.0])
    potentials = T([1.0, 2.0, 3.0], [1.0, 5.0, 7.0])
    mask = torch.tensor([[1, 1], [1, 0]])
    got = E.potential_based_shaping(rewards, potentials, 0.5, mask, torch.tensor([True, False]))
    # row 0 terminated after 2 turns: Phi(s_2) := 0; row 1 truncated after 1 turn keeps Phi(s_1) = 5.
    assert got.tolist() == [[0.5 * 2 - 1, 1 + 0 - 2], [0.5 * 5 - 1, 0.0]]
    assert E.potential_based_shaping(rewards, potentials, 1.0).tolist() == [[1.0, 2.0], [4.0, 2.0]]


# diagnostics ------------------------------------------------------------------------------------------

def test_lecture_sparse_reward_and_degenerate_group_numbers():
    assert E.prob_at_least_one_success(0.01, 100).item() == pytest.approx(0.634, abs=5e-4)
    assert E.prob_at_least_one_success(1e-4, 100).item() == pytest.approx(0.010, abs=5e-4)
    assert E.degenerate_group_probability(0.01, 8).item() == pytest.approx(0.99**8 + 0.01**8)
    assert E.degenerate_group_probability(0.01, 8).item() > 0.92
    assert E.degenerate_group_fraction(T(1, 1, 0, 1, 0, 0), 2).item() == pytest.approx(2 / 3)


def test_effective_sample_size_extremes():
    assert E.effective_sample_size(torch.ones(8)).item() == pytest.approx(8.0)
    assert E.effective_sample_size(T(1.0, 0.0, 0.0)).item() == pytest.approx(1.0)
    assert E.effective_sample_size(torch.ones(2, 5)).tolist() == pytest.approx([5.0, 5.0])
    big = torch.tensor([1000.0, 1000.0, -float("inf")])  # weights e^1000 overflow in linear space
    assert E.effective_sample_size(big, log_weights=True).item() == pytest.approx(2.0)


def test_per_sample_gradient_norms_and_top_share():
    theta = torch.tensor([1.0, -2.0], dtype=DTYPE, requires_grad=True)
    features = T([1.0, 0.0], [3.0, 4.0], [0.0, 0.0])
    contributions = features @ theta * T(1.0, 2.0, 5.0)  # c_i = w_i <x_i, theta>: grad = w_i x_i
    norms = E.per_sample_gradient_norms(contributions, [theta])
    assert norms.tolist() == pytest.approx([1.0, 10.0, 0.0])
    assert E.top_share(norms, 1).item() == pytest.approx(10 / 11)
    assert E.top_share(norms, 3).item() == pytest.approx(1.0)
    unused = torch.zeros(3, dtype=DTYPE, requires_grad=True)  # a parameter no sample touches adds nothing
    assert E.per_sample_gradient_norms(features @ theta, [theta, unused]).tolist() == pytest.approx([1.0, 5.0, 0.0])


def test_policy_lag_counts_optimizer_steps():
    assert E.policy_lag(torch.tensor([3, 5, 5]), 5).tolist() == [2, 0, 0]


def test_expand_to_tokens_broadcasts_sequence_values():
    like = torch.zeros(2, 3)
    assert E.expand_to_tokens(torch.tensor([1.0, 2.0]), like).tolist() == [[1.0] * 3, [2.0] * 3]
    same = torch.ones(2, 3)
    assert E.expand_to_tokens(same, like) is same


@pytest.mark.parametrize("objective, want", [
    ("token_mean", (1 + 3 + 2, 3)),                    # three masked tokens
    ("seq_mean_token_mean", ((1 + 3) / 2 + 2, 2)),     # row means 2 and 2, over B = 2 rows
    ("constant", (1 + 3 + 2, 2 * 3)),                  # B * max_tokens
    ("turn_then_trajectory", ((1 + 3) / 2 + 2, 2)),    # row 0: turns [1], [3]; row 1: turn [2]
])
def test_aggregate_ignores_nan_and_inf_outside_the_mask(objective, want):
    s = T([1.0, float("nan"), 3.0], [float("inf"), 2.0, -float("inf")])
    mask = torch.tensor([[1, 0, 1], [0, 1, 0]])
    turn_ids = torch.tensor([[0, -1, 1], [-1, 0, -1]])
    numerator, denominator = E.aggregate(s, mask, objective, turn_ids=turn_ids, max_tokens=3)
    assert (numerator.item(), denominator.item()) == want


def test_reduce_loss_divides_by_the_all_reduced_denominator_and_scales_by_the_world_size(monkeypatch):
    # In-process companion of the two-process invariant test: a stand-in for a second worker whose
    # denominator is 4 (all_reduce adds it), so skipping the all-reduce or the scale gives a different loss.
    import agent_lab.estimators.aggregation as aggregation

    reduced, group = [], object()  # the process group the caller passes must be the one reduced over

    def all_reduce(tensor, op=aggregation.dist.ReduceOp.SUM, group=None):
        reduced.append((float(tensor), op, group, tensor.dtype))
        tensor.add_(4.0)

    def get_world_size(group=None):
        return 2 if group is reduced[0][2] else 3

    monkeypatch.setattr(aggregation.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(aggregation.dist, "all_reduce", all_reduce)
    monkeypatch.setattr(aggregation.dist, "get_world_size", get_world_size)
    numerator = torch.tensor(3.0, dtype=DTYPE, requires_grad=True)
    denominator = torch.tensor(4.0, dtype=torch.float32)  # every worker reduces in the numerator's dtype
    loss = E.reduce_loss(numerator, denominator, process_group=group)
    loss.backward()
    # W * num / (den_0 + den_1) = 2 * 3 / 8; DDP's average over the two workers then gives grad num / 8.
    assert loss.item() == 0.75 and numerator.grad.item() == 0.25
    assert reduced == [(4.0, aggregation.dist.ReduceOp.SUM, group, DTYPE)], "sum over the caller's group"
    assert denominator.item() == 4.0, "the caller's denominator must not be reduced in place"


# masked reductions over a dimension ---------------------------------------------------------------

MASKED_X = T([1.0, 2.0, float("nan"), 4.0], [8.0, float("inf"), 5.0, -1.0], [3.0, 3.0, 3.0, 3.0])
MASKED_M = torch.tensor([[1, 1, 0, 1], [1, 0, 1, 0], [0, 0, 0, 0]])


def test_masked_sum_and_mean_over_each_dimension_on_a_worked_example():
    assert E.masked_sum(MASKED_X, MASKED_M, 1).tolist() == [7.0, 13.0, 0.0]
    assert E.masked_sum(MASKED_X, MASKED_M, 0).tolist() == [9.0, 2.0, 5.0, 4.0]
    assert E.masked_sum(MASKED_X, MASKED_M).item() == 20.0
    assert E.masked_mean(MASKED_X, MASKED_M, 1).tolist() == [7 / 3, 6.5, 0.0], "the empty row gives 0"
    assert E.masked_mean(MASKED_X, MASKED_M, -2).tolist() == [4.5, 2.0, 5.0, 4.0]
    assert E.masked_mean(MASKED_X, MASKED_M).item() == 20 / 5
    assert E.masked_mean(MASKED_X, MASKED_M, (0, 1)).item() == 20 / 5
    assert E.masked_mean(MASKED_X, MASKED_M, 1, keepdim=True).shape == (3, 1)
    assert E.masked_sum(MASKED_X, MASKED_M, 0, keepdim=True).shape == (1, 4)
    stated = E.masked_mean(MASKED_X, MASKED_M, 1, empty=float("nan"))
    assert stated[:2].tolist() == [7 / 3, 6.5] and math.isnan(stated[2])


def test_masked_mean_agrees_with_the_token_and_sequence_mean_objectives():
    s = T([1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0], [9.0, 9.0, 9.0, 9.0])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    num, den = E.aggregate(s, mask, "token_mean")
    assert E.masked_mean(s, mask).item() == (num / den).item() == 10 / 4
    assert E.masked_sum(s, mask).item() == num.item() == 10.0
    num, den = E.aggregate(s, mask, "seq_mean_token_mean")
    assert E.masked_mean(s, mask, 1).mean().item() == pytest.approx((num / den).item(), abs=1e-15)


def test_masked_mean_gradient_is_one_over_the_count_inside_and_zero_outside_and_on_empty_slices():
    x = T([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]).requires_grad_(True)
    mask = torch.tensor([[1, 0, 1], [0, 0, 0]])
    E.masked_mean(x, mask, 1).sum().backward()
    assert x.grad.tolist() == [[0.5, 0.0, 0.5], [0.0, 0.0, 0.0]]
    x.grad = None
    E.masked_sum(x, mask, 0).sum().backward()
    assert x.grad.tolist() == [[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]


@pytest.mark.parametrize("dim", [2, -3, (), (0, 5), 1.0, True])
def test_masked_reductions_reject_a_dimension_the_values_lack(dim):
    with pytest.raises(ValueError, match=r"dim must be None, an int or a tuple of ints in \[-2, 2\)"):
        E.masked_mean(MASKED_X[:, :2], MASKED_M[:, :2], dim)


def test_masked_reductions_need_a_mask_of_the_values_shape():
    with pytest.raises(ValueError, match=r"mask must have shape \(3, 4\), got shape \(3, 3\)"):
        E.masked_sum(MASKED_X, MASKED_M[:, :3], 1)
    with pytest.raises(ValueError, match="mask must hold only 0 and 1"):
        E.masked_mean(MASKED_X, MASKED_M * 0.5, 1)


# edge cases found by mutation testing (make mutation) -------------------------------------------------

def test_lecture_reward_to_go_defaults_to_gamma_one():
    from agent_lab import training

    assert training.reward_to_go([1.0, 2.0, 3.0]) == (6.0, 5.0, 3.0)


def test_sequence_mean_log_ratio_divides_each_row_by_its_own_token_count():
    lp = T([1.0, 2.0, 0.0], [3.0, 0.0, 0.0])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert E.sequence_log_ratios(lp, torch.zeros_like(lp), mask, "mean").tolist() == [1.5, 3.0]


def test_local_loss_divides_by_any_positive_denominator_and_returns_the_numerator_for_zero():
    assert E.local_loss(torch.tensor(1.0), torch.tensor(0.5)).item() == 2.0
    assert E.reduce_loss(torch.tensor(1.0), torch.tensor(0.5)).item() == 2.0
    assert E.local_loss(torch.tensor(3.0), torch.tensor(0.0)).item() == 3.0


def test_running_mean_update_keeps_the_old_mean_from_count_one_and_refuses_a_bool_count():
    mean, count = E.running_mean_update(2.0, 1, T(4.0))
    assert (mean.item(), count) == (3.0, 2)
    assert E.running_mean_update(T(2.0), 1, torch.ones(1))[0].dtype == torch.float32, "the rewards' dtype"
    with pytest.raises(ValueError, match="count must be a non-negative integer, got True"):
        E.running_mean_update(0.0, True, T(1.0))


def test_optimal_constant_baseline_computes_in_the_rewards_dtype():
    rewards = torch.tensor([1.0, 0.0, 2.0])  # float32
    assert E.optimal_constant_baseline(rewards, T(1.0, 2.0, 0.5)).dtype == torch.float32
    assert E.optimal_constant_baseline(rewards, torch.ones(3), weights=T(0.2, 0.3, 0.5)).dtype == torch.float32


def test_optimal_constant_baseline_accepts_zero_weights():
    # A zero-probability outcome is a valid weight; only negative ones are refused.
    got = E.optimal_constant_baseline(T(1.0, 0.0, 5.0), T(1.0, 2.0, 3.0), weights=T(0.5, 0.5, 0.0))
    assert got.item() == pytest.approx((0.5 * 1 + 0) / (0.5 * 1 + 0.5 * 4))


def test_log_space_ess_refuses_a_row_of_zero_weights_and_normalises_each_row_by_its_own_maximum():
    with pytest.raises(ValueError, match="must not be all zero"):
        E.effective_sample_size(T([0.0, 0.0], [-float("inf"), -float("inf")]), log_weights=True)
    log_w = T([0.0, 1.0, 2.0], [5.0, 0.0, 0.0], [1.0, 1.0, 9.0])  # 3 x 3: a wrong broadcast would still run
    rows = [E.effective_sample_size(row.exp()).item() for row in log_w]
    assert E.effective_sample_size(log_w, log_weights=True).tolist() == pytest.approx(rows, rel=1e-12)


def test_per_sample_gradient_norms_of_one_sample_of_an_untouched_sample_and_in_bfloat16():
    theta = torch.tensor([3.0, 4.0], dtype=DTYPE, requires_grad=True)
    assert E.per_sample_gradient_norms((theta * theta.detach()).sum()[None], [theta]).tolist() == [5.0]
    other = torch.ones(1, dtype=DTYPE, requires_grad=True)
    untouched = torch.stack([theta.sum(), other.sum()])  # sample 1's gradient on theta is zero
    assert E.per_sample_gradient_norms(untouched, [theta]).tolist() == pytest.approx([2**0.5, 0.0])
    unrelated = torch.ones(2, dtype=DTYPE, requires_grad=True)  # in no sample's graph: no gradient at all
    assert E.per_sample_gradient_norms(untouched, [unrelated]).tolist() == [0.0, 0.0]
    # bf16 parameters: squares are summed in float32 (in bf16 the sum loses its fourth digit), and the
    # norms come back in the contributions' dtype.
    half = torch.full((1000,), 0.017, dtype=torch.bfloat16, requires_grad=True)
    contributions = (half.float() * half.detach().float()).sum()[None]  # float32, gradient = half (bf16)
    norms = E.per_sample_gradient_norms(contributions, [half])
    want = (half.detach().float() ** 2).sum().sqrt()
    assert norms.dtype == torch.float32 and norms.item() == pytest.approx(want.item(), rel=1e-6)
    assert E.per_sample_gradient_norms(contributions.to(torch.bfloat16), [half]).dtype == torch.bfloat16


def test_top_share_defaults_to_the_largest_entry_and_accepts_totals_below_one():
    assert E.top_share(T(1.0, 2.0, 3.0)).item() == pytest.approx(0.5)
    assert E.top_share(T(0.2, 0.3)).item() == pytest.approx(0.6)


def test_policy_lag_of_a_single_sequence():
    assert E.policy_lag(torch.tensor([3]), 5).tolist() == [2]
