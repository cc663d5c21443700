"""Grade a folder of submissions: ``python -m autograder.grade SUBMISSIONS [--out DIR] [--jobs N]``.

Pipeline (``make grade SUBMISSIONS=<dir>`` runs it through ``scripts/grade.sh``):

1. ``prepare_course``: copy ``assignments/source/<assignment>`` into a private nbgrader course under
   ``--out`` (default ``autograder/_work``) and run ``nbgrader generate_assignment`` there; this
   makes the course gradebook (``course/gradebook.db``), whose cells hold the hidden tests.
2. ``submissions.load``: one notebook per student folder or zip, parsed and normalised, never run.
3. ``grade_submission``, in parallel (at most one per core): each student gets a scratch copy of the
   course (``runs/<student>``) with a pristine copy of the assignment's gradebook, and
   ``nbgrader autograde`` runs there with :class:`autograder.execute.SandboxExecute`, so each kernel
   runs in the bubblewrap sandbox as its own unprivileged uid.  A student's run can only touch its
   own scratch copy, never the course gradebook or another student's run.
4. ``merge`` (serial, in this process): copy each student's scores into the course gradebook, write
   the feedback HTML (test names, points, messages, never the test code), export ``grades.csv``
   (nbgrader's export) and ``grades_by_test.csv``, and print a summary table.
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
import tempfile
import time
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

from . import sandbox, submissions
from .sandbox import Limits

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = REPO / "assignments" / "source"
DEFAULT_ASSIGNMENT = "policy_gradients"
DEFAULT_OUT = REPO / "autograder" / "_work"
COURSE_ID = "agent-lab"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
MESSAGE_CHARS = 600


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
    status: str                      # graded | missing | invalid | error
    tests: list[TestResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    review: list[str] = field(default_factory=list)   # suspicious code for a human to look at

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


def _nbgrader(args: list[str], cwd: Path, timeout: float | None = None,
              log: Path | None = None) -> subprocess.CompletedProcess:
    _ensure_venv_on_path()
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONHASHSEED="0", MPLBACKEND="Agg")
    env.pop("JUPYTER_CONFIG_DIR", None)
    with open(log or os.devnull, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "nbgrader", *args], cwd=cwd, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the sandboxes die with it (--die-with-parent)
            proc.wait()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode)


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
    result = _nbgrader(["generate_assignment", assignment, "--force"], cwd=course, log=log)
    if result.returncode != 0 or not release.exists():
        raise RuntimeError(f"nbgrader generate_assignment failed; see {log}")
    shutil.copy(course / "gradebook.db", out / "assignment.db")
    stamp.write_text(digest)
    return release


# ---------------------------------------------------------------------------------------------
# 3. one student, in a scratch course copy
# ---------------------------------------------------------------------------------------------
def _worker_config(run: Path, uid: int, ipc_dir: str, limits: Limits,
                   timeouts: dict[str, int] | None = None) -> str:
    extra = f"""
from nbgrader.preprocessors import (IgnorePattern, LimitOutput, SaveAutoGrades,
                                    AssignLatePenalties, CheckCellMetadata)
from nbconvert.preprocessors import ClearMetadataPreprocessor
from autograder.execute import SandboxExecute
c.Autograde.autograde_preprocessors = [SandboxExecute, IgnorePattern, ClearMetadataPreprocessor,
                                       LimitOutput, SaveAutoGrades, AssignLatePenalties,
                                       CheckCellMetadata]
