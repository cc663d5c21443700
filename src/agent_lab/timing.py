"""Where a run's time goes: wall-clock seconds per phase, logged with every step (book/part2/08_diagnostics.md).

The loop and its stages mark their work with ``with span("loss"): ...``; :func:`take` returns the seconds
summed per phase since the last call and starts again. Spans nest, and each second counts once, in the
innermost open span: the environment's ``step`` inside a rollout counts as ``environment``, not as
``sampling``. The trainer logs each phase as ``time_<phase>_s`` and what no span covered as ``time_other_s``.

One stopwatch per thread: under ``torchrun`` each worker times its own share, and work a second thread does
for a later step (:mod:`agent_lab.ahead`) never lands in the step the main thread is timing.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict
from collections.abc import Iterator

__all__ = ["PHASES", "span", "take", "Stopwatch"]

#: The phases the trainer marks, in the order a step runs them.
PHASES = ("demonstrations", "environment", "sampling", "advantages", "reference", "loss", "optimizer",
          "evaluation")


class Stopwatch:
    """Exclusive wall-clock seconds per named span: a span's own time, less that of the spans inside it."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self._open: list[list] = []  # per open span: [name, seconds of the spans nested inside it so far]

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        self._open.append([name, 0.0])
        try:
            yield
        finally:
            _, inner = self._open.pop()
            spent = time.perf_counter() - start
            self.totals[name] += spent - inner
            if self._open:
                self._open[-1][1] += spent

    def take(self) -> dict[str, float]:
        """Seconds per phase since the last ``take`` (spans still open count when they close)."""
        out = dict(self.totals)
        self.totals.clear()
        return out


_CLOCKS = threading.local()


def _clock() -> Stopwatch:
    """The calling thread's stopwatch (made on first use)."""
    if not hasattr(_CLOCKS, "watch"):
        _CLOCKS.watch = Stopwatch()
    return _CLOCKS.watch


def span(name: str):
    """``with span("loss"):`` counts the block's exclusive seconds under ``name`` on the calling thread's
    stopwatch."""
    return _clock().span(name)


def take() -> dict[str, float]:
    """The calling thread's seconds per phase since its last call."""
    return _clock().take()
