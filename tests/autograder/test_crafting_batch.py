"""The crafting assignment graded end to end in the sandbox: a trained agent handed in as a file beside the
notebook, and the files a student could hand in instead (a pickle that runs code, another architecture, an
oversized file, a link to a file outside the submission). Each scores exactly what it earned, with the reason;
nothing a checkpoint carries runs; the leaderboard holds the agents that were evaluated."""
from __future__ import annotations

import csv
import dataclasses
import os
import shutil
from pathlib import Path

import nbformat
import pytest
import torch

from autograder import grade, sandbox, samples
from sandbox_marks import BATCH

pytestmark = BATCH

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "assignments" / "source"
NAME = "crafting_agent"
AGENT = ("test_trained_agent_visible", "test_trained_agent_seen_goals_hidden",
         "test_trained_agent_held_out_goals_hidden")
MANUAL = ("explain_signal", "explain_failures")


def _extra_cases(subs: Path, reference: Path) -> None:
    from agent_lab.checkpoints import save_checkpoint
    from agent_lab.policy import TinyTransformer, WordTokenizer
    from agent_lab.recipes import recipe
    from agent_lab.trainer import build_env

    def student(name: str) -> Path:
        folder = subs / name
        folder.mkdir()
        shutil.copyfile(reference / f"{NAME}.ipynb", folder / f"{NAME}.ipynb")
        return folder

    cfg = recipe("crafting-assignment")
    tok = WordTokenizer.from_env(build_env(cfg))
    small = TinyTransformer(dataclasses.replace(cfg.model, d_model=32, n_heads=2, vocab_size=len(tok)))
    save_checkpoint(student("wrong_architecture") / "crafting_agent.pt", small, tok)
    with open(student("oversized") / "crafting_agent.pt", "wb") as f:
        f.truncate(40 << 20)
    os.symlink(reference / "crafting_agent.pt", student("linked_checkpoint") / "crafting_agent.pt")


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    root = tmp_path_factory.mktemp("crafting-batch")
    out, subs = root / "grading", root / "submissions"
    release = nbformat.read(grade.prepare_course(out, SOURCE, NAME), as_version=4)
    source_nb = nbformat.read(SOURCE / NAME / f"{NAME}.ipynb", as_version=4)
    if os.path.exists(samples.PICKLE_MARKER):
        os.unlink(samples.PICKLE_MARKER)
    samples.build_crafting(subs, source_nb, release, NAME)
    _extra_cases(subs, subs / "reference")
    results = grade.grade_all(subs, out=out, source_root=SOURCE, assignment=NAME, jobs=2, accept_reference=True,
                              limits=sandbox.Limits(cell_timeout=120, notebook_timeout=900, memory_bytes=3 << 30))
    return out, {r.student: r for r in results}


def _scores(result):
    return {t.grade_id: t.score for t in result.tests}, {t.grade_id: t.message for t in result.tests}


def test_the_reference_earns_every_autograded_point_and_its_answers_wait_for_a_person(batch):
    out, results = batch
    scores, messages = _scores(results["reference"])
    assert all(scores[t.grade_id] == t.max_score for t in results["reference"].tests), messages
    assert "seen goals: success" in messages["test_trained_agent_seen_goals_hidden"]
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{out / 'course' / 'gradebook.db'}", grade.COURSE_ID) as gb:
        nb = gb.find_submission_notebook(NAME, NAME, "reference")
        manual = {g.name: g.needs_manual_grade for g in nb.grades if g.name in MANUAL}
    assert manual == {m: True for m in MANUAL}


def test_the_blank_release_scores_zero(batch):
    _, results = batch
    assert results["blank"].score == 0


def test_bookkeeping_bugs_lose_their_visible_and_hidden_points_and_are_named(batch):
    # The unshifted mask and the bootstrapped termination are the classic bugs the visible tests now name,
    # so the student sees them before hand-in; the hidden tests take their own points as well.
    _, results = batch
    scores, messages = _scores(results["observation_mask"])
    lost = {g for g, s in scores.items() if s == 0}
    assert lost == {"test_transcript_batch_visible", "test_transcript_batch_hidden",
                    "test_turn_returns_visible", "test_turn_returns_hidden"}, messages
    assert "unshifted" in messages["test_transcript_batch_visible"], messages["test_transcript_batch_visible"]
    assert "bootstrap" in messages["test_turn_returns_visible"], messages["test_turn_returns_visible"]


@pytest.mark.parametrize("student, reason", [
    ("pickled_checkpoint", "refused: it holds Python objects"),
    ("wrong_architecture", "not the required architecture: d_model=32 (expected 128)"),
    ("oversized", "over the limit of"),
    ("linked_checkpoint", "no file named 'crafting_agent.pt'"),
])
def test_a_bad_checkpoint_scores_zero_for_the_agent_only_with_the_reason(batch, student, reason):
    _, results = batch
    scores, messages = _scores(results[student])
    for t in results[student].tests:
        if t.grade_id in AGENT:
            assert scores[t.grade_id] == 0 and reason in messages[t.grade_id], (student, messages[t.grade_id])
        else:
            assert scores[t.grade_id] == t.max_score, (student, t.grade_id, messages[t.grade_id])


def test_nothing_a_checkpoint_carries_runs(batch):
    assert not os.path.exists(samples.PICKLE_MARKER)


def test_the_leaderboard_lists_the_evaluated_agents_with_intervals(batch):
    out, _ = batch
    rows = {r["student_id"]: r for r in csv.DictReader(open(out / "leaderboard.csv"))}
    assert set(rows) == {"reference", "observation_mask"}
    row = rows["reference"]
    assert float(row["seen_goals_success"]) >= 0 and row["held_out_goals_ci"].startswith("[")
    assert row["seen_goals_n"] == "100"
