"""The helpers an assignment's test cells use: ``_check = Checks()`` in the notebook's setup cell.

The same test code runs in two places. In a student's notebook the functions under test are ordinary Python
functions and the checks help the student find the bug. In the grader the test cells run in the grader's own
process, the functions are proxies for the student's kernel (:mod:`agent_lab.grading.remote`), and the
checks decide the grade; nothing in the student's process can reach them there.

A test cell passes when it raises nothing. Failures are ``AssertionError`` with a message for the student.
With ``hidden=True`` (the grader's setting for hidden tests) a message names the case and the property that
failed but repeats nothing that came from the student's process: no returned value, shape or type, and no
text of a raised exception, since a student's function could have put the hidden inputs there.
"""
from __future__ import annotations

import builtins
import hashlib
import hmac
import os
import random
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from agent_lab.grading.inkernel.wire import Opaque


#: Elements a check turns into Python numbers at most: far above any tensor a test compares value by value.
MAX_VALUES = 1 << 20


class GraderMessage(Exception):
    """An error whose message the grader composed (a dead kernel, a timeout): shown as it is."""


class Rng:
    """Seeded pure-Python random numbers for hidden test cases (the same on every machine)."""

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)

    def uniform(self, low: float, high: float) -> float:
        return low + (high - low) * self._random.random()

    def randint(self, low: int, high: int) -> int:
        return min(high, low + int(self._random.random() * (high - low + 1)))

    def choice(self, options: list) -> Any:
        return options[self.randint(0, len(options) - 1)]


# The exception classes Python itself defines, listed when this module is imported: in the grader that is before
# any student code exists, so a class the kernel registers in ``builtins`` later is not among them.
BUILTIN_EXCEPTIONS = frozenset(name for name, value in vars(builtins).items()
                               if isinstance(value, type) and issubclass(value, BaseException))


def is_builtin_exception(name: str, module: str) -> bool:
    """Whether a class called ``name`` in ``module`` is one of Python's own exceptions, decided by the grader.

    The name and module of a remote exception are whatever the kernel reported; the answer is still one of a
    fixed set of names, so a class named after a hidden input never counts as builtin."""
    return module == "builtins" and name in BUILTIN_EXCEPTIONS


def _exception_facts(exc: BaseException) -> tuple[str, str, bool]:
    """(class name, message, is a builtin exception) of a local or a remote (proxied) exception."""
    if hasattr(exc, "remote_type"):
        return exc.remote_type, exc.remote_message, exc.remote_builtin
    kind = type(exc)
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - an exception whose __str__ raises
        message = ""
    return kind.__name__, message, is_builtin_exception(kind.__name__, kind.__module__)


def flat(nested: Any) -> list:
    """A nested list flattened, in row-major order."""
    if isinstance(nested, list):
        return [x for item in nested for x in flat(item)]
    return [nested]


def _pieces(nested: Any) -> Iterator[str]:
    """The text of a (nested) list, piece by piece, so that a caller can stop early."""
    if isinstance(nested, list):
        yield "["
        for i, item in enumerate(nested):
            if i:
                yield ", "
            yield from _pieces(item)
        yield "]"
    else:
        yield repr(round(nested, 6)) if type(nested) is float else repr(nested)


def show(nested: Any, limit: int = 240) -> str:
    """Short text of a (nested) list of floats, cut after ``limit`` characters.

    Only the pieces up to the cut are formatted: the list may hold as many values as a student returned.
    """
    pieces, size = [], 0
    for piece in _pieces(nested):
        pieces.append(piece)
        size += len(piece)
        if size > limit:
            break
    text = "".join(pieces)
    return text if len(text) <= limit else text[:limit] + " ...]"


def first_mismatch(got: list, want: list, rtol: float, atol: float) -> int:
    """Index of the first entry with ``|got - want| > atol + rtol |want|`` (NaN never matches), else -1."""
    if len(got) != len(want):
        return 0
    for i, (g, w) in enumerate(zip(got, want)):
        g = float(g) if type(g) in (int, bool) else g  # integer and boolean tensors compare as numbers
        if type(g) is not float or not abs(g - w) <= atol + rtol * abs(w):
            return i
    return -1


