"""One request frame off a client connection, within the listener's time and memory bounds.

Kafka's ``NetworkReceive`` reads a frame's size, checks it against
``socket.request.max.bytes``, takes that much from the ``MemoryPool`` and fills the buffer
as bytes come; its ``Selector`` closes a connection that shows no activity for
``connections.max.idle.ms``. Here the same steps, and one bound Kafka lacks: a frame must
arrive whole within ``socket.request.read.timeout.ms`` of its first byte, since any byte
counts as activity for Kafka's idle expiry and a client trickling bytes would hold its
half-read frame forever. The bytes are held as they arrive (``read_frame_body``), never
reserved for what was only declared, so a half-sent frame costs what was sent, for at most
the read timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from minibroker.network.codec import (
    PREFIX_CUT,
    KafkaProtocolError,
    check_frame_size,
    read_frame_body,
)
from minibroker.network.memory_pool import MemoryPool
from minibroker.network.socket_config import SocketServerConfig

__all__ = ["ConnectionIdle", "RequestReceiver"]


class ConnectionIdle(Exception):
    """No request began within ``connections.max.idle.ms``: the connection is closed, as
    Kafka's Selector closes an expired one (quietly: idle clients are normal)."""


class RequestReceiver:
    """Reads the request frames of one connection."""

    def __init__(self, reader: asyncio.StreamReader, config: SocketServerConfig,
                 pool: MemoryPool) -> None:
        self._reader = reader
        self._config = config
        self._pool = pool

    def buffered(self) -> bool:
        """Whether bytes of the next frame are already in the reader's buffer (asyncio's
        ``StreamReader`` keeps them in ``_buffer``, and offers no public count)."""
        return bool(self._reader._buffer)

    @asynccontextmanager
    async def receive(self) -> AsyncIterator[bytes | None]:
        """The next frame (None: the peer closed between frames), its bytes counted in the
        memory pool until the block ends: parse it there, and drop it.

        Raises ``ConnectionIdle``, or ``KafkaProtocolError`` for a size out of bounds, a
        frame cut by the peer closing, or one not whole within the read timeout.
        """
        config = self._config
        try:
            async with asyncio.timeout(config.connections_max_idle_ms / 1000):
                first = await self._reader.read(1)
        except TimeoutError:
            raise ConnectionIdle(f"no request for {config.connections_max_idle_ms} ms "
                                 "(connections.max.idle.ms)") from None
        if not first:
            yield None
            return
        size: int | None = None
        taken = 0  # of the memory pool
        chunks: list[bytes] = []
        try:
            async with asyncio.timeout(config.request_read_timeout_ms / 1000):
                try:
                    rest = await self._reader.readexactly(3)
                except asyncio.IncompleteReadError:
                    raise KafkaProtocolError(PREFIX_CUT) from None
                size = check_frame_size(first + rest, config.max_request_size)
                await self._pool.allocate(size)
                taken = size
                frame = await read_frame_body(self._reader, size, chunks)
        except BaseException as exc:
            self._pool.release(taken)
            if isinstance(exc, TimeoutError):
                raise KafkaProtocolError(self._late(size, taken > 0, chunks)) from None
            raise
        del chunks
        try:
            yield frame
        finally:
            self._pool.release(taken)

    def _late(self, size: int | None, admitted: bool, chunks: list[bytes]) -> str:
        after = (f"{self._config.request_read_timeout_ms} ms after its first byte "
                 "(socket.request.read.timeout.ms)")
        if size is None:
            return f"a frame's size prefix still incomplete {after}"
        if not admitted:
            return (f"a frame of {size} bytes still waiting for memory "
                    f"(queued.max.request.bytes) {after}")
        return f"only {sum(map(len, chunks))} of a frame's {size} bytes received {after}"
