"""Dynamic sampling (DAPO, Yu et al. 2025; book/part3/01_crafting.md): more rounds of fresh task groups while
too few groups disagree, the update taking the disagreeing groups first (``estimators.mixed_group_rows``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from agent_lab import distributed as D
from agent_lab.config import setting
from agent_lab.estimators.filtering import mixed_group_rows
from agent_lab.estimators.statistics import degenerate_group_fraction
from agent_lab.plugins import Collector, register
from agent_lab.plugins._checks import count
from agent_lab.rollout import RolloutBatch
from agent_lab.streams import group_rollouts


@register
@dataclass
class DynamicSampling(Collector):
    """Up to ``rounds`` extra rounds of ``batch_size / group_size`` fresh tasks per RL step."""

    rounds: int = setting(2, "RL: up to this many extra rounds of fresh tasks per step, keeping groups whose "
                             "rewards disagree (dynamic sampling)", flat="resample_rounds", off=0)

    name: ClassVar[str] = "dynamic_sampling"

    def __post_init__(self):
        count("dynamic_sampling rounds (resample_rounds)", self.rounds, 1)

    def check(self, cfg, world_size):
        if not cfg.algorithm.build(max_tokens=1).needs_groups:
            raise ValueError(f"dynamic_sampling (resample_rounds) keeps task groups whose rewards disagree, which only "
                             f"group algorithms learn from; algo={cfg.algorithm.name!r}: turn it off")

    def collect(self, run, step):
        G = run.cfg.algorithm.group_size
        batches: list[RolloutBatch] = []
        for r in range(self.rounds + 1):
            batches.append(group_rollouts(run, step, r))
            returns = torch.cat([b.episode_return for b in batches])
            n_mixed = round((1.0 - float(degenerate_group_fraction(returns, G))) * len(returns))
            if n_mixed >= len(batches[0]):  # rows of groups that disagree fill the update
                break
        if len(batches) == 1:
            update, every = batches[0], batches[0]
        else:
            every = RolloutBatch.concat(batches, pad_id=run.tok.pad_id)
            update = every.select(mixed_group_rows(every.episode_return, G, len(batches[0]) // G))
        return update, every, {"rollout_rounds": D.all_mean(float(len(batches)), run.info),
                               "update_degenerate_fraction": float(degenerate_group_fraction(update.episode_return, G))}

    def describe(self, cfg):
        n = cfg.algorithm.batch_size // cfg.algorithm.group_size
        return (f"dynamic sampling: up to {self.rounds} more rounds of {n} fresh tasks while too few groups have "
                "unequal rewards; the update takes those groups first, then all-equal ones, to the same batch size")
