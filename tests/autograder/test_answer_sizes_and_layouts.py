"""What a student's function returns cannot make the grader's side large, slow or dead (issue 47, 5 and 6).

A tiny torch assignment is graded end to end in the sandbox for three entries: an honest one, one whose
correct answers are views of unusual layouts (a one-element tensor of stride 2), and one whose function
returns a 64 MiB tensor where a few bytes are expected. Each worker runs under a wrapper that records its own
peak resident memory and its data-segment limit when it exits.
"""
from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from autograder import grade, sandbox
from sandbox_marks import BATCH

pytestmark = BATCH

NAME = "sizes"
LIMITS = sandbox.Limits(cell_timeout=30, notebook_timeout=300, memory_bytes=3 << 30)
PEAK_BOUND = 1536 << 20   # bytes of resident memory a worker may reach on any of these entries
WRAPPER = ("-c", "import json, resource, sys\n"
                 "from pathlib import Path\n"
                 "from autograder import worker\n"
                 "code = worker.main(sys.argv[1:])\n"
                 "Path(sys.argv[1]).with_name('peak.json').write_text(json.dumps({\n"
                 "    'maxrss': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10,\n"
                 "    'data_limit': resource.getrlimit(resource.RLIMIT_DATA)[0]}))\n"
                 "sys.exit(code)\n")


def _meta(grade_id: str, *, solution=False, points=0):
    meta = {"grade_id": grade_id, "solution": solution, "grade": points > 0, "locked": not solution,
            "schema_version": 3}
    if points:
        meta["points"] = points
    return {"nbgrader": meta}


def _solution(body: str) -> str:
    head, ret = body.split("\n", 1)
    return f"{head}\n    ### BEGIN SOLUTION\n{ret}\n    ### END SOLUTION"


DOUBLE, HALF = "def double(x):\n    return x * 2", "def half(x):\n    return x / 2"
ANSWERS = {
    "honest": {},
    "strided": {"double": "def double(x):\n    return torch.stack([x * 2, x * 2], -1)[:, 0]",
                "half": "def half(x):\n    return torch.stack([x / 2, x / 2], -1)[..., 0]"},
    "huge": {"double": "def double(x):\n    return torch.zeros((64 << 20) - 4096, dtype=torch.uint8)"},
}
TESTS = {
    "test_double": ("x = torch.tensor([1, 2, 3], dtype=torch.uint8)\nout = _check.call(double, x)\n"
                    "_check.check_tensor(out, 'double(x)', (3,), torch.uint8)\n"
                    "_check.check_close(out, [2, 4, 6], 'double(x)')", 2),
    "test_double_values": ("_check.check_close(_check.call(double, torch.tensor([5], dtype=torch.uint8)), "
                           "[10], 'double(x)')", 1),
    "test_double_hidden": ("### BEGIN HIDDEN TESTS\n"
                           "out = _check.call(double, torch.tensor([7], dtype=torch.uint8))\n"
                           "_check.check_close(out, [14], 'double(x)')\n### END HIDDEN TESTS", 1),
    "test_half": ("_check.check_close(_check.call(half, torch.tensor([3.0])), [1.5], 'half(x)')", 1),
}


def _write_source(root: Path) -> Path:
    cells = [new_code_cell("import torch", metadata=_meta("imports"))]
    cells += [new_code_cell(_solution(DOUBLE), metadata=_meta("double", solution=True)),
              new_code_cell(_solution(HALF), metadata=_meta("half", solution=True))]
    cells += [new_code_cell(src, metadata=_meta(gid, points=pts)) for gid, (src, pts) in TESTS.items()]
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    (root / NAME).mkdir(parents=True)
    nbformat.write(nb, root / NAME / f"{NAME}.ipynb")
    return root


def _entry(release: nbformat.NotebookNode, bodies: dict[str, str]) -> nbformat.NotebookNode:
    nb = nbformat.from_dict(release)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in ("double", "half"):
            cell.source = bodies.get(gid, DOUBLE if gid == "double" else HALF)
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("sizes")
    source, out, subs = _write_source(root / "source"), root / "out", root / "subs"
    release = nbformat.read(grade.prepare_course(out, source, NAME), as_version=4)
    for student, bodies in ANSWERS.items():
        (subs / student).mkdir(parents=True)
        nbformat.write(_entry(release, bodies), subs / student / f"{NAME}.ipynb")
    patch = pytest.MonkeyPatch()
    patch.setattr(grade, "Batch", functools.partial(grade.Batch, worker=WRAPPER))
    try:
        results = grade.grade_all(subs, out=out, source_root=source, assignment=NAME, jobs=2, limits=LIMITS,
                                  keep_runs=True)
    finally:
        patch.undo()
    peaks = {p.parent.name: json.loads(p.read_text()) for p in (out / "runs").glob("*/*/peak.json")}
    return {r.student: r for r in results}, peaks


def _messages(result) -> dict[str, tuple[float, str]]:
    return {t.grade_id: (t.score, t.message) for t in result.tests}


def test_correct_answers_of_any_layout_get_every_point(graded):
    results, _ = graded
    for student in ("honest", "strided"):
        assert results[student].score == results[student].max_score == 5.0, _messages(results[student])


def test_a_64_mib_answer_fails_its_tests_with_a_clear_verdict_and_nothing_else(graded):
    results, _ = graded
    got = _messages(results["huge"])
    assert got["test_double"][0] == 0 and "should have shape (3,), got (67104768,)" in got["test_double"][1]
    assert got["test_double_hidden"][0] == 0 and "far more values than the test expects" in \
        got["test_double_hidden"][1] and "67104768" not in got["test_double_hidden"][1]
    assert got["test_double_values"][0] == 0 and "far more values than the test expects (shape (67104768,)" \
        in got["test_double_values"][1]
    assert got["test_half"] == (1.0, "passed")


def test_a_64_mib_answer_leaves_the_worker_small_and_on_time(graded):
    results, peaks = graded
    assert set(peaks) == set(ANSWERS), "every worker reports its peak"
    print({student: f"{p['maxrss'] / 2**20:.0f} MiB" for student, p in peaks.items()},
          {student: f"{r.seconds:.1f} s" for student, r in results.items()}, file=sys.stderr)
    assert peaks["huge"]["maxrss"] < PEAK_BOUND
    assert peaks["huge"]["maxrss"] < peaks["honest"]["maxrss"] + (512 << 20)
    assert results["huge"].seconds < 1.5 * results["honest"].seconds + 10   # both graded at once: same load


def test_each_worker_runs_under_its_own_memory_cap(graded):
    _, peaks = graded
    assert {p["data_limit"] for p in peaks.values()} == {LIMITS.memory_bytes}
