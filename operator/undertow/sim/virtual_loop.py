"""An asyncio event loop whose clock is virtual: the broker's own asyncio code, in simulation.

The simulation is worth what its fidelity is worth, so it should run the broker's own
coroutines (the Kafka listener, the fetcher, the controller's RPC server) with only the
clock, the network, the disk and the randomness swapped, as FoundationDB's and TigerBeetle's
simulators run their production code. This loop swaps the clock: ``loop.time()`` reads a
virtual clock, and where a real loop would block in ``select`` until its next timer is due,
this one moves the clock to that timer at once. ``asyncio.sleep``, ``asyncio.wait_for``,
``call_later`` and every timeout built on them then run unchanged, in virtual time, and as
fast as the code computes.

Nothing real is polled: sockets have no place in it (the network is in memory,
``virtual_streams.VirtualNetwork``), and ``run_in_executor`` runs its function at once on
the loop's thread, so that no thread's timing enters the run. Given the same code and seed,
the callbacks run in the same order, and the run is the same, every time.

The same idea as the ``looptime`` pytest plugin (by kopf's author), which fakes the clock of
asyncio's own loop; here the loop is built for it, so nothing real can wake it either.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
from collections.abc import Callable
from typing import Any


class SimulationStalled(RuntimeError):
    """Every task waits, and on nothing that can come: no callback is ready and no timer
    is set. A real loop would block for ever here; a simulation says so instead."""


class _VirtualSelector:
    """What ``BaseEventLoop._run_once`` calls ``select`` on: moves the clock instead of
    waiting."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._loop = loop

    def select(self, timeout: float | None) -> list[Any]:
        if timeout is None:
            raise SimulationStalled(
                f"at t={self._loop.time():.6f} s (virtual) no callback is ready and no timer "
                f"is set: every task waits on something that never comes")
        if timeout > 0:
            self._loop.advance_to(self._loop.time() + timeout)
        return []

    def close(self) -> None:
        """Nothing to release."""


class VirtualTimeLoop(asyncio.BaseEventLoop):
    """An event loop on a virtual clock, in seconds from ``start``."""

    def __init__(self, start: float = 0.0) -> None:
        super().__init__()
        self._now = float(start)
        self._selector = _VirtualSelector(self)
        # Timers due within this of the clock run in the same iteration (asyncio's default is
        # the real clock's resolution); far below a millisecond, and above float rounding.
        self._clock_resolution = 1e-7

    def time(self) -> float:
        return self._now

    def advance_to(self, when: float) -> None:
        """Move the clock forward to ``when``; it never goes back."""
        self._now = max(self._now, when)

    def _process_events(self, event_list: list[Any]) -> None:
        """No real events: the in-memory network schedules its deliveries as callbacks."""

    def _write_to_self(self) -> None:
        """``call_soon_threadsafe`` wakes a real loop blocked in select; this one never
        blocks."""

    def close(self) -> None:
        super().close()
        self._selector.close()

    def run_in_executor(self, executor: concurrent.futures.Executor | None,
                        func: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Run ``func`` now, on the loop's thread, and return its settled future: disk I/O
        and other blocking calls take no virtual time, and no thread's timing enters the
        run (``asyncio.to_thread`` comes here too)."""
        self._check_closed()
        future = self.create_future()
        try:
            future.set_result(contextvars.copy_context().run(func, *args))
        except Exception as error:  # the caller awaits it, as it would from a thread
            future.set_exception(error)
        return future
