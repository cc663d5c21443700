"""Option checks shared by the plug-ins."""

from __future__ import annotations

import math
from typing import Any


def probability(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"{name} must lie in [0, 1], got {value!r}")


def weight(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def count(name: str, value: Any, low: int = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def env_has(cfg, method: str, what: str) -> None:
    """The run's environment class must offer ``method`` (without building the environment)."""
    from agent_lab.envs import env_class

    if not hasattr(env_class(cfg.env), method):
        raise ValueError(f"{what} needs an environment with {method}(); env={cfg.env!r} has none (crafting has)")
