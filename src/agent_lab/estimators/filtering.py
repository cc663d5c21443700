"""Filtering samples before an update.

ReST-EM filtering keeps the successful samples for an SFT-style update, and keeps everything for analysis
(lecture section "Why SFT, filtered self-training, and RL differ", lecture notes section 2). Dynamic sampling
(DAPO) keeps the task groups whose rewards disagree, the only ones a centred group advantage learns from.
Planner guidance picks the groups no sample solved, where a group advantage has nothing to learn from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ._validation import as_float_tensor, check_ndim, group_count, positive_int

__all__ = ["RestEMSelection", "rest_em_filter", "mixed_group_rows", "unsolved_groups"]


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

    (lecture notes section 2; threshold 1 for binary reward). With ``group_size`` and ``max_per_group``, at most
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


def mixed_group_rows(rewards: Any, group_size: int, n_groups: int) -> Tensor:
    r"""Rows of ``n_groups`` task groups for an update, groups whose rewards disagree first (dynamic sampling).

    A group whose samples all earn the same reward has centred advantages :math:`A_{ij} = R_{ij} - \bar R_i = 0`
    and adds nothing to a group-relative gradient. Dynamic sampling (DAPO, Yu et al. 2025) samples extra groups
    and trains on the informative ones. This picks, in row order, the groups with :math:`\min_j R_{ij} <
    \max_j R_{ij}`, then tops up with all-equal groups (again in order) if fewer than ``n_groups`` disagree, so
    the update always holds ``n_groups * group_size`` rows and its normaliser is unchanged. Shapes: ``rewards``
    ``[B]`` in contiguous groups with ``B >= n_groups * group_size``; returns the row indices, a ``[n_groups *
    group_size]`` long tensor, each group's rows contiguous and in their original order.
    Used by the dynamic-sampling plug-in (flag ``resample_rounds``, :mod:`agent_lab.plugins.sampling`).
    Book: part3/01_crafting.md.
    """
    rewards = as_float_tensor("rewards", rewards)
    groups = group_count(rewards, group_size)
    n_groups = positive_int("n_groups", n_groups)
    if n_groups > groups:
        raise ValueError(f"n_groups={n_groups} is more than the {groups} groups in rewards; sample more groups")
    grouped = rewards.reshape(groups, group_size)
    mixed = grouped.amin(dim=1) < grouped.amax(dim=1)
    order = torch.cat([mixed.nonzero().reshape(-1), (~mixed).nonzero().reshape(-1)])[:n_groups]
    return (order[:, None] * group_size + torch.arange(group_size)).reshape(-1)


def unsolved_groups(rewards: Any, group_size: int, threshold: float = 1.0) -> Tensor:
    r"""Which task groups no sample solved: ``[n_groups]`` bool, True where :math:`\max_j R_{ij} < \text{threshold}`.

    Such a group has centred advantages :math:`A_{ij} = R_{ij} - \bar R_i = 0` for binary rewards, so a group
    algorithm learns nothing from the task however often it is drawn; the planner-guidance plug-in (flag
    ``guide_coef``, :mod:`agent_lab.plugins.losses`) imitates the planner's demonstration of exactly these
    tasks. Shapes: ``rewards`` ``[B]`` in contiguous groups of ``group_size`` (pass success as 0/1 to ignore
    shaping).
    Book: part3/01_crafting.md.
    """
    rewards = as_float_tensor("rewards", rewards)
    groups = group_count(rewards, group_size)
    return rewards.reshape(groups, group_size).amax(dim=1) < float(threshold)
