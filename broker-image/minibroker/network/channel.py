"""How a connection's requests reach the handlers and their responses leave it, at both
ends.

Kafka's ``KafkaChannel`` reads and writes through a ``TransportLayer`` (plaintext, SSL);
here a listener's connection goes through a ``RequestChannel`` and a client's
(``client.KafkaConnection``: the follower fetcher's) through a ``ClientChannel``. On a
socket they are ``FrameChannel`` and ``FrameClientChannel``: size-prefixed frames within the
bounds, encoded and decoded by the codec. A transport may offer a channel of its own, under
the extra info ``REQUEST_CHANNEL``, that carries requests and responses already decoded:
the simulator's in-memory connections do (docs/simulation.md), so that a simulated request
reaches the same handlers, in the same order and under the same muting, as a decoded frame
does, and its response the same client code, without the cost of encoding and decoding
them (the codec has tests of its own).
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from kio.static.protocol import ResponsePayload

from minibroker.network.codec import (
    KafkaProtocolError,
    Request,
    decode_response,
    encode_request,
    encode_response,
    parse_request,
    read_frame,
    response_schema,
)
from minibroker.network.memory_pool import MemoryPool
from minibroker.network.receive import RequestReceiver
from minibroker.network.socket_config import SocketServerConfig

__all__ = ["REQUEST_CHANNEL", "ClientChannel", "FrameChannel", "FrameClientChannel",
           "RequestChannel", "channel_of", "client_channel_of"]

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

    def buffered(self) -> bool:
        """Whether the next request (or part of it) has already arrived, so that
        ``receive`` would not wait for the peer."""
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

    def buffered(self) -> bool:
        return self._receiver.buffered()


def channel_of(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
               config: SocketServerConfig, pool: MemoryPool) -> RequestChannel:
    """The transport's own channel of decoded requests if it has one, else frames."""
    own: RequestChannel | None = writer.get_extra_info(REQUEST_CHANNEL)
    return own if own is not None else FrameChannel(reader, writer, config, pool)


class ClientChannel(Protocol):
    def send_request(self, request: Request) -> None:
        """Queue ``request`` on the connection (the caller drains)."""
        ...

    async def receive_response(self, request: Request) -> tuple[int, ResponsePayload]:
        """The next response, read as the answer to ``request``: (its correlation id, its
        payload). Raises ``codec.KafkaProtocolError`` (the broker closed the connection,
        or sent what does not parse) or ``OSError``."""
        ...


class FrameClientChannel:
    """Kafka's wire format on a client's stream."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 max_response_size: int) -> None:
        self._reader = reader
        self._writer = writer
        self._max_response_size = max_response_size

    def send_request(self, request: Request) -> None:
        self._writer.write(encode_request(request.body, request.correlation_id,
                                          request.client_id))

    async def receive_response(self, request: Request) -> tuple[int, ResponsePayload]:
        frame = await read_frame(self._reader, self._max_response_size)
        if frame is None:
            raise KafkaProtocolError("connection closed by the broker")
        received: tuple[int, ResponsePayload] = decode_response(
            frame, response_schema(request.api_key, request.api_version))
        return received


def client_channel_of(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      max_response_size: int) -> ClientChannel:
    """The transport's own channel of decoded responses if it has one, else frames."""
    own: ClientChannel | None = writer.get_extra_info(REQUEST_CHANNEL)
    return own if own is not None else FrameClientChannel(reader, writer, max_response_size)
