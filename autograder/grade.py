"""Grade a folder of submissions: ``python -m autograder.grade SUBMISSIONS [--out DIR] [--jobs N]``.

Pipeline (``make grade SUBMISSIONS=<dir>`` runs it through ``scripts/grade.sh``):

1. ``prepare_course``: copy ``assignments/source/<assignment>`` into a private nbgrader course under
   ``--out`` (default ``autograder/_work``) and run ``nbgrader generate_assignment`` there: the release and
   the course gradebook (``course/gradebook.db``).
2. ``submissions.scan``: one entry (folder, zip or a Canvas student's loose files) per student, names made into
   ids that never collide.
3. ``run_worker``, in parallel (at most one per core): each entry is graded by its own process
   (:mod:`autograder.worker`) with a leased sandbox uid and cgroup.  The student's cells run in the sandboxed
   kernel; the tests run in the worker and call the student's functions across the process boundary, so the
   score comes from code and data the student cannot touch (see ``autograder/README.md``).
4. ``merge`` (serial, in this process): scores into the course gradebook through nbgrader's API (never over
   another entry's student), the
   executed notebook for instructors, the feedback page (test names, points and the grader's messages, never
   test code), ``grades.csv`` (nbgrader's export), ``grades_by_test.csv`` and a summary table.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import html
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import unicodedata
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

from agent_lab.grading import runner
from agent_lab.grading.session import plain_text
from agent_lab.grading.trained_agent import ACCEPT_REFERENCE_ENV, REVIEW_FLAG
from . import sandbox, submissions
from .sandbox import KernelCgroup, Limits
from .worker import Job

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = REPO / "assignments" / "source"
DEFAULT_ASSIGNMENT = "policy_gradients"
DEFAULT_OUT = REPO / "autograder" / "_work"
COURSE_ID = "agent-lab"
CSV_FORMULA = ("=", "+", "-", "@", "\t", "\r")
NOT_RECORDED = ("duplicate", "skipped", "conflict")  # statuses that leave the gradebook and feedback alone
ENTRY_NAMES = "entry_names.json"  # in the course folder: student id -> the entry name it was made from


@dataclass
class TestResult:
    """One graded cell: its grade id, points earned and available, and the message shown."""

    grade_id: str
    score: float
    max_score: float
    message: str


@dataclass
class StudentResult:
    student: str
    status: str                      # graded | missing | invalid | error, or one of NOT_RECORDED
    tests: list[TestResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    review: list[str] = field(default_factory=list)   # suspicious code for a human to look at
    manual: list[dict] = field(default_factory=list)  # answers a person grades: grade_id, points, answered
    records: list = field(default_factory=list)       # (table, row) pairs the tests recorded

    @property
    def score(self) -> float:
        return sum(t.score for t in self.tests)

    @property
    def max_score(self) -> float:
        return sum(t.max_score for t in self.tests)


# ---------------------------------------------------------------------------------------------
# 1. the course
# ---------------------------------------------------------------------------------------------
def _config_text(root: Path, extra: str = "") -> str:
    """An nbgrader_config.py for a course at ``root``: the assignment's config, then ours."""
    lines = ["c = get_config()  # noqa: F821 (traitlets config file)"]
    shared = REPO / "assignments" / "nbgrader_config.py"
    if shared.exists():
        lines.append(f"load_subconfig({str(shared)!r})  # noqa: F821")
    lines += [
        f"c.CourseDirectory.root = {str(root)!r}",
        f"c.CourseDirectory.course_id = {COURSE_ID!r}",
        f"c.CourseDirectory.db_url = {'sqlite:///' + str(root / 'gradebook.db')!r}",
    ]
    return "\n".join(lines) + "\n" + extra


def _tree_hash(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode())
        digest.update(path.read_bytes())
    shared = REPO / "assignments" / "nbgrader_config.py"
    if shared.exists():
        digest.update(shared.read_bytes())
    return digest.hexdigest()


def _ensure_venv_on_path() -> None:
    """nbgrader's Gradebook runs the ``alembic`` script, which lives next to this Python."""
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")


