"""Input checks shared by the estimators.

Every check raises ``ValueError`` with a message that names the argument, says what it got and what it
needs, so that a wrong call fails at the estimator boundary instead of deep inside a backward pass.
These helpers are private: the public functions call them and document the contract.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor


def as_float_tensor(name: str, value: Any, *, finite: bool = True, dtype: torch.dtype | None = None) -> Tensor:
    """Return ``value`` as a non-empty floating tensor (lists, ints and bools are converted).

    Floating tensors are returned as they are (same object, same dtype, same device) so that autograd
    still flows through them; other input becomes a tensor of ``dtype`` (default: torch's default floating
    dtype), converted once, so that a list of float64 numbers meant for float64 arithmetic is not rounded first.
    """
    if isinstance(value, Tensor):
        if value.is_complex():
            raise ValueError(f"{name} must be real, got a tensor of dtype {value.dtype}")
        tensor = value if value.is_floating_point() else value.to(dtype or torch.get_default_dtype())
    else:
        try:
            tensor = torch.as_tensor(value, dtype=dtype or torch.get_default_dtype())
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(f"{name} must be a tensor or a sequence of real numbers, got {value!r}") from exc
    if tensor.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(tensor.shape)}; pass at least one value")
    if finite:
        check_finite(name, tensor)
    return tensor


def as_float_like(name: str, value: Any, like: Tensor) -> Tensor:
    """``value`` as a finite floating tensor in ``like``'s dtype: a tensor is cast (autograd flows through the
    cast), other input is converted straight to that dtype, never rounded through the default dtype first."""
    return as_float_tensor(name, value, dtype=like.dtype).to(like.dtype)


def check_finite(name: str, tensor: Tensor) -> None:
    """Raise if ``tensor`` holds NaN or an infinity, naming the first offending index."""
    bad = ~torch.isfinite(tensor.detach())
    if bool(bad.any()):
        index = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"{name} must be finite, got {tensor.detach()[index].item()!r} at index {index}; drop or fix NaN/inf entries"
        )


def check_ndim(name: str, tensor: Tensor, allowed: Sequence[int], meaning: str) -> None:
    """Raise unless ``tensor.ndim`` is one of ``allowed``; ``meaning`` spells the expected shapes."""
    if tensor.ndim not in allowed:
        raise ValueError(f"{name} must have shape {meaning}, got shape {tuple(tensor.shape)}")


def check_same_shape(name: str, tensor: Tensor, other_name: str, other: Tensor) -> None:
    """Raise unless two tensors have exactly the same shape."""
    if tensor.shape != other.shape:
        raise ValueError(
            f"{name} has shape {tuple(tensor.shape)} but {other_name} has shape {tuple(other.shape)}; "
            "they must match"
        )


def unit_interval(name: str, value: Any) -> float:
    """Return ``value`` as a float in [0, 1] or raise (used for gamma, lambda and probabilities)."""
    try:
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a real number in [0, 1], got {value!r}") from exc
    if math.isnan(number) or not 0.0 <= number <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {value!r}")
    return number


def positive_int(name: str, value: Any) -> int:
    """Return ``value`` if it is a positive ``int`` (bools are refused)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def group_count(rewards: Tensor, group_size: Any, *, minimum: int = 1) -> int:
    """Check that ``rewards`` is ``[B]`` made of contiguous groups of ``group_size``; return ``B // G``."""
    check_ndim("rewards", rewards, (1,), "[B] (one return per sample)")
    size = positive_int("group_size", group_size)
    if size < minimum:
        raise ValueError(f"group_size must be at least {minimum} for this estimator, got {size}")
    batch = rewards.shape[0]
    if batch % size:
        raise ValueError(
            f"group_size {size} does not divide the batch size {batch}; rewards must hold whole groups "
            f"(a multiple of {size} entries, groups as contiguous blocks)"
        )
    return batch // size


def as_mask(name: str, mask: Any, shape: Sequence[int] | torch.Size) -> Tensor:
    """Return ``mask`` as a bool tensor of ``shape``.

    Accepted: a tensor of dtype bool, or an integer/floating tensor whose entries are all 0 or 1.
    Fractional weights are refused: a mask says which tokens belong to the objective, weights are a
    different object and belong in the per-token surrogate.
    """
    if not isinstance(mask, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of 0/1 or bool values, got {type(mask).__name__}")
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got shape {tuple(mask.shape)}")
    if mask.dtype == torch.bool:
        return mask
    if mask.is_complex():
        raise ValueError(f"{name} must have dtype bool or a real dtype holding 0/1, got dtype {mask.dtype}")
    bad = (mask != 0) & (mask != 1)
    if bool(bad.any()):
        index = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"{name} must hold only 0 and 1 (or be bool), got {mask[index].item()!r} at index {index}"
        )
    return mask != 0


def check_trailing_padding(name: str, mask: Tensor) -> None:
    """Raise unless every row of a bool ``[..., T]`` mask is ones followed by zeros (padding at the end)."""
    if mask.shape[-1] > 1 and bool((mask[..., 1:] & ~mask[..., :-1]).any()):
        raise ValueError(
            f"{name} must mark real steps as a prefix of each row (1...1 0...0, padding at the end); "
            "got a row with a real step after a padded one"
        )


def as_turn_ids(turn_ids: Any, shape: Sequence[int] | torch.Size) -> Tensor:
    """Check that ``turn_ids`` is an integer tensor of ``shape`` (-1 marks tokens outside any action)."""
    if not isinstance(turn_ids, Tensor) or turn_ids.dtype.is_floating_point or turn_ids.dtype in (torch.bool, torch.complex64, torch.complex128):
        raise ValueError(f"turn_ids must be an integer torch.Tensor, got {getattr(turn_ids, 'dtype', type(turn_ids).__name__)}")
    if tuple(turn_ids.shape) != tuple(shape):
        raise ValueError(f"turn_ids must have shape {tuple(shape)}, got {tuple(turn_ids.shape)}")
    if bool((turn_ids < -1).any()):
        raise ValueError(f"turn_ids must be >= -1 (-1 outside actions), got minimum {int(turn_ids.min())}")
    return turn_ids
