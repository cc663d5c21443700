"""Worker for the two-process gloo test of reduce_loss (imported by spawned children; not a test module).

Each rank builds the same tiny float64 model (same seed), wraps it in DDP, takes its own shard of one
fixed batch (rank 0: 1 row, rank 1: 3 rows, so token counts differ), and back-propagates both the
globally reduced loss and the average of locally normalised losses, for every objective. The gradients
are written to ``out_dir/rank{r}.pt`` for the parent to compare with a single-process run.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from agent_lab.estimators import OBJECTIVES, aggregate, local_loss, reduce_loss, reinforce_surrogate, token_logprobs

VOCAB, LENGTH, ROWS = 5, 6, 4
SHARDS = ((0, 1), (1, 4))  # rows of rank 0 and rank 1


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(VOCAB, 4), torch.nn.Linear(4, VOCAB)).double()


def make_batch() -> dict[str, torch.Tensor]:
    """One fixed batch: inputs, targets, a ragged action mask, turn ids and per-sequence advantages."""
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randint(0, VOCAB, (ROWS, LENGTH), generator=generator)
    lengths = torch.tensor([5, 1, 3, 2])  # action tokens per row: unequal on purpose
    positions = torch.arange(LENGTH - 1)[None, :]
    mask = (positions >= 0) & (positions < lengths[:, None])
    turn_ids = torch.where(mask, positions // 2, torch.full_like(positions, -1).expand_as(mask))
    advantages = torch.tensor([1.0, -0.5, 2.0, 0.25], dtype=torch.float64)
    return {"inputs": inputs, "mask": mask, "turn_ids": turn_ids, "advantages": advantages}


def numerator_denominator(model, batch, rows: slice, objective: str):
    inputs = batch["inputs"][rows]
    logits = model(inputs[:, :-1])
    logprobs = token_logprobs(logits, inputs[:, 1:])
    surrogate = reinforce_surrogate(logprobs, batch["advantages"][rows])
    numerator, denominator = aggregate(
        surrogate, batch["mask"][rows], objective, turn_ids=batch["turn_ids"][rows], max_tokens=LENGTH - 1
    )
    return -numerator, denominator  # a loss to minimise


def gradients(model) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters()]


def worker(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        model = torch.nn.parallel.DistributedDataParallel(make_model())
        batch = make_batch()
        rows = slice(*SHARDS[rank])
        results = {}
        for objective in OBJECTIVES:
            for mode, reduce in (("global", reduce_loss), ("local", local_loss)):
                model.zero_grad(set_to_none=True)
                reduce(*numerator_denominator(model, batch, rows, objective)).backward()
                results[(objective, mode)] = gradients(model)
        torch.save(results, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def single_process_gradients() -> dict[str, list[torch.Tensor]]:
    """Gradient of each objective on the concatenated batch, one process."""
    batch = make_batch()
    out = {}
    for objective in OBJECTIVES:
        model = make_model()
        reduce_loss(*numerator_denominator(model, batch, slice(0, ROWS), objective)).backward()
        out[objective] = gradients(model)
    return out
