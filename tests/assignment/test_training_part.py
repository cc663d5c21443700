"""Part 5: the reference plug-ins reach the threshold within the fixed budget, and a sign error does not.

Each test trains once with the notebook's own budget (about a minute on 2 CPU cores), so both are ``slow``.
"""

from __future__ import annotations

import re

import pytest
import torch

from .mutants import MUTANTS
from .notebook_runner import cell_source, run_notebook

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("assignment")]


def _budget() -> tuple[dict, float]:
    """TRAIN_BUDGET and TRAIN_THRESHOLD exactly as the test cell states them."""
    source = cell_source("test_train_agent")
    namespace: dict = {}
    for name in ("TRAIN_BUDGET", "TRAIN_THRESHOLD"):
        match = re.search(rf"^{name} = (.*?)(?=^\S)", source + "\nEND", flags=re.S | re.M)
        assert match, f"the training test cell no longer defines {name}"
        exec(f"{name} = {match.group(1)}", namespace)
    return namespace["TRAIN_BUDGET"], namespace["TRAIN_THRESHOLD"]


def test_reference_plug_ins_pass_the_training_test():
    score = run_notebook(include_training=True)
    assert score.passed["test_train_agent"], score.messages["test_train_agent"]


def test_a_sign_error_does_not_reach_the_threshold_within_the_budget():
    """The budget is discriminative: training with the loss's sign flipped stays below the threshold."""
    from agent_lab.trainer import TrainConfig, train

    budget, threshold = _budget()
    namespace: dict = {"torch": torch}
    exec(MUTANTS["drl_sign_error"].source, namespace)

    def advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        groups = rewards.reshape(-1, group_size)
        return (groups - groups.mean(dim=1, keepdim=True)).reshape(-1)

    result = train(TrainConfig(**budget), advantage_fn=advantages, loss_fn=namespace["dr_grpo_loss"], progress=False)
    assert result.final_eval.success < threshold, (result.final_eval.success, threshold)
