"""Bad input raises ValueError naming the argument, what it got and what it needs."""

import pytest
import torch

import agent_lab.estimators as E
from agent_lab import training

R = torch.tensor([1.0, 0.0, 0.5, 0.5])
TURNS = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
TMASK = torch.ones(2, 2, dtype=torch.bool)
DONE = torch.tensor([True, False])
LP = torch.zeros(2, 3)
MASK = torch.ones(2, 3, dtype=torch.bool)
NAN, INF = float("nan"), float("inf")

CASES = {
    # empty input
    "empty rewards": (lambda: E.group_centered_advantages(torch.tensor([]), 1), ["rewards must not be empty", "(0,)"]),
    "empty reward_to_go": (lambda: E.reward_to_go([], 0.9), ["rewards must not be empty"]),
    "empty logits": (lambda: E.entropy_from_logits(torch.zeros(2, 0)), ["logits must be non-empty", "(2, 0)"]),
    # groups
    "group does not divide": (lambda: E.group_centered_advantages(R, 3), ["group_size 3 does not divide the batch size 4"]),
    "group size zero": (lambda: E.rloo_advantages(R, 0), ["group_size must be a positive integer, got 0"]),
    "group size bool": (lambda: E.group_mean_baseline(R, True), ["group_size must be a positive integer, got True"]),
    "rloo needs two": (lambda: E.rloo_advantages(R, 1), ["group_size must be at least 2", "got 1"]),
    "loo needs two": (lambda: E.leave_one_out_baseline(R, 1), ["group_size must be at least 2"]),
    "rewards not 1-D": (lambda: E.group_standardized_advantages(TURNS, 2), ["rewards must have shape [B]", "(2, 2)"]),
    "negative eps": (lambda: E.group_standardized_advantages(R, 2, eps=-1.0), ["eps must be a non-negative number, got -1.0"]),
    # gamma / lambda / probabilities
    "gamma above one": (lambda: E.reward_to_go(R, 1.5), ["gamma must lie in [0, 1], got 1.5"]),
    "gamma negative": (lambda: E.discounted_returns(TURNS, TMASK, -0.1, DONE), ["gamma must lie in [0, 1], got -0.1"]),
    "gamma nan": (lambda: E.td_residuals(TURNS, TURNS, TMASK, NAN, DONE), ["gamma must lie in [0, 1], got nan"]),
    "gamma text": (lambda: E.reward_to_go(R, "high"), ["gamma must be a real number in [0, 1], got 'high'"]),
    "lambda above one": (lambda: E.gae(TURNS, TURNS, TMASK, 0.9, 1.01, DONE), ["lam must lie in [0, 1], got 1.01"]),
    "p above one": (lambda: E.prob_at_least_one_success(1.2, 3), ["p must lie in [0, 1]", "1.2"]),
    "p text": (lambda: E.degenerate_group_probability("x", 3), ["p must be a probability", "'x'"]),
    "n zero": (lambda: E.prob_at_least_one_success(0.5, 0), ["n must be a positive integer, got 0"]),
    "clip eps": (lambda: E.ppo_clipped_surrogate(LP, LP, torch.zeros(2), MASK, 1.5), ["clip_eps must lie in [0, 1], got 1.5"]),
    "clip eps high": (lambda: E.ppo_clipped_surrogate(LP, LP, torch.zeros(2), MASK, 0.2, clip_eps_high=-1),
                      ["clip_eps_high must be a non-negative number, got -1"]),
    # NaN / inf rewards
    "nan reward": (lambda: E.group_centered_advantages(torch.tensor([1.0, NAN]), 2), ["rewards must be finite, got nan at index (1,)"]),
    "inf reward": (lambda: E.reward_to_go(torch.tensor([[0.0, INF]]), 0.9), ["rewards must be finite, got inf at index (0, 1)"]),
    "nan values": (lambda: E.gae(TURNS, torch.full((2, 2), NAN), TMASK, 0.9, 0.9, DONE), ["values must be finite"]),
    "inf bootstrap": (lambda: E.discounted_returns(TURNS, TMASK, 0.9, DONE, torch.tensor([0.0, INF])), ["bootstrap_values must be finite"]),
    "nan advantages": (lambda: E.reinforce_surrogate(LP, torch.tensor([NAN, 0.0])), ["coefficients must be finite"]),
    "text rewards": (lambda: E.group_centered_advantages(["a", "b"], 2), ["rewards must be a tensor or a sequence of real numbers"]),
    "complex rewards": (lambda: E.reward_to_go(torch.ones(2, dtype=torch.complex64), 0.5), ["rewards must be real", "complex64"]),
    # masks: shape, dtype, values, padding layout
    "mask wrong shape": (lambda: E.aggregate(LP, torch.ones(2, 4, dtype=torch.bool), "token_mean"),
                         ["action_mask must have shape (2, 3), got shape (2, 4)"]),
    "mask complex dtype": (lambda: E.aggregate(LP, torch.ones(2, 3, dtype=torch.complex64), "token_mean"),
                           ["action_mask must have dtype bool or a real dtype holding 0/1, got dtype torch.complex64"]),
    "mask fractional": (lambda: E.aggregate(LP, torch.full((2, 3), 0.5), "token_mean"),
                        ["action_mask must hold only 0 and 1 (or be bool), got 0.5 at index (0, 0)"]),
    "mask not tensor": (lambda: E.ppo_clipped_surrogate(LP, LP, torch.zeros(2), [[1, 1, 1]] * 2, 0.2),
                        ["action_mask must be a torch.Tensor", "got list"]),
    "turn mask wrong shape": (lambda: E.discounted_returns(TURNS, torch.ones(2, 3), 0.9, DONE), ["turn_mask must have shape (2, 2), got shape (2, 3)"]),
    "turn mask hole": (lambda: E.discounted_returns(TURNS, torch.tensor([[0, 1], [1, 1]]), 0.9, DONE),
                       ["turn_mask must mark real steps as a prefix of each row"]),
    "reward_to_go mask hole": (lambda: E.reward_to_go(TURNS, 0.9, torch.tensor([[0, 1], [1, 1]])), ["mask must mark real steps as a prefix"]),
    "terminated wrong shape": (lambda: E.discounted_returns(TURNS, TMASK, 0.9, torch.tensor([True])), ["terminated must have shape (2,), got shape (1,)"]),
    "terminated float": (lambda: E.discounted_returns(TURNS, TMASK, 0.9, torch.tensor([0.5, 1.0])), ["terminated must hold only 0 and 1"]),
    # mismatched lengths and shapes
    "bootstrap length": (lambda: E.discounted_returns(TURNS, TMASK, 0.9, DONE, torch.zeros(3)), ["bootstrap_values must have shape (2,)", "got (3,)"]),
    "values shape": (lambda: E.td_residuals(TURNS, torch.zeros(2, 3), TMASK, 0.9, DONE), ["values has shape (2, 3) but rewards has shape (2, 2)"]),
    "rewards 1-D for turns": (lambda: E.discounted_returns(R, TMASK, 0.9, DONE), ["rewards must have shape [B, T]", "(4,)"]),
    "old logprobs shape": (lambda: E.token_log_ratios(LP, torch.zeros(2, 4)), ["old_logprobs has shape (2, 4) but logprobs has shape (2, 3)"]),
    "ref logprobs shape": (lambda: E.kl_estimate(LP, torch.zeros(3, 3)), ["ref_logprobs has shape (3, 3) but logprobs has shape (2, 3)"]),
    "kl kind": (lambda: E.kl_estimate(LP, LP, "k4"), ["kind must be one of ('k1', 'k2', 'k3'), got 'k4'"]),
    "coefficient shape": (lambda: E.reinforce_surrogate(LP, torch.zeros(3)), ["coefficients must have shape (2,), (2, 3), or [B, T] together with turn_ids; got (3,)"]),
    "baseline shape": (lambda: E.reinforce_surrogate(LP, torch.zeros(2), baseline=torch.zeros(3)), ["baseline must have the shape of coefficients (2,), got (3,)"]),
    "logprobs 1-D": (lambda: E.reinforce_surrogate(torch.zeros(3), torch.zeros(3)), ["logprobs must have shape [B, L-1], got shape (3,)"]),
    "turn ids float": (lambda: E.reinforce_surrogate(LP, TURNS, turn_ids=torch.zeros(2, 3)), ["turn_ids must be an integer torch.Tensor, got torch.float32"]),
    "turn ids shape": (lambda: E.reinforce_surrogate(LP, TURNS, turn_ids=torch.zeros(2, 2, dtype=torch.long)), ["turn_ids must have shape (2, 3), got (2, 2)"]),
    "turn ids range": (lambda: E.reinforce_surrogate(LP, TURNS, turn_ids=torch.full((2, 3), 2)), ["turn_ids must lie in [-1, 2)", "got values in [2, 2]"]),
    "turn ids below -1": (lambda: E.expand_to_tokens(TURNS, LP, torch.full((2, 3), -2)), ["turn_ids must be >= -1", "got minimum -2"]),
    "turn values 1-D": (lambda: E.expand_to_tokens(torch.zeros(2), LP, torch.zeros(2, 3, dtype=torch.long)), ["coefficients must have shape [B, T] when turn_ids is given"]),
    "turn values rows": (lambda: E.expand_to_tokens(torch.zeros(3, 2), LP, torch.zeros(2, 3, dtype=torch.long)), ["coefficients has 3 rows but the token batch has 2"]),
    "targets float": (lambda: E.token_logprobs(torch.zeros(2, 3, 5), torch.zeros(2, 3)), ["targets must be an integer torch.Tensor of token ids, got torch.float32"]),
    "targets shape": (lambda: E.token_logprobs(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long)), ["targets must have shape (2, 3), got (2, 4)"]),
    "targets range": (lambda: E.token_logprobs(torch.zeros(2, 3, 5), torch.full((2, 3), 5)), ["targets must be token ids in [0, 5), got values in [5, 5]"]),
    "logits int": (lambda: E.token_logprobs(torch.zeros(2, 3, 5, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long)), ["logits must be a floating torch.Tensor"]),
    "ratio normalize": (lambda: E.sequence_log_ratios(LP, LP, MASK, "max"), ["normalize must be 'sum' or 'mean', got 'max'"]),
    "ratio mask": (lambda: E.sequence_log_ratios(LP, LP, None), ["action_mask is required"]),
    "ratio level": (lambda: E.ppo_clipped_surrogate(LP, LP, torch.zeros(2), MASK, 0.2, ratio_level="turn"), ["ratio_level must be 'token' or 'sequence', got 'turn'"]),
    "inf log ratio": (lambda: E.ppo_clipped_surrogate(LP, torch.full((2, 3), -INF), torch.zeros(2), MASK, 0.2), ["logprobs - old_logprobs on action tokens must be finite"]),
    # aggregation and reduction
    "objective": (lambda: E.aggregate(LP, MASK, "sum"), ["objective must be one of", "got 'sum'"]),
    "constant needs max_tokens": (lambda: E.aggregate(LP, MASK, "constant"), ["max_tokens is required for objective 'constant'"]),
    "max_tokens zero": (lambda: E.aggregate(LP, MASK, "constant", max_tokens=0), ["max_tokens must be a positive integer, got 0"]),
    "turns need ids": (lambda: E.aggregate(LP, MASK, "turn_then_trajectory"), ["turn_ids [B, L-1] is required"]),
    "action token without turn": (lambda: E.aggregate(LP, MASK, "turn_then_trajectory", turn_ids=torch.full((2, 3), -1)),
                                  ["turn_ids must be >= 0 on every token in action_mask"]),
    "per_token 3-D": (lambda: E.aggregate(torch.zeros(2, 3, 1), MASK, "token_mean"), ["per_token must have shape [B, L-1], got shape (2, 3, 1)"]),
    "reduce vector": (lambda: E.reduce_loss(torch.zeros(2), torch.tensor(1.0)), ["numerator must be a 0-dim torch.Tensor", "(2,)"]),
    "reduce float": (lambda: E.reduce_loss(torch.tensor(1.0), 2.0), ["denominator must be a 0-dim torch.Tensor", "float"]),
    "reduce negative": (lambda: E.reduce_loss(torch.tensor(1.0), torch.tensor(-2.0)), ["denominator must be non-negative, got a total of -2.0"]),
    # baselines
    "running count": (lambda: E.running_mean_update(0.0, -1, R), ["count must be a non-negative integer, got -1"]),
    "running mean vector": (lambda: E.running_mean_update(torch.zeros(2), 1, R), ["mean must be a single number, got shape (2,)"]),
    "constant vector": (lambda: E.constant_baseline(R, [1.0, 2.0]), ["value must be a single number, got shape (2,)"]),
    "b* rows": (lambda: E.optimal_constant_baseline(R, torch.ones(3)), ["scores has 3 rows but rewards has 4"]),
    "b* zero scores": (lambda: E.optimal_constant_baseline(R, torch.zeros(4)), ["E[Z^2] is zero"]),
    "b* weights shape": (lambda: E.optimal_constant_baseline(R, torch.ones(4), torch.ones(3)), ["weights must have shape (4,), got (3,)"]),
    "b* negative weights": (lambda: E.optimal_constant_baseline(R, torch.ones(4), -torch.ones(4)), ["weights must be non-negative"]),
    "b* scores 3-D": (lambda: E.optimal_constant_baseline(R, torch.ones(4, 1, 1)), ["scores must have shape [N] or [N, D]"]),
    # filtering and shaping
    "rest cap needs groups": (lambda: E.rest_em_filter(R, max_per_group=1), ["group_size is required with max_per_group"]),
    "rest cap zero": (lambda: E.rest_em_filter(R, group_size=2, max_per_group=0), ["max_per_group must be a positive integer, got 0"]),
    "rest group divides": (lambda: E.rest_em_filter(R, group_size=3), ["group_size 3 does not divide the batch size 4"]),
    "potentials shape": (lambda: E.potential_based_shaping(TURNS, torch.zeros(2, 2), 0.9), ["potentials must have shape (2, 3) = [B, T+1], got (2, 2)"]),
    # diagnostics
    "ess negative": (lambda: E.effective_sample_size(torch.tensor([1.0, -1.0])), ["weights must be non-negative, got minimum -1.0"]),
    "ess zero": (lambda: E.effective_sample_size(torch.zeros(3)), ["weights must not be all zero"]),
    "ess log nan": (lambda: E.effective_sample_size(torch.tensor([0.0, NAN]), log_weights=True), ["must not hold NaN or +inf"]),
    "ess log all -inf": (lambda: E.effective_sample_size(torch.tensor([-INF, -INF]), log_weights=True), ["must not be all zero"]),
    "top k too big": (lambda: E.top_share(torch.ones(3), 4), ["k must be at most the number of values 3, got 4"]),
    "top negative": (lambda: E.top_share(torch.tensor([1.0, -1.0])), ["values must be non-negative"]),
    "top zero": (lambda: E.top_share(torch.zeros(3)), ["values must not all be zero"]),
    "contributions shape": (lambda: E.per_sample_gradient_norms(torch.zeros(2, 2), []), ["contributions must be a non-empty [N] tensor", "(2, 2)"]),
    "contributions no grad": (lambda: E.per_sample_gradient_norms(torch.zeros(2), []), ["contributions must require grad"]),
    "no parameters": (lambda: E.per_sample_gradient_norms(torch.zeros(2, requires_grad=True), [torch.zeros(1)]),
                      ["parameters must contain at least one tensor that requires grad"]),
    "lag from future": (lambda: E.policy_lag(torch.tensor([3, 5]), 4), ["policy_version must not exceed current_version 4, got 5"]),
    "lag float": (lambda: E.policy_lag(torch.tensor([1.0]), 4), ["policy_version must be a non-empty integer tensor", "torch.float32"]),
    "lag current": (lambda: E.policy_lag([1, 2], 4.0), ["current_version must be an int, got 4.0"]),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_bad_input_raises_value_error_that_names_argument_got_and_needed(case):
    call, fragments = CASES[case]
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"expected {fragment!r} in the message, got {message!r}"


