"""Device choice shared by the trainer, the benchmarks and the book, and the host memory a run gives back."""

import ctypes
import functools
import os
import sys
from collections.abc import Mapping
from typing import Any

import torch

from agent_lab.config import DEVICE_CHOICES

MAP_THRESHOLD = 1 << 20  # bytes: blocks this large or larger are mapped on their own (map_large_blocks)


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


#: The CPU features that multiply bfloat16 matrices in hardware (``torch.cpu.get_capabilities``' names),
#: the faster first. Without one, bfloat16 arithmetic on the CPU is emulated and slower than float32.
FAST_BF16_FEATURES = ("amx_bf16", "avx512_bf16")


def cpu_fast_bf16(capabilities: Mapping[str, Any] | None = None) -> str | None:
    """The feature of this CPU that makes bfloat16 matmuls fast (one of :data:`FAST_BF16_FEATURES`), or None
    where it has none. ``capabilities``: the features as ``torch.cpu.get_capabilities()`` reports them,
    read from torch when None (an empty mapping where torch cannot tell: then None, so float32)."""
    if capabilities is None:
        get = getattr(torch.cpu, "get_capabilities", None)
        capabilities = get() if get is not None else {}
    return next((f for f in FAST_BF16_FEATURES if capabilities.get(f) is True), None)


def autocast_dtype(device: torch.device, cuda_bf16: bool, cpu_bf16: bool) -> tuple[torch.dtype | None, str]:
    """The dtype a run autocasts its forward passes to on ``device`` (None: float32 throughout) and a line
    saying which and why, for the run's description. ``cuda_bf16`` and ``cpu_bf16`` are RunConfig's ``bf16``
    and ``cpu_bf16``: bfloat16 on CUDA when asked; on the CPU only when asked and the CPU has a fast-bf16
    feature (:func:`cpu_fast_bf16`), since emulated bfloat16 would slow the run down instead."""
    if device.type == "cuda":
        return (torch.bfloat16, "bfloat16 autocast on CUDA (bf16)") if cuda_bf16 else (None, "float32")
    if device.type != "cpu" or not cpu_bf16:
        return None, "float32" + (f" (cpu_bf16 applies to the CPU, not {device.type})" if cpu_bf16 else "")
    feature = cpu_fast_bf16()
    if feature is None:
        return None, (f"float32: cpu_bf16 is on, but this CPU has none of {', '.join(FAST_BF16_FEATURES)}, "
                      "so bfloat16 would be emulated and slower")
    return torch.bfloat16, f"bfloat16 autocast on the CPU (cpu_bf16; this CPU has {feature})"


def release_freed_memory() -> None:
    """Give the memory that the C allocator keeps from freed tensors back to the operating system (glibc's
    ``malloc_trim``; a no-op elsewhere)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


#: glibc's ``mallopt`` parameter for the size from which a block gets a mapping of its own.
_M_MMAP_THRESHOLD = -3


def map_large_blocks(threshold: int = MAP_THRESHOLD) -> bool:
    """Have the C allocator give every block of ``threshold`` bytes or more a mapping of its own, unmapped (so
    returned to the operating system) the moment its tensor is freed. True if set.

    glibc starts with such a threshold but raises it to the size of each mapped block freed, up to 32 MiB, so a
    training run soon takes its large tensors from the heap. There, blocks of shapes that change every turn and
    every batch are not all handed back, even by ``malloc_trim`` after each step: a crafting run's resident
    memory then grows step after step although no tensor outlives its step. A threshold set here is
    fixed (glibc stops adjusting it). Left alone where ``MALLOC_MMAP_THRESHOLD_`` is set (the user chose), and
    off glibc, where it returns False."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") is not None or sys.platform != "linux":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, int(threshold)))


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
