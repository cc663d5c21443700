"""Kernel side of the grader's calls: a thread that runs the student's functions on the grader's request.

The kernel launcher (:mod:`agent_lab.grading.inkernel.kernel`) starts it before any student code exists, so
later code that rewires IPython (input transformers, ``do_execute``, display hooks) does not stand between the grader and
the functions. Nothing here is trusted: student code runs in this process and could replace any of it. That is
fine by design, because all it could change is what a call returns, and the grader judges that on its side.

One request, one answer, in order (:mod:`agent_lab.grading.inkernel.wire` frames):

* ``{"op": "call", "id", "name", "args", "kwargs"}`` runs ``name(*args, **kwargs)`` from the notebook's
  namespace. Floating tensors the grader marked ``requires_grad`` arrive as leaves that require grad; for every
  0-dim floating output that requires grad the answer carries its gradient with respect to those leaves (in
  argument order), so the grader can chain it into its own graph. What the call did to its arguments in place
  stays in the kernel: the grader judges what comes back, and could not check a report of in-place writes.
  Answer: ``{"id", "ok": True, "value"}`` followed by a second frame
  ``{"grads": [[gradient or None per leaf] per marked output]}``, or ``{"id", "ok": False, "type", "module",
  "message"}`` (the grader decides itself whether that names one of Python's own exceptions).
* ``{"op": "ping"}`` answers ``{"ok": True}``; ``{"op": "bye"}`` ends the thread.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
from typing import Any, Callable

import torch

from agent_lab.grading.inkernel import wire

MESSAGE_CHARS = 2000
# Bound when the kernel starts, before any student code: a notebook that rebinds torch.autograd.grad (to fake
# some other cell's result, say) does not change the gradients of its honest functions.
_autograd_grad = torch.autograd.grad


def user_namespace() -> dict:
    """The notebook's globals: IPython's ``user_ns`` when a shell runs, else ``__main__``'s."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is not None:
            return shell.user_ns
    except ImportError:
        pass
    return vars(sys.modules["__main__"])


def tensor_arguments(args: list, kwargs: dict) -> list[tuple[Any, torch.Tensor]]:
    """(key, tensor) for every tensor argument: positions are ints, keywords are strs."""
    pairs = [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    return pairs + [(k, v) for k, v in kwargs.items() if isinstance(v, torch.Tensor)]


def _gradients(slots: list[torch.Tensor], leaves: list[torch.Tensor]) -> list[list[torch.Tensor | None]]:
    grads = []
    for out in slots:
        try:
            got = _autograd_grad(out, leaves, allow_unused=True, retain_graph=True) if leaves else ()
            grads.append([None if g is None else g.detach() for g in got])
        except Exception:  # noqa: BLE001 - a broken graph gives no gradient; the grader says so
            grads.append([None] * len(leaves))
    return grads


def _describe(exc: BaseException) -> dict:
    try:
        message = str(exc)[:MESSAGE_CHARS]
    except Exception:  # noqa: BLE001 - an exception whose __str__ raises
        message = ""
    kind = type(exc)
    return {"ok": False, "type": str(kind.__name__)[:80], "module": str(kind.__module__)[:80], "message": message}


def handle_call(request: dict, namespace: Callable[[], dict]) -> tuple[dict, list[torch.Tensor]]:
    """Run one call: (the answer before encoding, the leaves that gradients are taken with respect to)."""
    name, args, kwargs = request.get("name"), list(request.get("args") or []), dict(request.get("kwargs") or {})
    leaves = [t for _, t in tensor_arguments(args, kwargs) if t.requires_grad]
    try:
        fn = namespace().get(name) if isinstance(name, str) else None
        if fn is None:
            raise NameError(f"name {name!r} is not defined in the notebook")
        value = fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt are answers too
        return _describe(exc), []
    return {"ok": True, "value": value}, leaves


def serve(sock: socket.socket, namespace: Callable[[], dict] = user_namespace) -> None:
    """Answer requests on ``sock`` until ``bye`` or until the grader goes away."""
    try:
        while True:
            request, _ = wire.recv(sock)
            op = request.get("op") if isinstance(request, dict) else None
            if op == "bye":
                return
            if op == "ping":
                wire.send(sock, {"ok": True})
                continue
            if op != "call":
                wire.send(sock, {"ok": False, "type": "ProtocolError",
                                 "message": f"unknown op {str(op)[:40]!r}"})
                continue
            answer, leaves = handle_call(request, namespace)
            answer["id"] = request.get("id")
            _send_answer(sock, answer, leaves)
    except (EOFError, OSError, wire.WireError):
        return
    finally:
        sock.close()


def _send_answer(sock: socket.socket, answer: dict, leaves: list[torch.Tensor]) -> None:
    """The answer frame, then (for a success) a second frame with the gradients of its marked outputs.

    Encoding runs student code (tensor subclasses, ``__int__``) and torch on the student's values, so it may
    raise anything: each frame is encoded in full before any byte is sent, and a value that cannot be encoded
    is answered with an error for this call (or gradients the grader reports as missing), never a dead server.
    """
    try:
        body, slots = wire.encode(answer, mark_grads=answer["ok"])
    except BaseException as exc:  # noqa: BLE001 - whatever the student's value raised while being read
        body, slots = wire.encode({"id": answer["id"], "ok": False, "type": "WireError",
                                   "message": "your function returned a value the grader cannot read: "
                                              + _reason(exc)})[0], None
    wire.send_frame(sock, body)
    if slots is None or not answer["ok"]:
        return
    try:
        body, _ = wire.encode({"grads": _gradients(slots, leaves)})
    except BaseException:  # noqa: BLE001 - as above; the grader then names the call's missing gradients
        body, _ = wire.encode({"grads": None})
    wire.send_frame(sock, body)


def _reason(exc: BaseException) -> str:
    try:
        text = str(exc)[:MESSAGE_CHARS // 4]
    except Exception:  # noqa: BLE001 - an exception whose __str__ raises
        text = ""
    return f"{type(exc).__name__[:80]}: {text}".rstrip(": ")


def start(path: str) -> threading.Thread | None:
    """Connect to the grader's socket at ``path``, say hello, and serve calls on a daemon thread."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        wire.send(sock, {"op": "hello"})
    except OSError as exc:
        print(f"agent_lab.grading: could not reach the grader at {path}: {exc}", file=sys.stderr)
        sock.close()
        return None
    # A forked child (a fork bomb in a graded function) must not answer on the grader's socket.
    os.register_at_fork(after_in_child=sock.close)
    thread = threading.Thread(target=serve, args=(sock,), name="agent-lab-grading", daemon=True)
    thread.start()
    return thread
