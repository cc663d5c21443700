"""The course's reference agent ships with the repository, so handing it in (as it is, re-saved, cast to a lower
precision and back, or with a little noise) earns no agent points and flags the submission for review; an agent
of its own is evaluated as before; only a grader of the bundled samples accepts the reference."""
from __future__ import annotations

import dataclasses
import sys
import types
from pathlib import Path

import nbformat
import pytest
import torch

from agent_lab.checkpoints import load_checkpoint, save_checkpoint
from agent_lab.grading import runner, trained_agent
from agent_lab.policy import TinyTransformer
from autograder import grade

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "autograder" / "samples" / "crafting_reference.pt"
CRAFTING = REPO / "assignments" / "source" / "crafting_agent" / "crafting_agent.ipynb"
RECIPE = "crafting-assignment"
AGENT = ("test_trained_agent_visible", "test_trained_agent_seen_goals_hidden",
         "test_trained_agent_held_out_goals_hidden")


def _variant(tmp_path: Path, change) -> Path:
    """The reference with ``change`` applied to each weight tensor, saved as a student would save it."""
    policy, tok, _ = load_checkpoint(REFERENCE)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for tensor in policy.state_dict().values():
            if tensor.is_floating_point():
                tensor.copy_(change(tensor, generator))
    path = tmp_path / "crafting_agent.pt"
    save_checkpoint(path, policy, tok, recipe=RECIPE, seed=0)
    return path


def _noise(relative: float):
    return lambda w, g: w + relative * w.abs().mean() * torch.randn(w.shape, generator=g)


@pytest.mark.parametrize("change", [lambda w, g: w, lambda w, g: w.half().float(),
                                    lambda w, g: w.bfloat16().float(), _noise(1e-3)],
                         ids=["re-saved", "float16", "bfloat16", "noise"])
def test_a_copy_of_the_reference_is_refused_and_flagged_for_review(tmp_path, change):
    for path in (REFERENCE, _variant(tmp_path, change)):
        with pytest.raises(trained_agent.ReferenceCopy, match=trained_agent.REVIEW_FLAG) as raised:
            trained_agent.evaluate_checkpoint(path, RECIPE, {})
        assert "crafting_reference.pt" in str(raised.value) and "earns no points" in str(raised.value)


def test_an_agent_of_its_own_is_not_taken_for_the_reference(tmp_path):
    _, tok, _ = load_checkpoint(REFERENCE)
    torch.manual_seed(1)
    from agent_lab.recipes import recipe
    own = TinyTransformer(dataclasses.replace(recipe(RECIPE).model, vocab_size=len(tok)))
    save_checkpoint(tmp_path / "own.pt", own, tok, recipe=RECIPE, seed=1)
    assert trained_agent.evaluate_checkpoint(tmp_path / "own.pt", RECIPE, {}) == {}
    far = _variant(tmp_path, _noise(0.2))   # far beyond the tolerance: judged by its evaluation alone
    assert trained_agent.evaluate_checkpoint(far, RECIPE, {}) == {}


def test_only_a_grader_of_the_samples_accepts_the_reference(monkeypatch):
    monkeypatch.setenv(trained_agent.ACCEPT_REFERENCE_ENV, "1")
    assert trained_agent.evaluate_checkpoint(REFERENCE, RECIPE, {}) == {}


class _NoKernel:
    """The agent tests read the handed-in file only; they call no function of the student's kernel."""

    current = None

    def ready(self):
        return types.SimpleNamespace(deadline=None, budget=None)


def test_the_reference_handed_in_earns_no_agent_point_and_lands_in_the_review_column():
    tests = [t for t in runner.test_cells(nbformat.read(CRAFTING, as_version=4)) if t.grade_id in AGENT]
    assert [t.grade_id for t in tests] == list(AGENT)
    outcomes = runner.run_tests(tests, _NoKernel(), [], 600, files={"crafting_agent.pt": REFERENCE})
    results = [grade.TestResult(o.grade_id, o.score, o.max_score, o.message) for o in outcomes]
    assert [r.score for r in results] == [0.0, 0.0, 0.0], [r.message for r in results]
    assert all(trained_agent.REVIEW_FLAG in r.message for r in results), [r.message for r in results]
    assert grade.flagged(results) == [f"flagged:{g}" for g in AGENT]
    assert not any(o.records for o in outcomes)   # no leaderboard row for a copy


def test_the_workers_environment_accepts_the_reference_only_when_the_batch_asks(tmp_path, monkeypatch):
    monkeypatch.setenv(trained_agent.ACCEPT_REFERENCE_ENV, "1")   # set in the instructor's shell: not inherited
    name = trained_agent.ACCEPT_REFERENCE_ENV
    probe = ["-c", f"import os, sys; open(sys.argv[1], 'w').write(os.environ.get({name!r}, '-'))"]
    seen = []
    for extra in (None, {name: "1"}):
        grade._run_process([sys.executable, *probe, str(tmp_path / "env")], cwd=tmp_path, extra_env=extra)
        seen.append((tmp_path / "env").read_text())
    assert seen == ["-", "1"]
