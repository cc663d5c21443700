"""Baselines: constant, running mean, variance-optimal constant, leave-one-out and group mean.

A baseline b is subtracted from the return before it multiplies the score. If b does not depend on the
sampled action the expected gradient is unchanged (lecture notes section 4, foundations chapter section 7); only the
variance moves. Group baselines use the other samples of the same task (foundations chapter section 12).
Lecture sections: "Baselines" and "Group-relative advantages".
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._validation import as_float_like, as_float_tensor, check_ndim, group_count

__all__ = [
    "constant_baseline",
    "running_mean_update",
    "optimal_constant_baseline",
    "group_mean_baseline",
    "leave_one_out_baseline",
]


def constant_baseline(rewards: Any, value: float) -> Tensor:
    r"""The same baseline :math:`b_i = b` for every sample: a tensor shaped like ``rewards``, filled with ``value``.

    Unbiased for any finite constant, because :math:`\mathbb E[b \nabla \log \pi] = b \nabla 1 = 0`.
    Book: part1/04_baselines.
    """
    rewards = as_float_tensor("rewards", rewards)
    level = as_float_tensor("value", value)
    if level.numel() != 1:
        raise ValueError(f"value must be a single number, got shape {tuple(level.shape)}")
    return torch.full_like(rewards, float(level))


def running_mean_update(mean: Any, count: int, rewards: Any) -> tuple[Tensor, int]:
    r"""Fold a batch of returns into a running mean (a baseline carried across updates).

    .. math:: n' = n + N, \qquad \bar R' = \bar R + \frac{\sum_{i=1}^{N} R_i - N \bar R}{n'}

    ``mean`` is the mean of the ``count`` returns seen so far (any value when ``count`` is 0); ``rewards`` is
    the new batch (any shape, all entries used). Returns ``(new_mean, new_count)``: a 0-dim tensor and an int.
    The baseline for a batch must be the mean *before* that batch is folded in, or it depends on the
    batch's own actions.
    Book: part1/04_baselines.
    """
    rewards = as_float_tensor("rewards", rewards).detach()
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"count must be a non-negative integer, got {count!r}")
    old = as_float_like("mean", mean, rewards).detach()
    if old.numel() != 1:
        raise ValueError(f"mean must be a single number, got shape {tuple(old.shape)}")
    old = old.reshape(())
    if count == 0:
        old = torch.zeros_like(old)
    new_count = count + rewards.numel()
    new_mean = old + (rewards.sum() - rewards.numel() * old) / new_count
    return new_mean, new_count


def optimal_constant_baseline(
    rewards: Any,
    scores: Any,
    weights: Any = None,
    *,
    per_dimension: bool = False,
) -> Tensor:
    r"""The constant baseline that minimises the variance of :math:`(R - b) Z`.

    .. math:: b^* = \frac{\mathbb E[R Z^2]}{\mathbb E[Z^2]}

    where Z is the score :math:`\nabla_\theta \log \pi_\theta(a \mid h)` along one parameter direction
    (lecture notes section 4). Because :math:`\mathbb E[Z] = 0` under the sampling policy, minimising the second
    moment :math:`\mathbb E[(R-b)^2 Z^2]` minimises the variance. ``E`` is the sample mean, or the
    ``weights``-weighted mean when ``weights`` (``[N]``, non-negative, e.g. exact probabilities) is given.

    Shapes: ``rewards`` ``[N]``; ``scores`` ``[N]`` or ``[N, D]``. For ``[N, D]`` the default returns one
    scalar that minimises the total variance (the trace), with :math:`Z^2` read as :math:`\lVert Z\rVert^2`;
    ``per_dimension=True`` returns ``[D]``, one optimal constant per parameter direction.
    Book: part1/04_baselines.
    """
    rewards = as_float_tensor("rewards", rewards)
    check_ndim("rewards", rewards, (1,), "[N]")
    scores = as_float_like("scores", scores, rewards)
    check_ndim("scores", scores, (1, 2), "[N] or [N, D]")
    if scores.shape[0] != rewards.shape[0]:
        raise ValueError(f"scores has {scores.shape[0]} rows but rewards has {rewards.shape[0]}; pass one score per reward")
    if weights is None:
        w = torch.full_like(rewards, 1.0 / rewards.shape[0])
    else:
        w = as_float_like("weights", weights, rewards)
        if w.shape != rewards.shape:
            raise ValueError(f"weights must have shape {tuple(rewards.shape)}, got {tuple(w.shape)}")
        if bool((w < 0).any()):
            raise ValueError("weights must be non-negative")
    squared = scores.square()
    if scores.ndim == 2 and not per_dimension:
        squared = squared.sum(dim=1)
    elif scores.ndim == 1 and per_dimension:
        squared = squared[:, None]
    w_col = w if squared.ndim == 1 else w[:, None]
    r_col = rewards if squared.ndim == 1 else rewards[:, None]
    denominator = (w_col * squared).sum(dim=0)
    if bool((denominator <= 0).any()):
        raise ValueError("E[Z^2] is zero (every score is zero), so b* = E[R Z^2]/E[Z^2] is undefined")
    return (w_col * r_col * squared).sum(dim=0) / denominator


def group_mean_baseline(rewards: Any, group_size: int) -> Tensor:
    r"""Mean return of each sample's own group, repeated for every member.

    .. math:: b_j = \bar R = \frac{1}{G} \sum_{k=1}^{G} R_k

    The mean includes the sample's own return, so it is *not* action-independent: the expected gradient
    of :math:`(R_j - \bar R)\nabla\log\pi(a_j)` is :math:`(G-1)/G` of the true gradient for i.i.d. samples.
    Shapes: ``rewards`` ``[B]`` made of ``B/G`` contiguous groups; returns ``[B]``.
    Book: part1/06_group_relative_advantages.
    """
    rewards = as_float_tensor("rewards", rewards)
    groups = group_count(rewards, group_size)
    means = rewards.reshape(groups, group_size).mean(dim=1, keepdim=True)
    return means.expand(groups, group_size).reshape(-1)


def leave_one_out_baseline(rewards: Any, group_size: int) -> Tensor:
    r"""Mean return of the *other* members of each sample's group (RLOO).

    .. math:: b_j^{\text{LOO}} = \frac{1}{G-1} \sum_{k \ne j} R_k

    Independent of sample j given the task, hence unbiased. Needs ``group_size`` of at least 2.
    Shapes: ``rewards`` ``[B]`` made of ``B/G`` contiguous groups; returns ``[B]``.
    Book: part1/04_baselines, part2/04_kl_and_group_baselines.
    """
    rewards = as_float_tensor("rewards", rewards)
    groups = group_count(rewards, group_size, minimum=2)
    grouped = rewards.reshape(groups, group_size)
    return ((grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)).reshape(-1)