c.Autograde.create_student = True
c.OverwriteCells.add_missing_cells = True
c.SandboxExecute.timeout = {limits.cell_timeout}
c.SandboxExecute.notebook_timeout = {limits.notebook_timeout}
c.SandboxExecute.timeout_by_grade_id = {dict(timeouts or {})!r}
c.SandboxExecute.kernel_name = "python3"
c.SandboxExecute.startup_timeout = 120
c.SandboxKernelManager.sandbox_uid = {uid}
c.SandboxKernelManager.ipc_dir = {ipc_dir!r}
c.SandboxKernelManager.limit_values = {list(asdict(limits).values())!r}
"""
    return _config_text(run, extra)


def _cell_message(cell: nbformat.NotebookNode) -> str:
    """ename: evalue of the cell's last error, never its traceback (which quotes the test's code)."""
    errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    if errors:
        err = errors[-1]
        text = f"{err.get('ename', 'Error')}: {err.get('evalue', '')}"
    elif any(o.get("output_type") == "stream" and o.get("name") == "stderr"
             for o in cell.get("outputs", [])):
        text = "the test wrote to stderr (counted as a failure by nbgrader)"
    else:
        return ""
    text = ANSI.sub("", text).strip()
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS] + " ..."


def _zero_result(student: str, status: str, release_nb, notes: list[str],
                 message: str) -> StudentResult:
    tests = []
    for cell in release_nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade"):
            tests.append(TestResult(meta["grade_id"], 0.0, float(meta.get("points", 0)), message))
    return StudentResult(student, status, tests, notes)


def grade_submission(sub: submissions.Submission, *, release_nb, assignment: str, out: Path,
                     run_id: str, limits: Limits,
                     timeouts: dict[str, int] | None = None) -> StudentResult:
    """Autograde one normalised submission in its own scratch course; never raises for bad code."""
    start = time.monotonic()
    if sub.status != "ok":
        result = _zero_result(sub.student, sub.status, release_nb, sub.notes,
                              "not graded: " + "; ".join(sub.notes))
        result.seconds = time.monotonic() - start
        return result
    run = out / "runs" / run_id / sub.student
    submitted = run / "submitted" / sub.student / assignment
    submitted.mkdir(parents=True)
    shutil.copytree(out / "course" / "source", run / "source")
    shutil.copy(out / "assignment.db", run / "gradebook.db")
    nbformat.write(sub.notebook, submitted / f"{assignment}.ipynb")
    lease = sandbox.UidLease()
    ipc_dir = str(sandbox.GRADE_TMP / uuid.uuid4().hex[:12])
    log = run / "autograde.log"
    try:
        sandbox.root_dir(ipc_dir)
        config = _worker_config(run, lease.uid, ipc_dir, limits, timeouts)
        (run / "nbgrader_config.py").write_text(config)
        try:
            proc = _nbgrader(["autograde", assignment, "--student", sub.student, "--force"],
                             cwd=run, timeout=limits.notebook_timeout + 180, log=log)
            crashed = proc.returncode != 0
        except subprocess.TimeoutExpired:
            crashed = True
        graded = run / "autograded" / sub.student / assignment / f"{assignment}.ipynb"
        if crashed or not graded.exists():
            result = _zero_result(sub.student, "error", release_nb, sub.notes,
                                  "grading failed for this notebook; the instructor has the log")
            result.notes.append(f"grader log: {log}")
        else:
            result = _read_scores(sub, graded, run / "gradebook.db", assignment)
            # The executed notebook, for instructors (it holds the hidden tests: never for students).
            kept = out / "course" / "autograded" / sub.student / assignment
            kept.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(graded, kept / f"{assignment}.ipynb")
    finally:
        sandbox.reap(lease.uid)  # nothing a student started may outlive the grading
        shutil.rmtree(ipc_dir, ignore_errors=True)
        lease.release()
    result.seconds = time.monotonic() - start
    return result


def _read_scores(sub, graded: Path, db: Path, assignment: str) -> StudentResult:
    from nbgrader.api import Gradebook

    nb = nbformat.read(graded, as_version=4)
    messages = {}
    for cell in nb.cells:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid and gid not in messages:
            messages[gid] = _cell_message(cell)
    result = StudentResult(sub.student, "graded", notes=list(sub.notes))
    for index, cell in enumerate(nb.cells):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "code" and not meta.get("grade"):
            message = _cell_message(cell)  # the student's own cell: safe to quote
            if message:
                result.notes.append(f"cell {meta.get('grade_id') or index} failed: {message}")
    with Gradebook(f"sqlite:///{db}", COURSE_ID) as gb:
        notebook = gb.find_submission_notebook(assignment, assignment, sub.student)
        order = {c.name: i for i, c in enumerate(gb.find_notebook(assignment, assignment).grade_cells)}
        for grade in sorted(notebook.grades, key=lambda g: order.get(g.name, 0)):
            score = float(grade.auto_score or 0.0)
            message = messages.get(grade.name, "") or ("passed" if score >= grade.max_score else "")
            result.tests.append(TestResult(grade.name, score, float(grade.max_score), message))
    return result


# ---------------------------------------------------------------------------------------------
# 4. merge, feedback, export, summary
# ---------------------------------------------------------------------------------------------
def merge(result: StudentResult, out: Path, assignment: str) -> None:
    """Write one student's scores into the course gradebook (called serially)."""
    from nbgrader.api import Gradebook

    scores = {t.grade_id: t.score for t in result.tests}
    with Gradebook(f"sqlite:///{out / 'course' / 'gradebook.db'}", COURSE_ID) as gb:
        gb.update_or_create_student(result.student)
        gb.update_or_create_submission(assignment, result.student)
        notebook = gb.find_submission_notebook(assignment, assignment, result.student)
        for grade in notebook.grades:
            grade.auto_score = scores.get(grade.name, 0.0)
            grade.needs_manual_grade = False
        gb.db.commit()


