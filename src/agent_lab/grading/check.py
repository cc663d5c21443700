"""The students' check: run a notebook's visible tests the way the grader runs them, on the student's machine.

The notebook is read and assembled exactly as the grader does (:mod:`agent_lab.grading.notebook`), its cells
run in a fresh local kernel with the grading view of ``agent_lab`` (so a call into the library fails here as it
would there), and the release's visible tests run in this process against the student's functions. Hidden tests
are not in a release: they are reported as run by the grader. There is no sandbox here.
"""
from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from pathlib import Path

import nbformat

from agent_lab.grading import notebook, runner
from agent_lab.grading.session import KernelSession, LocalKernelManager, SessionLimits


@dataclass(frozen=True)
class CheckLine:
    grade_id: str
    score: float       # NaN when the test is not run here (hidden, or skipped)
    points: float
    message: str


def is_hidden(test: runner.TestCell) -> bool:
    """A release's test cell that holds hidden tests: named so (``..._hidden``), or with no code left."""
    return "_hidden" in test.grade_id or not ast.parse(test.source).body


def check_notebook(path: Path, release: nbformat.NotebookNode, skip: tuple[str, ...] = (),
                   cell_timeout: int = 600) -> tuple[list[CheckLine], list[str]]:
    """(one line per test, notes about the notebook); raises ``ValueError`` for a file that is no notebook."""
    cells, problem = notebook.read_submission(Path(path).read_bytes(), Path(path).name)
    if cells is None:
        raise ValueError(problem)
    nb, notes = notebook.assemble(release, cells)
    tests = runner.test_cells(release)
    session = KernelSession(nb, LocalKernelManager, SessionLimits(cell_timeout=cell_timeout),
                            cwd=str(Path(path).resolve().parent))
    lines, cache = [], {}
    try:
        session.run_notebook()
        session.check_server()
        names = runner.interface(release)
        files, file_notes = notebook.files_beside(Path(path).resolve())
        notes += file_notes
        for test in tests:
            if is_hidden(test):
                lines.append(CheckLine(test.grade_id, math.nan, test.points, "hidden: run by the grader"))
            elif test.grade_id in skip:
                lines.append(CheckLine(test.grade_id, math.nan, test.points, "skipped"))
            else:
                out = runner.run_test(test, session, names, float(cell_timeout), files, cache)
                lines.append(CheckLine(test.grade_id, out.score, out.max_score, out.message))
    finally:
        session.close()
    return lines, notes + session.notes
