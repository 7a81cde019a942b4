"""A `Scheduler` (``minibroker.cluster.scheduler``) whose time moves only when a test says:
the step-by-step cluster (``stepper.py``) and the group coordinator's harness run the
broker's core on it, so that every timer fires exactly where a test puts it."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from minibroker.cluster.scheduler import Timer


class _ManualTimer:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualScheduler:
    """Time moves only when ``advance`` is called; due timers fire in order."""

    def __init__(self, start_ms: float = 0.0) -> None:
        self._now = start_ms
        self._queue: list[tuple[float, int, _ManualTimer, Callable[[], None]]] = []
        self._seq = itertools.count()

    def now_ms(self) -> float:
        return self._now

    def call_later(self, delay_ms: float, callback: Callable[[], None]) -> Timer:
        timer = _ManualTimer()
        heapq.heappush(self._queue, (self._now + max(delay_ms, 0.0), next(self._seq), timer,
                                     callback))
        return timer

    def advance(self, ms: float) -> None:
        deadline = self._now + ms
        while self._queue and self._queue[0][0] <= deadline:
            due, _, timer, callback = heapq.heappop(self._queue)
            self._now = max(self._now, due)
            if not timer.cancelled:
                callback()
        self._now = deadline
