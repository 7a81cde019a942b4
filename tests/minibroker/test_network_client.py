"""KafkaConnection: correlation ids, and the two failure kinds callers handle differently."""

from __future__ import annotations

import asyncio
import datetime
import socket
import struct
from collections.abc import Awaitable, Callable

import pytest
from kio.schema.api_versions.v3 import request as api_versions_req
from kio.schema.api_versions.v3 import response as api_versions_resp
from kio.schema.errors import ErrorCode

from minibroker.network.client import (
    KafkaClientError,
    KafkaConnection,
    KafkaConnectionError,
    KafkaRequestTimeout,
)
from minibroker.network.codec import Request, encode_response, parse_request

API_VERSIONS = api_versions_req.ApiVersionsRequest(
    client_software_name="test", client_software_version="1")


def answer(correlation_id: int) -> bytes:
    return encode_response(correlation_id, api_versions_resp.ApiVersionsResponse(
        error_code=ErrorCode.none, throttle_time=datetime.timedelta(0), api_keys=()))


Behaviour = Callable[[Request, asyncio.StreamWriter], Awaitable[None]]


def with_peer(behaviour: Behaviour, scenario: Callable[[int, list[Request]], Awaitable[None]]
              ) -> None:
    """Run ``scenario`` against a raw server that applies ``behaviour`` to each request."""
    seen: list[Request] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                request = parse_request(await reader.readexactly(size))
                seen.append(request)
                await behaviour(request, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        try:
            port = server.sockets[0].getsockname()[1]
            await asyncio.wait_for(scenario(port, seen), 10)
        finally:
            server.close()

    asyncio.run(main())


async def respond(request: Request, writer: asyncio.StreamWriter) -> None:
    writer.write(answer(request.correlation_id))


def test_requests_carry_increasing_correlation_ids_and_the_client_id() -> None:
    async def scenario(port: int, seen: list[Request]) -> None:
        conn = await KafkaConnection.connect("127.0.0.1", port, client_id="replica-2")
        for _ in range(3):
            assert (await conn.request(API_VERSIONS)).error_code == ErrorCode.none
        conn.close()
        assert [r.correlation_id for r in seen] == [0, 1, 2]
        assert {r.client_id for r in seen} == {"replica-2"}

    with_peer(respond, scenario)


def test_concurrent_callers_are_serialised() -> None:
    async def scenario(port: int, seen: list[Request]) -> None:
        conn = await KafkaConnection.connect("127.0.0.1", port)
        responses = await asyncio.gather(*(conn.request(API_VERSIONS) for _ in range(10)))
        assert len(responses) == 10 and len(seen) == 10
        conn.close()

    with_peer(respond, scenario)


def test_no_answer_is_a_timeout_and_closes_the_connection() -> None:
    async def silent(_request: Request, _writer: asyncio.StreamWriter) -> None:
        return None

    async def scenario(port: int, _seen: list[Request]) -> None:
        conn = await KafkaConnection.connect("127.0.0.1", port)
        with pytest.raises(KafkaRequestTimeout) as raised:
            await conn.request(API_VERSIONS, timeout=0.2)
        assert isinstance(raised.value, TimeoutError)
        assert conn.closed
        with pytest.raises(KafkaConnectionError, match="closed"):
            await conn.request(API_VERSIONS)

    with_peer(silent, scenario)


def test_peer_closing_is_a_connection_error() -> None:
    async def hang_up(_request: Request, writer: asyncio.StreamWriter) -> None:
        writer.close()

    async def scenario(port: int, _seen: list[Request]) -> None:
        conn = await KafkaConnection.connect("127.0.0.1", port)
        with pytest.raises(KafkaConnectionError) as raised:
            await conn.request(API_VERSIONS)
        assert isinstance(raised.value, ConnectionError)
        assert conn.closed

    with_peer(hang_up, scenario)


def test_a_response_to_another_request_is_refused() -> None:
    async def misnumber(request: Request, writer: asyncio.StreamWriter) -> None:
        writer.write(answer(request.correlation_id + 1000))

    async def scenario(port: int, _seen: list[Request]) -> None:
        conn = await KafkaConnection.connect("127.0.0.1", port)
        with pytest.raises(KafkaConnectionError, match="correlation id 1000"):
            await conn.request(API_VERSIONS)
        assert conn.closed

    with_peer(misnumber, scenario)


def test_refused_connect_is_a_connection_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound but not listening: connections are refused

        async def connect() -> None:
            await KafkaConnection.connect("127.0.0.1", port, timeout=2)

        with pytest.raises(KafkaConnectionError) as raised:
            asyncio.run(connect())
    assert isinstance(raised.value, KafkaClientError)
    assert isinstance(raised.value, OSError)
