"""Exact checks on the policy-gradient surrogates and log-prob helpers: argument names in error messages,
non-finite values outside the action mask, output dtypes and the clip boundary (mutation-testing survivors)."""

import math

import pytest
import torch

import agent_lab.estimators as E

F64 = torch.float64
NAN_STATS = ("ratio_mean", "ratio_max", "ratio_min", E.KL_OLD_NEW, "approx_kl")


def _error(fn, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as excinfo:
        fn(*args, **kwargs)
    return str(excinfo.value)


EMPTY_LOGPROBS = "logprobs must not be empty, got shape (0,); pass at least one value"


# reinforce_surrogate ---------------------------------------------------------------------------------

def test_reinforce_surrogate_names_logprobs_when_they_are_empty():
    assert _error(E.reinforce_surrogate, [], [1.0]) == EMPTY_LOGPROBS


def test_reinforce_surrogate_accepts_minus_inf_logprobs_that_the_mask_drops():
    # A token with probability 0 outside the action mask (e.g. padding) must not be refused.
    logprobs = torch.tensor([[-0.5, -math.inf]], dtype=F64)
    got = E.reinforce_surrogate(logprobs, [2.0])
    assert got.tolist() == [[-1.0, -math.inf]]
    num, den = E.aggregate(got, torch.tensor([[1, 0]]), "token_mean")
    assert (num.item(), den.item()) == (-1.0, 1.0)


def test_reinforce_surrogate_subtracts_the_baseline_in_the_coefficients_dtype():
    # The baseline is cast to the coefficients' dtype first: 1 - 0.1 is rounded in float32, not float64.
    coefficients = torch.tensor([1.0], dtype=torch.float32)
    got = E.reinforce_surrogate(torch.tensor([[1.0, 2.0]], dtype=F64), coefficients,
                                baseline=torch.tensor([0.1], dtype=F64))
    weight = (torch.tensor(1.0, dtype=torch.float32) - torch.tensor(0.1, dtype=torch.float32)).item()
    assert weight != 0.9
    assert got.dtype == F64
    assert got.tolist() == [[weight, 2.0 * weight]]


def test_reinforce_surrogate_is_in_the_logprobs_dtype_whatever_the_coefficients_dtype():
    logprobs = torch.tensor([[-0.5, -2.0]], dtype=torch.float32)
    got = E.reinforce_surrogate(logprobs, torch.tensor([0.1], dtype=F64))
    assert got.dtype == torch.float32
    assert torch.equal(got, torch.tensor(0.1, dtype=torch.float32) * logprobs)


# ppo_clipped_surrogate -------------------------------------------------------------------------------

def test_ppo_names_logprobs_when_they_are_empty():
    assert _error(E.ppo_clipped_surrogate, [], [], [1.0], torch.ones(0, dtype=torch.bool)) == EMPTY_LOGPROBS


@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
def test_ppo_accepts_minus_inf_logprobs_outside_the_action_mask(ratio_level):
    logprobs = torch.tensor([[-0.5, -math.inf]], dtype=F64)
    old = torch.tensor([[-0.5, -3.0]], dtype=F64)
    surrogate, stats = E.ppo_clipped_surrogate(logprobs, old, [2.0], torch.tensor([[1, 0]]), ratio_level=ratio_level)
    # Outside the mask the surrogate is exactly 0; the one action token has ratio 1.
    assert surrogate.tolist() == [[2.0, 0.0]]
    assert {k: stats[k].item() for k in ("clip_frac_pos", "ratio_mean", "ratio_max", E.KL_OLD_NEW)} == {
        "clip_frac_pos": 0.0, "ratio_mean": 1.0, "ratio_max": 1.0, E.KL_OLD_NEW: 0.0}
    assert stats["n_tokens"].item() == 1


def test_ppo_surrogate_is_in_the_logprobs_dtype_when_advantages_are_float64():
    logprobs = torch.tensor([[0.0, -1.0]], dtype=torch.float32)
    advantages = torch.tensor([[0.1, -0.3]], dtype=F64)
    surrogate, stats = E.ppo_clipped_surrogate(logprobs, logprobs.clone(), advantages, torch.ones(1, 2))
    assert surrogate.dtype == torch.float32
    assert torch.equal(surrogate, advantages.float())
    assert stats["ratio_mean"].dtype == torch.float32


def test_ppo_ratio_exactly_at_one_plus_or_minus_eps_is_not_clipped():
    # exp(log 1.5), exp(log 2), exp(log 0.5), exp(log 0.25) are exact in float64, so ratios 1.5 = 1 + eps
    # and 0.5 = 1 - eps sit exactly on the clip boundary: clamp leaves them unchanged (not clipped).
    logprobs = torch.tensor([[math.log(1.5), math.log(2.0), math.log(0.5), math.log(0.25)]], dtype=F64)
    assert torch.exp(logprobs).tolist() == [[1.5, 2.0, 0.5, 0.25]]
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=F64)
    surrogate, stats = E.ppo_clipped_surrogate(logprobs, torch.zeros_like(logprobs), advantages, torch.ones(1, 4), 0.5)
    assert surrogate.tolist() == [[1.5, 1.5, -0.5, -0.5]]
    assert stats["clip_frac_pos"].item() == 0.5
    assert stats["clip_frac_neg"].item() == 0.5
    assert (stats["ratio_mean"].item(), stats["ratio_max"].item(), stats["ratio_min"].item()) == (1.0625, 2.0, 0.25)
    assert (stats["n_pos"].item(), stats["n_neg"].item(), stats["n_tokens"].item()) == (2, 2, 4)


