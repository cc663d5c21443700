"""The dozen lines of torchrun/DDP support (book/part2/05_loss_normalisation.md; foundations chapter section 13,
"Loss normalization and length bias").

Under ``torchrun --nproc_per_node N`` each process reads ``RANK``/``WORLD_SIZE`` from the environment,
joins a process group (gloo on CPU, nccl on CUDA) and trains on its own contiguous share of every batch.
Gradients are averaged by DDP; the loss uses ``estimators.reduce_loss``, which all-reduces the
normaliser, so the applied gradient equals the single-process gradient on the concatenated batch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def setup(device_type: str) -> DistInfo:
    """Join the torchrun process group if ``WORLD_SIZE > 1`` (idempotent); else a single-process info."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    info = DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
    if device_type == "cuda":
        torch.cuda.set_device(info.local_rank)
    return info


def all_mean(x: float, info: DistInfo) -> float:
    """Mean of a scalar over workers (for logging only)."""
    if not info.enabled:
        return float(x)
    t = torch.tensor([float(x)], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t)
    return float(t.item()) / info.world_size


def shard(n: int, info: DistInfo) -> slice:
    """This worker's contiguous share of ``n`` rows (``n`` divisible by the world size, checked earlier)."""
    per = n // info.world_size
    return slice(info.rank * per, (info.rank + 1) * per)


def teardown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
