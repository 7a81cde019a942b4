"""How a connection's requests reach the handlers and their responses leave it.

Kafka's ``KafkaChannel`` reads and writes through a ``TransportLayer`` (plaintext, SSL);
here a listener's connection goes through a ``RequestChannel``. On a socket that is
``FrameChannel``: size-prefixed frames within the listener's bounds (``RequestReceiver``),
decoded by the codec. A transport may offer a channel of its own, under the extra info
``REQUEST_CHANNEL``, that carries requests already decoded: the simulator's in-memory
connections do (docs/simulation.md), so that a simulated client's request reaches the same
handlers, in the same order and under the same muting, as a decoded frame does, without
the cost of encoding and decoding it.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from kio.static.protocol import ResponsePayload

from minibroker.network.codec import Request, encode_response, parse_request
from minibroker.network.memory_pool import MemoryPool
from minibroker.network.receive import RequestReceiver
from minibroker.network.socket_config import SocketServerConfig

__all__ = ["REQUEST_CHANNEL", "FrameChannel", "RequestChannel", "channel_of"]

REQUEST_CHANNEL = "request_channel"
"""The transport extra info naming a channel of decoded requests (``get_extra_info``)."""


class RequestChannel(Protocol):
    async def receive(self) -> Request | None:
        """The next request; None when the peer closed between requests. Raises
        ``receive.ConnectionIdle``, ``codec.KafkaProtocolError`` or ``OSError``, each of
        which closes the connection."""
        ...

    def send(self, request: Request, response: ResponsePayload) -> None:
        """Queue ``response`` to ``request`` on the connection (the caller drains)."""
        ...


class FrameChannel:
    """Kafka's wire format on a stream: the production channel."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 config: SocketServerConfig, pool: MemoryPool) -> None:
        self._receiver = RequestReceiver(reader, config, pool)
        self._writer = writer
        self._max_elements = config.max_request_elements

    async def receive(self) -> Request | None:
        # The frame's bytes stay counted in the memory pool until it is parsed.
        async with self._receiver.receive() as frame:
            return None if frame is None else parse_request(frame, self._max_elements)

    def send(self, request: Request, response: ResponsePayload) -> None:
        self._writer.write(encode_response(request.correlation_id, response))


def channel_of(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
               config: SocketServerConfig, pool: MemoryPool) -> RequestChannel:
    """The transport's own channel of decoded requests if it has one, else frames."""
    own: RequestChannel | None = writer.get_extra_info(REQUEST_CHANNEL)
    return own if own is not None else FrameChannel(reader, writer, config, pool)
