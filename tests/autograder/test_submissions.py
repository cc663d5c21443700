"""Reading the submissions folder without running anything: ids, zips, notebook choice, reports, samples."""
from __future__ import annotations

import csv
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


@pytest.mark.parametrize("name, safe", [("alice", "alice"), ("alice_", "alice_"), ("Bob.Smith@x", "Bob.Smith@x"),
                                        ("bob smith", "bob_smith~"), ("jos\u00e9", "jose~"), ("-rf", "rf~"),
                                        (".hidden.", "hidden~"), ("a;rm -rf /", "a_rm_-rf~"),
                                        ("\u5b66\u751f", "student~"), ("x" * 64, "x" * 64),
                                        ("x" * 70, "x" * 48 + "~"), ("alice\n", "alice~")])
def test_safe_names_are_kept_and_others_get_a_readable_slug_and_a_hash(name, safe):
    got = submissions.safe_id(name)
    if safe.endswith("~"):
        assert got.startswith(safe) and len(got) == len(safe) + 10 and int(got[len(safe):], 16) >= 0, got
        assert submissions.SAFE_ID.fullmatch(got.replace("~", "_")), got
    else:
        assert got == safe


def test_odd_names_are_graded_under_a_safe_id_with_a_note_and_duplicates_are_not_graded(tmp_path):
    for folder in ("bob smith", "jos\u00e9", "-rf", "carol", "al ice", "al_ice"):
        (tmp_path / folder).mkdir()
    zipfile.ZipFile(tmp_path / "carol.zip", "w").close()
    (tmp_path / "stray.txt").write_text("not an entry")
    entries, ignored = submissions.scan(tmp_path)
    entries = {e.origin.name: e for e in entries}
    assert sorted(entries) == sorted(["bob smith", "jos\u00e9", "-rf", "carol", "carol.zip", "al ice", "al_ice"])
    assert ignored == ["stray.txt"]
    assert entries["bob smith"].student.startswith("bob_smith~") and entries["bob smith"].status == "ok"
    assert "not a safe id" in entries["jos\u00e9"].notes[0] and entries["-rf"].student.startswith("rf~")
    assert entries["al ice"].status == entries["al_ice"].status == "ok"
    for name in ("carol", "carol.zip"):
        assert entries[name].status == "duplicate" and "keep one" in entries[name].notes[-1]
    with pytest.raises(ValueError, match="not a directory"):
        submissions.discover(tmp_path / "missing")


@pytest.mark.parametrize("entry", ["../evil.ipynb", "/abs/evil.ipynb", "a/../../evil.ipynb"])
def test_zip_entries_that_escape_the_folder_are_refused(tmp_path, entry):
    archive = tmp_path / "bob.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr(entry, "{}")
    status, raw, notes, _ = submissions.load(archive, "toy.ipynb", tmp_path / "scratch")
    assert (status, raw) == ("invalid", None) and "unsafe entry" in notes[0]
    assert not (tmp_path / "evil.ipynb").exists()


def test_zip_bombs_and_broken_zips_are_refused_before_unpacking(tmp_path, monkeypatch):
    monkeypatch.setattr(submissions, "MAX_ZIP_BYTES", 1000)
    archive = tmp_path / "carol.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("toy.ipynb", "0" * 5000)
    status, _, notes, _ = submissions.load(archive, "toy.ipynb", tmp_path / "scratch")
    assert status == "invalid" and "unpacks to more than" in notes[0]
    (tmp_path / "dan.zip").write_bytes(b"PK\x03\x04 truncated")
    status, _, notes, _ = submissions.load(tmp_path / "dan.zip", "toy.ipynb", tmp_path / "scratch2")
    assert status == "invalid" and "could not be read" in notes[0]


def test_notebook_choice_exact_name_then_single_renamed_then_missing(tmp_path, release):
    folder = tmp_path / "dave"
    folder.mkdir()
    nbformat.write(release, folder / "copy of toy.ipynb")
    status, raw, notes, _ = submissions.load(folder, "toy.ipynb", tmp_path)
    assert status == "ok" and raw and "renamed" in notes[0]
    nbformat.write(release, folder / "other.ipynb")
    status, raw, notes, _ = submissions.load(folder, "toy.ipynb", tmp_path)
    assert (status, raw) == ("missing", None) and "copy of toy.ipynb" in notes[0]
    (folder / "sub").mkdir()
    nbformat.write(release, folder / "sub" / "toy.ipynb")
    assert submissions.load(folder, "toy.ipynb", tmp_path)[0] == "ok"
    (folder / ".ipynb_checkpoints").mkdir()
    nbformat.write(release, folder / ".ipynb_checkpoints" / "toy.ipynb")
    assert submissions.load(folder, "toy.ipynb", tmp_path)[2] == []


