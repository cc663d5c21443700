"""Mutation test of the assignment's tests: every plausible wrong implementation must lose points.

Each run grades the notebook the way the grader does (``notebook_runner``: the student's cells in a grading
kernel, the tests in this process, hidden tests included), without the sandbox.
"""

from __future__ import annotations

import pytest

from .mutants import CALLS_REFERENCE, HARD_CODED, MUTANTS, VISIBLE_PASSING
from .notebook_runner import GRADED_FUNCTIONS, points_by_test, run_notebook

pytestmark = pytest.mark.xdist_group("assignment-mutants")

POINTS = points_by_test()
FULL = sum(points for grade, points in POINTS.items() if grade != "test_train_agent")


@pytest.fixture(scope="session")
def reference_score():
    return run_notebook()


def test_reference_solution_gets_full_marks(reference_score):
    assert reference_score.failed() == [], reference_score.messages
    assert reference_score.total == FULL and reference_score.notes == []


def test_there_are_mutants_covering_every_graded_function_and_some_only_hidden_tests_catch():
    assert len(MUTANTS) >= 15
    assert {mutant.grade_id for mutant in MUTANTS.values()} == set(GRADED_FUNCTIONS)
    assert {mutant.grade_id for mutant in VISIBLE_PASSING.values()} == set(GRADED_FUNCTIONS)


def _check_only_its_function_lost(name, mutant, score):
    hidden = f"test_{mutant.grade_id}_hidden"
    assert not score.passed[hidden], f"the hidden tests accept the mutant '{name}' ({mutant.bug})"
    others = [g for g in score.passed if not g.startswith(f"test_{mutant.grade_id}_")]
    assert all(score.passed[g] for g in others), {g: score.messages[g] for g in others if not score.passed[g]}
    assert "hidden case" in score.messages[hidden] or "should" in score.messages[hidden], score.messages[hidden]


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_loses_the_hidden_points_of_its_function_only(name):
    mutant = MUTANTS[name]
    _check_only_its_function_lost(name, mutant, run_notebook({mutant.grade_id: mutant.source}))


@pytest.mark.parametrize("name", sorted(VISIBLE_PASSING))
def test_a_bug_the_visible_tests_miss_is_caught_by_the_hidden_tests(name):
    mutant = VISIBLE_PASSING[name]
    score = run_notebook({mutant.grade_id: mutant.source})
    assert score.passed[f"test_{mutant.grade_id}_visible"], f"'{name}' should pass the visible tests: " \
        + score.messages[f"test_{mutant.grade_id}_visible"]
    _check_only_its_function_lost(name, mutant, score)


@pytest.mark.parametrize("function", GRADED_FUNCTIONS)
def test_calling_the_agent_lab_reference_gets_no_credit(function):
    score = run_notebook({function: CALLS_REFERENCE[function]})
    for kind in ("visible", "hidden"):
        grade = f"test_{function}_{kind}"
        assert not score.passed[grade], f"{grade} credits a function that only calls agent_lab's reference"
    assert "not available while your notebook is graded" in score.messages[f"test_{function}_visible"] \
        + " ".join(score.notes)


def test_hard_coded_visible_answers_score_under_half():
    score = run_notebook(dict(HARD_CODED))
    assert all(not score.passed[f"test_{f}_hidden"] for f in GRADED_FUNCTIONS), score.messages
    assert score.total < sum(POINTS.values()) / 2, (score.total, score.points)


def test_blank_release_scores_zero():
    stub = "def {name}(*args, **kwargs):\n    # YOUR CODE HERE\n    raise NotImplementedError()\n"
    score = run_notebook({name: stub.format(name=name) for name in GRADED_FUNCTIONS})
    assert score.total == 0.0, score.points
    assert "is not implemented yet" in score.messages["test_reward_to_go_visible"]
