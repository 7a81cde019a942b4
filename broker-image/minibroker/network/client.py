"""KafkaConnection: a minimal async Kafka client connection.

Used by the follower fetcher and the CLI tools. One request in flight at a time (callers
are serialised by a lock), correlation ids checked, header versions taken from the kio
payload class. The requests travel through a ``channel.ClientChannel``: frames on TCP, the
decoded objects themselves where the world's connections carry them (the simulator's).
Any failure leaves the connection closed, because a late or partial response would
otherwise be read as the answer to the next request.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
from typing import Any

from kio.static.protocol import RequestPayload

from minibroker import environment
from minibroker.network.channel import ClientChannel, client_channel_of
from minibroker.network.codec import (
    DEFAULT_MAX_REQUEST_SIZE,
    ApiKey,
    KafkaProtocolError,
    Request,
)

__all__ = ["KafkaClientError", "KafkaConnection", "KafkaConnectionError", "KafkaRequestTimeout"]


class KafkaClientError(Exception):
    """Base of the errors a KafkaConnection raises; the subclasses are also the matching
    builtin OSErrors, so ``except OSError`` catches every network failure."""


class KafkaConnectionError(KafkaClientError, ConnectionError):
    """The connection could not be made, was lost, or carried an unreadable response."""


class KafkaRequestTimeout(KafkaClientError, TimeoutError):
    """No response within the timeout; the connection has been closed."""


class KafkaConnection:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        address: str,
        client_id: str | None,
        max_response_size: int,
    ) -> None:
        self._writer = writer
        self._channel: ClientChannel = client_channel_of(reader, writer, max_response_size)
        self.address = address
        self.client_id = client_id
        self._correlation_ids = itertools.count()
        self._lock = asyncio.Lock()
        self._closed = False

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        *,
        client_id: str | None = "minibroker",
        timeout: float = 10.0,
        max_response_size: int = DEFAULT_MAX_REQUEST_SIZE,
    ) -> KafkaConnection:
        address = f"{host}:{port}"
        world = environment.current()
        open_connection = world.open_object_connection or world.open_connection
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await open_connection(host, port)
        except TimeoutError:
            raise KafkaRequestTimeout(f"connecting to {address} took over {timeout:g} s") from None
        except OSError as exc:
            raise KafkaConnectionError(f"cannot connect to {address}: {exc}") from exc
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer, address=address, client_id=client_id,
                   max_response_size=max_response_size)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._writer.close()

    async def request(self, request: RequestPayload, *, timeout: float = 30.0) -> Any:
        """Send ``request`` and return its response payload (None for an acks=0 produce,
        which gets no response)."""
        async with self._lock:
            if self._closed:
                raise KafkaConnectionError(
                    f"{_name(request)} to {self.address}: connection is closed")
            correlation_id = next(self._correlation_ids) & 0x7FFFFFFF
            expects_response = not (request.__api_key__ == ApiKey.PRODUCE and request.acks == 0)
            sent = Request.of(request, correlation_id, self.client_id)
            try:
                async with asyncio.timeout(timeout):
                    self._channel.send_request(sent)
                    # Wait for the socket only while the request is still buffered (as the
                    # listener waits on its answers): a lost connection shows in the read.
                    if self._writer.transport.get_write_buffer_size():
                        await self._writer.drain()
                    if not expects_response:
                        return None
                    received_id, response = await self._channel.receive_response(sent)
                if received_id != correlation_id:
                    raise KafkaProtocolError(
                        f"response carries correlation id {received_id}",
                        correlation_id=correlation_id,
                    )
            except asyncio.CancelledError:
                self.close()  # the response, if any, would answer the wrong request
                raise
            except TimeoutError:
                self.close()
                raise KafkaRequestTimeout(f"{_name(request)} to {self.address}: no response "
                                          f"within {timeout:g} s") from None
            except (OSError, KafkaProtocolError) as exc:
                self.close()
                raise KafkaConnectionError(f"{_name(request)} to {self.address}: {exc}") from exc
            return response


def _name(request: RequestPayload) -> str:
    return f"{type(request).__name__} v{request.__version__}"
