"""What each step of a run draws. Every random stream depends only on (seed, step, round, rank), never on what
ran before, so a resumed run draws exactly the tasks and samples the uninterrupted run drew
(book/part3/00_number_search.md).

* tasks of a step (and of each extra round of dynamic sampling): :func:`task_rng`;
* the sampler's generator of a worker at a step: :func:`sampling_generator`, and of its continuations from saved
  states (branching algorithms): :func:`branch_generator`;
* a demonstration source's draws at an SFT step: :func:`demonstration_rng` and :func:`replay_choice_rng`.
"""

from __future__ import annotations

import numpy as np
import torch

from agent_lab import distributed as D
from agent_lab.rollout import RolloutBatch, collect_rollouts
from agent_lab.timing import span


def task_rng(seed: int, step: int, round_: int = 0) -> np.random.Generator:
    """Draws the tasks of ``step`` (round 0), or of extra round ``round_`` of dynamic sampling."""
    return np.random.default_rng([seed, step, 7] + ([round_] if round_ else []))


def sampling_generator(seed: int, step: int, rank: int, device, round_: int = 0) -> torch.Generator:
    """The torch generator worker ``rank`` samples its rollouts of ``step`` (and round ``round_``) with."""
    s = ((seed * 1_000_003 + step) * 1_009 + rank) % (2**62)
    if round_:
        s = int(np.random.SeedSequence([s, round_]).generate_state(1, np.uint64)[0]) % (2**62)
    return torch.Generator(device=device).manual_seed(s)


def branch_generator(seed: int, step: int, rank: int, device) -> torch.Generator:
    """The torch generator worker ``rank`` samples the continuations of ``step``'s saved states with (branching)."""
    s = int(np.random.SeedSequence([seed, step, 17, rank]).generate_state(1, np.uint64)[0]) % (2**62)
    return torch.Generator(device=device).manual_seed(s)


def demonstration_rng(seed: int, step: int, rank: int) -> np.random.Generator:
    """The draws of the demonstration sources of SFT ``step`` on worker ``rank`` (slips, DAgger branch turns)."""
    return np.random.default_rng([seed, step, 11, rank])


def replay_choice_rng(seed: int, step: int, rank: int) -> np.random.Generator:
    """Which tasks of SFT ``step`` on worker ``rank`` start from the policy's own episode (DAgger)."""
    return np.random.default_rng([seed, step, 13, rank])


def grouped(tasks: list, group_size: int) -> list:
    """Each task repeated ``group_size`` times in contiguous rows: groups ``[g*G, (g+1)*G)``."""
    return [t for t in tasks for _ in range(group_size)]


def group_rollouts(run, step: int, round_: int = 0) -> RolloutBatch:
    """This worker's contiguous share of RL step ``step``'s task groups (``batch_size / group_size`` tasks x
    ``group_size`` samples; extra round ``round_`` of dynamic sampling), played by ``run.model`` as sampled."""
    cfg, a = run.cfg, run.cfg.algorithm
    with span("environment"):
        drawn = run.env.sample_tasks(task_rng(cfg.seed, step, round_), a.batch_size // a.group_size, split="train")
    tasks = grouped(drawn, a.group_size)
    return collect_rollouts(run.model, run.tok, run.env, tasks[D.shard(len(tasks), run.info)], cfg.sampling,
                            sampling_generator(cfg.seed, step, run.info.rank, run.device, round_),
                            policy_version=step, autocast_dtype=run.amp_dtype)
