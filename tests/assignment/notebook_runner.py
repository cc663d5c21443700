"""Grade the assignment's notebook with chosen answers, exactly as the grader does, without the sandbox.

``run_notebook({"reward_to_go": source, ...})`` puts those sources into the answer cells of the source notebook
(every other answer gets the reference solution), assembles the graded notebook, runs the student's cells in a
local grading kernel (:class:`agent_lab.grading.session.LocalKernelManager`: the same view of ``agent_lab`` as
the sandbox) and runs the tests in this process (:mod:`agent_lab.grading.runner`), hidden tests included.  Only
the sandbox differs from ``make grade``; the autograder's own tests cover the sandbox.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass, field

import nbformat

from agent_lab.grading import notebook, runner
from agent_lab.grading.session import KernelSession, LocalKernelManager, SessionLimits

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCE = ROOT / "assignments" / "source" / "policy_gradients" / "policy_gradients.ipynb"
CRAFTING = ROOT / "assignments" / "source" / "crafting_agent" / "crafting_agent.ipynb"
GRADED_FUNCTIONS = ("reward_to_go", "reinforce_loss", "dr_grpo_advantages", "dr_grpo_loss")
TRAINING_TEST = "test_train_agent"


def load_source(path: pathlib.Path = SOURCE) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def grade_id(cell: nbformat.NotebookNode) -> str | None:
    return notebook.grade_id(cell)


def cell_source(grade: str, nb: nbformat.NotebookNode | None = None) -> str:
    matches = [cell.source for cell in (nb or load_source()).cells if grade_id(cell) == grade]
    if len(matches) != 1:
        raise ValueError(f"expected one cell with grade_id {grade!r}, found {len(matches)}")
    return matches[0]


def points_by_test(nb: nbformat.NotebookNode | None = None) -> dict[str, float]:
    """grade_id -> points of every test cell."""
    return {t.grade_id: t.points for t in runner.test_cells(nb or load_source())}


@dataclass
class Score:
    passed: dict[str, bool] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)
    points: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    records: list = field(default_factory=list)  # (table, row) pairs the tests recorded

    @property
    def total(self) -> float:
        return sum(self.points.values())

    def failed(self) -> list[str]:
        return [name for name, ok in self.passed.items() if not ok]


def run_notebook(solutions: dict[str, str] | None = None, *, include_training: bool = False,
                 visible_only: bool = False, cell_timeout: int = 60,
                 tests: list[runner.TestCell] | None = None, path: pathlib.Path = SOURCE,
                 files: dict[str, pathlib.Path] | None = None) -> Score:
    """Grade the source notebook with some answer cells replaced (grade_id -> source).

    Without ``include_training`` the training test is left out; with ``visible_only`` the hidden tests are;
    ``tests`` replaces the notebook's tests altogether; ``path`` is the source notebook (the first assignment's
    by default); ``files`` are the files handed in beside the notebook (none by default).
    """
    source = load_source(path)
    solutions = dict(solutions or {})
    submission = nbformat.from_dict(source)
    for cell in submission.cells:
        if grade_id(cell) in solutions:
            cell.source = solutions.pop(grade_id(cell))
    if solutions:
        raise ValueError(f"no answer cells named {sorted(solutions)}")
    cells, problem = notebook.read_submission(nbformat.writes(submission).encode())
    assert cells is not None, problem
    graded, _ = notebook.assemble(source, cells)
    if tests is None:
        tests = [t for t in runner.test_cells(source) if (include_training or t.grade_id != TRAINING_TEST)
                 and not (visible_only and t.hidden)]
    session = KernelSession(graded, LocalKernelManager, SessionLimits(cell_timeout=cell_timeout))
    try:
        session.run_notebook()
        session.check_server()
        outcomes = runner.run_tests(tests, session, runner.interface(source), cell_timeout,
                                    {TRAINING_TEST: 600}, files=files or {})
    finally:
        session.close()
    score = Score(notes=session.notes)
    for o in outcomes:
        score.passed[o.grade_id], score.messages[o.grade_id] = o.score >= o.max_score, o.message
        score.points[o.grade_id] = o.score
        score.records += o.records
    return score
