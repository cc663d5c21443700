"""Turn-level credit: per-turn advantages on the tokens of their turn, a critic's GAE targets and value loss,
branching Monte Carlo values from saved states, and anchor-state groups.

Every estimator here produces a ``[B, T]`` per-turn advantage (``turn_mask`` marks the real turns, padding
at the end of each row) that :func:`turn_to_tokens` places on the ``[B, L-1]`` token grid. Lecture
section: "Multi-turn credit assignment" (foundations chapter section 14; section 8 for the critic).
Book: part2/06_credit_assignment.md, where each is compared with the exact advantage of number search.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

import torch
from torch import Tensor

from ._validation import (
    as_float_like,
    as_float_tensor,
    as_mask,
    check_finite,
    check_ndim,
    check_trailing_padding,
    positive_int,
)
from .advantages import gae, td_residuals
from .aggregation import masked_sum
from .policy_gradient import expand_to_tokens
from .returns import reward_to_go

__all__ = [
    "turn_to_tokens",
    "gae_targets",
    "value_loss",
    "branching_values",
    "branching_advantages",
    "branching_cost",
    "anchor_state_ids",
    "anchor_state_baselines",
    "anchor_state_advantages",
]


def _turn_mask(turn_mask: Any, shape: torch.Size) -> Tensor:
    real = as_mask("turn_mask", turn_mask, shape)
    check_trailing_padding("turn_mask", real)
    return real


def turn_to_tokens(turn_values: Any, turn_ids: Tensor, turn_mask: Tensor | None = None) -> Tensor:
    r"""Spread per-turn values ``[B, T]`` to the tokens of their turn: ``[B, L-1]``.

    .. math:: \hat A_{ij} = \hat A_{i,\,\mathrm{turn}(i,j)} \text{ where } \mathrm{turn}(i,j) \ge 0,
              \quad 0 \text{ elsewhere}

    ``turn_ids`` ``[B, L-1]`` (integer, the tensor contract's: the decision that generated target token j, -1
    on prompt, observation and padding tokens). Every token of a turn gets that turn's value, not a share of
    it: normalisation is the loss aggregation's job (:func:`agent_lab.estimators.aggregate`). With
    ``turn_mask`` ``[B, T]``, a token that points at a padded turn is an error (its value would be padding).
    Book: part2/06_credit_assignment, part2/09_tensor_contract.
    """
    values = as_float_tensor("turn_values", turn_values)
    check_ndim("turn_values", values, (2,), "[B, T] (one value per turn)")
    if not isinstance(turn_ids, Tensor) or turn_ids.ndim != 2:
        got = tuple(turn_ids.shape) if isinstance(turn_ids, Tensor) else type(turn_ids).__name__
        raise ValueError(f"turn_ids must be an integer torch.Tensor of shape [B, L-1], got {got}")
    tokens = expand_to_tokens(values, turn_ids, turn_ids, name="turn_values")  # checks ids, rows and range
    if turn_mask is not None:
        real = _turn_mask(turn_mask, values.shape)
        padded = (turn_ids >= 0) & ~real.gather(1, turn_ids.clamp(min=0).long())
        if bool(padded.any()):
            row, col = (int(i) for i in padded.nonzero()[0])
            raise ValueError(f"turn_ids[{row}, {col}] = {int(turn_ids[row, col])} points at a padded turn "
                             f"(turn_mask is 0 there); every action token must belong to a real turn")
    return tokens


def gae_targets(
    rewards: Any,
    values: Any,
    turn_mask: Tensor,
    gamma: float,
    lam: float,
    terminated: Tensor,
    bootstrap_values: Any = None,
) -> tuple[Tensor, Tensor]:
    r"""GAE(gamma, lambda) advantages of a turn-level critic and the critic's regression targets.

    .. math:: \hat A_t = \sum_{l \ge 0} (\gamma\lambda)^l \delta_{t+l}, \quad
              \delta_t = r_t + \gamma V_\phi(h_{t+1}) - V_\phi(h_t), \qquad y_t = \hat A_t + V_\phi(h_t)

    :func:`agent_lab.estimators.gae` computes :math:`\hat A` (after the last real turn :math:`V = 0` if the
    row terminated, ``bootstrap_values`` if it was truncated: the tensor contract's rule); :math:`y_t` is the
    lambda-return, the target of :func:`value_loss`. Shapes: ``rewards``, ``values`` (critic
    :math:`V_\phi(h_t)` per turn, detached) and ``turn_mask`` ``[B, T]``; ``terminated`` ``[B]``;
    ``bootstrap_values`` ``[B]`` or None. Returns ``(advantages, targets)``, both ``[B, T]``, 0 at padding.
    Book: part2/06_credit_assignment, part1/05_reward_to_go_td_gae.
    """
    advantages = gae(rewards, values, turn_mask, gamma, lam, terminated, bootstrap_values)
    real = as_mask("turn_mask", turn_mask, advantages.shape)
    targets = advantages + as_float_like("values", values, advantages).detach()
    return advantages, torch.where(real, targets, torch.zeros_like(targets))


def value_loss(
    values: Tensor,
    targets: Any,
    turn_mask: Tensor,
    *,
    old_values: Any = None,
    clip_range: float | None = None,
) -> tuple[Tensor, Tensor]:
    r"""The critic's squared error over real turns, as ``(numerator, denominator)``.

    .. math:: \mathcal L_V = \frac{1}{\sum_{it} m_{it}} \sum_{it} m_{it}\, \tfrac12 \big(V_\phi(h_{it}) - y_{it}\big)^2

    (a mean over the batch's real turns; pass both parts to :func:`agent_lab.estimators.reduce_loss` so that
    micro-batches and workers divide by the whole step's turn count). With ``clip_range`` c and
    ``old_values`` :math:`V_{\text{old}}` (PPO's value clipping) the per-turn term is
    :math:`\tfrac12 \max\big((V - y)^2, (V_{\text{old}} + \operatorname{clip}(V - V_{\text{old}}, -c, c) - y)^2\big)`.
    ``values`` ``[B, T]`` carries the gradient; ``targets`` (e.g. from :func:`gae_targets`) and
    ``old_values`` are detached. A batch with no real turn gives ``(0, 0)``, which ``reduce_loss`` turns into 0.
    Book: part2/06_credit_assignment.
    """
    values = as_float_tensor("values", values)
    check_ndim("values", values, (2,), "[B, T] (one value per turn)")
    targets = as_float_like("targets", targets, values).detach()
    if targets.shape != values.shape:
        raise ValueError(f"targets must have the shape of values {tuple(values.shape)}, got {tuple(targets.shape)}")
    real = _turn_mask(turn_mask, values.shape)
    error = (values - targets).square()
    if (old_values is None) != (clip_range is None):
        raise ValueError("old_values and clip_range go together: pass both for clipped value loss, or neither")
    if clip_range is not None:
        if not float(clip_range) > 0:
            raise ValueError(f"clip_range must be a positive number, got {clip_range!r}")
        old = as_float_like("old_values", old_values, values).detach()
        if old.shape != values.shape:
            raise ValueError(f"old_values must have the shape of values {tuple(values.shape)}, got {tuple(old.shape)}")
        clipped = old + (values - old).clamp(-float(clip_range), float(clip_range))
        error = torch.maximum(error, (clipped - targets).square())
    return masked_sum(0.5 * error, real), real.sum().to(values.dtype)


# ----------------------------------------------------------------------------- branching from saved states
def branching_values(continuation_returns: Any, turn_mask: Tensor) -> Tensor:
    r"""Monte Carlo values from K continuations sampled from the saved state before each turn.

    .. math:: \hat V(h_{it}) = \frac1K \sum_{k=1}^{K} G^{(k)}_{it}

    where :math:`G^{(k)}_{it}` is the (discounted) return from turn t on of the k-th continuation of episode
    i, replayed exactly to the state before its turn t (:func:`agent_lab.envs.replay_prefix`) and continued
    with the current policy. Each continuation is a draw of the return from that state, so
    :math:`\mathbb E[\hat V(h_{it}) \mid s_{it}] = V^\pi(s_{it})`: the value of the *state* (hidden
    information included, such as the number being searched for) and, averaged over what the history does
    not reveal, :math:`V^\pi(h_{it})`. Shapes: ``continuation_returns`` ``[B, T, K]`` (entries at padded
    turns are ignored, NaN allowed there); ``turn_mask`` ``[B, T]``. Returns ``[B, T]``, 0 at padding.
    Book: part2/06_credit_assignment.
    """
    returns = as_float_tensor("continuation_returns", continuation_returns, finite=False)
    check_ndim("continuation_returns", returns, (3,), "[B, T, K] (K continuation returns per turn)")
    real = _turn_mask(turn_mask, returns.shape[:2])
    check_finite("continuation_returns (at real turns)", torch.where(real[..., None], returns, 0.0))
    mean = torch.where(real[..., None], returns, torch.zeros_like(returns)).mean(dim=2)
    return torch.where(real, mean, torch.zeros_like(mean))


def branching_advantages(
    rewards: Any,
    continuation_returns: Any,
    turn_mask: Tensor,
    gamma: float,
    terminated: Tensor,
    bootstrap_values: Any = None,
) -> Tensor:
    r"""Per-turn advantages from branching values (VinePPO-style): a TD residual on Monte Carlo values.

    .. math:: \hat A_t = r_t + \gamma \hat V(h_{t+1}) - \hat V(h_t)

    with :math:`\hat V` from :func:`branching_values` and, after each row's last real turn, 0 if it
    terminated or ``bootstrap_values`` if it was truncated (:func:`agent_lab.estimators.td_residuals`). The
    continuations from :math:`h_t` are independent of the action :math:`a_t` taken in the episode, so
    :math:`\mathbb E[\hat A_t \mid h_t, a_t] = Q^\pi(h_t, a_t) - V^\pi(h_t) = A^\pi(h_t, a_t)`: unbiased for
    every turn, at the price of K extra rollouts per turn (:func:`branching_cost`). Shapes as in
    :func:`branching_values` and :func:`agent_lab.estimators.td_residuals`; returns ``[B, T]``.
    Book: part2/06_credit_assignment.
    """
    values = branching_values(continuation_returns, turn_mask)
    return td_residuals(rewards, values, turn_mask, gamma, terminated, bootstrap_values)


def branching_cost(turn_mask: Tensor, k: int, continuation_turns: Any = None) -> dict[str, int]:
    r"""What branching costs: K continuations from each real turn's saved state.

    Returns ``{"branch_points": n, "extra_episodes": K n, "extra_turns": ...}`` with :math:`n =
    \sum_{it} m_{it}`; ``extra_turns`` (environment steps, the sum of ``continuation_turns`` ``[B, T, K]``
    over real turns) is present when ``continuation_turns`` is given. Count these in the episode budget when
    comparing with estimators that use no extra rollouts. Book: part2/06_credit_assignment.
    """
    if not isinstance(turn_mask, Tensor):
        raise ValueError(f"turn_mask must be a torch.Tensor of 0/1 or bool values, got {type(turn_mask).__name__}")
    real = _turn_mask(turn_mask, turn_mask.shape)
    k = positive_int("k", k)
    points = int(real.sum())
    out = {"branch_points": points, "extra_episodes": k * points}
    if continuation_turns is not None:
        steps = as_float_tensor("continuation_turns", continuation_turns)
        if tuple(steps.shape) != (*real.shape, k):
            raise ValueError(f"continuation_turns must have shape {(*real.shape, k)}, got {tuple(steps.shape)}")
        out["extra_turns"] = int(steps[real].sum())
    return out


# ----------------------------------------------------------------------------- anchor-state groups
def anchor_state_ids(keys: Sequence[Sequence[Hashable]], turns: int | None = None) -> Tensor:
    """Integer ids ``[B, T]`` for per-turn state keys: equal keys get equal ids, -1 pads short rows.

    ``keys[i][t]`` is any hashable description of the environment state before turn t of episode i (an
    observation text, a tuple of the state's fields). Ids are numbered by first appearance; ``turns``
    (default: the longest row) sets T. Book: part2/06_credit_assignment.
    """
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence) or not keys:
        raise ValueError("keys must be a non-empty list with one list of per-turn state keys per episode")
    width = max(len(row) for row in keys) if turns is None else positive_int("turns", turns)
    ids: dict[Hashable, int] = {}
    out = torch.full((len(keys), width), -1, dtype=torch.long)
    for i, row in enumerate(keys):
        if len(row) > width:
            raise ValueError(f"keys[{i}] has {len(row)} turns, more than turns={width}")
        for t, key in enumerate(row):
            try:
                out[i, t] = ids.setdefault(key, len(ids))
            except TypeError:
                raise ValueError(f"keys[{i}][{t}] must be hashable, got {type(key).__name__}") from None
    return out


def _group_means(values: Tensor, keys: Tensor, real: Tensor, weights: Tensor, leave_one_out: bool
                 ) -> tuple[Tensor, Tensor]:
    """Weighted mean of ``values`` [B, T] over the real entries sharing (group row, key) and the count of them;
    ``keys`` [B, T] already combine the group index and the state id. Entries alone in their set get their
    own value (with leave-one-out too: there is no one else)."""
    flat_key = torch.where(real, keys, torch.zeros_like(keys)).reshape(-1)
    w = torch.where(real, weights[:, None].expand_as(values), torch.zeros_like(values)).reshape(-1)
    v = torch.where(real, values, torch.zeros_like(values)).reshape(-1)
    size = int(flat_key.max()) + 1
    sums = torch.zeros(size, dtype=values.dtype, device=values.device).scatter_add(0, flat_key, w * v)
    mass = torch.zeros_like(sums).scatter_add(0, flat_key, w)
    count = torch.zeros(size, dtype=torch.long, device=values.device).scatter_add(0, flat_key, real.reshape(-1).long())
    s, m, n = sums[flat_key], mass[flat_key], count[flat_key]
    if leave_one_out:
        s, m = s - w * v, m - w
    alone = (n <= 1) | (m <= 0)
    mean = torch.where(alone, v, s / torch.where(alone, torch.ones_like(m), m))
    return mean.reshape(values.shape), torch.where(real, n.reshape(values.shape), torch.zeros_like(keys))


def _anchor_inputs(state_ids: Tensor, like: Tensor, turn_mask: Tensor, group_size: int, weights: Any
                   ) -> tuple[Tensor, Tensor, Tensor]:
    """Validated (real-turn mask, keys that combine the group index with the state id, weights [B])."""
    real = _turn_mask(turn_mask, like.shape)
    if not isinstance(state_ids, Tensor) or state_ids.dtype.is_floating_point or state_ids.dtype == torch.bool:
        got = getattr(state_ids, "dtype", type(state_ids).__name__)
        raise ValueError(f"state_ids must be an integer torch.Tensor, got {got}")
    if state_ids.shape != like.shape:
        raise ValueError(f"state_ids must have shape {tuple(like.shape)}, got {tuple(state_ids.shape)}")
    if bool((real & (state_ids < 0)).any()):
        raise ValueError("state_ids must be >= 0 at every real turn (-1 only on padded turns)")
    group_size = positive_int("group_size", group_size)
    if like.shape[0] % group_size:
        raise ValueError(f"group_size {group_size} does not divide the batch size {like.shape[0]}; the batch must "
                         f"hold whole groups (contiguous blocks of {group_size} episodes of one task)")
    if weights is None:
        w = torch.ones(like.shape[0], dtype=like.dtype, device=like.device)
    else:
        w = as_float_like("weights", weights, like)
        if tuple(w.shape) != (like.shape[0],):
            raise ValueError(f"weights must have shape ({like.shape[0]},) (one per episode), got {tuple(w.shape)}")
        if bool((w < 0).any()):
            raise ValueError("weights must be non-negative")
    group = torch.arange(like.shape[0], device=like.device) // group_size
    span = int(state_ids.max()) + 2 if state_ids.numel() else 1
    return real, group[:, None] * span + state_ids.clamp(min=0).long(), w


def anchor_state_baselines(
    returns: Any,
    state_ids: Tensor,
    turn_mask: Tensor,
    group_size: int,
    *,
    weights: Any = None,
    leave_one_out: bool = False,
) -> tuple[Tensor, Tensor]:
    r"""The step-level baseline of anchor-state groups: the mean return of the group's turns from the same state.

    Within a group g (``group_size`` contiguous episodes of one task), the anchor group of turn (i, t) is
    every real turn (j, t') of the group with the same state id, :math:`S = \{(j,t') : s_{jt'} = s_{it}\}`:

    .. math:: b_{it} = \frac{\sum_{(j,t') \in S} w_j\, G_{jt'}}{\sum_{(j,t') \in S} w_j}

    (``leave_one_out``: over :math:`S \setminus \{(i,t)\}`). ``weights`` ``[B]`` (default 1) are per-episode
    weights, e.g. exact probabilities of enumerated episodes, which make :math:`b_{it}` the exact state value
    :math:`V^\pi(s_{it})`. A turn whose state no other turn of its group visited (a singleton) gets its own
    return as baseline, so its step advantage :math:`G - b` is 0. Shapes: ``returns`` (e.g. reward-to-go) and
    ``state_ids`` (integer, from :func:`anchor_state_ids`) ``[B, T]``; ``turn_mask`` ``[B, T]``. Returns
    ``(baselines [B, T], counts [B, T])``, counts :math:`|S|` as integers, both 0 at padding.
    Book: part2/06_credit_assignment.
    """
    returns = as_float_tensor("returns", returns)
    check_ndim("returns", returns, (2,), "[B, T] (one return per turn)")
    real, keys, w = _anchor_inputs(state_ids, returns, turn_mask, group_size, weights)
    means, counts = _group_means(returns, keys, real, w, leave_one_out)
    return torch.where(real, means, torch.zeros_like(means)), counts


def anchor_state_advantages(
    rewards: Any,
    state_ids: Tensor,
    turn_mask: Tensor,
    group_size: int,
    gamma: float = 1.0,
    *,
    step_weight: float = 1.0,
    weights: Any = None,
    leave_one_out: bool = False,
) -> Tensor:
    r"""GiGPO's two-level advantage: the episode's group-relative return plus a step term from anchor states.

    .. math:: \hat A_{it} = \underbrace{R_i - \bar R_{g(i)}}_{\text{episode level}}
              + \omega \underbrace{\big(G_{it} - b_{it}\big)}_{\text{step level}}

    with :math:`R_i = \sum_t r_{it}` the episode's return, :math:`\bar R_g` its group's mean (Dr.GRPO's
    centring, no division by a standard deviation; weighted by ``weights``, leave-one-out on request),
    :math:`G_{it}` the reward-to-go with discount ``gamma`` and :math:`b_{it}` the anchor-state baseline of
    :func:`anchor_state_baselines`. ``step_weight`` is :math:`\omega` (0 gives Dr.GRPO on every turn).
    Singleton states have step advantage 0 and keep the episode term. Both terms are centred on the group's
    own samples, so without ``leave_one_out`` each is shrunk towards 0 by its set size (:math:`(n-1)/n`, as
    Dr.GRPO's is by :math:`(G-1)/G`). Shapes: ``rewards``, ``state_ids``, ``turn_mask`` ``[B, T]``;
    returns ``[B, T]``, 0 at padding. Book: part2/06_credit_assignment.
    """
    rewards = as_float_tensor("rewards", rewards)
    check_ndim("rewards", rewards, (2,), "[B, T] (one reward per turn)")
    real = _turn_mask(turn_mask, rewards.shape)
    to_go = reward_to_go(rewards, gamma, real)
    baselines, _ = anchor_state_baselines(to_go, state_ids, real, group_size, weights=weights,
                                          leave_one_out=leave_one_out)
    episode = masked_sum(rewards, real, dim=1)[:, None]  # [B, 1]: one shared anchor, the task's initial state
    one_state = torch.zeros_like(episode, dtype=torch.long)
    centre, _ = anchor_state_baselines(episode, one_state, torch.ones_like(one_state, dtype=torch.bool),
                                       group_size, weights=weights, leave_one_out=leave_one_out)
    omega = float(step_weight)
    if not math.isfinite(omega):
        raise ValueError(f"step_weight must be a finite number, got {step_weight!r}")
    total = (episode - centre) + omega * (to_go - baselines)
    return torch.where(real, total, torch.zeros_like(total))
