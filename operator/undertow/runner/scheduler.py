"""When the runner's background work runs: the one thing about time the nemesis (and what
follows it onto this interface) needs, so that the same code runs against real processes and
in deterministic simulation.

The runner's background work is callbacks: "inject fault 2 at 12 s", "check again in 50 ms
whether fault 1's targets are back in the ISR". A `Scheduler` runs a callback after a delay:
on real platforms each on a thread of its own when its time comes (`ThreadScheduler`: a slow
injection, a broker's restart, delays no other fault, as when every fault had a thread), in
simulation on the virtual loop (`undertow.sim.simulated_world.VirtualScheduler`), where the
same callbacks run in virtual time, one after the other, and the same seed gives the same
order. This is
TigerBeetle's and FoundationDB's split: the logic above the interface is shared, the clock
below it is swapped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol


class Scheduler(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for deadlines)."""

    def call_later(self, delay_s: float, callback: Callable[[], None], name: str) -> None:
        """Run `callback` once, `delay_s` seconds from now (`name`: what it is, for a
        thread's name or a log)."""

    def shutdown(self, timeout_s: float) -> None:
        """Run nothing more: drop the callbacks not yet due, and wait up to `timeout_s` for
        those running."""


class ThreadScheduler:
    """Each callback on a daemon thread of its own (`threading.Timer`) when its time comes:
    an exception in it reaches `threading.excepthook`, which the runner's `Abort` catches."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._timers: set[threading.Timer] = set()
        self._closed = False

    def monotonic(self) -> float:
        return time.monotonic()

    def call_later(self, delay_s: float, callback: Callable[[], None], name: str) -> None:
        def run() -> None:
            try:
                callback()
            finally:
                with self._lock:
                    self._timers.discard(timer)

        timer = threading.Timer(max(delay_s, 0.0), run)
        timer.daemon, timer.name = True, name
        with self._lock:  # started inside, or a shutdown meanwhile would join it unstarted
            if self._closed:
                return
            self._timers.add(timer)
            timer.start()

    def shutdown(self, timeout_s: float) -> None:
        with self._lock:
            self._closed = True
            timers = list(self._timers)
        for timer in timers:
            timer.cancel()  # a callback not yet due never runs; one running finishes
        deadline = time.monotonic() + timeout_s
        for timer in timers:
            if timer is not threading.current_thread():
                timer.join(max(0.0, deadline - time.monotonic()))
