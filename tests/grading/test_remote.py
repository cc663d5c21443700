"""Calls across the process boundary: values, gradients through RemoteGradient, failures in the grader's words.

The kernel side runs in a thread here (same code as in the sandbox,
:func:`agent_lab.grading.inkernel.server.serve`).
"""
from __future__ import annotations

import socket
import threading
import time

import pytest
import torch

from agent_lab.grading import remote
from agent_lab.grading.inkernel import server, wire
from agent_lab.grading.inkernel.checks import Checks

STUDENT = '''
import time, torch
def rtg(r, g):
    out = torch.empty_like(r)
    run = torch.zeros_like(r[..., 0])
    for t in range(r.shape[-1] - 1, -1, -1):
        run = r[..., t] + g * run
        out[..., t] = run
    return out
def loss(lp, m, a, T):
    return -(a * (m * lp).sum(1)).sum() / (lp.shape[0] * T)
def pair(lp):
    return lp.sum(), torch.tensor(2.0, dtype=lp.dtype)
def detached(lp):
    return lp.sum().detach()
def leaky(r):
    raise ValueError("the inputs were " + repr(r.tolist()))
class Mine(Exception):
    pass
def own_exception(r):
    raise Mine("x")
def in_place(r):
    r.mul_(2)
    return r
def slow(r):
    time.sleep(30)
def not_implemented(*a):
    raise NotImplementedError()
def exits(*a):
    raise SystemExit(3)
'''


@pytest.fixture()
def channel(serve_student):
    return serve_student(STUDENT)


def fn(ch, name):
    return remote.StudentFunction(name, lambda: ch)


def test_values_come_back_as_fresh_grader_tensors(channel):
    r = torch.tensor([0.2, 1.0], dtype=torch.float64)
    out = fn(channel, "rtg")(r, 0.9)
    assert type(out) is torch.Tensor and out.dtype == torch.float64
    assert out.tolist() == pytest.approx([1.1, 1.0], abs=1e-15)


def test_the_kernels_gradient_flows_into_the_graders_graph_exactly(channel):
    w = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -0.5]], dtype=torch.float64, requires_grad=True)
    lp = w * 1.0  # not a leaf: as in the trainer, where log-probs come out of the model
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    adv = torch.tensor([0.5, -0.5], dtype=torch.float64)
    loss = fn(channel, "loss")(lp, mask, adv, 4)
    assert loss.requires_grad and loss.item() == pytest.approx(0.09375, abs=1e-15)
    (3.0 * loss).backward()
    expected = -3.0 * adv[:, None] * mask / 8
    assert torch.equal(w.grad, expected)


def test_each_zero_dim_output_of_a_tuple_carries_its_own_gradient(channel):
    w = torch.ones(2, 3, requires_grad=True)
    num, den = fn(channel, "pair")(w * 1.0)
    assert num.requires_grad and not den.requires_grad and den.item() == 2.0
    (grad,) = torch.autograd.grad(num / den, [w])
    assert torch.equal(grad, torch.full((2, 3), 0.5))


def test_a_detached_loss_is_not_differentiable_on_the_graders_side(channel):
    out = fn(channel, "detached")(torch.ones(3, requires_grad=True))
    assert not out.requires_grad
    with pytest.raises(AssertionError, match="not differentiable"):
        Checks().check_scalar_loss(out, "detached", torch.float32)


def test_in_place_writes_stay_in_the_kernel_and_never_reach_the_graders_arguments(channel):
    r = torch.tensor([1.0, 2.0])
    assert fn(channel, "in_place")(r).tolist() == [2.0, 4.0]
    assert r.tolist() == [1.0, 2.0]


def test_exceptions_are_reported_with_text_in_visible_tests_and_without_in_hidden_ones(channel):
    secret = torch.tensor([3.25, 7.5])
    with pytest.raises(AssertionError) as visible:
        Checks().call(fn(channel, "leaky"), secret)
    assert "ValueError" in str(visible.value) and "3.25" in str(visible.value)
    with pytest.raises(AssertionError) as hidden:
        Checks(hidden=True).call(fn(channel, "leaky"), secret)
    assert str(hidden.value) == "leaky raised ValueError"
    with pytest.raises(AssertionError) as own:
        Checks(hidden=True).call(fn(channel, "own_exception"), secret)
    assert "Mine" not in str(own.value) and "a class your code defined" in str(own.value)


def test_missing_stub_and_exiting_functions_get_clear_messages(channel):
    with pytest.raises(AssertionError, match="not implemented yet"):
        Checks().call(fn(channel, "not_implemented"))
    with pytest.raises(AssertionError, match="raised SystemExit"):
        Checks().call(fn(channel, "exits"))
    with pytest.raises(AssertionError, match="is not defined"):
        Checks().call(fn(channel, "nowhere"), 1)
    assert channel.ping()  # none of these broke the server


def test_a_call_past_the_deadline_breaks_the_channel_for_good(channel):
    channel.deadline, channel.budget = time.monotonic() + 0.3, 0.3
    with pytest.raises(AssertionError, match="did not return within"):
        Checks().call(fn(channel, "slow"), torch.ones(1))
    assert isinstance(channel.broken, remote.CallTimedOut)
    with pytest.raises(remote.CallTimedOut, match="not called"):
        fn(channel, "rtg")(torch.ones(2), 1.0)


def test_a_kernel_that_dies_mid_call_is_reported_as_dead():
    a, b = socket.socketpair()

    def die():
        wire.recv(b)
        b.close()
    threading.Thread(target=die, daemon=True).start()
    ch = remote.Channel(a)
    ch.deadline = time.monotonic() + 5
    with pytest.raises(remote.KernelDied, match="died while running f"):
        fn(ch, "f")(1)


def _forging_kernel(answers):
    """A 'kernel' that answers every request with the given raw values (as student code could)."""
    a, b = socket.socketpair()

    def run():
        for answer in answers:
            request, _ = wire.recv(b)
            for frame in answer(request):
                wire.send(b, frame, mark_grads=True)
    threading.Thread(target=run, daemon=True).start()
    ch = remote.Channel(a)
    ch.deadline = time.monotonic() + 5
    return ch


@pytest.mark.parametrize("answer, message", [
    (lambda r: [{"id": r["id"] + 1, "ok": True, "value": 1, "changed": {}}], "another request"),
    (lambda r: [{"id": r["id"], "ok": True, "value": torch.tensor(1.0, requires_grad=True), "changed": {}},
                {"grads": [[torch.ones(5)]]}], "wrong shape"),
    (lambda r: [{"id": r["id"], "ok": True, "value": torch.tensor(1.0, requires_grad=True), "changed": {}},
                {"grads": []}], "missing or malformed"),
])
def test_forged_answers_break_the_protocol_and_earn_nothing(answer, message):
    ch = _forging_kernel([answer])
    with pytest.raises(remote.BadAnswer, match=message):
        fn(ch, "loss")(torch.ones(3, requires_grad=True) * 1.0)
    assert ch.broken is not None


def test_a_forged_correct_value_is_just_a_return_value():
    """What the kernel sends is judged like any return value: a forged answer is the student's answer."""
    ch = _forging_kernel([lambda r: [{"id": r["id"], "ok": True, "value": torch.tensor([1.1, 1.0]),
                                      "changed": {}}, {"grads": []}]])
    assert fn(ch, "rtg")(torch.tensor([0.2, 1.0]), 0.9).tolist() == pytest.approx([1.1, 1.0])
