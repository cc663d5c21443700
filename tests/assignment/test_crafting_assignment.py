"""The crafting assignment: the reference passes, and every bug it is about passes the visible tests and fails
the hidden ones (its mutation score over visible-passing variants is 100%)."""
from __future__ import annotations

import pytest

from .crafting_mutants import CRAFTING_MUTANTS
from .notebook_runner import CRAFTING, points_by_test, run_notebook

pytestmark = pytest.mark.xdist_group("assignment-crafting")

FUNCTIONS = ("transcript_batch", "turn_returns", "turn_gae", "ppo_loss")
NAMED_BUGS = ("mask_two_ahead", "mask_on_the_input_position", "returns_bootstrap_at_termination",
              "gae_lambda_once_too_often", "ppo_clip_wrong_side_for_negative")


def test_the_reference_gets_every_point_of_parts_1_to_4():
    score = run_notebook(path=CRAFTING)
    graded = [g for g in points_by_test(__import__("nbformat").read(CRAFTING, as_version=4))
              if any(g.startswith(f"test_{f}_") for f in FUNCTIONS)]
    assert graded and all(score.passed[g] for g in graded), score.messages
    assert score.notes == []


def test_at_least_three_visible_passing_variants_per_function_including_the_named_bugs():
    per_function = {f: [m for m in CRAFTING_MUTANTS.values() if m.grade_id == f] for f in FUNCTIONS}
    assert all(len(v) >= 3 for v in per_function.values()), {f: len(v) for f, v in per_function.items()}
    assert set(NAMED_BUGS) <= set(CRAFTING_MUTANTS)


@pytest.mark.parametrize("name", sorted(CRAFTING_MUTANTS))
def test_each_variant_passes_the_visible_tests_and_only_the_hidden_ones_catch_it(name):
    mutant = CRAFTING_MUTANTS[name]
    score = run_notebook({mutant.grade_id: mutant.source}, path=CRAFTING)
    visible, hidden = f"test_{mutant.grade_id}_visible", f"test_{mutant.grade_id}_hidden"
    assert score.passed[visible], f"'{name}' should pass the visible tests: {score.messages[visible]}"
    assert not score.passed[hidden], f"the hidden tests accept '{name}' ({mutant.bug})"
    assert "hidden case" in score.messages[hidden]
    others = [g for g in score.passed if not g.startswith(f"test_{mutant.grade_id}_")
              and any(g.startswith(f"test_{f}_") for f in FUNCTIONS)]
    assert all(score.passed[g] for g in others), {g: score.messages[g] for g in others if not score.passed[g]}
