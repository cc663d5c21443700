"""No point of the assignment rests on what the student's kernel says about itself.

Two claims the kernel could make: that a call left its tensor arguments alone (a patched ``server._same_bytes``
hides an in-place write) and that a loss is differentiable (a loss built with ``.item()`` plus a gradient a
patched ``server._gradients`` hands over). Each submission below makes the claim; the grader's verdict must
follow only from the values the function returned, judged against the grader's own.
"""
from __future__ import annotations

import pytest

from agent_lab.grading import runner
from assignment.notebook_runner import cell_source, load_source, run_notebook

IN_PLACE = '''
def reward_to_go(rewards, gamma):
    for t in range(rewards.shape[-1] - 2, -1, -1):
        rewards[..., t] += gamma * rewards[..., t + 1]
    return rewards
'''
HIDE_WRITES = ("\nimport agent_lab.grading.inkernel.server as _server\n"
               "_server._same_bytes = lambda a, b: True\n")


def _test(grade_id: str) -> runner.TestCell:
    return next(t for t in runner.test_cells(load_source()) if t.grade_id == grade_id)


def test_hiding_an_in_place_write_earns_nothing_an_honest_in_place_write_does_not():
    tests = [_test("test_reward_to_go_hidden")]
    honest = run_notebook({"reward_to_go": IN_PLACE}, tests=tests)
    lying = run_notebook({"reward_to_go": IN_PLACE + HIDE_WRITES}, tests=tests)
    assert lying.points == honest.points, (lying.messages, honest.messages)


# loss_fn built with .item(): no autograd graph in the kernel. The patched _gradients hands over a gradient
# computed by hand, `SCALE` times the true one.
ITEM_LOSS = '''
import torch
import agent_lab.grading.inkernel.server as _server

def advantage_fn(rewards, group_size):
    return dr_grpo_advantages(rewards, group_size)

_LAST = {{}}

def loss_fn(logprobs, action_mask, advantages, max_tokens):
    mask = action_mask.to(logprobs.dtype)
    value = dr_grpo_loss(logprobs.detach(), mask, advantages, max_tokens).item()
    _LAST["grad"] = -(advantages[:, None] * mask) / (logprobs.shape[0] * max_tokens)
    return torch.tensor(value, dtype=logprobs.dtype, requires_grad=True)

_server._gradients = lambda slots, leaves: [[{scale} * _LAST["grad"] for _ in leaves] for _ in slots]
'''


def _plug_in_checks() -> runner.TestCell:
    """The training test up to its training run: the checks of advantage_fn and loss_fn."""
    code = cell_source("test_train_agent")
    marker = "# Then: train"
    assert marker in code, "the training test cell changed: update this test"
    return runner.TestCell("test_train_agent_plug_ins", code[:code.index(marker)], 4.0, False)


@pytest.mark.parametrize("scale, earns", [(3.0, False), (1.0, True)])
def test_a_gradient_the_kernel_hands_over_counts_only_when_it_is_the_right_one(scale, earns):
    """A wrong gradient scores nothing; the right one (as a custom autograd.Function would give) is an answer."""
    score = run_notebook({"train_agent": ITEM_LOSS.format(scale=scale)}, tests=[_plug_in_checks()])
    assert score.passed["test_train_agent_plug_ins"] is earns, score.messages
    if not earns:
        assert "gradient" in score.messages["test_train_agent_plug_ins"]
