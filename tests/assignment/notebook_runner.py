"""Run the assignment's graded cells against a chosen implementation, without the nbgrader pipeline.

This is equivalent to nbgrader's autograde for the purpose of scoring implementations: the cells run top
to bottom in one namespace, each test cell passes when it raises nothing, and earns its ``points`` from
the nbgrader metadata. Solution cells can be replaced by other source code (a mutant, a stub, a
hard-coded answer). One end-to-end nbgrader run in ``test_release_and_autograde.py`` checks the
equivalence on a real submission.
"""

from __future__ import annotations

import builtins
import contextlib
import copy
import math
import pathlib
import sys
import types
from collections.abc import Iterator
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


@contextlib.contextmanager
def restored_globals() -> Iterator[None]:
    """Undo, on exit, what a submission monkeypatched in torch, numpy, math, builtins and agent_lab.

    The runner executes submissions in the test process, so a patch must not leak into the next test.
    """
    import numpy
    import numpy.testing
    import torch
    import torch.nn.functional
    import torch.testing

    names = ("torch", "torch.autograd", "torch.testing", "torch.nn.functional", "numpy", "numpy.testing")
    modules = [sys.modules[n] for n in names] + [math, builtins]
    modules += [m for n, m in list(sys.modules.items()) if n.startswith("agent_lab") and m is not None]
    saved = [(m, dict(vars(m))) for m in modules]
    tensor_saved = dict(vars(torch.Tensor))
    codes = [(f, f.__code__) for m, d in saved for f in d.values()
             if type(f) is types.FunctionType and f.__module__.startswith("agent_lab")]
    try:
        yield
    finally:
        for function, code in codes:
            function.__code__ = code
        for module, old in saved:
            for key, value in old.items():
                if vars(module).get(key, object()) is not value:
                    setattr(module, key, value)
        for key in [k for k in vars(torch.Tensor) if k not in tensor_saved]:
            delattr(torch.Tensor, key)
        for key, value in tensor_saved.items():
            if vars(torch.Tensor).get(key, object()) is not value:
                setattr(torch.Tensor, key, value)


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
    with restored_globals():
        return _run(copy.deepcopy(notebook or load_source()), dict(solutions or {}), include_training)


def _run(notebook: nbformat.NotebookNode, solutions: dict[str, str], include_training: bool) -> Score:
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
