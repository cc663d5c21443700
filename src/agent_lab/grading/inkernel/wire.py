"""Values across the grader/kernel boundary: a JSON header plus raw tensor bytes, with hard limits. No pickle.

Both ends use this module, but only the grader's end is trusted: everything :func:`decode` reads may have been
written by student code, so it accepts a small, closed set of types and checks every size before it allocates.
A frame holds at most :data:`MAX_FRAME` bytes: :func:`recv` refuses a longer one from its length prefix,
before reading or allocating it, and :func:`encode` measures each tensor before copying it (an expanded view
of a huge shape is refused, not materialised). Any tensor layout is sent as its values in row-major order.

A frame is ``8-byte big-endian length | 4-byte header length | header JSON | buffer 0 | buffer 1 | ...``; the
header is ``{"v": value, "buffers": [len0, len1, ...]}`` and a value is JSON with a few tagged objects:

=========================  =================================================================
Python value               on the wire
=========================  =================================================================
None, bool, int, float,    JSON (NaN and infinities as JSON's ``NaN`` / ``Infinity``)
str, list
dict with str keys         JSON object (a ``"$"`` key is reserved for the tags below)
other dict                 ``{"$": "dict", "items": [[key, value], ...]}``
tuple                      ``{"$": "tuple", "v": [...]}``
torch.Tensor (strided)     ``{"$": "tensor", "b": buffer index, "dtype": name, "shape": [...],
                           "rg": requires_grad, "g": gradient slot (optional)}``
torch.dtype                ``{"$": "dtype", "v": name}``
anything else              ``{"$": "object", "type": class name}``, decoded as :class:`Opaque`
=========================  =================================================================
"""
from __future__ import annotations

import json
import math
import socket
import time
from dataclasses import dataclass
from typing import Any

import torch

MAX_FRAME = 64 << 20     # bytes of one message: far above any tensor an assignment passes
MAX_HEADER = 4 << 20     # bytes of the JSON header
MAX_DEPTH = 32           # nesting of lists, tuples and dicts
MAX_NODES = 200_000      # values in one message
MAX_NDIM = 8
DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64,
    "int8": torch.int8, "int16": torch.int16, "int32": torch.int32, "int64": torch.int64,
    "uint8": torch.uint8, "bool": torch.bool,
}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


class WireError(ValueError):
    """A message that breaks the protocol (malformed, too large, or of a type the wire does not carry)."""


@dataclass(frozen=True)
class Opaque:
    """Stands for a value the sender could not put on the wire; only its class name crosses."""

    type_name: str


# ----------------------------------------------------------------------------------------------- encoding
class _Encoder:
    def __init__(self) -> None:
        self.buffers: list[memoryview] = []
        self.grad_slots: list[torch.Tensor] = []   # 0-dim outputs with a gradient, in slot order

    def value(self, x: Any, depth: int = 0, mark_grads: bool = False) -> Any:
        if depth > MAX_DEPTH:
            raise WireError(f"the value is nested more than {MAX_DEPTH} levels deep")
        if x is None or isinstance(x, (bool, str)):
            return x
        if isinstance(x, int):
            return int(x)
        if isinstance(x, float):
            return float(x)
        if isinstance(x, torch.dtype):
            return {"$": "dtype", "v": DTYPE_NAMES.get(x, str(x))}
        if isinstance(x, torch.Tensor):
            return self.tensor(x, mark_grads)
        if isinstance(x, (list, tuple)):
            items = [self.value(item, depth + 1, mark_grads) for item in x]
            return items if type(x) is list else {"$": "tuple", "v": items}
        if isinstance(x, dict):
            if all(type(k) is str for k in x) and "$" not in x:
                return {k: self.value(v, depth + 1, mark_grads) for k, v in x.items()}
            return {"$": "dict", "items": [[self.value(k, depth + 1), self.value(v, depth + 1, mark_grads)]
                                           for k, v in x.items()]}
        return {"$": "object", "type": type(x).__name__[:80]}

    def tensor(self, t: torch.Tensor, mark_grads: bool) -> dict:
        if t.layout is not torch.strided or t.dtype not in DTYPE_NAMES or t.dim() > MAX_NDIM:
            return {"$": "object", "type": f"Tensor({t.dtype}, {t.layout})"}
        out = {"$": "tensor", "b": len(self.buffers), "dtype": DTYPE_NAMES[t.dtype],
               "shape": list(t.shape), "rg": bool(t.requires_grad)}
        if mark_grads and t.dim() == 0 and t.requires_grad and t.is_floating_point():
            out["g"] = len(self.grad_slots)
            self.grad_slots.append(t)
        self.buffers.append(_tensor_bytes(t))
        return out


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    """The elements of ``t`` in row-major order, whatever its layout (strides, offset, stride 0, 0-dim).

    The size is checked first, so an expanded view of a huge shape is refused before it is materialised. The
    copy goes into a fresh one-dimensional tensor: ``.contiguous()`` alone may keep a one-element tensor's
    stride, and viewing that as bytes fails.
    """
    dtype = torch.uint8 if t.dtype is torch.bool else t.dtype
    size = t.numel() * t.element_size()
    if size > MAX_FRAME:
        raise WireError(f"a tensor of {size} bytes does not fit in one message (at most {MAX_FRAME})")
    flat = torch.empty(t.numel(), dtype=dtype)
    flat.view(t.shape).copy_(t.detach())
    return memoryview(flat.view(torch.uint8).numpy())   # no second copy: encode() joins the frame once


