"""A value the wire cannot carry is an error answer for that call; the call server keeps serving.

The kernel side runs in a thread here, as in ``test_remote.py``; what a student's function returns reaches the
encoder, and nothing the encoder raises may end the call server (the grader would report a dead kernel).
"""
from __future__ import annotations

import pytest
import torch

from agent_lab.grading import remote
from agent_lab.grading.inkernel import server
from agent_lab.grading.inkernel.checks import Checks

STUDENT = '''
import torch
class Loud(int):
    def __int__(self):
        raise SystemExit("an int that exits when it is read")
class Odd(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        raise OSError("a tensor subclass that fails every operation")
def meta(x):
    return torch.empty(3, device="meta")
def loud(x):
    return [Loud(3)]
def odd(x):
    return torch.ones(2).as_subclass(Odd)
def one_element(x):
    out = x * 2
    return torch.stack([out, out], -1)[..., 0]
def loss(x):
    return (x * x).sum()
'''


@pytest.fixture()
def channel(serve_student):
    return serve_student(STUDENT)


@pytest.mark.parametrize("name", ["meta", "loud", "odd"])
def test_an_unreadable_value_is_an_error_for_that_call_and_the_server_lives_on(channel, name):
    with pytest.raises(remote.RemoteError) as info:
        channel.call(name, (torch.ones(1),), {})
    assert "returned a value the grader cannot read" in info.value.remote_message
    assert channel.broken is None
    got = channel.call("one_element", (torch.tensor([1.5]),), {})
    assert torch.equal(got, torch.tensor([3.0]))


def test_the_message_reaches_the_student_through_the_checks(channel):
    with pytest.raises(AssertionError, match="cannot read"):
        Checks().call(remote.StudentFunction("meta", lambda: channel), torch.ones(1))


def test_a_one_element_answer_of_any_stride_is_graded_as_its_value(channel):
    x = torch.tensor([0.25], dtype=torch.float64)
    got = channel.call("one_element", (x,), {})
    Checks(hidden=True).check_close(got, [0.5], "one_element")


def test_gradients_the_wire_cannot_carry_are_reported_missing_not_a_dead_kernel(channel, monkeypatch):
    monkeypatch.setattr(server, "_gradients", lambda slots, leaves: [[torch.empty(2, device="meta")]])
    x = torch.ones(2, requires_grad=True)
    with pytest.raises(remote.BadAnswer, match="gradients for loss are missing"):
        channel.call("loss", (x,), {})
