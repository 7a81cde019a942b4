"""Failpoints the harness drives through the broker's control endpoint.

A disk stall blocks every append and follower write until it is cleared or its time limit
passes (so a stall can never outlive a crashed runner). A power loss throws away every byte
this process wrote but did not fsync, then exits at once, like the machine losing power
(what LazyFS's clear-cache does); checkpoint files, written with fsync, survive. A full
disk fails every log append, fsync and checkpoint write with ENOSPC until it is cleared or
its time limit passes; the first failure takes the log directory offline and halts the
broker, as Kafka does (``cluster/log_dir_failure.py``).
"""

from __future__ import annotations

import asyncio
import logging

from minibroker import environment
from minibroker.storage.durability import DurabilityTracker

log = logging.getLogger("minibroker.failpoints")

POWER_LOSS_EXIT_CODE = 137
MAX_STALL_MS = 10 * 60 * 1000


class DiskStall:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._clear = asyncio.Event()
        self._clear.set()
        self._timer: asyncio.TimerHandle | None = None
        self.until: float | None = None

    @property
    def stalled(self) -> bool:
        return not self._clear.is_set()

    def stall(self, duration_ms: int) -> None:
        """Block writes for ``duration_ms`` (bounded, so the stall always heals itself)."""
        if not 0 < duration_ms <= MAX_STALL_MS:
            raise ValueError(f"duration_ms must be in (0, {MAX_STALL_MS}], got {duration_ms}")
        if self._timer is not None:
            self._timer.cancel()
        self._clear.clear()
        self.until = self._loop.time() + duration_ms / 1000
        self._timer = self._loop.call_later(duration_ms / 1000, self.clear)
        log.warning("Disk stall injected for %d ms", duration_ms)

    def clear(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.stalled:
            log.warning("Disk stall cleared")
        self.until = None
        self._clear.set()

    async def wait(self) -> None:
        if self.stalled:
            await self._clear.wait()


class DiskFull:
    """The broker's disk has no free blocks for ``duration_ms`` (bounded, as a stall)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, durability: DurabilityTracker) -> None:
        self._loop = loop
        self._durability = durability
        self._timer: asyncio.TimerHandle | None = None

    def fill(self, duration_ms: int) -> None:
        if not 0 < duration_ms <= MAX_STALL_MS:
            raise ValueError(f"duration_ms must be in (0, {MAX_STALL_MS}], got {duration_ms}")
        if self._timer is not None:
            self._timer.cancel()
        self._durability.out_of_space = True
        self._timer = self._loop.call_later(duration_ms / 1000, self.clear)
        log.warning("Disk full injected for %d ms", duration_ms)

    def clear(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._durability.out_of_space:
            log.warning("Disk full cleared")
        self._durability.out_of_space = False


def power_loss(durability: DurabilityTracker) -> None:
    """Drop unsynced writes and die now; never returns."""
    log.warning("Power loss: dropping unsynced writes and exiting")
    durability.simulate_power_loss()
    environment.halt(POWER_LOSS_EXIT_CODE)
