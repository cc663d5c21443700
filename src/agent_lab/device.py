"""Device choice shared by the trainer, the benchmarks and the book, and the host memory a run gives back."""

import ctypes
import functools
import os
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
    ``malloc_trim``; a no-op elsewhere)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def resident_bytes() -> int | None:
    """This process's resident memory now (Linux ``/proc/self/statm``), or None where it cannot be read."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


class HeapTrimmer:
    """After each step of a run (and each RL step's rollouts), hands freed memory back
    (:func:`release_freed_memory`) when the work was long or the memory held between steps has grown.

    A run's batches change shape from step to step; glibc's heap keeps the freed blocks of each new shape, so
    without a trim the resident memory between steps grows for as long as the run lasts. A trim's cost is the
    next step's page faults on the memory it returned, about the same whatever the step: negligible against a
    step of ``long_step_s`` seconds or more, which is trimmed every time. A shorter step is trimmed only once
    held memory has grown by more than ``slack`` bytes over its level (what the first step since the last trim
    held). Where resident memory cannot be read it never trims."""

    def __init__(self, slack: float = 256e6, long_step_s: float = 1.0):
        self.slack, self.long_step_s = slack, long_step_s
        self.level: int | None = None  # resident bytes held after the first step since the last trim

    def __call__(self, step_s: float) -> bool:
        """After a step of ``step_s`` seconds: trim or not (see the class); True if it trimmed."""
        now = resident_bytes()
        if now is None:
            return False
        if step_s < self.long_step_s and (self.level is None or now < self.level + self.slack):
            self.level = now if self.level is None else self.level
            return False
        release_freed_memory()
        self.level = None  # the next step's held memory is the new level
        return True


@functools.cache
def _malloc_trim():
    if sys.platform != "linux":
        return None
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc's; musl and others have none
    except (AttributeError, OSError):
        return None
