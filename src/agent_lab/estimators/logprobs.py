"""Token log-probabilities, entropy, token/sequence log-ratios and KL estimators.

Tensor contract (foundations chapter section 18): for causal logits ``logits[:, :-1]`` the target is
``input_ids[:, 1:]``; every ``[B, L-1]`` tensor here is aligned with the *target* token.
Lecture sections: "Importance sampling and policy versions", "KL regularization and the reference policy"
and "Entropy and exploration" (foundations chapter sections 9, 11 and 15).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._validation import as_float_tensor, as_mask, check_ndim, check_same_shape

__all__ = [
    "token_logprobs",
    "entropy_from_logits",
    "token_log_ratios",
    "sequence_log_ratios",
    "kl_estimate",
    "KL_KINDS",
]

KL_KINDS = ("k1", "k2", "k3")


def _logits(logits: Any) -> Tensor:
    if not isinstance(logits, Tensor) or not logits.is_floating_point():
        raise ValueError(f"logits must be a floating torch.Tensor [..., V], got {type(logits).__name__}")
    if logits.ndim < 1 or logits.shape[-1] == 0 or logits.numel() == 0:
        raise ValueError(f"logits must be non-empty with a vocabulary dimension last, got shape {tuple(logits.shape)}")
    # Half-precision logits are upcast: log-softmax over a large vocabulary in bf16 loses ~3 digits.
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def token_logprobs(logits: Tensor, targets: Tensor) -> Tensor:
    r"""Log-probability of each target token under the logits.

    .. math:: \log \pi_\theta(x_{j+1} \mid x_{\le j}) = z_{j, x_{j+1}} - \log \textstyle\sum_v e^{z_{j,v}}

    Shapes: ``logits`` ``[B, L-1, V]`` (already shifted: position j predicts ``targets[:, j]``), ``targets``
    ``[B, L-1]`` integer ids in ``[0, V)``; returns ``[B, L-1]`` (float32 for half-precision logits).
    Gather-minus-logsumexp avoids materialising the full ``[B, L-1, V]`` log-softmax.
    Book: part2/00_nested_policies, part2/09_tensor_contract.
    """
    logits = _logits(logits)
    if not isinstance(targets, Tensor) or targets.dtype.is_floating_point or targets.dtype == torch.bool:
        got = targets.dtype if isinstance(targets, Tensor) else type(targets).__name__
        raise ValueError(f"targets must be an integer torch.Tensor of token ids, got {got}")
    if tuple(logits.shape[:-1]) != tuple(targets.shape):
        raise ValueError(
            f"logits has shape {tuple(logits.shape)} so targets must have shape {tuple(logits.shape[:-1])}, "
            f"got {tuple(targets.shape)}"
        )
    vocab = logits.shape[-1]
    if bool(((targets < 0) | (targets >= vocab)).any()):
        raise ValueError(f"targets must be token ids in [0, {vocab}), got values in [{int(targets.min())}, {int(targets.max())}]")
    picked = logits.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: Tensor) -> Tensor:
    r"""Entropy of the categorical distribution given by logits, over the last dimension.

    .. math:: \mathcal H = -\sum_v \pi_v \log \pi_v, \qquad \log \pi = \operatorname{log\_softmax}(z)

    Numerically stable: computed from log-softmax, so logits of any magnitude work; entries at ``-inf``
    (a masked vocabulary) contribute exactly 0 and give a finite gradient. Shapes: ``[..., V]`` -> ``[...]``.
    In nats. Sign: this is the quantity an entropy *bonus* adds to the objective to maximise.
    Book: part2/07_entropy_and_constraints.
    """
    logits = _logits(logits)
    log_p = torch.log_softmax(logits, dim=-1)
    # 0 * log 0 := 0. Replace -inf before multiplying so the backward pass has no 0 * inf = NaN either.
    safe_log_p = torch.where(torch.isfinite(log_p), log_p, torch.zeros_like(log_p))
    return -(log_p.exp() * safe_log_p).sum(dim=-1)


def _pair(name: str, logprobs: Any, other_name: str, other: Any) -> tuple[Tensor, Tensor]:
    a = as_float_tensor("logprobs", logprobs, finite=False)
    b = as_float_tensor(other_name, other, finite=False)
    check_same_shape(other_name, b, name, a)
    return a, b


def token_log_ratios(logprobs: Any, old_logprobs: Any, action_mask: Tensor | None = None) -> Tensor:
    r"""Per-token log importance ratio, kept in log space.

    .. math:: \log \rho_j = \log \pi_\theta(x_j \mid \cdot) - \log \mu(x_j \mid \cdot)

    ``old_logprobs`` are the behaviour log-probs stored at sampling time (never recomputed from
    re-tokenised text); they are detached here. Positions outside ``action_mask`` get log-ratio 0
    (ratio 1), whatever the stored value there. Shapes: ``[B, L-1]`` in, ``[B, L-1]`` out.
    Book: part2/03_critics_and_importance_sampling.
    """
    lp, old = _pair("logprobs", logprobs, "old_logprobs", old_logprobs)
    diff = lp - old.detach()
    if action_mask is None:
        return diff
    mask = as_mask("action_mask", action_mask, lp.shape)
    return torch.where(mask, diff, torch.zeros_like(diff))


def sequence_log_ratios(
    logprobs: Any, old_logprobs: Any, action_mask: Tensor, normalize: str = "sum"
) -> Tensor:
    r"""Per-sequence log importance ratio: the sum (or mean) of the masked token log-ratios.

    .. math:: \log \rho_i = \sum_j m_{ij} \log\rho_{ij} \quad (\texttt{"sum"}: \text{product of token ratios}),
              \qquad \frac{\sum_j m_{ij}\log\rho_{ij}}{\sum_j m_{ij}} \quad (\texttt{"mean"}: \text{geometric mean})

    The product ratio is the exact sequence importance weight but has enormous variance on long
    sequences (foundations chapter section 9); the length-normalised geometric mean (GSPO style) is a biased,
    tamer alternative. A row without action tokens gets 0. Shapes: ``[B, L-1]`` in, ``[B]`` out.
    Book: part2/03_critics_and_importance_sampling.
    """
    if normalize not in ("sum", "mean"):
        raise ValueError(f"normalize must be 'sum' or 'mean', got {normalize!r}")
    if action_mask is None:
        raise ValueError("action_mask is required: a sequence ratio multiplies only the policy's own tokens")
    per_token = token_log_ratios(logprobs, old_logprobs, action_mask)
    check_ndim("logprobs", per_token, (2,), "[B, L-1]")
    total = per_token.sum(dim=1)
    if normalize == "sum":
        return total
    counts = as_mask("action_mask", action_mask, per_token.shape).sum(dim=1).clamp(min=1)
    return total / counts


def kl_estimate(
    logprobs: Any, ref_logprobs: Any, kind: str = "k1", action_mask: Tensor | None = None
) -> Tensor:
    r"""Per-token Monte Carlo estimate of :math:`D_{\mathrm{KL}}(p \Vert q)` from tokens sampled from ``p``.

    ``p`` is the policy whose log-probs are ``logprobs`` (the *first* argument, the sampling distribution),
    ``q`` the one in ``ref_logprobs``. With :math:`\log r = \log q - \log p` at each sampled token:

    * ``"k1"``: :math:`-\log r` (unbiased, can be negative, high variance);
    * ``"k2"``: :math:`\tfrac12 (\log r)^2` (non-negative, biased: its mean is not the KL);
    * ``"k3"``: :math:`(r - 1) - \log r` (non-negative and unbiased, because :math:`\mathbb E_p[r] = 1`).

    The direction follows the sampling distribution: ``kl_estimate(logprobs, ref_logprobs)`` on samples
    from :math:`\pi_\theta` estimates :math:`D_{\mathrm{KL}}(\pi_\theta \Vert \pi_{\text{ref}})`, and
    ``kl_estimate(old_logprobs, logprobs)`` on samples from the behaviour policy estimates
    :math:`D_{\mathrm{KL}}(\pi_{\text{old}} \Vert \pi_\theta)` (a statistic: the second argument is detached,
    so no gradient reaches :math:`\theta` that way). On samples from any other policy the
    average estimates something else (foundations chapter section 20): :math:`\mathbb E_p[(1/r - 1) + \log r]`, for
    instance, is :math:`\chi^2(p \Vert q) - D_{\mathrm{KL}}(p \Vert q)`, not a KL. Summing over a sequence
    gives the sequence KL; dividing by length changes the objective (foundations chapter section 11). Positions outside
    ``action_mask`` are 0. Shapes: ``[B, L-1]`` (any equal shapes) in and out. ``ref_logprobs`` is detached.

    As a *loss term* (differentiated through ``logprobs`` on tokens sampled from :math:`\pi_\theta`, with no
    score-function term for the sampling) the three differ in what their expected gradient is: ``"k1"``
    gives 0, ``"k2"`` gives :math:`\nabla D_{\mathrm{KL}}(\pi_\theta\Vert\pi_{\text{ref}})` and ``"k3"`` gives
    :math:`\nabla D_{\mathrm{KL}}(\pi_{\text{ref}}\Vert\pi_\theta)`, the reverse direction.
    Book: part2/04_kl_and_group_baselines.
    """
    if kind not in KL_KINDS:
        raise ValueError(f"kind must be one of {KL_KINDS}, got {kind!r}")
    lp, ref = _pair("logprobs", logprobs, "ref_logprobs", ref_logprobs)
    log_r = ref.detach() - lp
    if action_mask is not None:
        mask = as_mask("action_mask", action_mask, lp.shape)
        log_r = torch.where(mask, log_r, torch.zeros_like(log_r))
    if kind == "k1":
        return -log_r
    if kind == "k2":
        return 0.5 * log_r.square()
    return torch.expm1(log_r) - log_r
