"""The wire carries a closed set of values exactly, and refuses anything malformed with WireError."""
from __future__ import annotations

import json
import math
import socket
import threading

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agent_lab.grading.inkernel import wire


def roundtrip(value, mark_grads=False):
    body, slots = wire.encode(value, mark_grads)
    out, got_slots = wire.decode(body)
    return out, slots, got_slots


@pytest.mark.parametrize("dtype", list(wire.DTYPES.values()))
def test_tensors_of_every_dtype_cross_bit_for_bit(dtype):
    t = (torch.arange(-6, 6).reshape(3, 4) * 7 % 5).to(dtype)
    out, _, _ = roundtrip(t)
    assert out.dtype == dtype and out.shape == (3, 4) and torch.equal(out, t)
    assert out.data_ptr() != t.data_ptr()


def test_special_floats_shapes_and_structures_survive():
    value = {"a": [1, 2.5, None, True, "x"], "t": (torch.tensor(float("nan")), torch.zeros(0, 3)),
             7: torch.float32, "inf": -math.inf, "$": "not a tag"}
    out, _, _ = roundtrip(value)
    assert out["a"] == [1, 2.5, None, True, "x"] and isinstance(out["t"], tuple)
    assert math.isnan(out["t"][0].item()) and out["t"][1].shape == (0, 3)
    assert out[7] is torch.float32 and out["inf"] == -math.inf and out["$"] == "not a tag"


def test_non_contiguous_and_requires_grad_tensors():
    base = torch.arange(12.0).reshape(3, 4)
    out, _, _ = roundtrip(base.t())
    assert torch.equal(out, base.t())
    leaf = torch.ones(2, requires_grad=True)
    out, _, _ = roundtrip([leaf])
    assert out[0].requires_grad and out[0].is_leaf


def test_unsendable_objects_cross_as_their_class_name_only():
    class Secret:
        def __repr__(self):
            return "do not send me"
    out, _, _ = roundtrip([Secret(), torch.zeros(2, dtype=torch.complex64)])
    assert out[0] == wire.Opaque("Secret") and out[1].type_name.startswith("Tensor(")


def test_gradient_slots_mark_only_zero_dim_floating_outputs_that_require_grad():
    x = torch.ones(3, requires_grad=True)
    value = {"loss": x.sum(), "vector": x * 2, "plain": torch.tensor(1.0)}
    _, slots, got = roundtrip(value, mark_grads=True)
    assert len(slots) == 1 and slots[0] is value["loss"]
    assert list(got) == [0] and got[0].shape == ()


def _nested(depth: int) -> list:
    value: list = [1]
    for _ in range(depth):
        value = [value]
    return value


def _frame(header: dict, *buffers: bytes) -> bytes:
    text = json.dumps(header).encode()
    return len(text).to_bytes(4, "big") + text + b"".join(buffers)


@pytest.mark.parametrize("body", [
    b"", b"\x00\x00\x00\x10{}", b"\x00\x00\x00\x02{}",                       # short, header length lies
    _frame({"v": 1}),                                                         # no buffer list
    _frame({"v": 1, "buffers": [4]}),                                         # buffer promised, absent
    _frame({"v": {"$": "tensor", "b": 0, "dtype": "float64", "shape": [3]}, "buffers": [8]}, b"x" * 8),
    _frame({"v": {"$": "tensor", "b": 0, "dtype": "complex128", "shape": [1]}, "buffers": [16]}, b"x" * 16),
    _frame({"v": {"$": "tensor", "b": 0, "dtype": "float32", "shape": [-1]}, "buffers": [0]}),
    _frame({"v": {"$": "tensor", "b": 1, "dtype": "float32", "shape": []}, "buffers": [4]}, b"x" * 4),
    _frame({"v": {"$": "tensor", "b": 0, "dtype": "uint8", "shape": [1] * 9}, "buffers": [1]}, b"x"),
    _frame({"v": {"$": "pickle", "v": "cos\nsystem"}, "buffers": []}),       # unknown tag
    _frame({"v": {"$": "dict", "items": [[[1], 2]]}, "buffers": []}),        # unhashable key
    _frame({"v": {"$": "dtype", "v": "torch.float64; rm"}, "buffers": []}),
    b"\x00\x00\x00\x05" + b"[" * 5,                                           # not JSON
    b"\x00\x01\x86\xa0" + b"[" * 100_000 + b"]" * 100_000,                    # nested 100,000 deep
    _frame({"v": _nested(40), "buffers": []}),                               # deeper than MAX_DEPTH
], ids=lambda b: repr(b[:24]))
def test_malformed_messages_are_refused_with_a_wire_error(body):
    with pytest.raises(wire.WireError):
        wire.decode(body)


