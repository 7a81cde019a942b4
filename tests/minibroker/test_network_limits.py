"""The Kafka listener's resource limits, on an in-process ``KafkaServer`` with real sockets.

Each limit with a small configured value: connections per address and in all
(``ConnectionQuotas``), idle connections (``connections.max.idle.ms``), frames that take too
long to arrive (``socket.request.read.timeout.ms``), the bytes of frames read at once
(``MemoryPool``), and the elements one request may hold (``max.request.elements``, walked
by the prescan before anything is decoded). The broker-process side, a real broker that a
huge request neither blocks nor fences and that drops half-sent frames, is in
``test_broker_limits.py``.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import socket
import struct
import time
from collections.abc import Awaitable, Callable

import pytest
from kio.schema.api_versions.v3 import request as api_versions_req
from kio.schema.api_versions.v3 import response as api_versions_resp
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v1 import request as metadata_v1
from kio.schema.metadata.v12 import response as metadata_v12_resp
from kio.schema.offset_fetch.v8 import request as offset_fetch_req
from kio.schema.types import BrokerId

from minibroker.cluster.types import MetadataImage, TopicImage
from minibroker.config import ConfigError, parse_overrides
from minibroker.network.client import KafkaConnection
from minibroker.network.codec import KafkaProtocolError, Request, encode_request, parse_request
from minibroker.network.kafka_server import KafkaServer
from minibroker.network.memory_pool import MemoryPool
from minibroker.network.socket_config import SocketServerConfig

API_VERSIONS = api_versions_req.ApiVersionsRequest(
    client_software_name="test", client_software_version="1")
SERVER_LOG = "minibroker.network.kafka_server"


class Answers:
    """Answers ApiVersions at once, or after ``delay`` seconds (a request in progress)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    async def handle(self, request: Request) -> api_versions_resp.ApiVersionsResponse:
        await asyncio.sleep(self.delay)
        return api_versions_resp.ApiVersionsResponse(
            error_code=ErrorCode.none, throttle_time=datetime.timedelta(0),
            api_keys=(api_versions_resp.ApiVersion(api_key=18, min_version=0, max_version=3),))


def serve(config: dict[str, str], scenario: Callable[[KafkaServer], Awaitable[None]],
          handler: Answers | None = None) -> None:
    async def main() -> None:
        server = KafkaServer(handler or Answers(),
                             config=SocketServerConfig.from_config(config))
        await server.start("127.0.0.1", 0)
        try:
            await asyncio.wait_for(scenario(server), 15)
        finally:
            await server.stop()

    asyncio.run(main())


async def until(condition: Callable[[], bool], what: str) -> None:
    """Poll the server's own state, at most 5 s."""
    deadline = time.monotonic() + 5
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def answered(port: int) -> KafkaConnection:
    """A connection that got an answer: the server kept it."""
    conn = await KafkaConnection.connect("127.0.0.1", port)
    assert (await conn.request(API_VERSIONS, timeout=5)).error_code == ErrorCode.none
    return conn


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """Whether the server closed the connection (EOF or reset) without answering."""
    try:
        return await reader.read() == b""
    except ConnectionResetError:
        return True


# -- max.connections.per.ip, max.connections --------------------------------------------


