"""``agent-lab check NOTEBOOK``: the release's tests are taken from the notebook's own locked cells, verified
against their nbgrader checksums, so the command works from wherever the notebook is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbgrader.utils import compute_checksum

from agent_lab.cli import main, release_from_copy

ROOT = Path(__file__).resolve().parents[2]
RELEASED = ROOT / "assignments" / "release" / "policy_gradients" / "policy_gradients.ipynb"


def _cell(kind, source, gid, **flags):
    meta = {"grade_id": gid, "schema_version": 3, "solution": False, "grade": False, "locked": False, **flags}
    cell = (nbformat.v4.new_code_cell if kind == "code" else nbformat.v4.new_markdown_cell)(source)
    cell.metadata["nbgrader"] = meta
    cell.metadata["nbgrader"]["checksum"] = compute_checksum(cell)
    return cell


@pytest.fixture()
def released():
    return nbformat.v4.new_notebook(cells=[
        _cell("code", "import math", "setup", locked=True),
        _cell("code", "def f(x):\n    raise NotImplementedError()", "f", solution=True),
        _cell("code", "assert f(2) == 4", "test_f", grade=True, locked=True, points=1),
    ])


def test_an_untouched_copy_stands_for_its_release_whatever_the_answers(released):
    released.cells[1].source = "def f(x):\n    return 2 * x"  # an answer cell: free to change
    assert release_from_copy(released) is released


def test_an_edited_test_cell_is_refused_by_name(released):
    released.cells[2].source = "assert True"
    with pytest.raises(ValueError, match=r"locked cell\(s\) \['test_f'\] differ from the release .* --release"):
        release_from_copy(released)


def test_a_notebook_without_test_cells_is_refused(released):
    del released.cells[2]
    with pytest.raises(ValueError, match="no nbgrader test cells"):
        release_from_copy(released)


def test_a_missing_notebook_is_one_clear_line(tmp_path, capsys):
    assert main(["check", str(tmp_path / "nope.ipynb")]) == 2
    assert "nope.ipynb is not a file" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(not RELEASED.exists(), reason="run `make assignments` first (the released notebook)")
def test_check_runs_from_the_notebooks_own_folder_outside_the_repository(tmp_path):
    (tmp_path / RELEASED.name).write_text(RELEASED.read_text())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([str(Path(sys.executable).with_name("agent-lab")), "check", RELEASED.name, "--skip-training"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 1, run.stdout + run.stderr  # the stubs fail their visible tests
    assert "reward_to_go is not implemented yet" in run.stdout
    assert "hidden: run by the grader" in run.stdout and "test_train_agent" in run.stdout
    assert "skipped" in run.stdout and "Kernel is running over TCP" not in run.stdout + run.stderr
    saved = json.loads((tmp_path / RELEASED.name).read_text())
    assert saved == json.loads(RELEASED.read_text()), "the check must not write to the student's notebook"
