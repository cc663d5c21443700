"""The crafting assignment's training part: the agent handed in beside the notebook is evaluated by the grader's
code on private worlds; the committed reference agent is the recipe's run and meets the notebook's thresholds."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import nbformat
import pytest

from agent_lab.checkpoints import save_checkpoint
from agent_lab.config import TrainConfig
from agent_lab.policy import TinyTransformer, WordTokenizer
from agent_lab.policy.tokenizer import SPECIALS
from agent_lab.recipes import recipe
from agent_lab.trainer import build_env

from .notebook_runner import CRAFTING, run_notebook

pytestmark = pytest.mark.xdist_group("assignment-crafting")

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "autograder" / "samples" / "crafting_reference.pt"
RECORD = REPO / "autograder" / "samples" / "crafting_reference.json"
AGENT_TESTS = ("test_trained_agent_visible", "test_trained_agent_seen_goals_hidden",
               "test_trained_agent_held_out_goals_hidden")


def _agent_scores(files):
    score = run_notebook(path=CRAFTING, files=files)
    others = [g for g in score.passed if g not in AGENT_TESTS]
    assert all(score.passed[g] for g in others), {g: score.messages[g] for g in others if not score.passed[g]}
    return score


def test_the_reference_agent_passes_every_agent_test_and_lands_on_the_leaderboard(monkeypatch):
    from agent_lab.grading.trained_agent import ACCEPT_REFERENCE_ENV
    monkeypatch.setenv(ACCEPT_REFERENCE_ENV, "1")  # a student's copy of it earns nothing (tests/autograder)
    score = _agent_scores({"crafting_agent.pt": REFERENCE})
    assert all(score.passed[g] for g in AGENT_TESTS), {g: score.messages[g] for g in AGENT_TESTS}
    assert "seen goals: success" in score.messages["test_trained_agent_seen_goals_hidden"]
    (table, row), = score.records
    assert table == "leaderboard" and 0 <= row["seen_goals_success"] <= 1 and row["held_out_goals_n"] == 100


def test_a_policy_of_another_vocabulary_is_refused(tmp_path):
    """(Missing, hostile, oversized, linked and wrong-architecture files: tests/autograder/test_crafting_batch.py,
    graded in the sandbox.)"""
    cfg = recipe("crafting-assignment")
    tok = WordTokenizer.from_env(build_env(cfg))
    other = WordTokenizer(tok.vocab[len(SPECIALS):-1] + ["zebra"])  # same size, one word differs
    policy = TinyTransformer(dataclasses.replace(cfg.model, vocab_size=len(other)))
    save_checkpoint(tmp_path / "crafting_agent.pt", policy, other)
    score = _agent_scores({"crafting_agent.pt": tmp_path / "crafting_agent.pt"})
    assert "vocabulary is not the crafting environment's" in score.messages[AGENT_TESTS[1]]


def test_the_committed_reference_is_the_recipes_run_and_meets_the_notebooks_thresholds():
    import hashlib
    import re

    record = json.loads(RECORD.read_text())
    assert record["sha256"] == hashlib.sha256(REFERENCE.read_bytes()).hexdigest()
    want = recipe("crafting-assignment", seed=record["seed"], run_dir=record["config"]["run"]["run_dir"],
                  cpu_threads=record["config"]["run"]["cpu_threads"]).to_dict()
    # read as any saved config is (settings added since take their defaults, which keep the old behaviour)
    saved = TrainConfig.from_dict(record["config"]).to_dict()
    assert saved == want, "the committed reference was trained with other settings than the recipe's"
    cells = {c.metadata.get("nbgrader", {}).get("grade_id"): c.source
             for c in nbformat.read(CRAFTING, as_version=4).cells}
    thresholds = eval(re.search(r"THRESHOLDS = (\{.*?\})", cells["test_trained_agent_visible"]).group(1))
    for group, t in thresholds.items():
        assert record["evaluation"][f"private {group}"]["success"] >= t
