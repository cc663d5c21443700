"""Advantages: group-centred (Dr.GRPO), group-standardised (GRPO), RLOO, one-step TD residual and GAE.

Group estimators take ``rewards`` ``[B]`` made of contiguous groups of ``group_size`` samples of one task
(rows ``[g*G, (g+1)*G)``). Turn estimators take padded ``[B, T]`` batches with a ``turn_mask``.
Lecture sections: "Group-relative advantages" (lecture notes section 6), "Actor-critic and temporal-difference
residuals" and "Group and leave-one-out baselines" (foundations chapter sections 8 and 12).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._validation import as_float_like, as_float_tensor, check_same_shape, group_count, unit_interval
from .returns import _turn_inputs

__all__ = [
    "group_centered_advantages",
    "group_standardized_advantages",
    "rloo_advantages",
    "td_residuals",
    "gae",
]


def _grouped(rewards: Any, group_size: int, minimum: int = 1) -> tuple[Tensor, Tensor, Tensor]:
    """Return (rewards as [B/G, G], centred rewards, bool [B/G, 1] marking all-equal groups)."""
    rewards = as_float_tensor("rewards", rewards)
    groups = group_count(rewards, group_size, minimum=minimum)
    grouped = rewards.reshape(groups, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    # An all-equal group has exactly zero advantage; floating-point means can leave ~1e-17 behind,
    # which a small std would blow up, so such groups are set to exact zeros.
    flat = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    return grouped, torch.where(flat, torch.zeros_like(centred), centred), flat


def group_centered_advantages(rewards: Any, group_size: int) -> Tensor:
    r"""Group-centred advantages (Dr.GRPO; the lecture's ``centered_group_advantages``, batched).

    .. math:: \hat A_j = R_j - \bar R, \qquad \bar R = \frac{1}{G} \sum_{k=1}^{G} R_k

    Sums to zero within each group; an all-equal group gives exact zeros. Because :math:`\bar R` includes
    :math:`R_j`, the expected policy gradient is :math:`(G-1)/G` of the true one (a uniform shrink, the
    direction is unbiased). Shapes: ``rewards`` ``[B]``, ``B`` a multiple of ``group_size``; returns ``[B]``.
    Book: part1/06_group_relative_advantages.
    """
    _, centred, _ = _grouped(rewards, group_size)
    return centred.reshape(-1)


def group_standardized_advantages(
    rewards: Any, group_size: int, eps: float = 1e-6, *, unbiased: bool = False
) -> Tensor:
    r"""Group-standardised advantages (GRPO).

    .. math:: \hat A_j = \frac{R_j - \bar R}{s + \varepsilon}, \qquad
              s = \sqrt{\tfrac{1}{G} \textstyle\sum_k (R_k - \bar R)^2}

    The std ``s`` is the **population** std (divide by G) by default; ``unbiased=True`` uses the sample std
    (divide by G-1, what ``torch.std`` gives, needs G >= 2). ``eps`` (default 1e-6) is added to the std,
    not to the variance. An all-equal group gives exact zeros. The result is invariant to adding a
    constant to a group's rewards and to scaling them by c > 0 (up to eps), which is why it is a
    *relative* score, not an absolute measure of utility. Dividing by a sample-dependent std makes the
    estimator biased. Shapes: ``rewards`` ``[B]``; returns ``[B]``.
    Book: part1/06_group_relative_advantages, part2/04_kl_and_group_baselines.
    """
    eps = float(eps)
    if not eps >= 0.0:
        raise ValueError(f"eps must be a non-negative number, got {eps!r}")
    _, centred, flat = _grouped(rewards, group_size, minimum=2 if unbiased else 1)
    divisor = group_size - 1 if unbiased else group_size
    std = (centred.square().sum(dim=1, keepdim=True) / divisor).sqrt()
    # All-equal groups have centred == 0 exactly; divide them by 1 so that eps=0 gives 0, not 0/0.
    scale = torch.where(flat, torch.ones_like(std), std + eps)
    return (centred / scale).reshape(-1)


def rloo_advantages(rewards: Any, group_size: int) -> Tensor:
    r"""REINFORCE leave-one-out advantages.

    .. math:: \hat A_j = R_j - \frac{1}{G-1} \sum_{k \ne j} R_k = \frac{G}{G-1} (R_j - \bar R)

    The baseline excludes sample j, so the estimator is unbiased for i.i.d. samples of one task. Needs
    ``group_size`` >= 2. Shapes: ``rewards`` ``[B]``; returns ``[B]``.
    Book: part2/04_kl_and_group_baselines.
    """
    _, centred, _ = _grouped(rewards, group_size, minimum=2)
    return (centred * (group_size / (group_size - 1))).reshape(-1)


def td_residuals(
    rewards: Any,
    values: Any,
    turn_mask: Tensor,
    gamma: float,
    terminated: Tensor,
    bootstrap_values: Any = None,
) -> Tensor:
    r"""One-step temporal-difference residuals per turn.

    .. math:: \delta_t = r_t + \gamma V(h_{t+1}) - V(h_t)

    where :math:`V(h_{T_i})` after the last real turn is 0 if the row terminated and
    ``bootstrap_values[i]`` if it was truncated (see :func:`agent_lab.estimators.final_values`).
    Shapes: ``rewards``, ``values`` (critic :math:`V(h_t)`, pass it detached), ``turn_mask``: ``[B, T]``;
    ``terminated`` ``[B]``; ``bootstrap_values`` ``[B]`` or None. Returns ``[B, T]``, zero at padded turns.
    Book: part1/05_reward_to_go_td_gae.
    """
    rewards, real, final = _turn_inputs(rewards, turn_mask, terminated, bootstrap_values)
    gamma = unit_interval("gamma", gamma)
    values = as_float_like("values", values, rewards)
    check_same_shape("values", values, "rewards", rewards)
    # V(h_{t+1}): the next column, except after each row's last real turn, where it is the final value.
    next_values = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], dim=1)
    next_real = torch.cat([real[:, 1:], torch.zeros_like(real[:, :1])], dim=1)
    last = real & ~next_real
    next_values = torch.where(last, final[:, None].expand_as(values), next_values)
    delta = rewards + gamma * next_values - values
    return torch.where(real, delta, torch.zeros_like(delta))


def gae(
    rewards: Any,
    values: Any,
    turn_mask: Tensor,
    gamma: float,
    lam: float,
    terminated: Tensor,
    bootstrap_values: Any = None,
) -> Tensor:
    r"""Generalised advantage estimation, GAE(gamma, lambda), per turn.

    .. math:: \hat A_t = \sum_{l=0}^{T_i-t-1} (\gamma\lambda)^l \delta_{t+l} = \delta_t + \gamma\lambda \hat A_{t+1}

    with :math:`\delta` from :func:`td_residuals` (same termination/truncation rule). ``lam = 0`` gives the
    TD residual; ``lam = 1`` gives the (bootstrapped) discounted return minus the value. Value targets
    for the critic are ``gae(...) + values``. Shapes as in :func:`td_residuals`; returns ``[B, T]``.
    ``gamma`` and ``lam`` must lie in [0, 1].
    Book: part1/05_reward_to_go_td_gae, part2/03_critics_and_importance_sampling.
    """
    lam = unit_interval("lam", lam)
    delta = td_residuals(rewards, values, turn_mask, gamma, terminated, bootstrap_values)
    decay = float(gamma) * lam
    out = torch.zeros_like(delta)
    running = torch.zeros_like(delta[:, 0])
    # Padded turns have delta 0 and come last, so the running sum enters each row's last real turn at 0.
    for t in range(delta.shape[1] - 1, -1, -1):
        running = delta[:, t] + decay * running
        out[:, t] = running
    return out
