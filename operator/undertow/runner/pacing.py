"""The workload producers' rate: one record every ``1/rate`` seconds, waited out in the
client's ``poll`` (which serves delivery reports meanwhile, and returns early when it
served one). A producer that fell more than a second behind (its queue was full) does not
burst to catch up."""

from __future__ import annotations

import time
from collections.abc import Callable

BEHIND_S = 1.0


class Pacer:
    def __init__(self, rate: float) -> None:
        """``rate``: records a second; 0 sends as fast as the client takes them."""
        self._interval = 1.0 / rate if rate > 0 else 0.0
        self._next = time.monotonic()

    def wait(self, poll: Callable[[float], object], stopping: Callable[[], bool]) -> None:
        """After a send: poll until the next one is due, or ``stopping``."""
        self._next += self._interval
        while (delay := self._next - time.monotonic()) > 0 and not stopping():
            poll(delay)
        if delay < -BEHIND_S:
            self._next = time.monotonic()

    def resume(self) -> None:
        """After a pause that was not sending (a transaction's end): the next record is due
        now at the earliest, not a burst making up for the pause."""
        self._next = max(self._next, time.monotonic())
