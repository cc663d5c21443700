"""Device choice shared by the trainer, the benchmarks and the book, and the host memory a run gives back."""

import ctypes
import functools
import sys

import torch

DEVICE_CHOICES = ("auto", "cuda", "mps", "cpu")


def pick_device(name: str = "auto") -> torch.device:
    """Return the device named by ``name``; ``"auto"`` picks cuda, then mps, then cpu.

    Raises ``ValueError`` for an unknown name or a device that is not available here.
    """
    if name not in DEVICE_CHOICES:
        raise ValueError(f"device must be one of {DEVICE_CHOICES}, got {name!r}")
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch.cuda.is_available() is False; use --device auto or cpu")
    if name == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError("device 'mps' requested but MPS is not available; use --device auto or cpu")
    return torch.device(name)


def release_freed_memory() -> None:
    """Give the memory that the C allocator keeps from freed tensors back to the operating system (glibc's
    ``malloc_trim``; a no-op elsewhere). The trainer calls it after every step: its batches change shape from step
    to step, and without the trim glibc's heap keeps each step's largest blocks and the process's resident
    memory only grows."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    if sys.platform != "linux":
        return None
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc's; musl and others have none
    except (AttributeError, OSError):
        return None
