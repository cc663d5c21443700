"""Run an assignment's test cells in the grader's process and score them there.

Each test cell runs in a fresh namespace of the grader's: its own builtins, ``torch``, a
:class:`~agent_lab.grading.inkernel.checks.Checks` and, for every function the assignment asks for, a
:class:`~agent_lab.grading.remote.StudentFunction` proxy. A cell earns its points when it raises nothing, and
only then: nothing the kernel prints or displays is read. What a cell prints goes nowhere near the feedback.
"""
from __future__ import annotations

import ast
import builtins
import contextlib
import io
import os
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import torch

from agent_lab.grading.inkernel.checks import Checks
from agent_lab.grading.notebook import grade_id, is_test
from agent_lab.grading.remote import CallFailed, StudentFunction
from agent_lab.grading.session import KernelSession, plain_text

HIDDEN = re.compile(r"^[ \t]*### (BEGIN|END) HIDDEN TESTS[^\n]*\n?", re.M)
MESSAGE_CHARS = 600


@dataclass(frozen=True)
class TestCell:
    __test__ = False  # not a pytest test class
    grade_id: str
    source: str      # the instructor's code, hidden tests included, without the hidden-test markers
    points: float
    hidden: bool     # the cell holds hidden tests: its messages repeat nothing the student's process sent


@dataclass
class TestOutcome:
    __test__ = False
    grade_id: str
    score: float
    max_score: float
    message: str
    seconds: float = 0.0
    records: list = field(default_factory=list)   # (table, row) pairs the test recorded (a leaderboard, say)


def test_cells(source_nb: nbformat.NotebookNode) -> list[TestCell]:
    """The autograded tests of an nbgrader *source* notebook (the version with the hidden tests)."""
    out = []
    for cell in source_nb.cells:
        if is_test(cell):
            points = float(cell.metadata["nbgrader"].get("points", 0))
            out.append(TestCell(grade_id(cell), HIDDEN.sub("", cell.source), points,
                                bool(HIDDEN.search(cell.source))))
    return out


def manual_cells(source_nb: nbformat.NotebookNode) -> list[tuple[str, float]]:
    """(grade id, points) of the answers a person grades: cells that are both an answer and graded."""
    return [(grade_id(c), float(c.metadata["nbgrader"].get("points", 0))) for c in source_nb.cells
            if c.get("metadata", {}).get("nbgrader", {}).get("grade") and c.metadata["nbgrader"].get("solution")]


def interface(source_nb: nbformat.NotebookNode) -> list[str]:
    """Names of the functions the assignment asks for: top-level ``def``s of its answer cells."""
    names: list[str] = []
    for cell in source_nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("solution"):
            tree = ast.parse(cell.source)
            names += [node.name for node in tree.body if isinstance(node, ast.FunctionDef)]
    return list(dict.fromkeys(names))


def _failure(exc: BaseException, hidden: bool) -> str:
    if hasattr(exc, "remote_type"):  # the test called a student's function without _check.call
        shown = exc.remote_type if exc.remote_builtin or not hidden else "an exception"
        return plain_text(f"your function raised {shown}" + ("" if hidden else f": {exc.remote_message}"),
                          MESSAGE_CHARS)
    if isinstance(exc, (AssertionError, CallFailed)):
        return plain_text(str(exc), MESSAGE_CHARS) or f"{type(exc).__name__} (no message)"
    if hidden:  # raised by the test while it looked at what came back: its text may quote that
        return f"{type(exc).__name__} while checking what your function returned"
    return plain_text(f"{type(exc).__name__}: {exc}", MESSAGE_CHARS)


def run_test(test: TestCell, session: KernelSession, names: list[str], seconds: float,
             files: dict[str, Path] | None = None, cache: dict | None = None, secret: bytes = b"") -> TestOutcome:
    """One test cell against the student's kernel, with ``seconds`` of wall time for its calls.

    ``files`` are the files handed in beside the notebook, ``cache`` the submission's shared cache and ``secret``
    the course's secret for hidden inputs (see :class:`~agent_lab.grading.inkernel.checks.Checks`)."""
    start = time.monotonic()
    try:
        channel = session.ready()
    except CallFailed as exc:
        return TestOutcome(test.grade_id, 0.0, test.points, f"not run: {exc}")
    channel.deadline, channel.budget = start + seconds, seconds
    checks = Checks(hidden=test.hidden, files=files, cache=cache, secret=secret)
    namespace = {"__name__": "__grader__", "__builtins__": builtins, "torch": torch, "_check": checks}
    namespace.update({name: StudentFunction(name, session.current) for name in names})
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            exec(compile(test.source, f"<test {test.grade_id}>", "exec"), namespace)  # noqa: S102 - our tests
    except Exception as exc:  # noqa: BLE001 - every failure of a test is a failed test
        return TestOutcome(test.grade_id, 0.0, test.points, _failure(exc, test.hidden),
                           time.monotonic() - start, checks.records)
    finally:
        channel.deadline = None
    message = "; ".join(["passed", *(plain_text(n, 200) for n in checks.notes)])
    return TestOutcome(test.grade_id, test.points, test.points, message, time.monotonic() - start,
                       checks.records)


def run_tests(tests: list[TestCell], session: KernelSession, names: list[str], cell_timeout: float,
              timeouts: dict[str, float] | None = None, deadline: float | None = None,
              files: dict[str, Path] | None = None, secret: bytes = b"") -> list[TestOutcome]:
    """Every test, the outcomes in the tests' order; past ``deadline`` (a ``time.monotonic()`` value) the rest
    are marked not run. ``secret``: the course's secret for hidden inputs (:func:`course_secret`).

    The visible tests run first, then the hidden ones. A kernel can keep what a hidden call received and put it
    into what a later call returns or raises, and a visible test's message quotes that; once a hidden input has
    reached the kernel, no visible test runs.
    """
    outcomes: dict[int, TestOutcome] = {}
    cache: dict = {}
    for index in sorted(range(len(tests)), key=lambda i: tests[i].hidden):  # stable: notebook order in each
        test = tests[index]
        seconds = float((timeouts or {}).get(test.grade_id, cell_timeout))
        if deadline is not None:
            seconds = min(seconds, deadline - time.monotonic())
        if seconds <= 0:
            outcomes[index] = TestOutcome(test.grade_id, 0.0, test.points, "not run: the notebook used its time budget")
            continue
        outcomes[index] = run_test(test, session, names, seconds, files, cache, secret)
    return [outcomes[i] for i in range(len(tests))]


def course_secret(path: Path) -> bytes:
    """The course's secret for hidden test inputs, read from ``path``; made (random, owner-only) if missing.

    Hidden tests draw their inputs from ``_check.Rng(seed)``; in the grader each seed is mixed with this secret,
    so the inputs are not the ones anyone can compute from the seeds in the repository, and a course with a new
    secret gets new inputs even if an earlier course's leaked. Workers that start together agree on one secret:
    the file appears at ``path`` in one step (a hard link), complete, or not at all.
    """
    path = Path(path)
    if not path.exists():
        draft = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32) + "\n")
        try:
            os.link(draft, path)
        except FileExistsError:
            pass   # another worker made it first: use theirs
        finally:
            draft.unlink()
    text = path.read_text().strip()
    if len(text) < 32:
        raise ValueError(f"{path} holds no usable secret (32 or more characters): delete it and grade again, "
                         "or copy the course's secret file there")
    return text.encode()
