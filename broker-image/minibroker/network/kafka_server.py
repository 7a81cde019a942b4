"""The broker's Kafka listener: one asyncio task per connection, one request at a time.

Like Kafka's SocketServer, a connection is muted while its request is processed, so
responses leave in request order even when a request waits in a purgatory. Anything
wrong with one connection (a bad frame, an unknown API, a handler bug) closes that
connection only.

What Kafka spreads over threads runs here on one event loop: its Acceptor and Processors
(accepting, reading frames), its KafkaRequestHandlerPool (handling), and beside them the
broker's heartbeats to the controller and its replica fetchers. So every part of a
connection's cost is bounded (``SocketServerConfig``): how many connections
(``ConnectionQuotas``), how long one may sit idle or take to send a frame, how large a
frame, how many bytes of frames at once (``MemoryPool``), how many elements one request may
hold (the prescan), and a connection yields the loop after every request, as a Processor
serves each channel a request at a time. docs/design.md, "Resource limits".
"""

from __future__ import annotations

import asyncio
import logging
import socket
from contextvars import ContextVar
from typing import Protocol

from kio.static.protocol import ResponsePayload

from minibroker import environment
from minibroker.cluster.types import DEFAULT_LISTENER
from minibroker.network.channel import channel_of
from minibroker.network.codec import KafkaProtocolError, Request
from minibroker.network.connection_quotas import ConnectionQuotas
from minibroker.network.memory_pool import MemoryPool
from minibroker.network.receive import ConnectionIdle
from minibroker.network.socket_config import SocketServerConfig
from minibroker.shutdown import end_tasks

__all__ = ["CLIENT_HOST", "LISTENER", "CloseConnection", "KafkaServer", "RequestHandler"]

log = logging.getLogger(__name__)

CLIENT_HOST: ContextVar[str] = ContextVar("client_host", default="")
"""The peer address of the connection being served (``/127.0.0.1``, as Kafka names a group
member's client host); each connection is its own task, so its own context."""
LISTENER: ContextVar[str] = ContextVar("listener", default=DEFAULT_LISTENER)
"""The name of the listener the connection being served came in on (Kafka's
``RequestContext.listenerName``): Metadata and FindCoordinator answer with that listener's
addresses (KIP-103)."""


class CloseConnection(Exception):
    """Raised by a handler to drop the connection instead of answering.

    Kafka does this for an acks=0 produce that failed: with no response to carry the
    error, closing the connection is the only signal the producer gets.
    """


class RequestHandler(Protocol):
    async def handle(self, request: Request) -> ResponsePayload | None:
        """The response to send, or None when the request gets none (acks=0)."""
        ...


class KafkaServer:
    """One listener. The broker's listeners share one ``ConnectionQuotas`` and one
    ``MemoryPool``, as Kafka's share theirs; a server given neither has its own."""

    def __init__(
        self, handler: RequestHandler, *, config: SocketServerConfig | None = None,
        listener: str = DEFAULT_LISTENER, quotas: ConnectionQuotas | None = None,
        memory_pool: MemoryPool | None = None,
    ) -> None:
        self._handler = handler
        self.listener = listener
        self._config = config or SocketServerConfig.from_config({})
        self.quotas = quotas or ConnectionQuotas(self._config)
        self.memory_pool = memory_pool or MemoryPool(self._config.queued_max_request_bytes)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> None:
        """Listen on ``host:port`` (port 0 picks a free one; see ``port``)."""
        self._server = await environment.current().start_server(
            self._serve_connection, host, port)

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("KafkaServer.port read before start()")
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop accepting, then close every open connection: its task is cancelled and
        awaited within ``shutdown.STOP_TIMEOUT_S`` (one that ignored its cancellation is
        logged and left, not waited for without end)."""
        if self._server is None:
            return
        self._server.close()
        await end_tasks(self._connections, f"the {self.listener} listener")
        await self._server.wait_closed()
        self._server = None

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        peername = writer.get_extra_info("peername")
        ip = peername[0] if peername else ""
        refusal = self.quotas.inc(ip)
        if refusal is not None:
            # Kafka's Acceptor: "Rejected connection from {ip}, address already has ..."
            log.info("Rejected connection from %s, %s", ip or "an unknown peer", refusal)
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer = f"{peername[0]}:{peername[1]}" if peername else "an unknown peer"
        CLIENT_HOST.set(f"/{ip}" if peername else "")
        LISTENER.set(self.listener)
        try:
            writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await self._process_requests(reader, writer, peer)
        except (OSError, asyncio.CancelledError):
            pass  # the peer went away, or the server is stopping
        finally:
            self._connections.discard(task)
            self.quotas.dec(ip)
            writer.close()

    async def _process_requests(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str
    ) -> None:
        channel = channel_of(reader, writer, self._config, self.memory_pool)
        idle_s = self._config.connections_max_idle_ms / 1000
        while True:
            try:
                request = await channel.receive()
                if request is None:
                    return
            except ConnectionIdle as exc:
                log.debug("closing connection from %s: %s", peer, exc)
                return
            except KafkaProtocolError as exc:
                log.warning("closing connection from %s: %s", peer, exc)
                return
            try:
                response = await self._handler.handle(request)
                if response is not None:
                    channel.send(request, response)
            except CloseConnection as exc:
                log.info("closing connection from %s after %s: %s", peer, request.name, exc)
                return
            except Exception:
                log.warning(
                    "closing connection from %s: %s (correlation_id=%d, client_id=%r) failed",
                    peer, request.name, request.correlation_id, request.client_id,
                    exc_info=True,
                )
                return
            # Wait for the peer to read only when the answer is still buffered: an empty
            # buffer is never paused, and the wait's timer would cost every answer.
            if response is not None and writer.transport.get_write_buffer_size():
                try:
                    async with asyncio.timeout(idle_s):
                        await writer.drain()
                except TimeoutError:
                    log.info("closing connection from %s: the answer to %s left unread for "
                             "%d ms (connections.max.idle.ms)", peer, request.name,
                             self._config.connections_max_idle_ms)
                    return
            # A next request already buffered waits a turn of the loop: one request per
            # connection per turn, as a Processor polls its channels. One not yet arrived
            # waits for the peer anyway, and the turn would cost every request.
            if channel.buffered():
                await asyncio.sleep(0)