def test_max_connections_per_ip_refuses_the_extra_connection(
        caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(server: KafkaServer) -> None:
        kept = [await answered(server.port) for _ in range(3)]
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(encode_request(API_VERSIONS, 1, "fourth"))
        assert await closed_by_server(reader)
        writer.close()
        assert server.quotas.total == 3
        for conn in kept:  # the three kept their connections
            assert (await conn.request(API_VERSIONS)).error_code == ErrorCode.none
        kept.pop().close()
        # The slot is free once the server has seen the close.
        deadline = time.monotonic() + 5
        while server.quotas.total > 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        kept.append(await answered(server.port))
        for conn in kept:
            conn.close()

    with caplog.at_level(logging.INFO, logger=SERVER_LOG):
        serve({"max.connections.per.ip": "3"}, scenario)
    (refusal,) = [r.getMessage() for r in caplog.records if "Rejected" in r.getMessage()]
    assert refusal == ("Rejected connection from 127.0.0.1, address already has the "
                       "configured maximum of 3 connections (max.connections.per.ip)")


def test_max_connections_per_ip_overrides_and_max_connections() -> None:
    async def scenario(server: KafkaServer) -> None:
        kept = [await answered(server.port) for _ in range(4)]  # the override allows 4
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        assert await closed_by_server(reader)  # max.connections: 4 in all
        writer.close()
        for conn in kept:
            conn.close()

    serve({"max.connections.per.ip": "2", "max.connections.per.ip.overrides": "127.0.0.1:9",
           "max.connections": "4"}, scenario)


def test_connection_limits_parse_as_kafka_writes_them() -> None:
    config = SocketServerConfig.from_config(parse_overrides(
        ["max.connections.per.ip.overrides=127.0.0.1:400, ::1:7", "max.connections=10"]))
    assert dict(config.max_connections_per_ip_overrides) == {"127.0.0.1": 400, "::1": 7}
    assert config.max_connections == 10
    defaults = SocketServerConfig.from_config({})
    assert (defaults.max_request_size, defaults.connections_max_idle_ms) == (104857600, 600000)
    with pytest.raises(ConfigError, match=r"must be -1 or at least socket\.request\.max\.bytes"):
        parse_overrides(["queued.max.request.bytes=1000"])


# -- connections.max.idle.ms ------------------------------------------------------------


def test_idle_connection_is_closed_after_connections_max_idle_ms() -> None:
    async def scenario(server: KafkaServer) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        # The server's idle clock starts at the latest when it reads the request, which is
        # after this moment (not after the answer reaches this client: that is later).
        sent_at = time.monotonic()
        writer.write(encode_request(API_VERSIONS, 1, "t"))
        size = struct.unpack(">i", await reader.readexactly(4))[0]
        await reader.readexactly(size)
        assert await closed_by_server(reader)  # then nothing: closed once idle
        assert 0.3 <= time.monotonic() - sent_at < 5
        writer.close()
        assert server.quotas.total == 0

    serve({"connections.max.idle.ms": "300"}, scenario)


def test_a_request_in_progress_is_not_idle() -> None:
    async def scenario(server: KafkaServer) -> None:
        conn = await KafkaConnection.connect("127.0.0.1", server.port)
        # The handler takes twice the idle time: the connection is busy, not idle.
        assert (await conn.request(API_VERSIONS, timeout=5)).error_code == ErrorCode.none
        conn.close()

    serve({"connections.max.idle.ms": "200"}, scenario, Answers(delay=0.4))


class LargeAnswers(Answers):
    """Answers of 1 MB each (a Metadata response with a long cluster id): a few fill a slow
    reader's socket."""

    async def handle(self, request: Request) -> metadata_v12_resp.MetadataResponse:
        return metadata_v12_resp.MetadataResponse(
            throttle_time=datetime.timedelta(0), brokers=(), cluster_id="x" * (1 << 20),
            controller_id=BrokerId(0), topics=())


def test_an_answer_left_unread_closes_the_connection_after_connections_max_idle_ms(
        caplog: pytest.LogCaptureFixture) -> None:
    """A peer that sends requests and never reads their answers: once the answers fill the
    socket and the listener's buffer, the listener waits for the peer to read, and closes
    the connection after connections.max.idle.ms (its later requests are never read)."""

    async def scenario(server: KafkaServer) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a slow reader's window
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", server.port))
        _, writer = await asyncio.open_connection(sock=sock)
        for correlation_id in range(40):
            writer.write(encode_request(API_VERSIONS, correlation_id, "never-reads"))
        await writer.drain()
        deadline = time.monotonic() + 10
        while server.quotas.total and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert server.quotas.total == 0
        writer.close()

    with caplog.at_level(logging.INFO, logger=SERVER_LOG):
        serve({"connections.max.idle.ms": "500"}, scenario, LargeAnswers())
    (closing,) = [r.getMessage() for r in caplog.records if r.name == SERVER_LOG]
    assert closing.startswith("closing connection from 127.0.0.1:")
    assert closing.endswith(": the answer to API_VERSIONS v3 left unread for 500 ms "
                            "(connections.max.idle.ms)")


# -- socket.request.read.timeout.ms -----------------------------------------------------


def test_a_frame_trickling_in_is_closed_at_the_read_timeout(
        caplog: pytest.LogCaptureFixture) -> None:
    """A byte every 50 ms keeps Kafka's idle timer from ever firing; the read timeout still
    closes the connection, its half-read frame dropped."""

    async def scenario(server: KafkaServer) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(struct.pack(">i", 1000))
        started = time.monotonic()

        async def trickle() -> None:
            for _ in range(200):
                writer.write(b"\0")
                await asyncio.sleep(0.05)

        trickling = asyncio.create_task(trickle())
        assert await closed_by_server(reader)
        elapsed = time.monotonic() - started
        trickling.cancel()
        writer.close()
        assert 0.4 <= elapsed < 5, elapsed

    with caplog.at_level(logging.WARNING, logger=SERVER_LOG):
        serve({"socket.request.read.timeout.ms": "500", "connections.max.idle.ms": "10000"},
              scenario)
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "of a frame's 1000 bytes received 500 ms after its first byte" in warning
    assert "socket.request.read.timeout.ms" in warning


def test_a_frame_over_socket_request_max_bytes_is_refused_before_it_is_read() -> None:
    async def scenario(server: KafkaServer) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(struct.pack(">i", 4097))  # one byte over, and none of the frame sent
        assert await closed_by_server(reader)
        writer.close()

    serve({"socket.request.max.bytes": "4096", "queued.max.request.bytes": "-1"}, scenario)


# -- queued.max.request.bytes -----------------------------------------------------------


def test_frames_past_the_memory_pool_wait_unread_until_memory_is_released() -> None:
    """A 3000-byte pool: a half-sent 2000-byte frame holds 2000, a second is admitted
    (Kafka's pool lets one overdraw), a third waits unread, whole as it is; when the first
    sender gives up, the third is read and answered."""

    async def scenario(server: KafkaServer) -> None:
        pool = server.memory_pool
        holders = []
        for _ in range(2):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(struct.pack(">i", 2000) + b"\0" * 100)
            holders.append((reader, writer))
        await until(lambda: pool.available == -1000, "both holders admitted")
        conn = await KafkaConnection.connect("127.0.0.1", server.port)
        answer = asyncio.create_task(conn.request(API_VERSIONS, timeout=10))
        await until(lambda: pool.waiting == 1, "the third frame to wait for memory")
        assert not answer.done()
        holders.pop(0)[1].close()  # the first sender gives up: its 2000 bytes go back
        assert (await answer).error_code == ErrorCode.none
        conn.close()
        for _reader, writer in holders:
            writer.close()
        await until(lambda: pool.available == 3000, "every byte back in the pool")

    serve({"queued.max.request.bytes": "3000", "socket.request.max.bytes": "3000"}, scenario)


def test_memory_pool_serves_waiters_in_order_and_a_cancelled_wait_takes_nothing() -> None:
    async def main() -> None:
        pool = MemoryPool(100)
        await pool.allocate(150)  # overdraws: something was left
        order: list[str] = []

        async def take(name: str, size: int) -> None:
            await pool.allocate(size)
            order.append(name)

        first = asyncio.create_task(take("first", 10))
        cancelled = asyncio.create_task(take("cancelled", 10))
        last = asyncio.create_task(take("last", 10))
        await until(lambda: pool.waiting == 3, "the three to queue, each in turn")
        cancelled.cancel()
        pool.release(150)
        await asyncio.gather(first, last, return_exceptions=True)
        assert order == ["first", "last"]
        assert pool.available == 80
        assert MemoryPool(-1).available is None

    asyncio.run(main())


# -- max.request.elements ---------------------------------------------------------------


def metadata_v1_frame(names: int) -> bytes:
    return encode_request(metadata_v1.MetadataRequest(
        topics=tuple(metadata_v1.MetadataRequestTopic(name="") for _ in range(names))),
        7, "big")[4:]


def test_max_request_elements_refuses_a_request_before_decoding_it() -> None:
    frame = metadata_v1_frame(300_000)
    started = time.perf_counter()
    with pytest.raises(KafkaProtocolError) as refused:
        parse_request(frame, 10_000)
    # The walk stops at the count: no element was walked, nothing decoded.
    assert time.perf_counter() - started < 0.05
    assert str(refused.value) == (
        "METADATA v1 request over max.request.elements: 300000 array elements at byte 17 "
        "take the message past 10000 array elements and tagged fields "
        "(api_key=3, api_version=1, correlation_id=7)")
    assert len(parse_request(metadata_v1_frame(10_000), 10_000).body.topics) == 10_000


def test_max_request_elements_counts_nested_arrays_together() -> None:
    """OffsetFetch v8: 3 groups of 2 topics of 4 partitions each hold 3 + 6 + 24 = 33."""
    frame = encode_request(offset_fetch_req.OffsetFetchRequest(
        groups=tuple(offset_fetch_req.OffsetFetchRequestGroup(
            group_id=f"g{g}", topics=tuple(offset_fetch_req.OffsetFetchRequestTopics(
                name=f"t{t}", partition_indexes=(0, 1, 2, 3)) for t in range(2)))
            for g in range(3)), require_stable=False), 1, "c")[4:]
    assert parse_request(frame, 33).body.groups[2].topics[1].partition_indexes == (0, 1, 2, 3)
    with pytest.raises(KafkaProtocolError, match="past 32 array elements"):
        parse_request(frame, 32)


def test_max_request_elements_counts_tagged_fields() -> None:
    """A flexible body may carry any number of tagged fields, each walked: they count too
    (ApiVersions v3: two empty strings, then the body's tagged fields)."""
    unknown_tags = b"".join(bytes([tag, 0]) for tag in range(20, 40))
    frame = (struct.pack(">hhih", 18, 3, 1, 1) + b"c" + b"\x00"  # header v2
             + b"\x01\x01" + bytes([len(unknown_tags) // 2]) + unknown_tags)
    with pytest.raises(KafkaProtocolError, match=r"20 tagged fields at byte \d+ take the"):
        parse_request(frame, 10)


def test_max_request_elements_closes_the_connection_naming_the_request(
        caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(server: KafkaServer) -> None:
        bystander = await answered(server.port)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        frame = metadata_v1_frame(101)
        writer.write(struct.pack(">i", len(frame)) + frame)
        assert await closed_by_server(reader)
        writer.close()
        assert (await bystander.request(API_VERSIONS)).error_code == ErrorCode.none
        bystander.close()

    with caplog.at_level(logging.WARNING, logger=SERVER_LOG):
        serve({"max.request.elements": "100"}, scenario)
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "METADATA v1 request over max.request.elements" in warning
    assert "correlation_id=7" in warning


# -- the topic-id index -----------------------------------------------------------------


def test_topics_by_id_indexes_every_topic_of_the_image() -> None:
    ids = [f"{i:032x}" for i in range(1, 4)]
    image = MetadataImage(1, {}, {f"t{i}": TopicImage(f"t{i}", topic_id, {}, {})
                                  for i, topic_id in enumerate(ids)})
    assert {k.hex: v.name for k, v in image.topics_by_id.items()} == {
        ids[0]: "t0", ids[1]: "t1", ids[2]: "t2"}
    assert image.topics_by_id is image.topics_by_id  # built once per image
