"""Reading submissions without running them: ids, zips, notebook choice, metadata, order, feedback."""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

import nbformat
import pytest

import toy_assignment as toy
from autograder import grade, submissions
from autograder.samples import SOLUTION_BLOCK, build, fill, solution_sources


@pytest.fixture()
def release(tmp_path):
    """The toy assignment's notebook with nbgrader metadata, as a release would carry it."""
    return nbformat.read(toy.write_source(tmp_path / "src") / "toy" / "toy.ipynb", as_version=4)


def _ids(nb):
    return [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]


def test_student_ids_must_be_safe_names(tmp_path):
    for bad in ("a b", "-x", ".x", "x" * 70, "caf\u00e9", "a;rm"):
        with pytest.raises(ValueError, match="student id"):
            submissions.student_id_for(tmp_path / bad)
    assert submissions.student_id_for(tmp_path / "alice.zip") == "alice"


def test_discover_rejects_a_student_who_appears_twice(tmp_path):
    (tmp_path / "alice").mkdir()
    zipfile.ZipFile(tmp_path / "alice.zip", "w").close()
    with pytest.raises(ValueError, match="appears twice"):
        submissions.discover(tmp_path)
    with pytest.raises(ValueError, match="not a directory"):
        submissions.discover(tmp_path / "missing")


@pytest.mark.parametrize("entry", ["../evil.ipynb", "/abs/evil.ipynb", "a/../../evil.ipynb"])
def test_zip_entries_that_escape_the_folder_are_refused(tmp_path, entry):
    archive = tmp_path / "bob.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr(entry, "{}")
    sub = submissions.load(archive, "toy.ipynb", tmp_path / "scratch")
    assert sub.status == "invalid" and "unsafe entry" in sub.notes[0]
    assert not (tmp_path / "evil.ipynb").exists()


def test_zip_bombs_are_refused_before_unpacking(tmp_path, monkeypatch):
    monkeypatch.setattr(submissions, "MAX_ZIP_BYTES", 1000)
    archive = tmp_path / "carol.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("toy.ipynb", "0" * 5000)
    sub = submissions.load(archive, "toy.ipynb", tmp_path / "scratch")
    assert sub.status == "invalid" and "unpacks to more than" in sub.notes[0]


def test_notebook_choice_exact_name_then_single_renamed_then_missing(tmp_path, release):
    folder = tmp_path / "dave"
    folder.mkdir()
    nbformat.write(release, folder / "copy of toy.ipynb")
    sub = submissions.load(folder, "toy.ipynb", tmp_path)
    assert sub.status == "ok" and "renamed" in sub.notes[0]
    nbformat.write(release, folder / "other.ipynb")
    sub = submissions.load(folder, "toy.ipynb", tmp_path)
    assert sub.status == "missing" and "copy of toy.ipynb" in sub.notes[0]
    (folder / "sub").mkdir()
    nbformat.write(release, folder / "sub" / "toy.ipynb")
    assert submissions.load(folder, "toy.ipynb", tmp_path).status == "ok"


@pytest.mark.parametrize("content", [b"", b"not json", b'{"cells": 3}', "\udcff".encode("utf-8", "surrogatepass"),
                                     json.dumps({"nbformat": 4}).encode()])
def test_files_that_are_not_notebooks_are_invalid_with_a_message(tmp_path, content):
    (tmp_path / "erin").mkdir()
    (tmp_path / "erin" / "toy.ipynb").write_bytes(content)
    sub = submissions.load(tmp_path / "erin", "toy.ipynb", tmp_path)
    assert sub.status == "invalid" and "not a valid Jupyter notebook" in sub.notes[0]


def test_normalise_restores_points_and_drops_unknown_or_duplicate_grade_ids(release):
    meta = submissions.release_metadata(release)
    nb = nbformat.from_dict(release)
    nb.cells[2].metadata.nbgrader["points"] = 100                  # test_square_visible
    nb.cells[5].metadata.nbgrader["grade_id"] = "invented"           # test_cube_hidden renamed
    nb.cells.insert(1, nbformat.from_dict(nb.cells[3]))              # a duplicate of test_square_hidden
    notes = submissions.normalise(nb, meta)
    points = {c.metadata.nbgrader["grade_id"]: c.metadata.nbgrader.get("points")
              for c in nb.cells if "nbgrader" in c.metadata}
    assert points["test_square_visible"] == 1
    assert "invented" not in points and "test_cube_hidden" not in points
    assert _ids(nb).count("test_square_hidden") == 1
    assert any("was changed" in n for n in notes)
    assert any("test_cube_hidden" in n and "missing" in n for n in notes)


