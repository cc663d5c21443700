"""Run the assignment's graded cells against a chosen implementation, without the nbgrader pipeline.

This is equivalent to nbgrader's autograde for the purpose of scoring implementations: the cells run top
to bottom in one namespace, each test cell passes when it raises nothing, and earns its ``points`` from
the nbgrader metadata. Solution cells can be replaced by other source code (a mutant, a stub, a
hard-coded answer). One end-to-end nbgrader run in ``test_release_and_autograde.py`` checks the
equivalence on a real submission.
"""

from __future__ import annotations

import copy
import pathlib
from dataclasses import dataclass, field

import nbformat

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCE = ROOT / "assignments" / "source" / "policy_gradients" / "policy_gradients.ipynb"
GRADED_FUNCTIONS = ("reward_to_go", "reinforce_loss", "dr_grpo_advantages", "dr_grpo_loss")
TRAINING_CELLS = ("train_agent", "test_train_agent")


def load_source() -> nbformat.NotebookNode:
    return nbformat.read(SOURCE, as_version=4)


def grade_id(cell: nbformat.NotebookNode) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def cell_source(grade: str, notebook: nbformat.NotebookNode | None = None) -> str:
    notebook = notebook or load_source()
    matches = [cell.source for cell in notebook.cells if grade_id(cell) == grade]
    if len(matches) != 1:
        raise ValueError(f"expected one cell with grade_id {grade!r}, found {len(matches)}")
    return matches[0]


def points_by_test(notebook: nbformat.NotebookNode | None = None) -> dict[str, float]:
    """grade_id -> points of every graded (test) cell."""
    notebook = notebook or load_source()
    return {
        grade_id(cell): float(cell.metadata["nbgrader"]["points"])
        for cell in notebook.cells
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade")
    }


@dataclass
class Score:
    passed: dict[str, bool] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)
    points: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.points.values())

    def failed(self) -> list[str]:
        return [name for name, ok in self.passed.items() if not ok]


def run_notebook(
    solutions: dict[str, str] | None = None,
    *,
    include_training: bool = False,
    notebook: nbformat.NotebookNode | None = None,
) -> Score:
    """Execute the notebook's code cells in order with some solution cells replaced by other source.

    ``solutions`` maps a solution grade_id to the source that replaces that cell. Test cells record
    pass/fail and points; an error in a non-test cell propagates (the notebook itself is broken).
    """
    notebook = copy.deepcopy(notebook or load_source())
    solutions = dict(solutions or {})
    points = points_by_test(notebook)
    namespace: dict[str, object] = {"__name__": "__main__"}
    score = Score()
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        gid = grade_id(cell)
        if gid in TRAINING_CELLS and not include_training:
            continue
        source = solutions.pop(gid, cell.source)
        if gid in points:
            try:
                exec(compile(source, f"<cell {gid}>", "exec"), namespace)
            except Exception as exc:  # a failing test cell scores 0, as in nbgrader
                score.passed[gid], score.messages[gid], score.points[gid] = False, f"{type(exc).__name__}: {exc}", 0.0
            else:
                score.passed[gid], score.messages[gid], score.points[gid] = True, "", points[gid]
        else:
            try:
                exec(compile(source, f"<cell {gid}>", "exec"), namespace)
            except Exception:
                if gid in GRADED_FUNCTIONS or gid == "train_agent":
                    continue  # a student cell that raises: its tests fail on their own
                raise
    if solutions:
        raise ValueError(f"no solution cells named {sorted(solutions)}")
    return score