# Every validated argument is named first in its error, and a shape error spells the expected shape.
# (A fragment check alone passes when the name is dropped or mangled; these fail on it.)
N2 = torch.full((2, 2), NAN)
STARTS = {
    "reward_to_go rewards": (lambda: E.reward_to_go(torch.tensor([NAN]), 0.9), "rewards must be finite"),
    "reward_to_go mask": (lambda: E.reward_to_go(TURNS, 0.9, torch.ones(2, 3)), "mask must have shape (2, 2)"),
    "returns bootstrap": (lambda: E.discounted_returns(TURNS, TMASK, 0.9, DONE, torch.tensor([NAN, 0.0])),
                          "bootstrap_values must be finite"),
    "constant rewards": (lambda: E.constant_baseline(torch.tensor([NAN]), 0.5), "rewards must be finite"),
    "constant value": (lambda: E.constant_baseline(R, NAN), "value must be finite"),
    "running rewards": (lambda: E.running_mean_update(0.0, 1, torch.tensor([NAN])), "rewards must be finite"),
    "running mean": (lambda: E.running_mean_update(NAN, 1, R), "mean must be finite"),
    "b* rewards": (lambda: E.optimal_constant_baseline(torch.tensor([NAN, 1.0]), torch.ones(2)), "rewards must be finite"),
    "b* scores": (lambda: E.optimal_constant_baseline(R, torch.tensor([NAN, 1.0, 1.0, 1.0])), "scores must be finite"),
    "b* weights": (lambda: E.optimal_constant_baseline(R, torch.ones(4), torch.tensor([NAN, 1.0, 1.0, 1.0])),
                   "weights must be finite"),
    "group mean rewards": (lambda: E.group_mean_baseline(torch.tensor([NAN, 1.0]), 2), "rewards must be finite"),
    "loo rewards": (lambda: E.leave_one_out_baseline(torch.tensor([NAN, 1.0]), 2), "rewards must be finite"),
    "td values": (lambda: E.td_residuals(TURNS, N2, TMASK, 0.9, DONE), "values must be finite"),
    "ratio mask": (lambda: E.token_log_ratios(LP, LP, torch.ones(2, 4)), "action_mask must have shape (2, 3)"),
    "sequence mask": (lambda: E.sequence_log_ratios(LP, LP, torch.ones(2, 4), "mean"), "action_mask must have shape (2, 3)"),
    "kl mask": (lambda: E.kl_estimate(LP, LP, "k1", torch.ones(2, 4)), "action_mask must have shape (2, 3)"),
    "reinforce baseline": (lambda: E.reinforce_surrogate(LP, torch.zeros(2), baseline=torch.tensor([NAN, 0.0])),
                           "baseline must be finite"),
    "ppo advantages": (lambda: E.ppo_clipped_surrogate(LP, LP, torch.tensor([NAN, 0.0]), MASK, 0.2),
                       "advantages must be finite"),
    "ppo mask": (lambda: E.ppo_clipped_surrogate(LP, LP, torch.zeros(2), torch.ones(2, 4), 0.2),
                 "action_mask must have shape (2, 3)"),
    "masked values": (lambda: E.masked_mean("x", MASK), "values must be a tensor or a sequence of real numbers"),
    "rest rewards": (lambda: E.rest_em_filter(torch.tensor([NAN])), "rewards must be finite"),
    "mixed rewards": (lambda: E.mixed_group_rows(torch.tensor([NAN, 1.0]), 2, 1), "rewards must be finite"),
    "mixed n_groups": (lambda: E.mixed_group_rows(R, 2, 0), "n_groups must be a positive integer, got 0"),
    "unsolved rewards": (lambda: E.unsolved_groups(torch.tensor([NAN, 1.0]), 2), "rewards must be finite"),
    "shaping rewards": (lambda: E.potential_based_shaping(torch.tensor([[NAN]]), torch.zeros(1, 2), 0.9),
                        "rewards must be finite"),
    "shaping potentials": (lambda: E.potential_based_shaping(TURNS, torch.full((2, 3), NAN), 0.9), "potentials must be finite"),
    "shaping gamma": (lambda: E.potential_based_shaping(TURNS, torch.zeros(2, 3), 2.0), "gamma must lie in [0, 1]"),
    "shaping turn mask": (lambda: E.potential_based_shaping(TURNS, torch.zeros(2, 3), 0.9, torch.ones(2, 3)),
                          "turn_mask must have shape (2, 2)"),
    "shaping terminated": (lambda: E.potential_based_shaping(TURNS, torch.zeros(2, 3), 0.9, TMASK, torch.tensor([True])),
                           "terminated must have shape (2,)"),
    "p nan": (lambda: E.prob_at_least_one_success(torch.tensor([NAN]), 3), "p must be finite"),
    "degenerate group size": (lambda: E.degenerate_group_probability(0.5, 0), "group_size must be a positive integer, got 0"),
    "degenerate fraction rewards": (lambda: E.degenerate_group_fraction(torch.tensor([NAN, 1.0]), 2), "rewards must be finite"),
    "ess linear nan": (lambda: E.effective_sample_size(torch.tensor([1.0, NAN])), "weights must be finite"),
    "ess log text": (lambda: E.effective_sample_size("x", log_weights=True), "weights must be a tensor or a sequence"),
    "top values": (lambda: E.top_share(torch.tensor([NAN, 1.0])), "values must be finite"),
    "top k": (lambda: E.top_share(torch.ones(3), 0), "k must be a positive integer, got 0"),
    # the lecture's scalar API
    "lecture rewards": (lambda: training.reinforce_estimate([(1.0,)], [NAN]), "rewards must be finite"),
    "lecture baselines": (lambda: training.reinforce_estimate([(1.0,)], [1.0], [NAN]), "baselines must be finite"),
    "lecture scores": (lambda: training.reinforce_estimate([(1.0,), (NAN,)], [1.0, 0.0]),
                       "score_gradients[1] must be finite"),
}
EXACT = {
    "reward_to_go 0-dim": (lambda: E.reward_to_go(torch.tensor(1.0), 0.9),
                           "rewards must have shape [..., T] with at least one dimension, got shape ()"),
    "b* rewards 2-D": (lambda: E.optimal_constant_baseline(torch.ones(2, 2), torch.ones(2)),
                       "rewards must have shape [N], got shape (2, 2)"),
    "b* scores 3-D": (lambda: E.optimal_constant_baseline(R, torch.ones(4, 1, 1)),
                      "scores must have shape [N] or [N, D], got shape (4, 1, 1)"),
    "top values 2-D": (lambda: E.top_share(torch.ones(2, 2)), "values must have shape [N], got shape (2, 2)"),
    "rest rewards 2-D": (lambda: E.rest_em_filter(torch.ones(2, 2)), "rewards must have shape [B] (one score per sample), got shape (2, 2)"),
    "shaping rewards 1-D": (lambda: E.potential_based_shaping(R, torch.zeros(4, 2), 0.9),
                            "rewards must have shape [B, T] (one reward per turn), got shape (4,)"),
    "sequence logprobs 1-D": (lambda: E.sequence_log_ratios(torch.zeros(3), torch.zeros(3), torch.ones(3)),
                              "logprobs must have shape [B, L-1], got shape (3,)"),
    "ppo logprobs 1-D": (lambda: E.ppo_clipped_surrogate(torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.ones(3), 0.2),
                         "logprobs must have shape [B, L-1], got shape (3,)"),
    "contributions list": (lambda: E.per_sample_gradient_norms([1.0], []),
                           "contributions must be a non-empty [N] tensor of per-sample scalars, got list"),
    "contributions empty": (lambda: E.per_sample_gradient_norms(torch.zeros(0, requires_grad=True), []),
                            "contributions must be a non-empty [N] tensor of per-sample scalars, got (0,)"),
    "lag empty": (lambda: E.policy_lag(torch.zeros(0, dtype=torch.long), 4),
                  "policy_version must be a non-empty integer tensor, got dtype torch.int64"),
    "lag bool": (lambda: E.policy_lag(torch.tensor([True]), 4),
                 "policy_version must be a non-empty integer tensor, got dtype torch.bool"),
    "contributions no grad": (lambda: E.per_sample_gradient_norms(torch.zeros(2), []),
                              "contributions must require grad (compute them from the parameters without no_grad)"),
    "no parameters": (lambda: E.per_sample_gradient_norms(torch.zeros(2, requires_grad=True), [torch.zeros(1)]),
                      "parameters must contain at least one tensor that requires grad"),
    "top zero": (lambda: E.top_share(torch.zeros(3)), "values must not all be zero"),
    "ratio mask required": (lambda: E.sequence_log_ratios(LP, LP, None),
                            "action_mask is required: a sequence ratio multiplies only the policy's own tokens"),
    "b* negative weights": (lambda: E.optimal_constant_baseline(R, torch.ones(4), -torch.ones(4)),
                            "weights must be non-negative"),
    "b* zero scores": (lambda: E.optimal_constant_baseline(R, torch.zeros(4)),
                       "E[Z^2] is zero (every score is zero), so b* = E[R Z^2]/E[Z^2] is undefined"),
    "degenerate binary bool": (lambda: training.degenerate_binary_group_probability(0.5, True),
                               "group_size must be a positive integer, got True"),
}


@pytest.mark.parametrize("case", list(STARTS), ids=list(STARTS))
def test_bad_input_message_starts_with_the_argument_name(case):
    call, start = STARTS[case]
    with pytest.raises(ValueError) as info:
        call()
    assert str(info.value).startswith(start), f"expected the message to start with {start!r}, got {str(info.value)!r}"


@pytest.mark.parametrize("case", list(EXACT), ids=list(EXACT))
def test_bad_input_message_is_exact(case):
    call, message = EXACT[case]
    with pytest.raises(ValueError) as info:
        call()
    assert str(info.value) == message
