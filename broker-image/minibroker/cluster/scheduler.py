"""The clock and timers the core runs on: asyncio's in a broker, a manual one in tests.

Keeping time behind this interface lets the deterministic in-process cluster
(``minibroker.sim``) replay the seeds' walkthroughs step by step with exact values.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Scheduler(Protocol):
    def now_ms(self) -> float: ...

    def call_later(self, delay_ms: float, callback: Callable[[], None]) -> Timer: ...


class AsyncioScheduler:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def now_ms(self) -> float:
        return self._loop.time() * 1000.0

    def call_later(self, delay_ms: float, callback: Callable[[], None]) -> Timer:
        return self._loop.call_later(max(delay_ms, 0.0) / 1000.0, callback)


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