def test_suspicious_code_is_listed_from_the_students_own_cells():
    cells = [submissions.StudentCell("code", "ip = get_ipython()\nimport ctypes", "square"),
             submissions.StudentCell("markdown", "import subprocess", None),
             submissions.StudentCell("code", "globals()['_ch' + 'eck']", None)]
    assert submissions.suspicious_code(cells) == ["ctypes", "get_ipython", "globals()"]


def test_suspicious_code_names_the_kernel_side_modules_but_not_the_checks():
    """The kernel side's modules are flagged by name, whichever is reached; the checks the notebooks import
    are not, and neither is a name that only starts like the package."""
    cells = [submissions.StudentCell("code", "import agent_lab.grading.inkernel.server as s", "f"),
             submissions.StudentCell("code", "from agent_lab.grading.inkernel import wire", None),
             submissions.StudentCell("code", "from agent_lab.grading.inkernel.checks import Checks", None),
             submissions.StudentCell("code", "import agent_lab.grading.inkernelx", None)]
    assert submissions.suspicious_code(cells) == ["agent_lab.grading.inkernel",
                                                  "agent_lab.grading.inkernel.server"]


def test_feedback_escapes_messages_and_lists_every_test():
    result = grade.StudentResult("zoe", "graded", [
        grade.TestResult("test_a_visible", 2, 2, "passed"),
        grade.TestResult("test_a_hidden", 0, 4, "AssertionError: <script>alert(1)</script>")],
        notes=["grader log: /secret/path", "renamed"])
    page = grade.feedback_html(result, "toy")
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "2 / 6" in page and "test_a_hidden" in page and "0 / 4" in page
    assert "/secret/path" not in page and "renamed" in page


@pytest.mark.parametrize("value, shown", [("=HYPERLINK(\"x\")", "'=HYPERLINK(\"x\")"), ("+1", "'+1"),
                                          ("-1+2", "'-1+2"), ("@SUM(A1)", "'@SUM(A1)"), ("\tx", "'\tx"),
                                          ("passed", "passed"), (2.0, 2.0)])
def test_csv_cells_that_a_spreadsheet_would_run_are_neutralised(value, shown):
    assert grade.csv_cell(value) == shown


def test_grades_by_test_csv_neutralises_formulas(tmp_path):
    result = grade.StudentResult("zoe", "graded", [grade.TestResult("t", 0, 1, "=cmd|' /C calc'!A0")],
                                 review=["-x"])
    grade.write_grades_by_test([result], tmp_path / "grades_by_test.csv")
    rows = list(csv.reader(open(tmp_path / "grades_by_test.csv", newline="")))
    assert rows[1][5] == "'=cmd|' /C calc'!A0" and rows[1][6] == "'-x"


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


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="leasing a sandbox uid needs root")
@pytest.mark.parametrize("worker, fragment", [(("-c", "raise SystemExit(3)"), "exited with code 3"),
                                              (("-c", "import time; time.sleep(60)"), "ran past its time budget")])
def test_a_worker_that_crashes_or_hangs_gives_its_entry_an_error_and_nothing_else(tmp_path, worker, fragment):
    from autograder.sandbox import Limits
    (tmp_path / "erin").mkdir()
    tests = [__import__("agent_lab.grading.runner", fromlist=["TestCell"]).TestCell("t", "pass", 2.0, False)]
    batch = grade.Batch("toy", tmp_path, "run", tmp_path / "r.ipynb", tmp_path / "s.ipynb", tests,
                        Limits(notebook_timeout=1), {}, 1.0, worker=worker, margin_s=1.0)
    result = grade.run_worker(submissions.Entry("erin", tmp_path / "erin"), batch)
    assert result.status == "error" and [t.score for t in result.tests] == [0.0]
    assert "grading failed" in result.tests[0].message and any(fragment in n for n in result.notes)


def test_files_beside_the_notebook_are_offered_to_tests_without_links_or_huge_files(tmp_path, monkeypatch):
    monkeypatch.setattr(__import__("agent_lab.grading.notebook", fromlist=["x"]), "MAX_FILE_BYTES", 100)
    (tmp_path / "hw.ipynb").write_text("{}")
    (tmp_path / "policy.pt").write_bytes(b"x" * 10)
    (tmp_path / "huge.pt").write_bytes(b"x" * 101)
    (tmp_path / "link.pt").symlink_to("/etc/passwd")
    (tmp_path / "other.ipynb").write_text("{}")
    (tmp_path / "sub").mkdir()
    files, notes = submissions.files_beside(tmp_path / "hw.ipynb")
    assert files == {"policy.pt": tmp_path / "policy.pt"}
    assert notes == ["huge.pt is larger than 0 MiB and was not read"]
