"""The clock and timers the core runs on: asyncio's in a broker, a manual one in tests
(``tests/minibroker/manual_scheduler.py``).

Keeping time behind this interface lets the tests' deterministic in-process cluster
(``tests/minibroker/stepper.py``) replay the seeds' walkthroughs step by step with exact
values.
"""

from __future__ import annotations

import asyncio
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