def test_a_five_thousand_digit_integer_is_refused():
    text = b'{"v": ' + b"9" * 5000 + b', "buffers": []}'
    with pytest.raises(wire.WireError):
        wire.decode(len(text).to_bytes(4, "big") + text)


def test_too_many_values_and_oversized_frames_are_refused(monkeypatch):
    with pytest.raises(wire.WireError, match="more than"):
        wire.decode(wire.encode(list(range(wire.MAX_NODES + 1)))[0])
    a, b = socket.socketpair()
    with a, b:
        a.sendall((wire.MAX_FRAME + 1).to_bytes(8, "big"))
        with pytest.raises(wire.WireError, match=str(wire.MAX_FRAME)):
            wire.recv(b)


def test_recv_reports_timeouts_and_closed_peers():
    a, b = socket.socketpair()
    import time
    with pytest.raises(TimeoutError):
        wire.recv(b, time.monotonic() + 0.05)
    a.close()
    with pytest.raises(EOFError):
        wire.recv(b, time.monotonic() + 1)
    b.close()


def test_frames_cross_a_socket_in_pieces():
    a, b = socket.socketpair()
    big = torch.randn(300, 300, dtype=torch.float64)
    sender = threading.Thread(target=wire.send, args=(a, {"x": big}))
    sender.start()
    out, _ = wire.recv(b)
    sender.join()
    assert torch.equal(out["x"], big)
    a.close(), b.close()


@st.composite
def layouts(draw) -> torch.Tensor:
    """A view of any layout over a fresh storage: strided, stride 0 (expanded), offset, one-element, 0-dim."""
    dtype = draw(st.sampled_from(list(wire.DTYPES.values())))
    ndim = draw(st.integers(0, 4))
    shape = draw(st.lists(st.integers(0, 4), min_size=ndim, max_size=ndim))
    strides = draw(st.lists(st.integers(0, 6), min_size=ndim, max_size=ndim))
    offset = draw(st.integers(0, 5))
    span = offset + 1 + sum((n - 1) * s for n, s in zip(shape, strides) if n > 0)
    storage = (torch.arange(span) * 37 % 251 - 120).to(dtype)   # distinct, exact in every dtype
    return storage.as_strided(shape, strides, offset)


def _assert_fresh_copy(out: torch.Tensor, t: torch.Tensor) -> None:
    assert out.dtype == t.dtype and out.shape == t.shape and out.is_contiguous()
    assert torch.equal(out, t)


@given(layouts())
@settings(max_examples=300, deadline=None)
@example(torch.stack([torch.tensor([1.5]), torch.tensor([1.5])], -1)[..., 0])  # one element, stride 2
@example(torch.tensor([True]).expand(3, 1).t()[:, 1:2])
def test_every_layout_crosses_as_the_values_it_shows(t):
    out, _, _ = roundtrip(t)
    _assert_fresh_copy(out, t)
    out, _, _ = roundtrip({"changed": [t, t.unsqueeze(0)]})
    _assert_fresh_copy(out["changed"][1], t.unsqueeze(0))


@pytest.mark.parametrize("make", [
    lambda: torch.ones(1, dtype=torch.float64).expand(5, 3),              # expanded: stride 0
    lambda: torch.arange(10, dtype=torch.int64)[3:9:2],                    # offset and step
    lambda: torch.arange(12.0).reshape(3, 4)[1, 2],                        # 0-dim with an offset
    lambda: torch.arange(24, dtype=torch.uint8).reshape(2, 3, 4).permute(2, 0, 1)[1:, :, ::2],
    lambda: torch.tensor([0.25], requires_grad=True).expand(1, 1) * 2,      # one element, grad
])
def test_views_the_assignments_return_cross_exactly(make):
    t = make()
    out, _, _ = roundtrip(t)
    _assert_fresh_copy(out, t.detach())
    assert out.requires_grad == t.requires_grad


def test_a_tensor_too_large_for_one_frame_is_refused_before_it_is_copied():
    huge = torch.zeros(1, dtype=torch.float64).expand(1 << 40)   # 8 TiB if it were copied
    with pytest.raises(wire.WireError, match="at most"):
        wire.encode(huge)
