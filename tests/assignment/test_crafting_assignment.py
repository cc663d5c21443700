"""The crafting assignment: the reference passes; each part's classic bug fails its visible test with a
message that names it; and the bugs left to the hidden tests pass the visible ones and fail the hidden ones (a
mutation score of 100% over both groups)."""
from __future__ import annotations

import pytest

from .crafting_mutants import CRAFTING_MUTANTS, VISIBLY_CAUGHT
from .notebook_runner import CRAFTING, points_by_test, run_notebook

pytestmark = pytest.mark.xdist_group("assignment-crafting")

FUNCTIONS = ("transcript_batch", "turn_returns", "turn_gae", "ppo_loss")
CLASSIC_BUGS = ("mask_on_the_input_position", "returns_bootstrap_at_termination", "ppo_kl_ratio_upside_down")


def test_the_reference_gets_every_point_of_parts_1_to_4():
    score = run_notebook(path=CRAFTING)
    graded = [g for g in points_by_test(__import__("nbformat").read(CRAFTING, as_version=4))
              if any(g.startswith(f"test_{f}_") for f in FUNCTIONS)]
    assert graded and all(score.passed[g] for g in graded), score.messages
    assert score.notes == []


def test_every_function_keeps_bugs_only_the_hidden_tests_catch_and_the_classic_ones_are_named():
    per_function = {f: [m for m in CRAFTING_MUTANTS.values() if m.grade_id == f] for f in FUNCTIONS}
    assert all(len(v) >= 2 for v in per_function.values()), {f: len(v) for f, v in per_function.items()}
    assert set(CLASSIC_BUGS) <= set(VISIBLY_CAUGHT)
    assert not set(CRAFTING_MUTANTS) & set(VISIBLY_CAUGHT)


def _others_keep_their_points(score, grade_id: str) -> None:
    others = [g for g in score.passed if not g.startswith(f"test_{grade_id}_")
              and any(g.startswith(f"test_{f}_") for f in FUNCTIONS)]
    assert all(score.passed[g] for g in others), {g: score.messages[g] for g in others if not score.passed[g]}


@pytest.mark.parametrize("name", sorted(VISIBLY_CAUGHT))
def test_the_visible_test_fails_on_the_classic_bug_and_names_it(name):
    mutant, named = VISIBLY_CAUGHT[name]
    score = run_notebook({mutant.grade_id: mutant.source}, path=CRAFTING)
    visible, hidden = f"test_{mutant.grade_id}_visible", f"test_{mutant.grade_id}_hidden"
    assert not score.passed[visible], f"the visible tests accept '{name}' ({mutant.bug})"
    assert named in score.messages[visible], (f"the visible test's message should name the bug ({named!r}): "
                                              f"{score.messages[visible]}")
    assert not score.passed[hidden], f"the hidden tests accept '{name}' ({mutant.bug})"
    _others_keep_their_points(score, mutant.grade_id)


@pytest.mark.parametrize("name", sorted(CRAFTING_MUTANTS))
def test_each_variant_passes_the_visible_tests_and_only_the_hidden_ones_catch_it(name):
    mutant = CRAFTING_MUTANTS[name]
    score = run_notebook({mutant.grade_id: mutant.source}, path=CRAFTING)
    visible, hidden = f"test_{mutant.grade_id}_visible", f"test_{mutant.grade_id}_hidden"
    assert score.passed[visible], f"'{name}' should pass the visible tests: {score.messages[visible]}"
    assert not score.passed[hidden], f"the hidden tests accept '{name}' ({mutant.bug})"
    assert "hidden case" in score.messages[hidden]
    _others_keep_their_points(score, mutant.grade_id)
