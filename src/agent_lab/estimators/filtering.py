"""ReST-EM filtering: keep the successful samples for an SFT-style update, and keep everything for analysis.

Lecture sections: "Why SFT, filtered self-training, and RL differ" (seed 000 section 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from ._validation import as_float_tensor, check_ndim, group_count, positive_int

__all__ = ["RestEMSelection", "rest_em_filter"]


@dataclass(frozen=True)
class RestEMSelection:
    """The outcome of :func:`rest_em_filter`.

    ``keep`` ``[B]`` bool marks the samples the filtered loss trains on; ``weights`` ``[B]`` is ``keep`` as
    floats (multiply per-sequence losses by it); ``scores`` ``[B]`` holds every sample's reward, failures
    included, for analysis; ``kept`` / ``rejected`` are index tensors; ``success`` ``[B]`` bool marks every
    sample at or above the threshold (``keep`` is a subset when ``max_per_group`` caps a group);
    ``success_rate`` is a 0-dim tensor.
    """

    keep: Tensor
    weights: Tensor
    scores: Tensor
    kept: Tensor
    rejected: Tensor
    success: Tensor
    success_rate: Tensor


def rest_em_filter(
    rewards: Any,
    threshold: float = 1.0,
    *,
    group_size: int | None = None,
    max_per_group: int | None = None,
) -> RestEMSelection:
    r"""Binary filter of ReST-EM: train on :math:`D^+ = \{\tau : R(\tau) \ge \text{threshold}\}`.

    .. math:: \mathcal L_{\text{filter}}(\theta') = -\mathbb E_{\tau \in D^+} \sum_t \log \pi_{\theta'}(a_t \mid h_t)

    (seed 000 section 2; threshold 1 for binary reward). With ``group_size`` and ``max_per_group``, at most
    that many successes per task are kept (the first ones in row order), so easy tasks do not flood the
    dataset. Nothing is dropped from ``scores``: failures are retained for analysis even though the
    filtered loss never trains on them. A batch without successes keeps nothing (the method then learns
    nothing). Shapes: ``rewards`` ``[B]``; see :class:`RestEMSelection`.
    Book: part1/02_sft_rest_rl.
    """
    rewards = as_float_tensor("rewards", rewards)
    check_ndim("rewards", rewards, (1,), "[B] (one score per sample)")
    threshold = float(threshold)
    success = rewards >= threshold
    keep = success
    if max_per_group is not None:
        cap = positive_int("max_per_group", max_per_group)
        if group_size is None:
            raise ValueError("group_size is required with max_per_group (the cap is per task group)")
        groups = group_count(rewards, group_size)
        grouped = success.reshape(groups, group_size)
        # Rank of each success within its group (1 for the first), so the first `cap` are kept.
        rank = grouped.long().cumsum(dim=1)
        keep = (grouped & (rank <= cap)).reshape(-1)
    elif group_size is not None:
        group_count(rewards, group_size)
    return RestEMSelection(
        keep=keep,
        weights=keep.to(rewards.dtype),
        scores=rewards.detach().clone(),
        kept=keep.nonzero().reshape(-1),
        rejected=(~keep).nonzero().reshape(-1),
        success=success,
        success_rate=success.to(rewards.dtype).mean(),
    )
