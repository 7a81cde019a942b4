"""Where a node's code meets the world: the network it listens and connects on, and the wall
clock.

A broker process runs on TCP and the system clock. The simulation runs the same code on an
in-memory network and a virtual clock (``undertow.sim.virtual_streams``, ``virtual_loop``):
it enters a node's ``environment`` before it starts the node's tasks, which carry it (a
context variable: asyncio copies the context into every task a task creates), so no
constructor threads it through. Kafka passes its ``Time`` the same way for the clock
(``MockTime`` in its tests); the loop's own ``time()`` is the monotonic clock already.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from minibroker.event_queue import EventQueue, ThreadEventQueue

StartServer = Callable[..., Awaitable[Any]]
OpenConnection = Callable[..., Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


@dataclass(frozen=True)
class Environment:
    """``asyncio.start_server`` and ``asyncio.open_connection``, or what stands for them;
    the wall clock in seconds since the epoch (record timestamps); and where a component
    runs what the node's loop must not delay (``event_queue``)."""

    start_server: StartServer = asyncio.start_server
    open_connection: OpenConnection = asyncio.open_connection
    wall_clock: Callable[[], float] = time.time
    event_queue: Callable[[str], EventQueue] = ThreadEventQueue


REAL = Environment()
"""TCP and the system clock: a broker process's."""
_current: ContextVar[Environment | None] = ContextVar("minibroker_environment", default=None)


def current() -> Environment:
    """The environment of the node whose code is running (``REAL`` unless one was
    ``entered``)."""
    return _current.get() or REAL


@contextmanager
def entered(environment: Environment) -> Iterator[None]:
    """Run what the block starts (its tasks, and theirs) in ``environment``."""
    token = _current.set(environment)
    try:
        yield
    finally:
        _current.reset(token)
