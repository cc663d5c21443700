"""The checks of a run's configuration that ask the registries, made where the run is prepared, before any
work.

:mod:`agent_lab.config` is plain data: each section checks its own fields and :meth:`TrainConfig.validate` the
plain checks that span sections. What only the environment, the algorithm or a plug-in knows is asked here:
whether the names exist, whether the algorithm accepts its options and the batch it will see, and each
plug-in's own :meth:`~agent_lab.plugins.Plugin.check`. The trainer calls :func:`check_config` first thing.
"""

from __future__ import annotations

from agent_lab.algorithms import rl_algorithms
from agent_lab.config import TrainConfig
from agent_lab.envs import ENV_NAMES
from agent_lab.estimators.aggregation import OBJECTIVES
from agent_lab.plugins import DemonstrationSource, make_plugins

__all__ = ["check_config"]


def check_config(cfg: TrainConfig, world_size: int = 1) -> None:
    """Every check of ``cfg`` for a run on ``world_size`` processes; ``ValueError`` naming the setting."""
    if cfg.env not in ENV_NAMES:
        raise ValueError(f"env must be one of {list(ENV_NAMES)}, got {cfg.env!r}")
    a = cfg.algorithm
    if a.name not in rl_algorithms():
        raise ValueError(f"algo must be one of {list(rl_algorithms())}, got {a.name!r}")
    if a.objective is not None and a.objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES} or None, got {a.objective!r}")
    cfg.validate(world_size)
    algo = a.build(max_tokens=1)  # the algorithm checks its own options
    if a.steps and algo.needs_groups and a.group_size < 2:
        raise ValueError(f"algo {a.name!r} compares samples within a group: group_size must be >= 2, "
                         f"got {a.group_size}")
    if a.steps and algo.needs_decision_states and world_size > 1:
        raise ValueError(f"algo {a.name!r} fits its critic on one process's batch; run it without torchrun")
    if (a.batch_size // world_size) % algo.minibatches:
        raise ValueError(f"minibatches={algo.minibatches} must divide the per-worker batch "
                         f"{a.batch_size // world_size}")
    for plugin in make_plugins(cfg.plugins):  # each plug-in checks its own options, then the run
        plugin.check(cfg, world_size)
        if cfg.run.prepare_ahead and isinstance(plugin, DemonstrationSource) and plugin.plays_policy:
            raise ValueError(f"prepare_ahead=True builds a step's demonstrations before the step before it has "
                             f"trained, but {plugin.name} plays the current policy: turn one of them off")