def test_normalise_notes_an_edited_locked_cell(release):
    nb = nbformat.from_dict(release)
    nb.cells[2].source = "pass"
    notes = submissions.normalise(nb, submissions.release_metadata(release),
                                  submissions.locked_sources(release))
    assert notes == ["the locked cell 'test_square_visible' was edited; the grader runs the original"]


def test_canonical_order_puts_tests_after_their_code_and_keeps_helpers_with_their_cell(release):
    meta = submissions.release_metadata(release)
    nb = nbformat.from_dict(release)
    helper = nbformat.v4.new_code_cell("HELPER = 1")
    square, tests = nb.cells[1], nb.cells[2:4]
    nb.cells = [nb.cells[0], *tests, square, helper, *nb.cells[4:]]
    notes = submissions.normalise(nb, meta)
    assert _ids(nb) == _ids(release)[:2] + [None] + _ids(release)[2:]
    assert nb.cells[2].source == "HELPER = 1"
    assert any("moved" in n for n in notes)
    assert not any("moved" in n for n in submissions.normalise(nbformat.from_dict(release), meta))


def test_suspicious_code_is_listed_only_from_unlocked_cells(release):
    nb = nbformat.from_dict(release)
    nb.cells[1].source = "ip = get_ipython()\nimport ctypes"
    nb.cells[2].source = "import subprocess"   # a locked test cell: the grader restores it anyway
    assert submissions.suspicious_code(nb) == ["ctypes", "get_ipython"]


def test_feedback_escapes_messages_and_lists_every_test():
    result = grade.StudentResult("zoe", "graded", [
        grade.TestResult("test_a_visible", 2, 2, "passed"),
        grade.TestResult("test_a_hidden", 0, 4, "AssertionError: <script>alert(1)</script>")],
        notes=["grader log: /secret/path", "renamed"])
    page = grade.feedback_html(result, "toy")
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "2 / 6" in page and "test_a_hidden" in page and "0 / 4" in page
    assert "/secret/path" not in page and "renamed" in page


def test_cell_message_keeps_the_error_but_never_the_traceback():
    cell = nbformat.v4.new_code_cell("secret_hidden_check()")
    cell.outputs = [nbformat.v4.new_output("error", ename="AssertionError", evalue="\x1b[31mwrong\x1b[0m",
                                           traceback=["secret_hidden_check() line 3"])]
    assert grade._cell_message(cell) == "AssertionError: wrong"
    cell.outputs = [nbformat.v4.new_output("stream", name="stderr", text="warning")]
    assert "stderr" in grade._cell_message(cell)


def test_samples_are_built_from_the_assignment(tmp_path):
    root = Path(__file__).resolve().parents[2] / "assignments" / "source" / "policy_gradients"
    source = nbformat.read(root / "policy_gradients.ipynb", as_version=4)
    from nbgrader.preprocessors import ClearSolutions  # the release, without running nbgrader
    release = nbformat.from_dict(source)
    ClearSolutions(begin_solution_delimeter="BEGIN SOLUTION", end_solution_delimeter="END SOLUTION",
                   code_stub={"python": "raise NotImplementedError()"}).preprocess(
        release, {"language": "python"})
    entries = build(tmp_path, source, release, "policy_gradients")
    assert sorted(e.name for e in entries) == ["blank", "grpo_habits", "off_by_direction",
                                               "reference", "zipped.zip"]
    ref = nbformat.read(tmp_path / "reference" / "policy_gradients.ipynb", as_version=4)
    solutions = solution_sources(source)
    for cell in ref.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in solutions:
            assert "NotImplementedError" not in cell.source and "BEGIN SOLUTION" not in cell.source
    for student, changed in (("grpo_habits", {"dr_grpo_advantages", "dr_grpo_loss"}),
                             ("off_by_direction", {"reward_to_go", "reinforce_loss", "train_agent"})):
        nb = nbformat.read(tmp_path / student / "policy_gradients.ipynb", as_version=4)
        differs = {c.metadata["nbgrader"]["grade_id"] for c, r in zip(nb.cells, ref.cells)
                   if c.source != r.source}
        assert differs == changed, student
    assert SOLUTION_BLOCK.search(json.dumps(fill(release, {}).cells[0].source)) is None