def encode(value: Any, mark_grads: bool = False) -> tuple[bytes, list[torch.Tensor]]:
    """The frame body of ``value`` and, with ``mark_grads``, its 0-dim outputs that carry a gradient slot."""
    enc = _Encoder()
    header = {"v": enc.value(value, mark_grads=mark_grads), "buffers": [len(b) for b in enc.buffers]}
    text = json.dumps(header, allow_nan=True, separators=(",", ":")).encode()
    if len(text) > MAX_HEADER:
        raise WireError(f"the message header has {len(text)} bytes (at most {MAX_HEADER})")
    body = b"".join([len(text).to_bytes(4, "big"), text, *enc.buffers])
    if len(body) > MAX_FRAME:
        raise WireError(f"the message has {len(body)} bytes (at most {MAX_FRAME})")
    return body, enc.grad_slots


# ----------------------------------------------------------------------------------------------- decoding
class _Decoder:
    """Reads what the other end wrote. Its errors name the problem and quote no value from the frame: a frame
    comes from the student's kernel, which could put a hidden test's inputs in any of its numbers or names."""

    def __init__(self, buffers: list[memoryview]) -> None:
        self.buffers = buffers
        self.nodes = 0
        self.grad_slots: dict[int, torch.Tensor] = {}   # slot -> the 0-dim tensor that carries it

    def value(self, x: Any, depth: int = 0) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise WireError(f"the message holds more than {MAX_NODES} values")
        if depth > MAX_DEPTH:
            raise WireError(f"the value is nested more than {MAX_DEPTH} levels deep")
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, list):
            return [self.value(item, depth + 1) for item in x]
        if not isinstance(x, dict):
            raise WireError("a value of a type JSON does not have")
        tag = x.get("$")
        if tag is None:
            return {k: self.value(v, depth + 1) for k, v in x.items()}
        if tag == "tuple":
            return tuple(self.value(item, depth + 1) for item in _field(x, "v", list))
        if tag == "dict":
            items = _field(x, "items", list)
            pairs = [_pair(item) for item in items]
            return {_hashable(self.value(k, depth + 1)): self.value(v, depth + 1) for k, v in pairs}
        if tag == "dtype":
            name = _field(x, "v", str)
            if name not in DTYPES:
                raise WireError("a dtype the wire does not carry")
            return DTYPES[name]
        if tag == "object":
            return Opaque(str(_field(x, "type", str))[:80])
        if tag == "tensor":
            return self.tensor(x)
        raise WireError("an object with an unknown tag")

    def tensor(self, x: dict) -> torch.Tensor:
        name, shape, index = _field(x, "dtype", str), _field(x, "shape", list), _field(x, "b", int)
        if name not in DTYPES:
            raise WireError("a tensor of a dtype the wire does not carry")
        if len(shape) > MAX_NDIM or not all(type(n) is int and 0 <= n < 2**40 for n in shape):
            raise WireError("a tensor shape must be at most 8 non-negative ints")
        if not 0 <= index < len(self.buffers):
            raise WireError("a tensor whose buffer does not exist")
        dtype = DTYPES[name]
        itemsize = torch.empty((), dtype=dtype).element_size()
        numel = math.prod(shape)
        raw = self.buffers[index]
        if numel * itemsize != len(raw):
            raise WireError("a tensor whose buffer does not hold its shape and dtype")
        if numel == 0:
            t = torch.empty(shape, dtype=dtype)
        elif dtype is torch.bool:
            t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).reshape(shape) != 0
        else:
            t = torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape)
        if x.get("rg") is True and t.is_floating_point():
            t.requires_grad_(True)
        slot = x.get("g")
        if slot is not None:
            if type(slot) is not int or slot in self.grad_slots or not 0 <= slot < MAX_NODES:
                raise WireError("bad gradient slot")
            self.grad_slots[slot] = t
        return t


