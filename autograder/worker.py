"""Grade one submission in a process of its own: ``python -m autograder.worker JOB.json``.

The parent (:mod:`autograder.grade`) leases a sandbox uid and its cgroup, writes the job, and runs one worker
per student, so a crash, a hang or a parser bug concerns that entry alone.  The worker:

1. reads the entry (a folder, or a zip unpacked with checks) and parses the notebook as untrusted JSON;
2. assembles the graded notebook from the instructor's release (:func:`agent_lab.grading.notebook.assemble`);
3. runs the student's cells in the sandboxed kernel (:class:`agent_lab.grading.session.KernelSession`);
4. runs every test cell of the course's source notebook here, in this process, calling the student's functions
   across the process boundary (:mod:`agent_lab.grading.runner`);
5. writes ``result.json`` and the executed notebook (test cells carry the grader's verdicts as outputs), with
   every markdown cell and output made inert (:mod:`autograder.untrusted`): instructors open it in formgrader.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent
# The course's secret for hidden test inputs (autograder/README.md): made at the first grading, kept with
# the sources the students must never see.
HIDDEN_SECRET = REPO / "assignments" / "hidden_tests.secret"
if str(REPO) not in sys.path:  # run as ``python -m autograder.worker`` from anywhere
    sys.path.insert(0, str(REPO))

from agent_lab.grading import notebook, runner  # noqa: E402
from agent_lab.grading.session import KernelSession, SessionLimits, error_output  # noqa: E402
from autograder import sandbox, submissions, untrusted  # noqa: E402


@dataclass
class Job:
    """Everything one worker needs; written by the parent as JSON."""

    student: str
    origin: str                  # the entry: a folder or a zip
    notebook_name: str           # e.g. policy_gradients.ipynb
    release: str                 # the release notebook (structure of the graded notebook)
    source: str                  # the course's source notebook (the tests, hidden ones included)
    scratch: str                 # this worker's folder: result.json, graded.ipynb, unzipped files
    uid: int
    ipc_dir: str                 # root-owned parent of the kernels' socket folders
    limits: dict                 # sandbox.Limits fields
    timeouts: dict = field(default_factory=dict)   # grade id -> seconds, where it differs from the cell timeout
    cgroup_procs: list = field(default_factory=list)
    notes: list = field(default_factory=list)      # from reading the submissions folder


def zero_result(student: str, status: str, tests: list[runner.TestCell], notes: list[str], message: str) -> dict:
    return {"student": student, "status": status, "notes": notes, "review": [],
            "tests": [asdict(runner.TestOutcome(t.grade_id, 0.0, t.points, message)) for t in tests]}


def manual_answers(nb: nbformat.NotebookNode, manual: list[tuple[str, float]]) -> list[dict]:
    """The answers a person grades: grade id, points, and whether the student wrote anything (nbgrader's rule:
    an answer whose checksum is still the release's is unanswered and scores 0)."""
    from nbgrader.utils import compute_checksum

    cells = {notebook.grade_id(c): c for c in nb.cells}
    out = []
    for gid, points in manual:
        cell = cells.get(gid)
        checksum = cell.metadata["nbgrader"].get("checksum") if cell is not None else None
        answered = cell is not None and checksum != compute_checksum(cell)
        out.append({"grade_id": gid, "points": points, "answered": answered})
    return out


def record_verdicts(nb: nbformat.NotebookNode, outcomes: list[runner.TestOutcome],
                    source_tests: list[runner.TestCell]) -> None:
    """Test cells of the executed notebook: the instructor's code (hidden tests included) and the verdict."""
    by_id = {o.grade_id: o for o in outcomes}
    code = {t.grade_id: t.source for t in source_tests}
    for cell in nb.cells:
        gid = notebook.grade_id(cell)
        if notebook.is_test(cell) and gid in by_id:
            outcome = by_id[gid]
            cell.source = code.get(gid, cell.source)
            verdict = f"{outcome.score:g} / {outcome.max_score:g}: {outcome.message}"
            cell.outputs = ([nbformat.v4.new_output("stream", name="stdout", text=verdict + "\n")]
                            if outcome.score >= outcome.max_score else [error_output("TestFailed", verdict)])


def grade(job: Job) -> tuple[dict, nbformat.NotebookNode | None]:
    source_nb = nbformat.read(job.source, as_version=4)
    tests, names = runner.test_cells(source_nb), runner.interface(source_nb)
    status, raw, notes, path = submissions.load(Path(job.origin), job.notebook_name, Path(job.scratch))
    notes = job.notes + notes
    if raw is None:
        return zero_result(job.student, status, tests, notes, "not graded: " + "; ".join(notes)), None
    cells, problem = notebook.read_submission(raw, job.notebook_name)
    if cells is None:
        notes.append(problem)
        return zero_result(job.student, "invalid", tests, notes, "not graded: " + problem), None
    release = nbformat.read(job.release, as_version=4)
    nb, assembly_notes = notebook.assemble(release, cells)
    files, file_notes = submissions.files_beside(path)
    limits = sandbox.Limits(**job.limits)

    def manager():
        return sandbox.SandboxKernelManager(sandbox_uid=job.uid, ipc_dir=job.ipc_dir,
                                            limit_values=list(asdict(limits).values()),
                                            cgroup_procs=list(job.cgroup_procs))

    start = time.monotonic()
    session = KernelSession(nb, manager, SessionLimits(cell_timeout=limits.cell_timeout))
    try:
        session.run_notebook()
        session.check_server()
        outcomes = runner.run_tests(tests, session, names, limits.cell_timeout, job.timeouts,
                                    deadline=start + limits.notebook_timeout, files=files,
                                    secret=runner.course_secret(HIDDEN_SECRET))
    finally:
        session.close()
    record_verdicts(nb, outcomes, tests)
    result = {"student": job.student, "status": "graded", "tests": [asdict(o) for o in outcomes],
              "notes": notes + assembly_notes + file_notes + session.notes,
              "review": submissions.suspicious_code(notebook.own_cells(release, cells)),
              "manual": manual_answers(nb, runner.manual_cells(source_nb))}
    # Sanitised only now: nbgrader's "answered" rule compares the answer cells as the student wrote them.
    return result, untrusted.clean_notebook(nb)


def cap_memory(limit_bytes: int) -> None:
    """Bound this process's heap (RLIMIT_DATA) to ``limit_bytes``: the grader's side of one submission may use
    as much memory as its kernel, and a runaway test fails with ``MemoryError`` instead of growing unchecked.

    The data segment, not the address space: torch maps far more address space than it uses. Only the soft
    limit is set, and the kernel this worker starts inherits it harmlessly: the sandbox caps the kernel's
    address space at the same ``memory_bytes``, and its data segment lies within that.
    """
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    soft = limit_bytes if hard == resource.RLIM_INFINITY else min(limit_bytes, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def main(argv: list[str]) -> int:
    job = Job(**json.loads(Path(argv[0]).read_text()))
    cap_memory(int(job.limits["memory_bytes"]))
    scratch = Path(job.scratch)
    os.environ["TMPDIR"] = tempfile.tempdir = str(scratch)  # the trainer's run folders go with the scratch
    import torch

    torch.set_num_threads(1)
    start = time.monotonic()
    result, nb = grade(job)
    result["seconds"] = time.monotonic() - start
    if nb is not None:
        nbformat.write(nb, scratch / "graded.ipynb")
    tmp = scratch / "result.json.tmp"
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(scratch / "result.json")  # the parent reads a whole result or none
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
