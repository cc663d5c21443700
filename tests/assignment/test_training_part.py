"""Part 5: the reference plug-ins reach the threshold within the fixed budget, and a sign error does not.

The training runs in the grader's process and calls the student's two plug-ins in the grading kernel at every
step; each test trains once with the notebook's own budget, so both are ``slow``.
"""

from __future__ import annotations

import re

import pytest

from agent_lab.grading.runner import TestCell
from .notebook_runner import cell_source, run_notebook

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("assignment-training")]


def test_reference_plug_ins_pass_the_training_test_and_the_feedback_says_how_well():
    score = run_notebook(include_training=True)
    assert score.passed["test_train_agent"], score.messages["test_train_agent"]
    success = float(re.search(r"greedy success after training: ([0-9.]+)", score.messages["test_train_agent"])[1])
    assert success >= 0.75 and "needs >= 0.75" in score.messages["test_train_agent"]


def test_a_sign_error_does_not_reach_the_threshold_within_the_budget():
    """The budget is discriminative: the training half of the test, with the loss's sign flipped, fails."""
    source = cell_source("test_train_agent")
    marker = "# Then: train"
    assert marker in source, "the training test cell changed: update this test"
    training_only = TestCell("test_train_agent", "import torch\n" + source[source.index(marker):], 4.0, False)
    flipped = "def loss_fn(logprobs, action_mask, advantages, max_tokens):\n" \
              "    return -dr_grpo_loss(logprobs, action_mask, advantages, max_tokens)\n" \
              "def advantage_fn(rewards, group_size):\n    return dr_grpo_advantages(rewards, group_size)\n"
    score = run_notebook({"train_agent": flipped}, tests=[training_only])
    assert not score.passed["test_train_agent"]
    success = float(re.search(r"greedy success ([0-9.]+) < 0.75", score.messages["test_train_agent"])[1])
    assert success < 0.75