def _run_process(argv: list[str], cwd: Path, timeout: float | None = None, log: Path | None = None,
                 extra_env: dict[str, str] | None = None) -> int:
    """Run ``argv`` in its own session with the output to ``log``; past ``timeout`` kill its whole group."""
    _ensure_venv_on_path()
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONHASHSEED="0", MPLBACKEND="Agg", OMP_NUM_THREADS="1")
    env.pop("JUPYTER_CONFIG_DIR", None)
    env.pop(ACCEPT_REFERENCE_ENV, None)  # only a batch that asks for it (the bundled samples) accepts the reference
    env.update(extra_env or {})
    with open(log or os.devnull, "ab") as out:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the sandboxes die with it (--die-with-parent)
            proc.wait()
            raise


def prepare_course(out: Path, source_root: Path, assignment: str) -> Path:
    """Build (or reuse) the course under ``out``; return the release notebook's path.

    The course is rebuilt when the assignment's source changes; the previous gradebook is kept as
    ``gradebook.<time>.db`` because nbgrader cannot change an assignment that has submissions.
    """
    src = source_root / assignment
    if not (src / f"{assignment}.ipynb").exists():
        raise ValueError(f"no source notebook {src / (assignment + '.ipynb')}: is the assignment written?")
    course = out / "course"
    stamp = course / ".source-hash"
    digest = _tree_hash(src)
    release = course / "release" / assignment / f"{assignment}.ipynb"
    if stamp.exists() and stamp.read_text() == digest and release.exists() \
            and (out / "assignment.db").exists():
        return release
    if (course / "gradebook.db").exists():
        backup = out / f"gradebook.{time.strftime('%Y%m%d-%H%M%S')}.db"
        shutil.move(course / "gradebook.db", backup)
        print(f"assignment source changed: previous gradebook kept as {backup}")
    if course.exists():
        shutil.rmtree(course)
    (course / "source").mkdir(parents=True)
    shutil.copytree(src, course / "source" / assignment,
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    (course / "nbgrader_config.py").write_text(_config_text(course))
    log = out / "generate_assignment.log"
    log.unlink(missing_ok=True)
    code = _run_process([sys.executable, "-m", "nbgrader", "generate_assignment", assignment, "--force"],
                        cwd=course, log=log)
    if code != 0 or not release.exists():
        raise RuntimeError(f"nbgrader generate_assignment failed; see {log}")
    shutil.copy(course / "gradebook.db", out / "assignment.db")
    stamp.write_text(digest)
    return release


# ---------------------------------------------------------------------------------------------
# 3. one student, in a process of its own
# ---------------------------------------------------------------------------------------------
def _zero_result(student: str, status: str, tests: list[runner.TestCell], notes: list[str],
                 message: str) -> StudentResult:
    return StudentResult(student, status, [TestResult(t.grade_id, 0.0, t.points, message) for t in tests],
                         list(notes))


def _from_json(data: dict) -> StudentResult:
    tests = [TestResult(str(t["grade_id"]), float(t["score"]), float(t["max_score"]), str(t["message"]))
             for t in data["tests"]]
    records = [(str(table), dict(row)) for t in data["tests"] for table, row in t.get("records", [])]
    manual = [{"grade_id": str(m["grade_id"]), "points": float(m["points"]), "answered": bool(m["answered"])}
              for m in data.get("manual", [])]
    review = [str(r) for r in data.get("review", [])] + flagged(tests)
    return StudentResult(str(data["student"]), str(data["status"]), tests, [str(n) for n in data["notes"]],
                         float(data.get("seconds", 0.0)), review, manual, records)


def flagged(tests: list[TestResult]) -> list[str]:
    """Review-column words for the tests that failed with a message flagging the submission for a person (a
    copy of the course's reference agent, say); a student who writes the words into a message flags only
    themselves."""
    return [f"flagged:{t.grade_id}" for t in tests if REVIEW_FLAG in t.message and t.score < t.max_score]


@dataclass(frozen=True)
class Batch:
    """What every worker of one grading run shares."""

    assignment: str
    out: Path
    run_id: str
    release: Path
    source: Path
    tests: list
    limits: Limits
    timeouts: dict
    cpus_per_kernel: float
    worker: tuple = ("-m", "autograder.worker")   # the worker's arguments after the interpreter
    margin_s: float = 180.0                        # past the notebook budget, the worker is killed
    accept_reference: bool = False                 # the bundled samples hand in the reference agent on purpose


def _failed(entry: submissions.Entry, batch: Batch, note: str) -> StudentResult:
    result = _zero_result(entry.student, "error", batch.tests, entry.notes,
                          "grading failed for this notebook; the instructor has the log")
    result.notes.append(note)
    return result


def run_worker(entry: submissions.Entry, batch: Batch) -> StudentResult:
    """Grade one entry in a worker process (see :mod:`autograder.worker`); never raises for a bad entry."""
    start = time.monotonic()
    if entry.status != "ok":
        return _zero_result(entry.student, entry.status, batch.tests, entry.notes,
                            "not graded: " + "; ".join(entry.notes))
    scratch = batch.out / "runs" / batch.run_id / entry.student
    scratch.mkdir(parents=True)
    origin = entry.origin
    if entry.files:  # a Canvas student's loose files: copied (plain files only) into a folder of their own
        origin = scratch / "entry"
        try:
            submissions.stage(entry, origin)
        except (ValueError, OSError) as exc:
            note = f"not graded: {plain_text(str(exc), 200)}; hand in plain files"
            return _zero_result(entry.student, "invalid", batch.tests, entry.notes + [note], note)
    lease = sandbox.UidLease()
    cgroup = KernelCgroup(f"uid{lease.uid}", batch.cpus_per_kernel, batch.limits.memory_bytes,
                          batch.limits.nproc)
    ipc_dir = sandbox.GRADE_TMP / uuid.uuid4().hex[:12]
    log = scratch / "worker.log"
    try:
        sandbox.root_dir(ipc_dir)
        procs = cgroup.create() if cgroup.kind else []
        job = Job(entry.student, str(origin), f"{batch.assignment}.ipynb", str(batch.release),
                  str(batch.source), str(scratch), lease.uid, str(ipc_dir), asdict(batch.limits),
                  dict(batch.timeouts), procs, list(entry.notes))
        (scratch / "job.json").write_text(json.dumps(asdict(job), indent=1))
        code = _run_process([sys.executable, *batch.worker, str(scratch / "job.json")], cwd=REPO,
                            timeout=batch.limits.notebook_timeout + batch.margin_s, log=log,
                            extra_env={ACCEPT_REFERENCE_ENV: "1"} if batch.accept_reference else None)
        if not (scratch / "result.json").exists():
            raise RuntimeError(f"the grading process exited with code {code} and wrote no result")
        result = _from_json(json.loads((scratch / "result.json").read_text()))
    except subprocess.TimeoutExpired:
        result = _failed(entry, batch, f"the grading process ran past its time budget and was stopped; "
                                       f"grader log: {log}")
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        result = _failed(entry, batch, f"{plain_text(str(exc), 200)} ({type(exc).__name__}); grader log: {log}")
    finally:
        try:
            sandbox.reap(lease.uid)  # nothing a student started may outlive the grading
        finally:
            cgroup.remove()
            shutil.rmtree(ipc_dir, ignore_errors=True)
            lease.release()
    result.seconds = time.monotonic() - start
    return result


# ---------------------------------------------------------------------------------------------
# 4. merge, feedback, export, summary
# ---------------------------------------------------------------------------------------------
def entry_names(course: Path) -> dict[str, str]:
    """Student id -> the entry name it was recorded for, from ``course``; a ValueError names a broken file."""
    path = course / ENTRY_NAMES
    try:
        names = json.loads(path.read_text()) if path.exists() else {}
    except (ValueError, OSError) as exc:
        raise ValueError(f"{path} cannot be read ({exc}): restore it from a backup, or delete it to accept "
                         "every id already in the gradebook") from None
    if not isinstance(names, dict) or not all(isinstance(v, str) for v in names.values()):
        raise ValueError(f"{path} is not a map of student ids to entry names: restore it or delete it")
    return names


def claim_id(course: Path, student: str, name: str) -> str | None:
    """Record in ``course`` that ``student`` is the id of the entry named ``name``; when the gradebook's id (or
    one differing only in case) belongs to another entry name, record nothing and return that entry's name."""
    path = course / ENTRY_NAMES
    names = entry_names(course)
    name = unicodedata.normalize("NFC", name)  # canonically equal spellings are one name (see safe_id)
    for other_id, other_name in names.items():
        if other_id.casefold() == student.casefold() and (other_id, other_name) != (student, name):
            return f"{other_name[:80]!r} (student id {other_id!r})"
    names[student] = name
    path.write_text(json.dumps(names, indent=1))
    return None


def merge(result: StudentResult, out: Path, assignment: str, graded: Path | None, name: str | None = None) -> bool:
    """One student's scores into the course gradebook and the executed notebook beside it (called serially);
    True when they were written.

    The scores are the grader's own verdicts, written through nbgrader's API, so formgrader and nbgrader's
    exports see them.  An entry that was not graded because its id is ambiguous leaves the gradebook alone, and
    so does an entry (named ``name``) whose id an earlier batch gave to an entry of another name: its status
    becomes ``conflict``, with a note naming both.
    """
    from nbgrader.api import Gradebook

    if result.status in NOT_RECORDED:
        return False
    holder = claim_id(out / "course", result.student, name if name is not None else result.student)
    if holder is not None:
        result.status = "conflict"
        result.notes.append(f"not recorded: the gradebook's student {result.student!r} (or one differing only in "
                            f"case) holds the grades of the entry {holder}; rename this entry and grade again")
        return False
    scores = {t.grade_id: t.score for t in result.tests}
    manual = {m["grade_id"]: m for m in result.manual}
    with Gradebook(f"sqlite:///{out / 'course' / 'gradebook.db'}", COURSE_ID) as gb:
        gb.update_or_create_student(result.student)
        gb.update_or_create_submission(assignment, result.student)
        notebook = gb.find_submission_notebook(assignment, assignment, result.student)
        for grade in notebook.grades:
            if grade.name in manual:  # nbgrader's rule: an unanswered cell scores 0, an answer waits for a person
                answered = manual[grade.name]["answered"] and result.status == "graded"
                grade.auto_score = None if answered else 0.0
                grade.needs_manual_grade = answered or grade.manual_score is not None
            else:
                grade.auto_score = scores.get(grade.name, 0.0)
                grade.needs_manual_grade = grade.manual_score is not None
        gb.db.commit()
    if graded is not None and graded.exists():  # for instructors only: it holds the hidden tests
        kept = out / "course" / "autograded" / result.student / assignment
        kept.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(graded, kept / f"{assignment}.ipynb")
    return True


def feedback_html(result: StudentResult, assignment: str) -> str:
    """The student's feedback page: each test's name, points and message; no test code."""
    esc = html.escape
    rows = "\n".join(
        f"<tr class='{'pass' if t.score >= t.max_score else 'fail'}'><td>{esc(t.grade_id)}</td>"
        f"<td>{t.score:g} / {t.max_score:g}</td><td><pre>{esc(t.message)}</pre></td></tr>"
        for t in result.tests)
    rows += "".join(
        f"<tr class='manual'><td>{esc(m['grade_id'])}</td><td>? / {m['points']:g}</td><td><pre>"
        + ("graded by hand: the instructors' feedback comes separately" if m["answered"] else "no answer")
        + "</pre></td></tr>" for m in result.manual)
    notes = "".join(f"<li>{esc(n)}</li>" for n in result.notes if "grader log:" not in n)
    pending = sum(m["points"] for m in result.manual)
    manual_total = f" (and up to {pending:g} points graded by hand)" if pending else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(assignment)}: feedback for {esc(result.student)}</title>
