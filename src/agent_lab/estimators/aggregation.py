"""Loss aggregation as named objectives, and the global reduction across workers.

The denominator is part of the objective (foundations chapter section 13): token mean, sequence mean, a constant and
per-turn averaging weight tokens differently. Every objective is returned as ``(numerator, denominator)``
so that several workers can sum both and divide once; averaging locally normalised losses is a different
objective whenever workers hold different token counts. Lecture sections: "Loss normalization and length bias".
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ._validation import as_float_tensor, as_mask, as_turn_ids, check_ndim, positive_int

__all__ = ["OBJECTIVES", "aggregate", "reduce_loss", "local_loss", "masked_sum", "masked_mean"]

OBJECTIVES = ("token_mean", "seq_mean_token_mean", "constant", "turn_then_trajectory")


def _masked(
    values: Any, mask: Tensor, dim: int | tuple[int, ...] | None, names: tuple[str, str] = ("values", "mask")
) -> tuple[Tensor, Tensor, Tensor, tuple[int, ...]]:
    """Values with masked-out entries set to 0, the bool mask, the mask as 0/1 floats, ``dim`` as a tuple."""
    values = as_float_tensor(names[0], values, finite=False)
    keep = as_mask(names[1], mask, values.shape)
    if dim is None:
        dims = tuple(range(values.ndim))
    else:
        dims = (dim,) if isinstance(dim, (int, bool)) else tuple(dim) if isinstance(dim, (tuple, list)) else ()
        if not dims or any(isinstance(d, bool) or not isinstance(d, int) or not -values.ndim <= d < values.ndim for d in dims):
            raise ValueError(f"dim must be None, an int or a tuple of ints in [-{values.ndim}, {values.ndim}) for "
                             f"values of shape {tuple(values.shape)}, got {dim!r}")
    # where(), not multiplication: 0 * NaN is NaN, and masked-out positions may hold anything.
    return torch.where(keep, values, torch.zeros_like(values)), keep, keep.to(values.dtype), dims


def masked_sum(values: Any, mask: Tensor, dim: int | tuple[int, ...] | None = None, *, keepdim: bool = False) -> Tensor:
    r"""Sum of the entries inside ``mask`` over ``dim``: :math:`\sum_{j} m_{ij} x_{ij}`.

    ``values`` any shape; ``mask`` (bool or 0/1) of the same shape; ``dim`` an int, a tuple of ints or None
    (every dimension, a 0-dim result). Entries outside the mask are ignored, even NaN or inf, and get zero
    gradient. An empty slice (no entry of it inside the mask) sums to 0. Use :func:`aggregate` for the
    named loss normalisations; this and :func:`masked_mean` are the per-row or per-column reductions.
    Book: part2/05_loss_normalisation.
    """
    kept, _, _, dims = _masked(values, mask, dim)
    return kept.sum(dim=dims, keepdim=keepdim)


def masked_mean(
    values: Any,
    mask: Tensor,
    dim: int | tuple[int, ...] | None = None,
    *,
    keepdim: bool = False,
    empty: float = 0.0,
) -> Tensor:
    r"""Mean of the entries inside ``mask`` over ``dim``: :math:`\sum_j m_{ij} x_{ij} / \sum_j m_{ij}`.

    Shapes and ``dim`` as in :func:`masked_sum`. An empty slice (its mask all 0) has no mean: it gets
    ``empty`` (default 0, with zero gradient, as :func:`aggregate`'s ``"seq_mean_token_mean"`` scores a row
    without action tokens; pass ``float("nan")`` to make such slices visible). Entries outside the mask are
    ignored, even NaN or inf. ``masked_mean(x, m)`` over everything is the ``"token_mean"`` objective, and
    ``masked_mean(x, m, dim=1).mean()`` the ``"seq_mean_token_mean"`` one.
    Book: part2/05_loss_normalisation.
    """
    kept, _, weights, dims = _masked(values, mask, dim)
    counts = weights.sum(dim=dims, keepdim=keepdim)
    means = kept.sum(dim=dims, keepdim=keepdim) / counts.clamp(min=1)
    return torch.where(counts > 0, means, torch.full_like(means, float(empty)))


def _per_turn_sums(values: Tensor, weights: Tensor, turn_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Sum ``weights * values`` and ``weights`` per (row, turn): two ``[B, T]`` tensors, T = max id + 1."""
    turns = int(turn_ids.max()) + 1 if bool((turn_ids >= 0).any()) else 1
    index = turn_ids.clamp(min=0).long()
    sums = torch.zeros(values.shape[0], turns, dtype=values.dtype, device=values.device)
    counts = torch.zeros_like(sums)
    return sums.scatter_add(1, index, weights * values), counts.scatter_add(1, index, weights)


