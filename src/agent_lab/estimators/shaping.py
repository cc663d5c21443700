"""Potential-based reward shaping.

Lecture sections: "Reward-to-go improves temporal credit assignment" (lecture notes section 5) and
"Multi-turn credit assignment" (foundations chapter section 14).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._validation import as_float_like, as_float_tensor, as_mask, check_ndim, check_trailing_padding, unit_interval

__all__ = ["potential_based_shaping"]


def potential_based_shaping(
    rewards: Any,
    potentials: Any,
    gamma: float,
    turn_mask: Tensor | None = None,
    terminated: Tensor | None = None,
) -> Tensor:
    r"""Add the shaping term :math:`F_t = \gamma \Phi(s_{t+1}) - \Phi(s_t)` to each turn's reward.

    .. math:: \tilde r_t = r_t + \gamma \Phi(s_{t+1}) - \Phi(s_t)

    Shapes: ``rewards`` ``[B, T]``; ``potentials`` ``[B, T+1]`` where column t is :math:`\Phi(s_t)` before
    turn t and, for a row with :math:`T_i` real turns, column :math:`T_i` is the potential of the state
    after its last turn. ``turn_mask`` ``[B, T]`` (real turns first) marks real turns; padded turns get 0.
    ``terminated`` ``[B]`` bool: a terminal state's potential is taken as 0, so the shaped return
    telescopes to :math:`\sum_t \gamma^t \tilde r_t = \sum_t \gamma^t r_t - \Phi(s_0)`, an action-independent
    shift. That is why the optimal policy is preserved in an MDP (Ng et al., 1999); the theorem's Markov
    assumptions must be checked for partially observed agents. Returns ``[B, T]``.
    Book: part1/05_reward_to_go_td_gae, part2/06_credit_assignment.
    """
    rewards = as_float_tensor("rewards", rewards)
    check_ndim("rewards", rewards, (2,), "[B, T] (one reward per turn)")
    gamma = unit_interval("gamma", gamma)
    phi = as_float_like("potentials", potentials, rewards)
    batch, turns = rewards.shape
    if tuple(phi.shape) != (batch, turns + 1):
        raise ValueError(f"potentials must have shape ({batch}, {turns + 1}) = [B, T+1], got {tuple(phi.shape)}")
    if turn_mask is None:
        real = torch.ones_like(rewards, dtype=torch.bool)
    else:
        real = as_mask("turn_mask", turn_mask, rewards.shape)
        check_trailing_padding("turn_mask", real)
    after = phi[:, 1:]
    if terminated is not None:
        done = as_mask("terminated", terminated, (batch,))
        lengths = real.sum(dim=1)
        # Column T_i of phi holds the state after the last turn; a terminal state has no future: Phi = 0.
        is_final = torch.arange(1, turns + 1, device=phi.device)[None, :] == lengths[:, None]
        after = torch.where(is_final & done[:, None], torch.zeros_like(after), after)
    shaped = rewards + gamma * after - phi[:, :-1]
    return torch.where(real, shaped, torch.zeros_like(shaped))