<style>body{{font-family:sans-serif;max-width:60rem;margin:2rem auto}}table{{border-collapse:collapse;width:100%}}
td,th{{border:1px solid #ccc;padding:.3rem .5rem;text-align:left;vertical-align:top}}
tr.pass td:first-child{{color:#075}}tr.fail td:first-child{{color:#a00}}pre{{white-space:pre-wrap;margin:0}}</style>
</head><body>
<h1>{esc(assignment)}: {result.score:g} / {result.max_score:g}{manual_total}</h1>
<p>Student: {esc(result.student)}. Status: {esc(result.status)}.</p>
{f'<h2>Notes</h2><ul>{notes}</ul>' if notes else ''}
<h2>Tests</h2>
<table><tr><th>test</th><th>points</th><th>message</th></tr>
{rows}
</table>
<p>Hidden tests are listed by name only. Run the visible tests yourself with
<code>.venv/bin/python autograder/check.py {esc(assignment)}.ipynb</code>.</p>
</body></html>
"""


def csv_cell(value: object) -> object:
    """A CSV value a spreadsheet will not run: text starting with = + - @ (or a tab or CR) gets a leading '."""
    if isinstance(value, str) and value.startswith(CSV_FORMULA):
        return "'" + value
    return value


def export_gradebook(out: Path) -> Path:
    """``grades.csv``: nbgrader's export of the course gradebook (manual grades from formgrader included)."""
    from nbgrader.api import Gradebook
    from nbgrader.plugins import CsvExportPlugin

    _ensure_venv_on_path()
    with Gradebook(f"sqlite:///{out / 'course' / 'gradebook.db'}", COURSE_ID) as gb:
        CsvExportPlugin(to=str(out / "grades.csv")).export(gb)
    return out / "grades.csv"


def export(results: list[StudentResult], out: Path) -> None:
    """``grades.csv``, ``grades_by_test.csv`` and, when tests recorded rows, one CSV per table."""
    export_gradebook(out)
    write_grades_by_test(results, out / "grades_by_test.csv")
    tables: dict[str, list[dict]] = {}
    for r in results:
        for table, row in r.records:
            tables.setdefault(table, []).append({"student_id": r.student, **row})
    for table, rows in tables.items():
        write_table(rows, out / f"{re.sub(r'[^A-Za-z0-9_-]', '_', table)}.csv")


def write_table(rows: list[dict], path: Path) -> None:
    """Rows with the union of their keys as columns (in first-seen order), formula-safe."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([csv_cell(row.get(c, "")) for c in columns])


def write_grades_by_test(results: list[StudentResult], path: Path) -> None:
    """One row per student and test: points, the grader's message and the review words."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student_id", "status", "grade_id", "score", "max_score", "message", "review"])
        for r in results:
            for t in r.tests:
                writer.writerow([csv_cell(v) for v in (r.student, r.status, t.grade_id, t.score,
                                                       t.max_score, t.message, " ".join(r.review))])


def summary_table(results: list[StudentResult]) -> str:
    if not results:
        return "no submissions"
    ids = [t.grade_id for t in results[0].tests]
    short = [re.sub(r"^test_", "", g).replace("_visible", "/v").replace("_hidden", "/h") for g in ids]
    width = max(12, *(len(r.student) for r in results))
    head = f"{'student':<{width}} {'status':<9} " + " ".join(f"{s:>{max(5, len(s))}}" for s in short)
    lines = [head + f" {'total':>11} {'sec':>6}  review"]
    for r in results:
        by_id = {t.grade_id: t for t in r.tests}
        cells = " ".join(f"{by_id[g].score if g in by_id else 0:>{max(5, len(s))}g}"
                         for g, s in zip(ids, short))
        lines.append(f"{r.student:<{width}} {r.status:<9} {cells} "
                     f"{f'{r.score:g}/{r.max_score:g}':>11} {r.seconds:6.1f}  "
                     f"{', '.join(r.review)}")
    return "\n".join(lines)


def grade_all(submissions_dir: Path, *, out: Path = DEFAULT_OUT, source_root: Path = DEFAULT_SOURCE,
              assignment: str = DEFAULT_ASSIGNMENT, jobs: int | None = None,
              limits: Limits = Limits(), keep_runs: bool = False,
              timeouts: dict[str, int] | None = None, cpus_per_kernel: float = 1.0,
              accept_reference: bool = False) -> list[StudentResult]:
    """Grade every submission in ``submissions_dir``; return results in student order.

    ``timeouts`` maps grade ids to test timeouts that differ from ``limits.cell_timeout``; ``accept_reference``
    lets a checkpoint equal to the course's reference agent earn points (for the bundled samples only).
    """
    sandbox.check_available()
    _ensure_venv_on_path()
    warnings.filterwarnings("ignore", message=".*not in session.*")  # nbgrader's SQLAlchemy noise
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    entries, ignored = submissions.scan(submissions_dir)
    if ignored:
        print(f"grade: not entries, ignored: {', '.join(repr(n[:80]) for n in ignored[:20])}"
              + (f" and {len(ignored) - 20} more" if len(ignored) > 20 else ""), file=sys.stderr)
    release = prepare_course(out, Path(source_root), assignment)
    source = out / "course" / "source" / assignment / f"{assignment}.ipynb"
    entry_names(out / "course")  # a broken record stops the batch here, before anything is graded
    run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    batch = Batch(assignment, out, run_id, release, source,
                  runner.test_cells(nbformat.read(source, as_version=4)), limits, dict(timeouts or {}),
                  cpus_per_kernel, accept_reference=accept_reference)
    if KernelCgroup.detect() is None:
        print("grade: warning: no cgroup hierarchy with the cpu, memory and pids controllers is writable here, "
              "so kernels run with per-process limits only and one submission's processes can slow another's",
              file=sys.stderr)
    cores = len(os.sched_getaffinity(0))
    jobs = max(1, min(jobs or cores, cores, len(entries) or 1))
    results: dict[int, StudentResult] = {}
    feedback_root = out / "course" / "feedback"
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(run_worker, entry, batch): index for index, entry in enumerate(entries)}
        for future in as_completed(futures):
            entry = entries[futures[future]]
            try:
                result = future.result()
            except Exception as exc:  # noqa: BLE001 - one broken run must not stop the others
                result = _zero_result(entry.student, "error", batch.tests, entry.notes,
                                      f"grading failed: {type(exc).__name__}")
            graded = out / "runs" / run_id / entry.student / "graded.ipynb"
            if merge(result, out, assignment, graded, entry.name):  # serial: only this thread writes the db
                page = feedback_root / result.student / assignment / f"{assignment}.html"
                page.parent.mkdir(parents=True, exist_ok=True)
                page.write_text(feedback_html(result, assignment))
            results[futures[future]] = result
    ordered = [results[i] for i in range(len(entries))]
    export(ordered, out)
    (out / "results.json").write_text(json.dumps([asdict(r) | {"score": r.score,
                                                              "max_score": r.max_score}
                                                  for r in ordered], indent=1))
    if not keep_runs:
        shutil.rmtree(out / "runs" / run_id, ignore_errors=True)
    return ordered


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("submissions", type=Path, nargs="?",
                        help="folder with one sub-folder or .zip per student")
    parser.add_argument("--export-only", action="store_true",
                        help="only export grades.csv again from the gradebook (after grading by hand in formgrader)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="course, gradebook and reports")
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="nbgrader source folder")
    parser.add_argument("--assignment", default=DEFAULT_ASSIGNMENT)
    parser.add_argument("--jobs", type=int, default=None, help="parallel kernels (default: cores)")
    parser.add_argument("--cell-timeout", type=int, default=Limits.cell_timeout)
    parser.add_argument("--notebook-timeout", type=int, default=Limits.notebook_timeout)
    parser.add_argument("--memory-mib", type=int, default=Limits.memory_bytes >> 20)
    parser.add_argument("--cpus-per-kernel", type=float, default=1.0,
                        help="CPU cores each student's kernel may use together with its children (cgroup)")
    parser.add_argument("--keep-runs", action="store_true", help="keep each student's scratch folder")
    parser.add_argument("--accept-reference-checkpoint", action="store_true",
                        help="let a copy of the course's reference agent earn points (the bundled samples only)")
    args = parser.parse_args(argv)
    if args.export_only:
        print(f"grades: {export_gradebook(args.out.resolve())}")
        return 0
    if args.submissions is None:
        parser.error("the SUBMISSIONS folder is required (or --export-only)")
    try:
        limits = Limits(cell_timeout=args.cell_timeout, notebook_timeout=args.notebook_timeout,
                        memory_bytes=args.memory_mib << 20)
    except ValueError as exc:
        parser.error(str(exc))
    start = time.monotonic()
    try:
        results = grade_all(args.submissions, out=args.out, source_root=args.source,
                            assignment=args.assignment, jobs=args.jobs, limits=limits,
                            keep_runs=args.keep_runs, cpus_per_kernel=args.cpus_per_kernel,
                            accept_reference=args.accept_reference_checkpoint)
    except (ValueError, RuntimeError) as exc:
        print(f"grade: {exc}", file=sys.stderr)
        return 2
    print(summary_table(results))
    out = args.out.resolve()
    print(f"\n{len(results)} submissions in {time.monotonic() - start:.1f} s. "
          f"Gradebook: {out / 'course' / 'gradebook.db'}; grades: {out / 'grades.csv'}; "
          f"feedback: {out / 'course' / 'feedback'}/<student>/")
    problem = nothing_graded(results)
    if problem:
        print(f"grade: {problem}", file=sys.stderr)
    return 1 if problem else 0


def nothing_graded(results: list[StudentResult]) -> str | None:
    """Why the batch graded no entry (the command then fails), or None when at least one was graded."""
    if any(r.status == "graded" for r in results):
        return None
    if not results:
        return ("nothing was graded: no entry was found (one folder or .zip per student, or the notebooks of "
                "Canvas's bulk download, lastnamefirstname_userid_submissionid_file.ipynb)")
    counts = ", ".join(f"{sum(r.status == s for r in results)} {s}" for s in dict.fromkeys(r.status for r in results))
    return f"nothing was graded ({counts}): see the notes in results.json and the summary above"


if __name__ == "__main__":
    sys.exit(main())
