"""Part 5: the reference plug-ins reach the threshold within the fixed budget, and a sign error does not.

Each test trains once with the notebook's own budget (about a minute on 2 CPU cores), so both are ``slow``.
"""

from __future__ import annotations

import pytest
import torch

from .mutants import MUTANTS, solution_source
from .notebook_runner import cell_source, restored_globals, run_notebook

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("assignment-training")]


def _training_code() -> str:
    """The training half of the test cell, exactly as the notebook states it."""
    source = cell_source("test_train_agent")
    marker = "# Then: train"
    assert marker in source, "the training test cell changed: update this test"
    return source[source.index(marker):]


def test_reference_plug_ins_pass_the_training_test():
    score = run_notebook(include_training=True)
    assert score.passed["test_train_agent"], score.messages["test_train_agent"]


def test_a_sign_error_does_not_reach_the_threshold_within_the_budget():
    """The budget is discriminative: the same training code with the loss's sign flipped fails."""
    namespace: dict = {"torch": torch}
    with restored_globals():
        exec(cell_source("setup"), namespace)
        exec(MUTANTS["drl_sign_error"].source, namespace)
        exec(solution_source("dr_grpo_advantages"), namespace)
        namespace["advantage_fn"] = namespace["dr_grpo_advantages"]
        namespace["loss_fn"] = namespace["dr_grpo_loss"]
        with pytest.raises(AssertionError, match="greedy success"):
            exec(_training_code(), namespace)
    assert namespace["success"] < namespace["TRAIN_THRESHOLD"]
