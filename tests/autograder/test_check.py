"""The student-side check runs the visible tests with the grader's messages and never the hidden ones."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat

import toy_assignment as toy
from agent_lab.grading.check import check_notebook

REPO = Path(__file__).resolve().parents[2]


def _release(tmp_path: Path) -> Path:
    """The toy release: the source with solutions and hidden tests cleared, as nbgrader makes it."""
    from nbgrader.preprocessors import ClearHiddenTests, ClearSolutions

    nb = nbformat.read(toy.write_source(tmp_path / "source") / "toy" / "toy.ipynb", as_version=4)
    resources = {"language": "python"}
    ClearSolutions().preprocess(nb, resources)
    ClearHiddenTests().preprocess(nb, resources)
    path = tmp_path / "release.ipynb"
    nbformat.write(nb, path)
    return path


def test_check_reports_visible_results_with_messages_and_hides_hidden_tests(tmp_path):
    release = _release(tmp_path)
    nb = toy.solved(nbformat.read(release, as_version=4),
                    square="def square(x):\n    return x - 1")       # wrong for 2
    tests = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    tests[0].source = "pass  # a student 'fixed' the visible test"  # the check restores it
    path = tmp_path / "student" / "toy.ipynb"
    path.parent.mkdir()
    nbformat.write(nb, path)
    lines, notes = check_notebook(path, nbformat.read(release, as_version=4))
    report = {line.grade_id: (line.score, line.points, line.message) for line in lines}
    assert report["test_square_visible"] == (0.0, 1.0, "square(2) should be 4")
    assert any("were edited" in n for n in notes)
    got, pts, msg = report["test_square_hidden"]
    assert got != got and msg == "hidden: run by the grader"     # NaN: not graded here
    assert "cube(2)" not in " ".join(m for _, _, m in report.values())


def test_check_runs_as_a_script_and_fails_on_a_wrong_visible_test(tmp_path):
    release = _release(tmp_path)
    nb = toy.solved(nbformat.read(release, as_version=4), square="def square(x):\n    return 0")
    path = tmp_path / "toy.ipynb"
    nbformat.write(nb, path)
    proc = subprocess.run([sys.executable, str(REPO / "autograder" / "check.py"), str(path),
                           "--release", str(release)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "square(2) should be 4" in proc.stdout
    assert "visible tests: 0 / 1 points" in proc.stdout


def test_the_check_finds_the_release_of_the_notebooks_own_assignment(tmp_path):
    from autograder.check import RELEASES, release_for

    assert release_for(tmp_path / "crafting_agent.ipynb") == RELEASES / "crafting_agent" / "crafting_agent.ipynb"
    assert release_for(tmp_path / "my copy.ipynb") == RELEASES / "policy_gradients" / "policy_gradients.ipynb"
