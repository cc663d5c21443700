"""Grading with a local kernel (no sandbox, no root): the tests run in the grader and call the kernel.

Each case is a tiny source notebook with one answer ``square`` and three tests; the student's cells vary.
"""
from __future__ import annotations

import time

import nbformat
import pytest

from agent_lab.grading import notebook, runner
from agent_lab.grading.session import KernelSession, LocalKernelManager, SessionLimits


def _meta(gid, **flags):
    return {"nbgrader": {"grade_id": gid, "schema_version": 3, "solution": False, "grade": False,
                         "locked": False, **flags}}


SOURCE = nbformat.v4.new_notebook(cells=[
    nbformat.v4.new_code_cell("from agent_lab.grading.inkernel.checks import Checks\n_check = Checks()",
                              metadata=_meta("setup", locked=True)),
    nbformat.v4.new_code_cell("def square(x):\n    ### BEGIN SOLUTION\n    return x * x\n    ### END SOLUTION",
                              metadata=_meta("square", solution=True)),
    nbformat.v4.new_code_cell("assert _check.call(square, 3) == 9, 'square(3) should be 9'",
                              metadata=_meta("test_visible", grade=True, locked=True, points=1)),
    nbformat.v4.new_code_cell("### BEGIN HIDDEN TESTS\nfor k in (0, 1, 2, 4, 5):\n"
                              "    assert _check.call(square, k) == k * k, f'hidden case {k}'\n"
                              "### END HIDDEN TESTS", metadata=_meta("test_hidden", grade=True, locked=True,
                                                                      points=2)),
])


def grade(*student_cells: str, cell_timeout: int = 20) -> tuple[dict, KernelSession]:
    """Scores by test id for a submission whose answer cell is the first source, then added cells."""
    sub = nbformat.from_dict(SOURCE)
    sub.cells[1].source = student_cells[0]
    sub.cells += [nbformat.v4.new_code_cell(s) for s in student_cells[1:]]
    cells, _ = notebook.read_submission(nbformat.writes(sub).encode())
    nb, _ = notebook.assemble(SOURCE, cells)
    session = KernelSession(nb, LocalKernelManager, SessionLimits(cell_timeout=cell_timeout, startup_timeout=60))
    try:
        session.run_notebook()
        session.check_server()
        outcomes = runner.run_tests(runner.test_cells(SOURCE), session, runner.interface(SOURCE), cell_timeout)
    finally:
        session.close()
    return {o.grade_id: (o.score, o.message) for o in outcomes}, session


RIGHT = "def square(x):\n    return x * x"
WRONG = "def square(x):\n    return x + x"


def test_the_reference_earns_everything_and_a_wrong_answer_nothing():
    scores, _ = grade(RIGHT)
    assert scores == {"test_visible": (1.0, "passed"), "test_hidden": (2.0, "passed")}
    scores, _ = grade(WRONG)
    assert scores["test_visible"] == (0.0, "square(3) should be 9")
    assert scores["test_hidden"] == (0.0, "hidden case 1")


@pytest.mark.parametrize("attack", [
    "import builtins\nbuiltins.range = lambda *a: iter(())",                      # hidden loop of no cases
    "_check.call = lambda f, *a: 9\nclass Checks:\n    pass",                    # the notebook's own helpers
    "import sys\nsys.displayhook('all good')\nprint('passed')",                  # output the kernel prints
    "import IPython\nip = IPython.get_ipython()\n"
    "ip.input_transformers_cleanup.append(lambda lines: ['pass\\n'] if '_check' in ''.join(lines) else lines)",
    "k = get_ipython().kernel\nasync def fake(*a, **kw):\n"
    "    return {'status': 'ok', 'execution_count': 1, 'payload': [], 'user_expressions': {}}\n"
    "k.do_execute = fake",
])
def test_nothing_the_kernel_does_outside_the_function_changes_its_score(attack):
    scores, _ = grade(WRONG, attack)
    assert scores == {"test_visible": (0.0, "square(3) should be 9"), "test_hidden": (0.0, "hidden case 1")}


def test_the_kernel_cannot_import_the_library_it_is_graded_against():
    scores, session = grade("from agent_lab.training import reward_to_go\n" + RIGHT)
    assert scores["test_visible"][0] == 0.0 and "not defined" in scores["test_visible"][1]
    assert any("agent_lab.training is not available while your notebook is graded" in n for n in session.notes)


def test_a_cell_that_kills_the_kernel_costs_only_what_depends_on_it():
    scores, session = grade(RIGHT, "import os\nos._exit(1)", "x = 1")
    assert scores == {"test_visible": (1.0, "passed"), "test_hidden": (2.0, "passed")}
    assert session.restarts == 1 and any("failed" in n for n in session.notes)


def test_a_hanging_call_times_out_and_the_next_test_gets_a_fresh_kernel():
    hang_on_3 = "import time\ndef square(x):\n    if x == 3:\n        time.sleep(60)\n    return x * x"
    start = time.monotonic()
    scores, session = grade(hang_on_3, cell_timeout=10)
    assert scores["test_visible"][0] == 0.0 and "did not return within" in scores["test_visible"][1]
    assert scores["test_hidden"] == (2.0, "passed") and session.restarts == 1
    assert time.monotonic() - start < 60


def test_what_the_function_prints_during_a_hidden_test_reaches_no_message():
    noisy = "def square(x):\n    print('SECRET', x)\n    raise ValueError(f'SECRET {x}')"
    scores, _ = grade(noisy)
    assert "SECRET 3" in scores["test_visible"][1]      # visible inputs are public
    assert scores["test_hidden"][1] == "hidden case 0" or "SECRET" not in scores["test_hidden"][1]
    assert "SECRET" not in scores["test_hidden"][1]
