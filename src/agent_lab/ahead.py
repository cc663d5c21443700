"""A step's inputs prepared on a second thread while the step before it trains (book/part3/02_results.md).

An SFT step builds its batch (tasks, the planner's demonstrations, their replay through the environment) in
Python, then trains on it in torch, whose kernels release the interpreter lock. With ``run.prepare_ahead`` the
trainer asks :class:`Ahead` for step ``k``'s batch, and while step ``k`` trains, a worker thread builds step
``k + 1``'s. The batches are the ones the step would build itself, bit for bit, because each is a function of
its step number alone (every draw is seeded per step, :mod:`agent_lab.streams`) and the worker builds them on
an environment of its own. Sources that play the current policy (DAgger) cannot be prepared ahead: the policy
changes at every step (``preflight`` refuses the combination).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Generic, TypeVar

from agent_lab import timing

__all__ = ["Ahead"]

T = TypeVar("T")


class Ahead(Generic[T]):
    """``take(k)`` returns ``make(k)`` and starts ``make(k + 1)`` on a worker thread when ``k + 1 < end``.

    ``make(k)`` must depend on ``k`` alone, not on anything the caller changes between steps. A step whose
    result was not prepared (the first, or after a jump) is made on the calling thread, as without ``Ahead``.
    An error in the worker is raised by the ``take`` that asks for its step."""

    def __init__(self, make: Callable[[int], T], end: int) -> None:
        self.make, self.end = make, end
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent-lab-ahead")
        self._pending: tuple[int, Future] | None = None

    def _made_off_thread(self, k: int) -> tuple[T, float]:
        t = time.perf_counter()
        out = self.make(k)
        timing.take()  # the worker's spans are no step's: its seconds are returned whole
        return out, time.perf_counter() - t

    def take(self, k: int) -> tuple[T, float]:
        """``(make(k), seconds the worker spent on it)``; 0.0 seconds when it was made on this thread."""
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == k:
            out, seconds = pending[1].result()
        else:
            if pending is not None:
                pending[1].cancel()
            out, seconds = self.make(k), 0.0
        if k + 1 < self.end:
            self._pending = (k + 1, self._pool.submit(self._made_off_thread, k + 1))
        return out, seconds

    def close(self) -> None:
        """Drop the prepared step and let the worker end (a step it is making finishes first)."""
        if self._pending is not None:
            self._pending[1].cancel()
            self._pending = None
        self._pool.shutdown(wait=False)
