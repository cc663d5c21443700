"""The graded notebook is the release plus the student's own cell sources; a submission is untrusted JSON."""
from __future__ import annotations

import json

import nbformat
import pytest

from agent_lab.grading import notebook
from agent_lab.grading.notebook import StudentCell


def _meta(gid, **flags):
    return {"nbgrader": {"grade_id": gid, "schema_version": 3, "solution": False, "grade": False,
                         "locked": False, **flags}}


@pytest.fixture()
def release():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import torch", metadata=_meta("setup", locked=True)),
        nbformat.v4.new_code_cell("def f(x):\n    raise NotImplementedError()", metadata=_meta("f", solution=True)),
        nbformat.v4.new_code_cell("assert f(2) == 4", metadata=_meta("test_f", grade=True, locked=True, points=1)),
        nbformat.v4.new_markdown_cell("Explain.", metadata=_meta("why", solution=True, grade=True, points=2)),
        nbformat.v4.new_code_cell("def g(x):\n    raise NotImplementedError()", metadata=_meta("g", solution=True)),
        nbformat.v4.new_code_cell("# hidden", metadata=_meta("test_g", grade=True, locked=True, points=3)),
    ])
    nb.cells[2].metadata["tags"] = ["keep-this-release-tag"]
    return nb


def _submission(release, **sources):
    nb = nbformat.from_dict(json.loads(json.dumps(release)))
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in sources:
            cell.source = sources[gid]
    return nb


def _cells(nb):
    cells, problem = notebook.read_submission(json.dumps(nb).encode())
    assert problem == ""
    return cells


def test_answers_come_from_the_submission_and_everything_else_from_the_release(release):
    sub = _submission(release, f="def f(x):\n    return x * x", test_f="pass  # edited test", setup="x = 1")
    for cell in sub.cells:
        cell.metadata.setdefault("tags", []).append("skip-execution")
        cell.metadata["nbgrader"]["points"] = 100
        if cell.cell_type == "code":
            cell.outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": "'ok'"})]
    sub.metadata["kernelspec"] = {"name": "bash"}
    graded, notes = notebook.assemble(release, _cells(sub))
    assert [c.source for c in graded.cells] == ["import torch", "def f(x):\n    return x * x",
                                                 "assert f(2) == 4", "Explain.",
                                                 "def g(x):\n    raise NotImplementedError()", "# hidden"]
    assert [c.metadata for c in graded.cells] == [c.metadata for c in release.cells]
    assert all(c.outputs == [] for c in graded.cells if c.cell_type == "code")
    assert "kernelspec" not in graded.metadata
    assert any("were edited" in n for n in notes)


def test_added_cells_travel_with_the_assignment_cell_above_them_and_moves_are_undone(release):
    sub = _submission(release, f="def f(x):\n    return helper(x)")
    sub.cells.insert(0, nbformat.v4.new_code_cell("TOP = 1"))
    sub.cells.insert(3, nbformat.v4.new_code_cell("def helper(x):\n    return x * x"))
    sub.cells.insert(4, nbformat.v4.new_markdown_cell("my note"))
    sub.cells.insert(5, nbformat.v4.new_raw_cell("raw cells are dropped"))
    g_cell = next(c for c in sub.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "g")
    sub.cells.remove(g_cell)                # g moved to the top
    sub.cells.insert(1, g_cell)
    graded, notes = notebook.assemble(release, _cells(sub))
    sources = [c.source for c in graded.cells]
    assert sources[:6] == ["TOP = 1", "import torch", "def f(x):\n    return helper(x)",
                           "def helper(x):\n    return x * x", "my note", "assert f(2) == 4"]
    assert "raw cells are dropped" not in sources
    assert [notebook.grade_id(c) for c in graded.cells if notebook.grade_id(c)] == [
        notebook.grade_id(c) for c in release.cells]
    assert any("moved" in n for n in notes)


def test_a_missing_answer_is_graded_as_released_with_a_note(release):
    sub = _submission(release)
    sub.cells = [c for c in sub.cells if c.metadata["nbgrader"]["grade_id"] != "f"]
    graded, notes = notebook.assemble(release, _cells(sub))
    assert graded.cells[1].source == release.cells[1].source
    assert any("'f'" in n and "graded as released" in n for n in notes)


def test_a_copied_grade_id_does_not_turn_student_code_into_a_test(release):
    sub = _submission(release)
    sub.cells.append(nbformat.v4.new_code_cell("print('pretend test')", metadata=_meta("test_f", grade=True)))
    sub.cells.append(nbformat.v4.new_code_cell("def f(x):\n    return 0", metadata=_meta("f", solution=True)))
    graded, _ = notebook.assemble(release, _cells(sub))
    assert [notebook.grade_id(c) for c in graded.cells if notebook.is_test(c)] == ["test_f", "test_g"]
    assert sum(c.source == "print('pretend test')" for c in graded.cells) == 0   # a copy of a locked cell
    assert graded.cells[-1].source == "def f(x):\n    return 0"              # a second 'f' is an added cell
    assert notebook.kernel_cells(graded) == [0, 1, 4, 6]


def test_own_cells_are_answers_and_additions_only(release):
    cells = _cells(_submission(release, f="import ctypes"))
    own = notebook.own_cells(release, cells)
    assert [c.grade_id for c in own] == ["f", "why", "g"]


@pytest.mark.parametrize("raw, fragment", [
    (b"", "not valid notebook JSON"),
    (b"\xff\xfe not utf-8", "not UTF-8"),
    (b'{"cells": [ this is not json', "not valid notebook JSON"),
    (b"[" * 100_000, "not valid notebook JSON"),
    (b'{"nbformat": 4, "nbformat_minor": "x", "cells": [{"cell_type": "code"}]}', "not a valid notebook cell"),
    (b'{"nbformat": 1, "cells": []}', "declares nbformat 1"),
    (b'{"nbformat": 5, "cells": []}', "declares nbformat 5"),
    (b'{"nbformat": "4", "cells": []}', "declares nbformat"),
    (b'{"cells": 3}', "no list of cells"),
    (b'{"nbformat": 4, "cells": [{"cell_type": "code", "source": 7}]}', "not a valid notebook cell"),
    (b'{"nbformat": 4, "cells": [{"cell_type": "widget", "source": ""}]}', "not a valid notebook cell"),
])
def test_files_that_are_not_usable_notebooks_get_a_message_that_says_what_and_the_fix(raw, fragment):
    cells, problem = notebook.read_submission(raw, "hw.ipynb")
    assert cells is None and fragment in problem and "hw.ipynb" in problem
    assert "hand it in again" in problem


def test_odd_but_valid_cells_are_read():
    raw = json.dumps({"nbformat": 4, "nbformat_minor": "x", "metadata": {"n": "BIG"}, "cells": [
        {"cell_type": "code", "source": ["a = 1\n", "b = 2"], "metadata": {"nbgrader": "not a dict"}},
        {"cell_type": "markdown", "source": "", "metadata": None}]}).replace('"BIG"', "9" * 5000).encode()
    cells, problem = notebook.read_submission(raw)
    assert problem == "" and cells == [StudentCell("code", "a = 1\nb = 2", None), StudentCell("markdown", "", None)]
