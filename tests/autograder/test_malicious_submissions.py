"""Malicious and broken submissions, graded end to end in one parallel batch through nbgrader.

One module-scoped grading run (about 20 notebooks, 2 at a time) feeds every test here; see
``malicious.py`` for the cases and the score each must get.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pickle
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import nbformat
import pytest

import malicious
from autograder import grade, sandbox
from autograder.submissions import release_metadata

needs_sandbox = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None,
    reason="the grading sandbox needs root and bubblewrap (run `make sysdeps` as root)")

pytestmark = [needs_sandbox, pytest.mark.slow, pytest.mark.xdist_group("autograder")]

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "assignments" / "source"
NAME = malicious.NAME
LIMITS = sandbox.Limits(cell_timeout=20, notebook_timeout=600, memory_bytes=3 << 30)
TIMEOUTS = {"test_train_agent": 400}  # the training cell; hangs elsewhere are cut after 20 s


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
        "assignment gradebook": str(out / "assignment.db"),
        "other student's submission": str(subs / "control" / f"{NAME}.ipynb"),
        "grading runs": str(out / "runs" / "x"),
        "repository tests": str(REPO / "tests" / "autograder" / "malicious.py"),
        "package source": str(REPO / "src" / "agent_lab" / "__init__.py"),
        "host /tmp": str(host_tmp / "x"),
    }
    cases = malicious.build(subs, source_nb, release_nb, secrets)
    protected = {p: _sha(Path(p)) for p in (secrets["instructor file"],)}
    results = grade.grade_all(subs, out=out, source_root=SOURCE, assignment=NAME, jobs=2,
                              limits=LIMITS, keep_runs=True, timeouts=TIMEOUTS)
    points = {gid: float(m["points"]) for gid, (_, m) in release_metadata(release_nb).items()
              if m.get("grade")}
    return {"out": out, "subs": subs, "cases": {c.student: c for c in cases},
            "results": {r.student: r for r in results}, "points": points, "secrets": secrets,
            "protected": protected, "host_tmp": host_tmp}


CASES = ["control", "reference", "infinite_loop", "memory_bomb", "fork_bomb", "os_exit", "sys_exit",
         "import_error", "deleted_tests", "edited_tests", "reordered_tests", "changed_metadata",
         "always_equal", "monkeypatch", "reads_secrets", "big_output", "not_json", "truncated_json",
         "missing_notebook", "renamed_notebook", "hooks_later_cells", "patches_shell_class"]


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
    graded = next((batch["out"] / "runs").glob(f"*/reads_secrets/autograded/reads_secrets/{NAME}/{NAME}.ipynb"))
    text = "".join(o.get("text", "") for c in nbformat.read(graded, as_version=4).cells
                   for o in c.get("outputs", []))
    report = json.loads(re.search(r"REPORT (\{.*\})", text).group(1))
    assert len(report) == 4 * len(batch["secrets"]) + 3
    leaked = {k: v for k, v in report.items() if not v.startswith("blocked")}
    # The kernel's /tmp is its own tmpfs: writing there succeeds and never reaches the host's /tmp.
    # The package sources are bound read-only on purpose (the notebook imports agent_lab).
    assert set(leaked) <= {"write host /tmp", "create next to host /tmp", "read package source",
                           "list package source"}, leaked
    assert report["write package source"].startswith("blocked")
    assert report["create next to package source"].startswith("blocked")
    assert not batch["host_tmp"].exists()
    for path, digest in batch["protected"].items():
        assert _sha(Path(path)) == digest, f"{path} changed"
    for path in batch["secrets"].values():  # other people edit the repository meanwhile: no hashes
        assert not (Path(path).parent / "pwned.txt").exists()
        assert not Path(path).is_file() or not Path(path).read_bytes().endswith(b"pwned")


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
    control = (batch["out"] / "course" / "feedback" / "control" / NAME / f"{NAME}.html").read_text()
    assert "24 / 28" in control or f"{sum(batch['points'].values()) - 4:g} /" in control


def test_gradebook_and_grades_csv_hold_every_student_with_the_batch_scores(batch):
    from nbgrader.api import Gradebook

    out = batch["out"]
    with Gradebook(f"sqlite:///{out / 'course' / 'gradebook.db'}", grade.COURSE_ID) as gb:
        for student, result in batch["results"].items():
            sub = gb.find_submission(NAME, student)
            assert sub.score == pytest.approx(result.score), student
    rows = (out / "grades.csv").read_text().splitlines()
    assert rows[0].startswith("assignment,")
    assert len(rows) == 1 + len(CASES)


def test_big_output_is_truncated_in_the_graded_notebook(batch):
    graded = next((batch["out"] / "runs").glob(f"*/big_output/autograded/big_output/{NAME}/{NAME}.ipynb"))
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
