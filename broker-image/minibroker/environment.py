"""Where a node's code meets the world: the network it listens and connects on, the wall
clock, the disk's fsync, and randomness.

A broker process runs on TCP and the system clock. The simulation runs the same code on an
in-memory network and a virtual clock (``undertow.sim.virtual_streams``, ``virtual_loop``):
it enters a node's ``environment`` before it starts the node's tasks, which carry it (a
context variable: asyncio copies the context into every task a task creates), so no
constructor threads it through. Kafka passes its ``Time`` the same way for the clock
(``MockTime`` in its tests); the loop's own ``time()`` is the monotonic clock already.

Randomness (member ids, topic and cluster ids, fetch session ids, nonces) comes from
``new_uuid``, ``token_hex`` and ``random_source``: the operating system's in a process, a
node's seeded ``random.Random`` in simulation, so that a seed gives the same run.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import random
import secrets
import time
import uuid
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
    open_object_connection: OpenConnection | None = None
    """A connection that carries Kafka requests and responses as decoded objects
    (``network.channel.REQUEST_CHANNEL``): the simulator's in-memory network has them;
    None where connections carry bytes only (TCP)."""
    wall_clock: Callable[[], float] = time.time
    event_queue: Callable[[str], EventQueue] = ThreadEventQueue
    rng: random.Random | None = None
    """The node's random source in simulation; None: the operating system's."""
    fsync: Callable[[int], None] = os.fsync
    """The disk's flush of a file descriptor. The simulated disk has no page cache that a
    crash could take: what a power loss keeps is what the broker marked durable
    (``storage.durability``), so its fsync returns at once, as on a RAM disk."""
    halt: Callable[[int], None] = os._exit
    """Kafka's ``Exit.halt``: the node ends now with this status, running nothing more
    (a power loss, a failed log directory). In simulation it kills the node and raises
    ``NodeHalted`` through the code that called it."""


REAL = Environment()
"""TCP and the system clock: a broker process's."""
_current: ContextVar[Environment | None] = ContextVar("minibroker_environment", default=None)


def current() -> Environment:
    """The environment of the node whose code is running (``REAL`` unless one was
    ``entered``)."""
    return _current.get() or REAL


def context_of(environment: Environment) -> contextvars.Context:
    """A context in which ``environment`` is current, for code scheduled from outside every
    node (``loop.call_soon(callback, context=...)``): a simulated client's, say."""
    context = contextvars.Context()
    context.run(_current.set, environment)
    return context


def environment_in(context: contextvars.Context) -> Environment | None:
    """The environment current in ``context`` (None: no node's), read without entering it:
    what a simulated loop asks of each callback before it runs it."""
    return context.get(_current)


@contextmanager
def entered(environment: Environment) -> Iterator[None]:
    """Run what the block starts (its tasks, and theirs) in ``environment``."""
    token = _current.set(environment)
    try:
        yield
    finally:
        _current.reset(token)


def new_uuid() -> uuid.UUID:
    """A random (version 4) UUID from the node's source (``uuid.uuid4`` in a process)."""
    rng = current().rng
    return uuid.uuid4() if rng is None else uuid.UUID(int=rng.getrandbits(128), version=4)


def token_hex(nbytes: int) -> str:
    """``secrets.token_hex`` in a process; the node's source in simulation."""
    rng = current().rng
    return secrets.token_hex(nbytes) if rng is None else rng.randbytes(nbytes).hex()


def random_source() -> random.Random:
    """The node's random source for draws a component keeps making (fetch session ids)."""
    rng = current().rng
    return random.SystemRandom() if rng is None else rng


def fsync(fd: int) -> None:
    """``os.fsync`` in a process; the simulated disk's (``Environment.fsync``)."""
    current().fsync(fd)


def halt(status: int) -> None:
    """End this node now (``Environment.halt``); never returns."""
    current().halt(status)
    raise AssertionError("Environment.halt returned")  # pragma: no cover


class NodeHalted(BaseException):
    """What a simulated node's ``halt`` raises through its code: the node is dead, and
    nothing after the call may run (a ``BaseException``, as ``SystemExit``, so no
    ``except Exception`` of the broker's catches it)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"halted with status {status}")
        self.status = status