def test_ppo_zero_clip_eps_is_allowed_and_ratio_one_is_not_clipped():
    logprobs = torch.tensor([[-0.7, -1.2]], dtype=F64)
    advantages = torch.tensor([[1.0, -1.0]], dtype=F64)
    for kwargs in ({"clip_eps": 0.0}, {"clip_eps": 0.0, "clip_eps_high": 0.0}, {"clip_eps_high": 0.0}):
        surrogate, stats = E.ppo_clipped_surrogate(logprobs, logprobs.clone(), advantages, torch.ones(1, 2), **kwargs)
        assert surrogate.tolist() == [[1.0, -1.0]], kwargs
        assert (stats["clip_frac_pos"].item(), stats["clip_frac_neg"].item()) == (0.0, 0.0), kwargs


def test_ppo_stats_of_an_empty_mask_are_nan_in_the_ratio_dtype():
    logprobs = torch.tensor([[-0.7, -1.2]], dtype=F64)
    _, stats = E.ppo_clipped_surrogate(logprobs, logprobs - 1.0, [1.0], torch.zeros(1, 2, dtype=torch.bool))
    for key in NAN_STATS:
        assert stats[key].dtype == F64, key
        assert math.isnan(stats[key].item()), key
    for key in ("clip_frac_pos", "clip_frac_neg"):
        assert stats[key].dtype == F64, key
        assert stats[key].item() == 0.0, key
    assert stats["n_tokens"].item() == 0


def test_ppo_clip_fraction_is_exactly_one_when_every_bfloat16_token_is_clipped():
    # 257 is not a bfloat16 number (256 is): the counts are divided before the share is rounded, so all/all = 1.
    logprobs = torch.zeros(1, 257, dtype=torch.bfloat16)
    _, stats = E.ppo_clipped_surrogate(logprobs, logprobs - 1.0, [1.0], torch.ones(1, 257, dtype=torch.bool))
    assert stats["clip_frac_pos"].dtype == torch.bfloat16
    assert stats["clip_frac_pos"].item() == 1.0
    assert stats["n_pos"].item() == 257


def test_ppo_clip_fractions_stay_exact_past_the_largest_float16_count():
    # 70000 tokens with A > 0, half of them clipped: a count cast to float16 (max 65504) would be inf.
    n = 70_000
    logprobs = torch.zeros(1, n, dtype=torch.float16)
    old = torch.cat([logprobs[:, : n // 2] - 1.0, logprobs[:, n // 2:]], dim=1)
    _, stats = E.ppo_clipped_surrogate(logprobs, old, [1.0], torch.ones(1, n, dtype=torch.bool))
    assert stats["clip_frac_pos"].dtype == torch.float16 and stats["clip_frac_pos"].item() == 0.5
    _, stats = E.ppo_clipped_surrogate(logprobs, old, [-1.0], torch.ones(1, n, dtype=torch.bool))
    assert stats["clip_frac_neg"].item() == 0.0 and stats["clip_frac_pos"].item() == 0.0


# logprobs helpers ------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [E.entropy_from_logits, lambda logits: E.token_logprobs(logits, torch.tensor([0]))])
def test_logits_that_are_not_a_tensor_are_named_by_type(fn):
    assert _error(fn, [[0.0, 1.0]]) == "logits must be a floating torch.Tensor [..., V], got list"


@pytest.mark.parametrize("shape", [(), (0, 3), (2, 0)])
def test_logits_without_vocabulary_or_rows_are_refused(shape):
    logits = torch.zeros(shape)
    expected = f"logits must be non-empty with a vocabulary dimension last, got shape {shape}"
    assert _error(E.entropy_from_logits, logits) == expected


def test_token_logprobs_names_the_type_of_non_tensor_targets():
    expected = "targets must be an integer torch.Tensor of token ids, got list"
    assert _error(E.token_logprobs, torch.zeros(1, 2, 3), [[0, 1]]) == expected


def test_log_ratio_helpers_name_the_empty_argument():
    assert _error(E.token_log_ratios, [], [0.0]) == EMPTY_LOGPROBS
    assert _error(E.kl_estimate, [], [0.0]) == EMPTY_LOGPROBS
    assert _error(E.token_log_ratios, [0.0], []) == (
        "old_logprobs must not be empty, got shape (0,); pass at least one value")
    assert _error(E.kl_estimate, [0.0], []) == (
        "ref_logprobs must not be empty, got shape (0,); pass at least one value")


def test_token_log_ratios_give_zero_outside_the_mask_even_for_minus_inf_logprobs():
    logprobs = torch.tensor([[-0.5, -math.inf]], dtype=F64)
    old = torch.tensor([[-1.5, -2.0]], dtype=F64)
    assert E.token_log_ratios(logprobs, old, torch.tensor([[1, 0]])).tolist() == [[1.0, 0.0]]
    assert E.token_log_ratios(logprobs, old).tolist() == [[1.0, -math.inf]]
    assert E.sequence_log_ratios(logprobs, old, torch.tensor([[1, 0]]), "mean").tolist() == [1.0]
