"""Grader side of the calls into a student's kernel: proxies, failures with the grader's words, gradients.

A :class:`StudentFunction` looks like the student's function to the test code: called with tensors and numbers,
it sends them to the kernel's call server (:mod:`agent_lab.grading.inkernel.server`) and returns what came
back, decoded by :mod:`agent_lab.grading.inkernel.wire` into fresh grader-side objects. When a tensor argument
requires grad and the function returns a 0-dim floating tensor, the kernel also returns that output's gradient with respect to the
argument, and the proxy chains it into the grader's graph through :class:`RemoteGradient` (a custom autograd
function): ``loss.backward()`` on the grader's side then moves the grader's parameters by exactly the gradient
the student's code computes, while the loss itself is never anything but numbers.

The gradient is part of the answer, as the value is, and the kernel could send any gradient: a test that awards
points for it compares it with the grader's own (``Checks.gradient`` then ``check_close``). The grader's
arguments are never changed by a call: what the function writes into them in place stays in the kernel.
"""
from __future__ import annotations

import select
import socket
import time
from typing import Any, Callable

import torch

from agent_lab.grading.inkernel import wire
from agent_lab.grading.inkernel.checks import GraderMessage, is_builtin_exception
from agent_lab.grading.inkernel.server import tensor_arguments


class CallFailed(GraderMessage):
    """The call did not produce an answer; the kernel must be replaced before the next test."""


class KernelDied(CallFailed):
    pass


class CallTimedOut(CallFailed):
    pass


class BadAnswer(CallFailed):
    pass


