"""Environments for agent RL: number search and crafting, their text protocol and exact planners.

``make_env(name, **options)`` builds one by name; every environment follows the contract in
ARCHITECTURE.md ("Environment contract"): ``vocabulary()``, ``max_turns``, ``max_action_words``,
``sample_tasks``, ``eval_tasks``, ``splits``, ``reset``, ``step`` -> :class:`StepBatch`,
``optimal_success``, ``demonstrations``, ``episode_logs`` and the module-level :func:`replay`.
Book: book/part1/00_demonstrations_vs_reward.md (number search and its dynamic programme),
book/part1/01_trajectories_and_support.md and book/part3/01_crafting.md.
"""

from __future__ import annotations

from typing import Any

from agent_lab.envs.base import INVALID_RULES, ReplayMismatch, StepBatch, TextEnv, replay, replay_prefix
from agent_lab.envs.crafting import Crafting
from agent_lab.envs.crafting_world import (
    HELD_OUT_GOALS,
    LEVELS,
    bfs_min_steps,
    check_world,
    generate_world,
    on_demand_plan,
    optimal_steps,
    shortest_plan,
)
from agent_lab.envs.number_search import NumberSearch
from agent_lab.envs.number_search_dp import (
    NumberSearchDP,
    PolicyEvaluation,
    PolicyTable,
    history_from_log,
    median_policy,
    sequential_policy,
    uniform_consistent_policy,
    uniform_optimal_policy,
)

__all__ = [
    "make_env",
    "env_class",
    "ENV_NAMES",
    "NumberSearch",
    "Crafting",
    "NumberSearchDP",
    "PolicyEvaluation",
    "PolicyTable",
    "StepBatch",
    "TextEnv",
    "INVALID_RULES",
    "ReplayMismatch",
    "replay",
    "replay_prefix",
    "history_from_log",
    "median_policy",
    "sequential_policy",
    "uniform_consistent_policy",
    "uniform_optimal_policy",
    "LEVELS",
    "HELD_OUT_GOALS",
    "generate_world",
    "check_world",
    "optimal_steps",
    "shortest_plan",
    "on_demand_plan",
    "bfs_min_steps",
]

_REGISTRY: dict[str, type[TextEnv]] = {"number-search": NumberSearch, "crafting": Crafting}
ENV_NAMES = tuple(_REGISTRY)


def env_class(name: str) -> type[TextEnv]:
    """The class of the environment called ``name`` (to ask what it offers without building one)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown environment {name!r}; known environments: {sorted(_REGISTRY)}")
    return _REGISTRY[name]


def make_env(name: str, **options: Any) -> TextEnv:
    """Build the environment called ``name`` with keyword ``options`` (see each class for its options)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown environment {name!r}; known environments: {sorted(_REGISTRY)}")
    return env_class(name)(**options)