def _field(x: dict, key: str, kind: type) -> Any:
    value = x.get(key)
    if type(value) is not kind:
        raise WireError(f"field {key!r} must be a {kind.__name__}")
    return value


def _pair(item: Any) -> tuple[Any, Any]:
    if not (isinstance(item, list) and len(item) == 2):
        raise WireError("dict items must be [key, value] pairs")
    return item[0], item[1]


def _hashable(key: Any) -> Any:
    if key is None or isinstance(key, (bool, int, float, str)):
        return key
    raise WireError("dict keys must be None, bool, int, float or str")


def decode(body: bytes | bytearray) -> tuple[Any, dict[int, torch.Tensor]]:
    """The value in a frame body and its gradient slots (slot -> 0-dim tensor); :class:`WireError` if bad."""
    view = memoryview(body)
    if len(view) < 4:
        raise WireError("the message is shorter than its header length")
    n = int.from_bytes(view[:4], "big")
    if n > MAX_HEADER or 4 + n > len(view):
        raise WireError("a header length larger than the message")
    try:
        header = json.loads(bytes(view[4:4 + n]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise WireError(f"the header is not valid JSON ({type(exc).__name__})") from None
    if not (isinstance(header, dict) and "v" in header and isinstance(header.get("buffers"), list)):
        raise WireError("the header must be {'v': value, 'buffers': [lengths]}")
    lengths = header["buffers"]
    if not all(type(k) is int and k >= 0 for k in lengths) or 4 + n + sum(lengths) != len(view):
        raise WireError("the buffer lengths do not add up to the message size")
    buffers, offset = [], 4 + n
    for k in lengths:
        buffers.append(view[offset:offset + k])
        offset += k
    dec = _Decoder(buffers)
    try:
        value = dec.value(header["v"])
    except RecursionError:
        raise WireError("the value is nested too deeply") from None
    return value, dec.grad_slots


# ----------------------------------------------------------------------------------------------- framing
def send(sock: socket.socket, value: Any, deadline: float | None = None, mark_grads: bool = False
         ) -> list[torch.Tensor]:
    """Send one frame; return the gradient-slot tensors of ``value`` (see :func:`encode`)."""
    body, slots = encode(value, mark_grads)
    send_frame(sock, body, deadline)
    return slots


def send_frame(sock: socket.socket, body: bytes, deadline: float | None = None) -> None:
    """Send a body that :func:`encode` made (encoding first lets a sender answer otherwise when it fails)."""
    sock.settimeout(_remaining(deadline))
    sock.sendall(len(body).to_bytes(8, "big"))
    sock.settimeout(_remaining(deadline))
    sock.sendall(body)


def recv(sock: socket.socket, deadline: float | None = None) -> tuple[Any, dict[int, torch.Tensor]]:
    """Read one frame (``TimeoutError`` past ``deadline``, ``EOFError`` if the peer closed)."""
    n = int.from_bytes(_read(sock, 8, deadline), "big")
    if n > MAX_FRAME:
        raise WireError(f"a message longer than the limit (at most {MAX_FRAME} bytes)")
    return decode(_read(sock, n, deadline))


def _remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the deadline has passed")
    return left


def _read(sock: socket.socket, n: int, deadline: float | None) -> bytearray:
    """Exactly ``n`` bytes, received into one buffer (a frame is never held twice while it arrives)."""
    out = bytearray(n)
    view, got = memoryview(out), 0
    while got < n:
        sock.settimeout(_remaining(deadline))
        k = sock.recv_into(view[got:], min(n - got, 1 << 20))
        if not k:
            raise EOFError("the other end closed the connection")
        got += k
    return out