def feedback_html(result: StudentResult, assignment: str) -> str:
    """The student's feedback page: each test's name, points and message; no test code."""
    esc = html.escape
    rows = "\n".join(
        f"<tr class='{'pass' if t.score >= t.max_score else 'fail'}'><td>{esc(t.grade_id)}</td>"
        f"<td>{t.score:g} / {t.max_score:g}</td><td><pre>{esc(t.message)}</pre></td></tr>"
        for t in result.tests)
    notes = "".join(f"<li>{esc(n)}</li>" for n in result.notes if not n.startswith("grader log"))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(assignment)}: feedback for {esc(result.student)}</title>
<style>body{{font-family:sans-serif;max-width:60rem;margin:2rem auto}}table{{border-collapse:collapse;width:100%}}
td,th{{border:1px solid #ccc;padding:.3rem .5rem;text-align:left;vertical-align:top}}
tr.pass td:first-child{{color:#075}}tr.fail td:first-child{{color:#a00}}pre{{white-space:pre-wrap;margin:0}}</style>
</head><body>
<h1>{esc(assignment)}: {result.score:g} / {result.max_score:g}</h1>
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


def export(results: list[StudentResult], out: Path) -> None:
    from nbgrader.api import Gradebook
    from nbgrader.plugins import CsvExportPlugin

    with Gradebook(f"sqlite:///{out / 'course' / 'gradebook.db'}", COURSE_ID) as gb:
        CsvExportPlugin(to=str(out / "grades.csv")).export(gb)
    with open(out / "grades_by_test.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student_id", "status", "grade_id", "score", "max_score", "message",
                         "review"])
        for r in results:
            for t in r.tests:
                writer.writerow([r.student, r.status, t.grade_id, t.score, t.max_score, t.message,
                                 " ".join(r.review)])


def summary_table(results: list[StudentResult]) -> str:
    if not results:
        return "no submissions"
    ids = [t.grade_id for t in results[0].tests]
    short = [re.sub(r"^test_", "", g).replace("_visible", "/v").replace("_hidden", "/h") for g in ids]
    width = max(12, *(len(r.student) for r in results))
    head = f"{'student':<{width}} {'status':<8} " + " ".join(f"{s:>{max(5, len(s))}}" for s in short)
    lines = [head + f" {'total':>11} {'sec':>6}  review"]
    for r in results:
        by_id = {t.grade_id: t for t in r.tests}
        cells = " ".join(f"{by_id[g].score if g in by_id else 0:>{max(5, len(s))}g}"
                         for g, s in zip(ids, short))
        lines.append(f"{r.student:<{width}} {r.status:<8} {cells} "
                     f"{f'{r.score:g}/{r.max_score:g}':>11} {r.seconds:6.1f}  "
                     f"{', '.join(r.review)}")
    return "\n".join(lines)


def grade_all(submissions_dir: Path, *, out: Path = DEFAULT_OUT, source_root: Path = DEFAULT_SOURCE,
              assignment: str = DEFAULT_ASSIGNMENT, jobs: int | None = None,
              limits: Limits = Limits(), keep_runs: bool = False,
              timeouts: dict[str, int] | None = None) -> list[StudentResult]:
    """Grade every submission in ``submissions_dir``; return results in student order.

    ``timeouts`` maps grade ids to cell timeouts that differ from ``limits.cell_timeout``.
    """
    sandbox.check_available()
    _ensure_venv_on_path()
    warnings.filterwarnings("ignore", module="nbformat")       # cell-id fixes on student notebooks
    warnings.filterwarnings("ignore", message=".*not in session.*")  # nbgrader's SQLAlchemy noise
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    entries = submissions.discover(submissions_dir)
    release_path = prepare_course(out, Path(source_root), assignment)
    release_nb = nbformat.read(release_path, as_version=4)
    release_meta = submissions.release_metadata(release_nb)
    release_locked = submissions.locked_sources(release_nb)
    run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    cores = len(os.sched_getaffinity(0))
    jobs = max(1, min(jobs or cores, cores, len(entries) or 1))
    loaded = []
    with tempfile.TemporaryDirectory(prefix="agentlab-unzip-") as tmp:
        for entry in entries:
            sub = submissions.load(entry, f"{assignment}.ipynb", Path(tmp) / entry.name)
            if sub.notebook is not None:
                sub.notes += submissions.normalise(sub.notebook, release_meta, release_locked)
            loaded.append(sub)
        review = {s.student: submissions.suspicious_code(s.notebook) for s in loaded if s.notebook}
        results: dict[str, StudentResult] = {}
        feedback_root = out / "course" / "feedback"
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(grade_submission, sub, release_nb=release_nb,
                                   assignment=assignment, out=out, run_id=run_id,
                                   limits=limits, timeouts=timeouts): sub for sub in loaded}
            for future in as_completed(futures):
                sub = futures[future]
                try:
                    result = future.result()
                except Exception as exc:  # noqa: BLE001 - one broken run must not stop the others
                    result = _zero_result(sub.student, "error", release_nb, sub.notes,
                                          f"grading failed: {type(exc).__name__}: {exc}")
                result.review = review.get(result.student, [])
                merge(result, out, assignment)          # serial: only this thread writes the db
                page = feedback_root / result.student / assignment / f"{assignment}.html"
                page.parent.mkdir(parents=True, exist_ok=True)
                page.write_text(feedback_html(result, assignment))
                results[result.student] = result
    ordered = [results[s.student] for s in loaded]
    export(ordered, out)
    (out / "results.json").write_text(json.dumps([asdict(r) | {"score": r.score,
                                                              "max_score": r.max_score}
                                                  for r in ordered], indent=1))
    if not keep_runs:
        shutil.rmtree(out / "runs" / run_id, ignore_errors=True)
    return ordered


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("submissions", type=Path, help="folder with one sub-folder or .zip per student")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="course, gradebook and reports")
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="nbgrader source folder")
    parser.add_argument("--assignment", default=DEFAULT_ASSIGNMENT)
    parser.add_argument("--jobs", type=int, default=None, help="parallel kernels (default: cores)")
    parser.add_argument("--cell-timeout", type=int, default=Limits.cell_timeout)
    parser.add_argument("--notebook-timeout", type=int, default=Limits.notebook_timeout)
    parser.add_argument("--memory-mib", type=int, default=Limits.memory_bytes >> 20)
    parser.add_argument("--keep-runs", action="store_true", help="keep the scratch course copies")
    args = parser.parse_args(argv)
    try:
        limits = Limits(cell_timeout=args.cell_timeout, notebook_timeout=args.notebook_timeout,
                        memory_bytes=args.memory_mib << 20)
    except ValueError as exc:
        parser.error(str(exc))
    start = time.monotonic()
    try:
        results = grade_all(args.submissions, out=args.out, source_root=args.source,
                            assignment=args.assignment, jobs=args.jobs, limits=limits,
                            keep_runs=args.keep_runs)
    except (ValueError, RuntimeError) as exc:
        print(f"grade: {exc}", file=sys.stderr)
        return 2
    print(summary_table(results))
    out = args.out.resolve()
    print(f"\n{len(results)} submissions in {time.monotonic() - start:.1f} s. "
          f"Gradebook: {out / 'course' / 'gradebook.db'}; grades: {out / 'grades.csv'}; "
          f"feedback: {out / 'course' / 'feedback'}/<student>/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