class Checks:
    """Test-cell helpers; ``hidden=True`` keeps student-produced data out of the messages.

    ``files`` maps the names of the files handed in next to the notebook to their paths (default: the working
    directory's files, as in a student's own notebook); ``cache`` is shared by all test cells of one submission
    (an evaluation several tests read, say); :meth:`record` collects rows for tables such as a leaderboard.
    ``secret`` is the course's secret that the grader mixes into every hidden test's seed (see :meth:`Rng`).
    """

    tensor = staticmethod(torch.tensor)

    def __init__(self, hidden: bool = False, files: dict[str, Path] | None = None,
                 cache: dict | None = None, secret: bytes = b"") -> None:
        self.hidden = hidden
        self.secret = bytes(secret)
        self.notes: list[str] = []
        self.records: list[tuple[str, dict]] = []
        self.files = files
        self.cache = {} if cache is None else cache

    def Rng(self, seed: int) -> Rng:  # noqa: N802 - the name the test cells use, as for a class
        """Random numbers for a hidden test: from ``seed`` alone, or, with a course secret (the grader's case),
        from ``seed`` mixed with it, so that the seeds written in the notebook do not give the inputs away."""
        if not self.secret:
            return Rng(seed)
        digest = hmac.new(self.secret, str(int(seed)).encode(), hashlib.sha256).digest()
        return Rng(int.from_bytes(digest[:8], "big"))

    def secret_seed(self, seed: int) -> int:
        """``seed`` itself in a notebook; in the grader a seed drawn from it and the course's secret, larger than
        ``seed`` by a whole number of millions (a base for private worlds that must stay above the public ones)."""
        return seed if not self.secret else seed + self.Rng(seed).randint(1, 10**6) * 10**6

    def note(self, text: str) -> None:
        """Add a line to this test's feedback (shown with its result)."""
        self.notes.append(str(text))

    def record(self, table: str, row: dict) -> None:
        """A row for the instructors' table ``table`` (``leaderboard`` becomes ``leaderboard.csv``)."""
        self.records.append((str(table), dict(row)))

    def submitted_file(self, name: str) -> Path:
        """The file ``name`` handed in next to the notebook, or a failure that says it is missing."""
        files = self.files if self.files is not None else {
            f: Path(f) for f in os.listdir(".") if os.path.isfile(f) and not os.path.islink(f)}
        if name not in files:
            raise AssertionError(f"no file named {name!r} next to the notebook: save it there (the notebook's "
                                 "training cell does) and hand it in with the notebook")
        return Path(files[name])

    def call(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``; any exception it raises becomes a failure that says what happened."""
        name = getattr(fn, "__name__", "the function")
        try:
            return fn(*args, **kwargs)
        except GraderMessage as exc:
            raise AssertionError(f"{name}: {exc}") from None
        except BaseException as exc:  # noqa: BLE001 - every way a student's function can fail is a failure
            kind, message, builtin = _exception_facts(exc)
        if kind == "NotImplementedError":
            raise AssertionError(f"{name} is not implemented yet: replace `raise NotImplementedError()`")
        if self.hidden:
            shown = kind if builtin else "an exception of a class your code defined"
            raise AssertionError(f"{name} raised {shown}")
        raise AssertionError(f"{name} raised {kind}: {message}".rstrip(": "))

    def shape_and_dtype(self, x: Any, what: str) -> tuple[tuple[int, ...], torch.dtype]:
        """(shape, dtype) of a tensor, else a failure naming what came back; nothing is converted."""
        if type(x) is not torch.Tensor:
            kind = x.type_name if isinstance(x, Opaque) else type(x).__name__  # Opaque: not sendable
            got = "another kind of object" if self.hidden else f"an object of type {kind}"
            raise AssertionError(f"{what} must return a torch.Tensor, got {got}")
        return tuple(int(n) for n in x.shape), x.dtype

    def values(self, x: Any, what: str) -> tuple[tuple[int, ...], torch.dtype, list]:
        """(shape, dtype, nested list of Python floats) of a tensor, else a failure naming what came back.

        A tensor of more than :data:`MAX_VALUES` elements is a failure before any conversion: the grader's
        process would otherwise hold as many Python numbers as the student's function chose to return.
        """
        shape, dtype = self.shape_and_dtype(x, what)
        if x.numel() > MAX_VALUES:
            got = "" if self.hidden else f" (shape {shape}, {x.numel()} values)"
            raise AssertionError(f"{what} returned far more values than the test expects{got}: check the "
                                 "shape of what it returns")
        return shape, dtype, x.detach().tolist()

    def check_tensor(self, x: Any, what: str, shape: tuple, dtype: torch.dtype) -> None:
        got_shape, got_dtype = self.shape_and_dtype(x, what)
        if got_shape != tuple(shape):
            got = "" if self.hidden else f", got {got_shape}"
            raise AssertionError(f"{what} should have shape {tuple(shape)}{got}")
        if got_dtype != dtype:
            got = "" if self.hidden else f", got {got_dtype}"
            raise AssertionError(f"{what} should keep the input dtype {dtype}{got}")

    def check_close(self, x: Any, want: Any, what: str, hint: str = "", rtol: float = 1e-6,
                    atol: float = 1e-8, mistakes: dict[str, Any] | None = None) -> None:
        """Compare a tensor (or a list of floats) with expected floats in plain float arithmetic.

        ``mistakes`` maps a description of a likely wrong formula to the values it would give: when the
        result matches one, the message names that mistake instead of the generic ``hint``.
        """
        got = self.values(x, what)[2] if not isinstance(x, list) else x
        flat_got, flat_want = flat(got), [float(w) for w in flat(want)]
        bad = first_mismatch(flat_got, flat_want, rtol, atol)
        if bad < 0:
            return
        if self.hidden:
            raise AssertionError(f"{what}: wrong values. {hint}".strip())
        for mistake, values in (mistakes or {}).items():  # loosely: an eps in a denominator still matches
            if first_mismatch(flat_got, [float(v) for v in flat(values)], max(rtol, 1e-4), max(atol, 1e-6)) < 0:
                hint = f"This is what you get when {mistake}."
                break
        first = ""
        if len(flat_got) == len(flat_want) > 1:
            first = (f" (first difference at flat index {bad}: expected {show(flat_want[bad])}, "
                     f"got {show(flat_got[bad])})")
        raise AssertionError(f"{what}: expected {show(want)}, got {show(got)}{first}. {hint}".strip())

    def check_scalar_loss(self, loss: Any, what: str, dtype: torch.dtype) -> None:
        """A 0-dim tensor of ``dtype`` that requires grad, or a failure that says what is missing.

        In the grader ``requires_grad`` is the kernel's word, so it can only fail this check: a test that gives
        points for a loss also compares :meth:`gradient` with the gradient it computes itself."""
        got_shape, got_dtype = self.shape_and_dtype(loss, what)
        if got_shape != ():
            got = "" if self.hidden else f", got shape {got_shape}"
            raise AssertionError(f"{what} should return a scalar (0-dimensional) tensor{got}")
        if got_dtype != dtype:
            got = "" if self.hidden else f", got {got_dtype}"
            raise AssertionError(f"{what} should keep the input dtype {dtype}{got}")
        if not loss.requires_grad:
            raise AssertionError(
                f"{what} is not differentiable with respect to logprobs: build it with torch operations on "
                "logprobs (no .item(), .detach(), .tolist() or torch.tensor(...) on the result)")

    def gradient(self, loss: torch.Tensor, wrt: torch.Tensor, what: str) -> torch.Tensor:
        """d loss / d wrt, or a failure when the loss does not depend on ``wrt``."""
        try:
            (grad,) = torch.autograd.grad(loss, [wrt], allow_unused=True)
        except RuntimeError as exc:
            detail = "" if self.hidden else f": {exc}"
            raise AssertionError(f"could not differentiate {what}{detail}") from None
        if grad is None:
            raise AssertionError(f"{what} does not depend on logprobs")
        return grad
