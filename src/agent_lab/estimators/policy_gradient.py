"""Policy-gradient surrogates: REINFORCE (with baseline and reward-to-go) and PPO's clipped surrogate.

Sign convention: a *surrogate* is the per-token quantity to MAXIMISE; its gradient is the policy-gradient
estimate. A loss to minimise is ``-aggregate(surrogate, action_mask, objective)`` reduced with
:func:`agent_lab.estimators.reduce_loss`. Lecture sections: "The score-function identity" and "Baselines",
"Deriving REINFORCE" and "PPO's clipped surrogate" (lecture notes sections 3-5, foundations chapter sections 6 and 10).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._validation import as_float_like, as_float_tensor, as_mask, as_turn_ids, check_finite, check_ndim, unit_interval
from .logprobs import kl_estimate, sequence_log_ratios, token_log_ratios

__all__ = ["expand_to_tokens", "reinforce_surrogate", "ppo_clipped_surrogate", "PPO_STATS", "KL_OLD_NEW"]

# KL_OLD_NEW names its direction, estimator and sampling distribution: k3 of KL(old || new) on old samples.
KL_OLD_NEW = "kl_old_new_k3_on_old"
PPO_STATS = ("clip_frac_pos", "clip_frac_neg", "ratio_mean", "ratio_max", "ratio_min", KL_OLD_NEW, "approx_kl")


def expand_to_tokens(values: Any, like: Tensor, turn_ids: Tensor | None = None, *, name: str = "coefficients") -> Tensor:
    r"""Place per-sequence, per-turn or per-token credit on the ``[B, L-1]`` token grid of ``like``.

    * ``[B]``: the sequence's value on every token (outcome reward copied to all tokens);
    * ``[B, T]`` with ``turn_ids`` ``[B, L-1]``: token j gets ``values[i, turn_ids[i, j]]``, and 0 where
      ``turn_ids`` is -1 (prompt, observations, padding);
    * ``[B, L-1]``: returned unchanged.
    Book: part2/09_tensor_contract.
    """
    values = as_float_tensor(name, values)
    batch_len = tuple(like.shape)
    if turn_ids is not None:
        check_ndim(name, values, (2,), "[B, T] when turn_ids is given")
        turn_ids = as_turn_ids(turn_ids, batch_len)
        if values.shape[0] != batch_len[0]:
            raise ValueError(f"{name} has {values.shape[0]} rows but the token batch has {batch_len[0]}")
        turns = values.shape[1]
        if bool((turn_ids >= turns).any()):
            raise ValueError(f"turn_ids must lie in [-1, {turns}) for {name} with {turns} turns, "
                             f"got values in [{int(turn_ids.min())}, {int(turn_ids.max())}]")
        picked = values.gather(1, turn_ids.clamp(min=0).long())
        return torch.where(turn_ids >= 0, picked, torch.zeros_like(picked))
    if tuple(values.shape) == batch_len:
        return values
    if values.ndim == 1 and values.shape[0] == batch_len[0]:
        return values[:, None].expand(batch_len)
    raise ValueError(
        f"{name} must have shape ({batch_len[0]},), {batch_len}, or [B, T] together with turn_ids; "
        f"got {tuple(values.shape)}"
    )


def reinforce_surrogate(
    logprobs: Tensor,
    coefficients: Any,
    *,
    baseline: Any = None,
    turn_ids: Tensor | None = None,
) -> Tensor:
    r"""Per-token REINFORCE surrogate, to maximise.

    .. math:: s_{ij} = \operatorname{sg}\!\left[c_{ij} - b_{ij}\right] \log \pi_\theta(x_{ij} \mid x_{i,<j})

    so that :math:`\nabla s_{ij} = (c_{ij} - b_{ij}) \nabla \log \pi_\theta(x_{ij})` (sg: stop-gradient).
    ``coefficients`` is the return or advantage: ``[B]`` (total return, copied to every token), ``[B, T]``
    with ``turn_ids`` (e.g. reward-to-go per turn, so an action is credited only with later rewards), or
    ``[B, L-1]``. ``baseline`` (optional, same shape as ``coefficients``) is subtracted first. Returns
    ``[B, L-1]``; mask and normalise it with :func:`agent_lab.estimators.aggregate`.
    Book: part1/03_score_function_reinforce, part2/02_trajectory_probability.
    """
    logprobs = as_float_tensor("logprobs", logprobs, finite=False)
    check_ndim("logprobs", logprobs, (2,), "[B, L-1]")
    coefficients = as_float_tensor("coefficients", coefficients)
    if baseline is not None:
        baseline = as_float_like("baseline", baseline, coefficients)
        if baseline.shape != coefficients.shape:
            raise ValueError(f"baseline must have the shape of coefficients {tuple(coefficients.shape)}, got {tuple(baseline.shape)}")
        coefficients = coefficients - baseline
    weight = expand_to_tokens(coefficients.detach(), logprobs, turn_ids).to(logprobs.dtype)
    return weight * logprobs


def _ppo_stats(ratio: Tensor, token_log_ratio: Tensor, adv: Tensor, mask: Tensor, low: float, high: float) -> dict[str, Tensor]:
    """Diagnostics over masked tokens (detached 0-dim tensors; see ppo_clipped_surrogate)."""
    with torch.no_grad():
        ratio, token_log_ratio = ratio.detach(), token_log_ratio.detach()
        pos, neg = mask & (adv > 0), mask & (adv < 0)
        clipped_pos = pos & (ratio > 1.0 + high)  # min() picks the flat clipped branch: no gradient
        clipped_neg = neg & (ratio < 1.0 - low)
        n = mask.sum()
        nan = torch.full((), float("nan"), dtype=ratio.dtype, device=ratio.device)

        def share(part: Tensor, whole: Tensor) -> Tensor:
            # Integer counts divided in float64 (a half-precision count overflows past 65504 tokens), then
            # returned in the ratio's dtype.
            return (part.sum().double() / whole.sum().clamp(min=1).double()).to(ratio.dtype)

        valid = bool(n > 0)
        masked_ratio = ratio[mask]
        # The tokens were sampled from the old policy, so it is kl_estimate's first argument (p = old, q = new;
        # only log q - log p = log rho matters): k3 = (rho - 1) - log rho estimates KL(old || new) without bias.
        # (1/rho - 1) + log rho, the k3 of KL(new || old), averages to chi^2(old || new) - KL(old || new) here.
        kl = kl_estimate(torch.zeros_like(token_log_ratio), token_log_ratio, "k3")[mask].mean() if valid else nan
        return {
            "clip_frac_pos": share(clipped_pos, pos),
            "clip_frac_neg": share(clipped_neg, neg),
            "ratio_mean": masked_ratio.mean() if valid else nan,
            "ratio_max": masked_ratio.max() if valid else nan,
            "ratio_min": masked_ratio.min() if valid else nan,
            KL_OLD_NEW: kl,
            "approx_kl": kl,  # the former name, kept for existing callers; same value
            "n_pos": pos.sum(),
            "n_neg": neg.sum(),
            "n_tokens": n,
        }


def ppo_clipped_surrogate(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Any,
    action_mask: Tensor,
    clip_eps: float = 0.2,
    *,
    clip_eps_high: float | None = None,
    ratio_level: str = "token",
    turn_ids: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    r"""PPO's clipped surrogate per token, to maximise, with clip statistics.

    .. math:: s_j = \min\!\left(\rho_j \hat A_j,\ \operatorname{clip}(\rho_j, 1-\epsilon, 1+\epsilon_{\text{high}}) \hat A_j\right),
              \qquad \rho_j = \exp(\log\pi_\theta(x_j) - \log\pi_{\text{old}}(x_j))

    The ratio is formed in log space from the *stored* ``old_logprobs``. For :math:`\hat A>0` the surrogate
    stops growing once :math:`\rho > 1+\epsilon_{\text{high}}`; for :math:`\hat A<0` once
    :math:`\rho < 1-\epsilon` (foundations chapter section 10). ``clip_eps_high`` defaults to ``clip_eps`` (set it
    higher for DAPO-style asymmetric clipping). ``ratio_level="sequence"`` uses one ratio per sequence,
    the geometric mean of its token ratios (GSPO style), on every token of the sequence.

    Shapes: ``logprobs``, ``old_logprobs``, ``action_mask``: ``[B, L-1]``; ``advantages`` ``[B]``,
    ``[B, L-1]`` or ``[B, T]`` with ``turn_ids``. Returns ``(per_token [B, L-1], stats)``; the surrogate is
    exactly 0 outside ``action_mask``. ``stats`` holds detached 0-dim tensors: ``clip_frac_pos`` /
    ``clip_frac_neg`` (share of masked tokens with A>0 / A<0 whose ratio is clipped; 0 when there are no
    such tokens), ``ratio_mean``, ``ratio_max``, ``ratio_min`` (over masked tokens), ``kl_old_new_k3_on_old``
    (:data:`KL_OLD_NEW`): the mean over masked tokens of :math:`(\rho_j - 1) - \log\rho_j` with the *token*
    ratio :math:`\rho_j`, the unbiased k3 estimate of :math:`D_{\mathrm{KL}}(\pi_{\text{old}}\Vert\pi_\theta)`
    per token, because the tokens were sampled from :math:`\pi_{\text{old}}` (``approx_kl`` is the same
    value under its former name; these five are NaN when no token is masked in), and the counts ``n_pos``,
    ``n_neg``, ``n_tokens``. Clipping is not a KL guarantee: log them.
    Book: part1/07_off_policy_ppo_kl_rewards.
    """
    low = unit_interval("clip_eps", clip_eps)
    high = low if clip_eps_high is None else float(clip_eps_high)
    if not high >= 0.0:
        raise ValueError(f"clip_eps_high must be a non-negative number, got {clip_eps_high!r}")
    if ratio_level not in ("token", "sequence"):
        raise ValueError(f"ratio_level must be 'token' or 'sequence', got {ratio_level!r}")
    logprobs = as_float_tensor("logprobs", logprobs, finite=False)
    check_ndim("logprobs", logprobs, (2,), "[B, L-1]")
    mask = as_mask("action_mask", action_mask, logprobs.shape)
    adv = expand_to_tokens(advantages, logprobs, turn_ids, name="advantages").detach().to(logprobs.dtype)
    adv = torch.where(mask, adv, torch.zeros_like(adv))
    if ratio_level == "token":
        log_ratio = token_log_ratios(logprobs, old_logprobs, mask)
    else:
        seq = sequence_log_ratios(logprobs, old_logprobs, mask, normalize="mean")
        log_ratio = torch.where(mask, seq[:, None].expand_as(logprobs), torch.zeros_like(logprobs))
    check_finite("logprobs - old_logprobs on action tokens", log_ratio)
    ratio = torch.exp(log_ratio)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1.0 - low, 1.0 + high) * adv)
    surrogate = torch.where(mask, surrogate, torch.zeros_like(surrogate))
    token_log_ratio = log_ratio if ratio_level == "token" else token_log_ratios(logprobs, old_logprobs, mask)
    return surrogate, _ppo_stats(ratio, token_log_ratio, adv, mask, low, high)
