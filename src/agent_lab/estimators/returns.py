"""Returns over padded ``[B, T]`` turn batches: reward-to-go and bootstrapped discounted returns.

Lecture notes section 5 (reward-to-go) and foundations chapter sections 4 and 8 (returns, termination versus
truncation).
Each function's docstring names the book chapter (``book/partN/...``) that explains it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._validation import (
    as_float_like,
    as_float_tensor,
    as_mask,
    check_ndim,
    check_trailing_padding,
    unit_interval,
)

__all__ = ["reward_to_go", "discounted_returns", "final_values"]


def reward_to_go(rewards: Any, gamma: float = 1.0, mask: Tensor | None = None) -> Tensor:
    r"""Discounted reward-to-go along the last dimension, in one reverse pass.

    .. math:: G_t = \sum_{k=t}^{T-1} \gamma^{k-t} r_k = r_t + \gamma G_{t+1}, \qquad G_T = 0

    Shapes: ``rewards`` is ``[..., T]`` (``[T]`` one trajectory, ``[B, T]`` a batch); the result has the
    same shape and dtype. ``mask`` (same shape, bool or 0/1) marks real steps; padding must come at the end
    of each row, padded steps count as reward zero and get return zero. No bootstrap value is added: every
    row is treated as terminated (use :func:`discounted_returns` for truncated rows).

    Normalisation: none (a sum of discounted rewards). ``gamma`` must lie in [0, 1].
    Book: part1/05_reward_to_go_td_gae.
    """
    rewards = as_float_tensor("rewards", rewards)
    if rewards.ndim == 0:  # any number of leading dimensions, up to torch's own limit
        raise ValueError("rewards must have shape [..., T] with at least one dimension, got shape ()")
    gamma = unit_interval("gamma", gamma)
    if mask is not None:
        real = as_mask("mask", mask, rewards.shape)
        check_trailing_padding("mask", real)
        rewards = torch.where(real, rewards, torch.zeros_like(rewards))
    out = torch.empty_like(rewards)
    running = torch.zeros_like(rewards[..., 0])
    # The recursion G_t = r_t + gamma G_{t+1} is the scalar lecture API's loop, vectorised over rows,
    # so the two agree bit for bit in float64. Trailing padding has reward 0, so its return stays 0.
    for t in range(rewards.shape[-1] - 1, -1, -1):
        running = rewards[..., t] + gamma * running
        out[..., t] = running
    return out


def _turn_inputs(rewards: Any, turn_mask: Any, terminated: Any, bootstrap_values: Any) -> tuple[Tensor, Tensor, Tensor]:
    """Validate the shared ``[B, T]`` inputs; return (rewards, real-turn mask, final value per row)."""
    rewards = as_float_tensor("rewards", rewards)
    check_ndim("rewards", rewards, (2,), "[B, T] (one reward per turn)")
    real = as_mask("turn_mask", turn_mask, rewards.shape)
    check_trailing_padding("turn_mask", real)
    done = as_mask("terminated", terminated, rewards.shape[:1])
    return rewards, real, final_values(done, bootstrap_values, rewards)


def final_values(terminated: Tensor, bootstrap_values: Any, like: Tensor) -> Tensor:
    r"""Value of the state after each row's last real turn: 0 if terminated, else the bootstrap value.

    .. math:: V_{\text{final}, i} = (1 - d_i)\, \hat V(h_{T_i})

    A true terminal state has no future; a truncated row (``terminated`` false: the collector ran out of
    turns) is continued by the critic's estimate ``bootstrap_values[i]``. ``bootstrap_values=None`` is the
    rule for critic-free methods: the truncated row is scored as if it had ended (value 0). Shapes:
    ``terminated`` ``[B]`` bool, ``bootstrap_values`` ``[B]`` or None; returns ``[B]``.
    Book: part1/05_reward_to_go_td_gae.
    """
    batch = like.shape[0]
    if bootstrap_values is None:
        return torch.zeros(batch, dtype=like.dtype, device=like.device)
    boot = as_float_like("bootstrap_values", bootstrap_values, like)
    if tuple(boot.shape) != (batch,):
        raise ValueError(f"bootstrap_values must have shape ({batch},) (one value per row), got {tuple(boot.shape)}")
    return torch.where(terminated, torch.zeros_like(boot), boot)


def discounted_returns(
    rewards: Any,
    turn_mask: Tensor,
    gamma: float,
    terminated: Tensor,
    bootstrap_values: Any = None,
) -> Tensor:
    r"""Discounted return of every real turn, bootstrapping only rows that were truncated.

    For row i with :math:`T_i` real turns and done flag :math:`d_i`,

    .. math:: G_{i,t} = \sum_{k=t}^{T_i-1} \gamma^{k-t} r_{i,k} + \gamma^{T_i - t} (1 - d_i)\, \hat V_i

    Shapes: ``rewards`` ``[B, T]``; ``turn_mask`` ``[B, T]`` (bool or 0/1, real turns first, padding at the
    end); ``terminated`` ``[B]`` bool (true terminal state, no future value); ``bootstrap_values`` ``[B]``
    critic value of the state after the last real turn, used only where ``terminated`` is false (None:
    zero, see :func:`final_values`). Returns ``[B, T]`` with zeros at padded turns.
    Normalisation: none. ``gamma`` must lie in [0, 1].
    Book: part1/05_reward_to_go_td_gae, part2/03_critics_and_importance_sampling.
    """
    rewards, real, final = _turn_inputs(rewards, turn_mask, terminated, bootstrap_values)
    gamma = unit_interval("gamma", gamma)
    out = torch.zeros_like(rewards)
    running = final  # before the last real turn the "return" is the value of what follows it
    for t in range(rewards.shape[1] - 1, -1, -1):
        step = real[:, t]
        running = torch.where(step, rewards[:, t] + gamma * running, running)
        out[:, t] = torch.where(step, running, torch.zeros_like(running))
    return out
