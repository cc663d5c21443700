"""The crafting chapter's committed policy (bench/results/crafting-full/) is the benchmark recipe's, unaltered."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from agent_lab.config import TrainConfig
from agent_lab.recipes import recipe

COMMITTED = Path(__file__).resolve().parents[2] / "bench" / "results" / "crafting-full"
pytestmark = pytest.mark.skipif(not (COMMITTED / "checkpoint.pt").exists(),
                                reason="no committed crafting policy (bench/results/README.md says how to make one)")


def learned_settings(cfg: TrainConfig) -> dict:
    """Everything but the run section (device, threads, checkpoints, run directory): what changes the policy."""
    d = cfg.to_dict()
    d.pop("run")
    return d


def test_committed_configuration_is_the_crafting_full_recipe():
    saved = TrainConfig.from_dict(json.loads((COMMITTED / "config.json").read_text()))
    assert learned_settings(saved) == learned_settings(recipe("crafting-full")), (
        "bench/results/crafting-full/config.json differs from recipe crafting-full: retrain it with the command in "
        "bench/results/README.md")


def test_committed_checkpoint_matches_its_checksum():
    expected = (COMMITTED / "checkpoint.pt.sha256").read_text().split()[0]
    assert hashlib.sha256((COMMITTED / "checkpoint.pt").read_bytes()).hexdigest() == expected