class RemoteError(Exception):
    """The student's function raised: ``remote_type`` and ``remote_message`` are what the kernel said about the
    exception; ``remote_builtin`` is the grader's own verdict on that name (see
    :func:`~agent_lab.grading.inkernel.checks.is_builtin_exception`), never the kernel's."""

    def __init__(self, kind: str, message: str, module: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.remote_type, self.remote_message = kind, message
        self.remote_builtin = is_builtin_exception(kind, module)


class RemoteGradient(torch.autograd.Function):
    """``value`` in the forward pass; in the backward pass ``grad_out * g_i`` for each leaf ``i``.

    ``grads[i]`` is d value / d leaf_i as computed in the student's kernel (``None``: no dependence).
    """

    @staticmethod
    def forward(ctx, value: torch.Tensor, grads: list, *leaves: torch.Tensor) -> torch.Tensor:  # noqa: D102
        ctx.grads = grads
        ctx.dtypes = [leaf.dtype for leaf in leaves]
        return value.clone()

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # noqa: D102
        return (None, None, *[None if g is None else (g * grad_out.to(g.dtype)).to(dtype)
                              for g, dtype in zip(ctx.grads, ctx.dtypes)])


def _substitute(value: Any, swap: dict[int, torch.Tensor]) -> Any:
    """``value`` with the tensors whose id is in ``swap`` replaced."""
    if isinstance(value, torch.Tensor):
        return swap.get(id(value), value)
    if isinstance(value, list):
        return [_substitute(v, swap) for v in value]
    if isinstance(value, tuple):
        return tuple(_substitute(v, swap) for v in value)
    if isinstance(value, dict):
        return {k: _substitute(v, swap) for k, v in value.items()}
    return value


class Channel:
    """One connection to one kernel's call server; unusable (``broken``) once a call failed to answer."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.broken: CallFailed | None = None
        self.deadline: float | None = None  # set per test by the runner
        self.budget = 0.0                   # that test's seconds, for the messages
        self._next_id = 0

    @staticmethod
    def listen(path: str) -> socket.socket:
        """A listening socket at ``path`` that the kernel (another uid in the sandbox) may connect to."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)
        return listener

    @classmethod
    def accept(cls, listener: socket.socket, timeout: float) -> "Channel":
        """Wait for the kernel's hello; ``KernelDied`` if it does not come within ``timeout`` seconds."""
        listener.settimeout(timeout)
        try:
            sock, _ = listener.accept()
            hello, _ = wire.recv(sock, time.monotonic() + timeout)
        except (OSError, EOFError, wire.WireError) as exc:
            raise KernelDied(f"the kernel's call server did not start ({type(exc).__name__})") from None
        if not (isinstance(hello, dict) and hello.get("op") == "hello"):
            sock.close()
            raise KernelDied("the kernel's call server did not say hello")
        return cls(sock)

    def ping(self, timeout: float = 10.0) -> bool:
        """True when the call server still answers."""
        try:
            wire.send(self.sock, {"op": "ping"}, time.monotonic() + timeout)
            answer, _ = wire.recv(self.sock, time.monotonic() + timeout)
        except (OSError, EOFError, TimeoutError, wire.WireError):
            return False
        return isinstance(answer, dict) and answer.get("ok") is True

    def has_stray_data(self) -> bool:
        """Bytes nobody asked for are waiting (a process the kernel forked answered too): do not trust it."""
        ready, _, _ = select.select([self.sock], [], [], 0)
        return bool(ready)

    def close(self) -> None:
        try:
            wire.send(self.sock, {"op": "bye"}, time.monotonic() + 1.0)
        except (OSError, TimeoutError, wire.WireError):
            pass
        self.sock.close()

    def call(self, name: str, args: tuple, kwargs: dict) -> Any:
        """Run ``name(*args, **kwargs)`` in the kernel and return its decoded value (see the module doc)."""
        if self.broken is not None:
            raise type(self.broken)(f"not called: {self.broken}")
        self._next_id += 1
        request = {"op": "call", "id": self._next_id, "name": name, "args": list(args), "kwargs": kwargs}
        try:
            wire.send(self.sock, request, self.deadline)
            answer, slots = wire.recv(self.sock, self.deadline)
            if not (isinstance(answer, dict) and answer.get("id") == self._next_id):
                raise wire.WireError("an answer to another request")
            if answer.get("ok") is not True:
                raise RemoteError(str(answer.get("type"))[:80], str(answer.get("message", ""))[:2000],
                                  str(answer.get("module", ""))[:80])
            grads, _ = wire.recv(self.sock, self.deadline)
            leaves = [t for _, t in tensor_arguments(list(args), kwargs) if t.requires_grad]
            return _chain(answer.get("value"), slots, grads, leaves, name)
        except TimeoutError:
            self.broken = CallTimedOut(f"{name} did not return within the test's {self.budget:g} s (an endless "
                                       "loop, or far too slow); the kernel is restarted for the next test")
        except (EOFError, OSError):
            self.broken = KernelDied(f"the kernel died while running {name} (os._exit, a crash, or the memory, "
                                     "CPU-time or process limit); the kernel is restarted for the next test")
        except wire.WireError as exc:
            self.broken = BadAnswer(f"the kernel's answer to {name} broke the protocol ({exc})")
        except BadAnswer as exc:
            self.broken = exc
        raise self.broken


def _chain(value: Any, slots: dict[int, torch.Tensor], grads: Any, leaves: list[torch.Tensor],
           name: str) -> Any:
    """Replace each gradient-carrying output by a :class:`RemoteGradient` node over the grader's leaves."""
    if not slots:
        return value
    rows = grads.get("grads") if isinstance(grads, dict) else None
    if not (isinstance(rows, list) and len(rows) == len(slots)):
        raise BadAnswer(f"the kernel's gradients for {name} are missing or malformed")
    swap = {}
    for slot, out in slots.items():
        row = rows[slot] if 0 <= slot < len(rows) else None
        if not (isinstance(row, list) and len(row) == len(leaves)):
            raise BadAnswer(f"the kernel's gradients for {name} do not match its arguments")
        for g, leaf in zip(row, leaves):
            if g is not None and not (isinstance(g, torch.Tensor) and g.shape == leaf.shape
                                      and g.is_floating_point()):
                raise BadAnswer(f"the kernel returned a gradient of the wrong shape for {name}")
        swap[id(out)] = RemoteGradient.apply(out.detach(), row, *leaves)
    return _substitute(value, swap)


class StudentFunction:
    """Stands in for the student's function ``name``; ``channel()`` gives the live connection."""

    def __init__(self, name: str, channel: Callable[[], Channel]) -> None:
        self.__name__ = name
        self._channel = channel

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._channel().call(self.__name__, args, kwargs)

    def __repr__(self) -> str:
        return f"<the student's {self.__name__}>"
