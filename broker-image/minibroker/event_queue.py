"""Where a component runs work that the broker's event loop must not delay: Kafka's
``KafkaEventQueue`` (server-common), a thread with a queue of its own, which the broker's
``BrokerLifecycleManager`` runs its registration and heartbeats on.

A broker process gives the component a thread with an event loop of its own
(``ThreadEventQueue``). The simulation runs every node on one virtual-time loop, where a
thread's own clock and scheduling would make the run neither virtual nor repeatable, so it
gives the caller's loop (``LoopEventQueue``): the same coroutines, on the same clock as the
rest of the node. ``minibroker.environment`` says which one a node gets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Coroutine
from typing import Any, Protocol

from minibroker.shutdown import STOP_TIMEOUT_S

log = logging.getLogger("minibroker.event_queue")


class EventQueue(Protocol):
    """Runs coroutines apart from the caller's work; the caller awaits their results."""

    @property
    def running(self) -> bool: ...

    def start(self) -> None: ...

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Future[Any]:
        """Run ``coroutine`` on the queue; its result, awaitable on the caller's loop."""
        ...

    async def stop(self) -> None:
        """Stop running anything (what was submitted has been ended by its owner)."""
        ...


class ThreadEventQueue:
    """A daemon thread running an event loop of its own until ``stop``."""

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Future[Any]:
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, self._loop))

    async def stop(self) -> None:
        """Stop the loop and join the thread (at once: its owner ended its tasks)."""
        with contextlib.suppress(RuntimeError):  # the loop has closed already
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(STOP_TIMEOUT_S)
        if self._thread.is_alive():
            log.error("Thread %s is still running %.0f s after its loop was stopped",
                      self._thread.name, STOP_TIMEOUT_S)

    def _run(self) -> None:
        """The thread: its loop until ``stop``, then the loop closed (its selector and
        self-pipe freed; a broker restarted in one process does not leak them)."""
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()


class LoopEventQueue:
    """The caller's own loop, for the simulation: each submitted coroutine is a task of it,
    named after the queue, which a caller's timeout does not cancel (as it cannot cancel the
    work of a thread)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._started = self._stopped = False

    @property
    def running(self) -> bool:
        return self._started and not self._stopped

    def start(self) -> None:
        self._started = True

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Future[Any]:
        task = asyncio.get_running_loop().create_task(coroutine, name=self._name)
        return asyncio.shield(task)

    async def stop(self) -> None:
        self._stopped = True
