"""The virtual clock: one event queue, time moves only from event to event.

Unlike ``minibroker.cluster.scheduler.ManualScheduler`` (which tests advance by hand), a
callback may itself wait (``wait_until``) for a condition: the loop runs the events after it
until the condition holds, as a blocking call in a real thread lets the others run. Time
never goes back: a nested wait only moves it forward.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from undertow.platform.errors import PlatformError


class SimTimer:
    """A scheduled callback; ``cancel`` keeps it from running."""

    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class SimLoop:
    """The virtual clock, in milliseconds from 0, and its event queue (FIFO among equals)."""

    def __init__(self) -> None:
        self._now = 0.0
        self._queue: list[tuple[float, int, SimTimer, Callable[[], None]]] = []
        self._seq = itertools.count()

    def now_ms(self) -> float:
        return self._now

    def call_later(self, delay_ms: float, callback: Callable[[], None]) -> SimTimer:
        timer = SimTimer()
        heapq.heappush(self._queue, (self._now + max(delay_ms, 0.0), next(self._seq), timer,
                                     callback))
        return timer

    def _step(self) -> bool:
        """Run the next event; False when none is left."""
        while self._queue:
            due, _, timer, callback = heapq.heappop(self._queue)
            if timer.cancelled:
                continue
            self._now = max(self._now, due)
            callback()
            return True
        return False

    def run_until(self, t_ms: float) -> None:
        """Run every event due by ``t_ms``; the clock then reads ``t_ms`` (or later, when a
        nested wait went past it)."""
        while self._queue and self._queue[0][0] <= t_ms:
            self._step()
        self._now = max(self._now, t_ms)

    def run_while_not(self, condition: Callable[[], bool], timeout_ms: float) -> bool:
        """Run events until ``condition()`` holds (True) or ``timeout_ms`` of virtual time
        have passed (False)."""
        deadline = self._now + timeout_ms
        alarm = self.call_later(timeout_ms, lambda: None)  # the clock reaches the deadline
        try:
            while not condition():
                if self._now >= deadline or not self._step():
                    return False
            return True
        finally:
            alarm.cancel()

    def wait_until(self, condition: Callable[[], bool], timeout_ms: float, what: str) -> None:
        """``run_while_not``, with a ``PlatformError`` naming ``what`` on the timeout."""
        if not self.run_while_not(condition, timeout_ms):
            raise PlatformError(
                f"timed out after {timeout_ms / 1000:g}s (virtual) waiting for {what}")


class LoopScheduler:
    """`undertow.runner.scheduler.Scheduler` on the virtual clock: the runner's callbacks
    (the nemesis's) run on the loop, in virtual time, in the order the seed gives."""

    def __init__(self, loop: SimLoop) -> None:
        self._loop = loop
        self._timers: list[SimTimer] = []
        self._closed = False

    def monotonic(self) -> float:
        return self._loop.now_ms() / 1000

    def call_later(self, delay_s: float, callback: Callable[[], None], name: str) -> None:
        del name  # one thread: nothing to name
        if not self._closed:
            self._timers = [t for t in self._timers if not t.cancelled]
            self._timers.append(self._loop.call_later(delay_s * 1000, callback))

    def shutdown(self, timeout_s: float) -> None:
        """Nothing runs beside the caller: drop what is not yet due."""
        del timeout_s
        self._closed = True
        for timer in self._timers:
            timer.cancel()
