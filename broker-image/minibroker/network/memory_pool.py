"""The bytes of request frames the broker holds at once: ``queued.max.request.bytes``.

Kafka's ``SimpleMemoryPool`` in its non-strict form, as the SocketServer uses it (KIP-72):
a frame's whole size is taken from the pool once its size prefix is read, an allocation
succeeds whenever anything is left (so one frame may overdraw), and while nothing is left
the Selector mutes the channels that want memory: their bytes stay in the kernel's socket
buffers, not in the broker. The pool here only counts: the bytes themselves are held as
they arrive (``receive.py``), never allocated ahead, so a frame declared at 100 MiB of
which 5 MiB came costs 5 MiB of memory and 100 MiB of the pool. The waiters are served in
order, each woken when something is left.

Memory a connection held goes back to the operating system when it is released, not only
to the allocator: the chunks of a half-read frame (a few hundred KiB each, as they came
off the socket) sit between other allocations, and glibc's ``free`` returns only the top
of its heap, so 20 connections dropped with 5 MiB each left a broker 30 MiB larger for
good. A release of a large frame schedules one ``malloc_trim`` (Linux's glibc; elsewhere
nothing), once for a burst of them.
"""

from __future__ import annotations

import asyncio
import ctypes
from collections import deque
from collections.abc import Callable

__all__ = ["MemoryPool"]

TRIM_AFTER_BYTES = 1 << 20
"""A release at least this large schedules a trim."""
TRIM_DELAY_S = 0.2
"""How long a trim waits for the rest of a burst of releases."""


def _malloc_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)``, or None where the C library has none (musl, macOS)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


_TRIM = _malloc_trim()


class MemoryPool:
    def __init__(self, size: int) -> None:
        """``size`` bytes; -1 (Kafka's value for no ``queued.max.request.bytes``): no bound."""
        self._available: int | None = None if size < 0 else size
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._trim: asyncio.TimerHandle | None = None

    @property
    def available(self) -> int | None:
        """Bytes left (negative when overdrawn); None when the pool is unbounded."""
        return self._available

    @property
    def waiting(self) -> int:
        """Connections waiting for memory, their frames unread."""
        return len(self._waiters)

    async def allocate(self, size: int) -> None:
        """Take ``size`` bytes, waiting behind earlier waiters while the pool is exhausted.
        A cancelled wait takes nothing."""
        if self._available is None:
            return
        if self._available <= 0 or self._waiters:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter  # woken only at the head of the queue, with something left
            except asyncio.CancelledError:
                self._waiters.remove(waiter)
                self._wake_head()  # a wake-up meant for this one goes to the next
                raise
            self._waiters.remove(waiter)
        self._available -= size
        self._wake_head()

    def release(self, size: int) -> None:
        """Give back what ``allocate`` took (an unbounded pool takes nothing, but its
        releases still trim)."""
        if size >= TRIM_AFTER_BYTES and _TRIM is not None and self._trim is None:
            self._trim = asyncio.get_running_loop().call_later(TRIM_DELAY_S, self._trim_now)
        if self._available is None:
            return
        self._available += size
        self._wake_head()

    def _trim_now(self) -> None:
        self._trim = None
        assert _TRIM is not None
        _TRIM()

    def _wake_head(self) -> None:
        if self._waiters and self._available is not None and self._available > 0:
            head = self._waiters[0]
            if not head.done():
                head.set_result(None)
