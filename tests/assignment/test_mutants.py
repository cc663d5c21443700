"""Mutation test of the assignment's tests: every plausible wrong implementation must lose points.

The notebook's cells run in-process (``notebook_runner``), which scores exactly like nbgrader's autograde
for these submissions; ``test_release_and_autograde.py`` checks one mutant end to end through nbgrader.
"""

from __future__ import annotations

import pytest

from .mutants import CALLS_REFERENCE, HARD_CODED, MUTANTS
from .notebook_runner import GRADED_FUNCTIONS, run_notebook, points_by_test

# The reference run is shared by several tests; the training cells need the trainer and run elsewhere.
pytestmark = pytest.mark.xdist_group("assignment-mutants")

POINTS = points_by_test()
FULL = sum(points for grade, points in POINTS.items() if grade != "test_train_agent")


@pytest.fixture(scope="session")
def reference_score():
    return run_notebook()


def test_reference_solution_gets_full_marks(reference_score):
    assert reference_score.failed() == [], reference_score.messages
    assert reference_score.total == FULL


def test_there_are_at_least_fifteen_mutants_covering_every_graded_function():
    assert len(MUTANTS) >= 15
    assert {mutant.grade_id for mutant in MUTANTS.values()} == set(GRADED_FUNCTIONS)


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_loses_the_hidden_points_of_its_function_only(name):
    mutant = MUTANTS[name]
    score = run_notebook({mutant.grade_id: mutant.source})
    hidden = f"test_{mutant.grade_id}_hidden"
    assert not score.passed[hidden], f"the hidden tests accept the mutant '{name}' ({mutant.bug})"
    assert score.total < FULL
    # The other functions are untouched, so their tests still pass: no collateral damage.
    others = [g for g in score.passed if not g.startswith(f"test_{mutant.grade_id}_")]
    assert all(score.passed[g] for g in others), {g: score.messages[g] for g in others if not score.passed[g]}
    # A failure message names the hidden case and what was expected.
    assert "hidden case" in score.messages[hidden] or "should" in score.messages[hidden], score.messages[hidden]


@pytest.mark.parametrize("function", GRADED_FUNCTIONS)
def test_calling_the_agent_lab_reference_gets_no_credit(function):
    score = run_notebook({function: CALLS_REFERENCE[function]})
    for kind in ("visible", "hidden"):
        grade = f"test_{function}_{kind}"
        assert not score.passed[grade], f"{grade} credits a function that only calls agent_lab's reference"
        assert "reference functions are switched off" in score.messages[grade], score.messages[grade]


def test_hard_coded_visible_answers_score_under_half():
    score = run_notebook(dict(HARD_CODED))
    assert all(not score.passed[f"test_{f}_hidden"] for f in GRADED_FUNCTIONS), score.messages
    assert score.total < sum(POINTS.values()) / 2, (score.total, score.points)


def test_blank_release_scores_zero():
    stub = "def {name}(*args, **kwargs):\n    # YOUR CODE HERE\n    raise NotImplementedError()\n"
    score = run_notebook({name: stub.format(name=name) for name in GRADED_FUNCTIONS})
    assert score.total == 0.0, score.points
    assert "is not implemented yet" in score.messages["test_reward_to_go_visible"]