def aggregate(
    per_token: Tensor,
    action_mask: Tensor,
    objective: str,
    *,
    turn_ids: Tensor | None = None,
    max_tokens: int | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Reduce a per-token surrogate ``[B, L-1]`` to ``(numerator, denominator)``; objective = num / den.

    With mask :math:`m` and surrogate :math:`s` (entries outside the mask are ignored, even NaN):

    * ``"token_mean"``: :math:`\sum_{ij} m_{ij}s_{ij} \,/\, \sum_{ij} m_{ij}` (every token weighs the same;
      long responses carry more weight);
    * ``"seq_mean_token_mean"`` (GRPO): :math:`\sum_i \big(\sum_j m_{ij}s_{ij}/\sum_j m_{ij}\big) \,/\, B`
      (every sequence weighs the same; a row without action tokens adds 0 and still counts in B);
    * ``"constant"`` (Dr.GRPO): :math:`\sum_{ij} m_{ij}s_{ij} \,/\, (B \cdot \texttt{max\_tokens})` with a
      fixed ``max_tokens`` (no length-dependent weight at all);
    * ``"turn_then_trajectory"``: mean over the tokens of each turn, then over the turns of each
      trajectory (turns with action tokens), then :math:`/\,B`; needs ``turn_ids`` ``[B, L-1]`` (-1 outside
      actions; every masked token must carry a turn id).

    Returns two 0-dim tensors; the numerator carries the gradient, the denominator is a count (no
    gradient). Sign: this aggregates a surrogate to maximise; the loss is ``-numerator / denominator``
    (or :func:`reduce_loss` of ``-numerator`` and ``denominator``). Padding columns (mask 0) change nothing,
    and splitting rows across micro-batches or workers and summing both parts gives the same objective.
    Book: part2/05_loss_normalisation.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    per_token = as_float_tensor("per_token", per_token, finite=False)
    check_ndim("per_token", per_token, (2,), "[B, L-1]")
    values, mask, weights, _ = _masked(per_token, action_mask, None, ("per_token", "action_mask"))
    batch = per_token.shape[0]
    rows = torch.tensor(float(batch), dtype=per_token.dtype, device=per_token.device)
    if objective == "token_mean":
        return values.sum(), weights.sum()
    if objective == "seq_mean_token_mean":
        per_row = values.sum(dim=1) / weights.sum(dim=1).clamp(min=1)
        return per_row.sum(), rows
    if objective == "constant":
        if max_tokens is None:
            raise ValueError("max_tokens is required for objective 'constant' (Dr.GRPO divides by B * max_tokens)")
        positive_int("max_tokens", max_tokens)
        return values.sum(), rows * max_tokens
    if turn_ids is None:
        raise ValueError("turn_ids [B, L-1] is required for objective 'turn_then_trajectory'")
    turn_ids = as_turn_ids(turn_ids, per_token.shape)
    if bool((mask & (turn_ids < 0)).any()):
        raise ValueError("turn_ids must be >= 0 on every token in action_mask (got -1 on an action token)")
    sums, counts = _per_turn_sums(values, weights, turn_ids)
    turn_means = sums / counts.clamp(min=1)
    turns_per_row = (counts > 0).sum(dim=1).clamp(min=1)
    return (turn_means.sum(dim=1) / turns_per_row).sum(), rows


def reduce_loss(numerator: Tensor, denominator: Tensor, process_group: Any = None) -> Tensor:
    r"""Globally normalised loss from per-worker ``(numerator, denominator)``.

    Single process (``torch.distributed`` not initialised): ``numerator / denominator``.

    Distributed: the denominator is detached and all-reduced (summed), and the result is
    :math:`W \cdot \text{num}_w / \sum_{w'} \text{den}_{w'}` for W workers. DDP averages gradients over
    workers, so the applied gradient is :math:`\nabla \sum_w \text{num}_w / \sum_w \text{den}_w`: the
    gradient of the objective on the concatenated batch. The returned *value* on each worker is its share
    times W, not the global loss; sum the numerators too if you need to log that.

    A zero denominator (no action tokens anywhere) returns the numerator itself (then 0, with zero
    gradient) instead of NaN. Both inputs must be 0-dim tensors (see :func:`aggregate`).
    Book: part2/05_loss_normalisation.
    """
    for name, value in (("numerator", numerator), ("denominator", denominator)):
        if not isinstance(value, Tensor) or value.ndim != 0:
            got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            raise ValueError(f"{name} must be a 0-dim torch.Tensor (from aggregate), got {got}")
    total = denominator.detach().to(numerator.dtype)
    scale = 1.0
    if dist.is_available() and dist.is_initialized():
        total = total.clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=process_group)
        scale = float(dist.get_world_size(group=process_group))
    if bool(total < 0):
        raise ValueError(f"denominator must be non-negative, got a total of {float(total)!r}")
    safe = torch.where(total > 0, total, torch.ones_like(total))
    return numerator * scale / safe


def local_loss(numerator: Tensor, denominator: Tensor) -> Tensor:
    """The *locally* normalised loss ``numerator / denominator`` with no communication.

    Kept for comparison only: DDP-averaging these over workers weights each worker's tokens by
    1/(its own denominator), which differs from the concatenated-batch objective unless every worker
    has the same denominator. Use :func:`reduce_loss` for training.
    Book: part2/05_loss_normalisation.
    """
    return numerator / torch.where(denominator > 0, denominator, torch.ones_like(denominator))
