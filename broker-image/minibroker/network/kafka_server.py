"""The broker's Kafka listener: one asyncio task per connection, one request at a time.

Like Kafka's SocketServer, a connection is muted while its request is processed, so
responses leave in request order even when a request waits in a purgatory. Anything
wrong with one connection (a bad frame, an unknown API, a handler bug) closes that
connection only.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from contextvars import ContextVar
from typing import Protocol

from kio.static.protocol import ResponsePayload

from minibroker.cluster.types import DEFAULT_LISTENER
from minibroker.network.codec import (
    DEFAULT_MAX_REQUEST_SIZE,
    KafkaProtocolError,
    Request,
    encode_response,
    parse_request,
    read_frame,
)

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
    def __init__(
        self, handler: RequestHandler, *, max_request_size: int = DEFAULT_MAX_REQUEST_SIZE,
        listener: str = DEFAULT_LISTENER,
    ) -> None:
        self._handler = handler
        self.listener = listener
        self._max_request_size = max_request_size
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> None:
        """Listen on ``host:port`` (port 0 picks a free one; see ``port``)."""
        self._server = await asyncio.start_server(self._serve_connection, host, port)

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("KafkaServer.port read before start()")
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop accepting, then close every open connection."""
        if self._server is None:
            return
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peername = writer.get_extra_info("peername")
        peer = f"{peername[0]}:{peername[1]}" if peername else "an unknown peer"
        CLIENT_HOST.set(f"/{peername[0]}" if peername else "")
        LISTENER.set(self.listener)
        try:
            writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await self._process_requests(reader, writer, peer)
        except (OSError, asyncio.CancelledError):
            pass  # the peer went away, or the server is stopping
        finally:
            self._connections.discard(task)
            writer.close()

    async def _process_requests(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str
    ) -> None:
        while True:
            try:
                frame = await read_frame(reader, self._max_request_size)
                if frame is None:
                    return
                request = parse_request(frame)
            except KafkaProtocolError as exc:
                log.warning("closing connection from %s: %s", peer, exc)
                return
            try:
                response = await self._handler.handle(request)
                if response is None:
                    continue
                data = encode_response(request.correlation_id, response)
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
            writer.write(data)
            await writer.drain()
