"""Malicious and broken submissions, graded end to end in one parallel batch (two at a time, in the sandbox).

One grading run feeds every test here; ``malicious.py`` lists the cases and the score each must get.  Every case
of the first design's weaknesses fails on that design (the grader before ``agent_lab.grading``): its score, its
feedback or the batch itself came out wrong.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pickle
import re
import uuid
from pathlib import Path

import nbformat
import pytest

import malicious
from sandbox_marks import BATCH
from autograder import grade, sandbox

pytestmark = BATCH

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "assignments" / "source"
NAME = malicious.NAME
LIMITS = sandbox.Limits(cell_timeout=20, notebook_timeout=600, memory_bytes=3 << 30)
TIMEOUTS = {"test_train_agent": 90}  # about six times the training's time alone; hangs elsewhere: 20 s


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="session")
def batch(tmp_path_factory, worker_id):
    """Grade the batch once per test session, even when several xdist workers need it.

    The first worker to take the lock grades and pickles the outcome next to the workers' temporary
    directories; the others wait on the lock and read it (xdist's recipe for once-per-session work).
    """
    shared = tmp_path_factory.getbasetemp() if worker_id == "master" else \
        tmp_path_factory.getbasetemp().parent
    with open(shared / "autograder-batch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stored = shared / "autograder-batch.pickle"
        if not stored.exists():
            stored.write_bytes(pickle.dumps(_grade_batch(shared / "autograder-batch")))
        return pickle.loads(stored.read_bytes())


def _grade_batch(root: Path) -> dict:
    out, subs = root / "grading", root / "submissions"
    subs.mkdir(parents=True)
    release = grade.prepare_course(out, SOURCE, NAME)
    source_nb = nbformat.read(SOURCE / NAME / f"{NAME}.ipynb", as_version=4)
    release_nb = nbformat.read(release, as_version=4)
    host_tmp = Path("/tmp") / f"agentlab-pwned-{uuid.uuid4().hex[:8]}"
    (root / "instructor").mkdir()
    canary = root / "instructor" / "answers.txt"
    canary.write_text("hidden answers")
    secrets = {
        "instructor file": str(canary),
        "source notebook": str(SOURCE / NAME / f"{NAME}.ipynb"),
        "course gradebook": str(out / "course" / "gradebook.db"),
        "other student's submission": str(subs / "control" / f"{NAME}.ipynb"),
        "grading runs": str(out / "runs" / "x"),
        "repository tests": str(REPO / "tests" / "autograder" / "malicious.py"),
        "package source": str(REPO / "src" / "agent_lab" / "estimators" / "returns.py"),
        "host /tmp": str(host_tmp / "x"),
    }
    cases = malicious.build(subs, source_nb, release_nb, secrets)
    protected = {p: _sha(Path(p)) for p in (secrets["instructor file"],)}
    results = grade.grade_all(subs, out=out, source_root=SOURCE, assignment=NAME, jobs=2,
                              limits=LIMITS, keep_runs=True, timeouts=TIMEOUTS)
    return {"out": out, "subs": subs, "cases": {c.student: c for c in cases},
            "results": {r.student: r for r in results}, "points": malicious.points_of(release_nb),
            "secrets": secrets, "protected": protected, "host_tmp": host_tmp}


CASES = ["control", "reference", "infinite_loop", "memory_bomb", "fork_bomb", "os_exit", "sys_exit",
         "import_error", "deleted_tests", "edited_tests", "reordered_tests", "changed_metadata",
         "always_equal", "monkeypatch", "hooks_later_cells", "patches_shell_class", "reads_secrets",
         "big_output", "not_json", "truncated_json", "missing_notebook", "renamed_notebook",
         # the first design's weaknesses, one case each
         "blank_skip_execution", "displayhook", "iopub_from_a_thread", "displayhook_from_a_signal",
         "student_range", "rebound_check", "caller_frame", "replaced_do_execute", "dropped_error_messages",
         "history_leak", "socket_dir_fill", "000_control_beside_hogs", "000_cpu_hogs", "formula_and_escapes",
         "nbformat_minor_x", "huge_integer", "nbformat_1", "nbformat_5", "nested_brackets",
         *(malicious.safe_id(name) for name in ("bob smith", "jos\u00e9", "-rf"))]


def _graded_notebook(batch, student: str) -> nbformat.NotebookNode:
    return nbformat.read(batch["out"] / "course" / "autograded" / student / NAME / f"{NAME}.ipynb", as_version=4)


def _printed(batch, student: str, marker: str) -> dict:
    text = "".join(o.get("text", "") for c in _graded_notebook(batch, student).cells for o in c.get("outputs", []))
    return json.loads(re.search(marker + r" (\{.*\})", text).group(1))


def test_every_case_is_in_the_batch(batch):
    assert sorted(batch["cases"]) == sorted(CASES)
    assert sorted(batch["results"]) == sorted(CASES)


@pytest.mark.parametrize("student", CASES)
def test_each_case_gets_exactly_the_points_for_the_parts_it_did_right(batch, student):
    case, result = batch["cases"][student], batch["results"][student]
    want = malicious.expected_scores(case, batch["points"])
    got = {t.grade_id: t.score for t in result.tests}
    assert result.status == case.status, (result.status, result.notes)
    assert got == want, f"{student}: expected {want}, got {got}; messages " + json.dumps(
        {t.grade_id: t.message for t in result.tests}, indent=1)
    assert result.max_score == sum(batch["points"].values()), "points must come from the release"


@pytest.mark.parametrize("student", CASES)
def test_each_case_gets_a_clear_message(batch, student):
    case, result = batch["cases"][student], batch["results"][student]
    messages = {t.grade_id: t.message for t in result.tests}
    for gid, fragment in case.messages.items():
        assert fragment in messages[gid], f"{student}/{gid}: {messages[gid]!r} lacks {fragment!r}"
    if case.note:
        assert any(case.note in n for n in result.notes), f"{student}: notes {result.notes}"
    for test in result.tests:
        if test.score < test.max_score:
            assert test.message, f"{student}/{test.grade_id} lost points without a message"
    if case.review:
        assert result.review, f"{student} should be flagged for review"


def test_attacks_on_files_network_and_privileges_are_blocked(batch):
    report = _printed(batch, "reads_secrets", "REPORT")
    assert len(report) == 4 * len(batch["secrets"]) + 3
    leaked = {k: v for k, v in report.items() if not v.startswith("blocked")}
    # The kernel's /tmp is its own tmpfs: writing there succeeds and never reaches the host's /tmp.
    assert set(leaked) <= {"write host /tmp", "create next to host /tmp"}, leaked
    assert not batch["host_tmp"].exists()
    for path, digest in batch["protected"].items():
        assert _sha(Path(path)) == digest, f"{path} changed"
    for path in batch["secrets"].values():  # other people edit the repository meanwhile: no hashes
        assert not (Path(path).parent / "pwned.txt").exists()
        assert not Path(path).is_file() or not Path(path).read_bytes().endswith(b"pwned")


def test_the_kernel_cannot_write_into_its_socket_directory_on_the_host(batch):
    fill = _printed(batch, "socket_dir_fill", "FILL")
    assert fill["written"] == 0 and fill["error"] == "PermissionError", fill


def test_cpu_hogs_that_escape_with_setsid_do_not_slow_the_submission_beside_them(batch):
    assert _printed(batch, "000_cpu_hogs", "HOGS") == {"started": 12}
    control = batch["results"]["000_control_beside_hogs"]
    assert control.score == control.max_score, [t.message for t in control.tests]


def test_feedback_shows_test_names_points_and_messages_but_never_hidden_test_code(batch):
    source = nbformat.read(SOURCE / NAME / f"{NAME}.ipynb", as_version=4)
    hidden_lines = []
    for cell in source.cells:
        block = re.search(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", cell.source, re.S)
        if block:
            hidden_lines += [ln.strip() for ln in block.group(1).splitlines() if len(ln.strip()) > 25]
    assert hidden_lines, "the source notebook should have hidden tests"
    pages = sorted((batch["out"] / "course" / "feedback").glob(f"*/{NAME}/{NAME}.html"))
    assert len(pages) == len(CASES)
    for page in pages:
        text = page.read_text()
        for gid in batch["points"]:
            assert gid in text
        for line in hidden_lines:
            assert line not in text, f"{page}: hidden test code leaked: {line!r}"


def test_reports_hold_no_terminal_escapes_and_no_spreadsheet_formulas(batch):
    out = batch["out"]
    texts = [(out / "results.json").read_text(), (out / "grades_by_test.csv").read_text()]
    texts += [p.read_text() for p in (out / "course" / "feedback").glob(f"*/{NAME}/{NAME}.html")]
    for text in texts:
        assert "\x1b" not in text and "\x07" not in text
    import csv
    with open(out / "grades_by_test.csv", newline="") as handle:
        for row in csv.reader(handle):
            assert not any(cell.startswith(("=", "+", "-", "@")) for cell in row), row


def test_gradebook_and_grades_csv_hold_every_student_with_the_batch_scores(batch):
    from nbgrader.api import Gradebook

    out = batch["out"]
    with Gradebook(f"sqlite:///{out / 'course' / 'gradebook.db'}", grade.COURSE_ID) as gb:
        for student, result in batch["results"].items():
            assert gb.find_submission(NAME, student).score == pytest.approx(result.score), student
    rows = (out / "grades.csv").read_text().splitlines()
    assert rows[0].startswith("assignment,")
    assert len(rows) == 1 + len(CASES)


def test_big_output_is_truncated_in_the_graded_notebook(batch):
    graded = batch["out"] / "course" / "autograded" / "big_output" / NAME / f"{NAME}.ipynb"
    assert graded.stat().st_size < 1_000_000


def test_no_sandboxed_process_outlives_the_grading(batch):
    # A sandbox holds its uid's lease for its whole life, so a live process of a sandbox uid whose
    # lease is free was left behind.  (Other tests may be grading meanwhile under held leases.)
    leftovers = {}
    for uid in sandbox.UID_RANGE:
        pids = sandbox.processes_of(uid)
        if not pids:
            continue
        fd = os.open(sandbox.LOCK_DIR / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            leftovers[uid] = pids
        except OSError:
            pass  # leased: a grading run in progress
        finally:
            os.close(fd)
    assert not leftovers
