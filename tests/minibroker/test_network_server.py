"""KafkaServer: a bad connection is closed alone; the server and its other clients go on.

The handler here answers ApiVersions and fails on Metadata (a handler bug), which is all
the server needs: it knows nothing of the APIs themselves.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import struct
from collections.abc import Callable

import pytest
from kio.schema.api_versions.v3 import request as api_versions_req
from kio.schema.api_versions.v3 import response as api_versions_resp
from kio.schema.errors import ErrorCode
from kio.schema.join_group.v9 import request as join_group_req
from kio.schema.metadata.v12 import request as metadata_req
from kio.schema.offset_fetch.v8 import request as offset_fetch_req

from minibroker.network.client import KafkaConnection, KafkaConnectionError
from minibroker.network.codec import Request, encode_request
from minibroker.network.kafka_server import KafkaServer
from minibroker.network.socket_config import SocketServerConfig

API_VERSIONS = api_versions_req.ApiVersionsRequest(
    client_software_name="test", client_software_version="1")


class ApiVersionsOnly:
    def __init__(self) -> None:
        self.handled: list[Request] = []

    async def handle(self, request: Request) -> api_versions_resp.ApiVersionsResponse:
        self.handled.append(request)
        if request.api_key != 18:
            raise RuntimeError(f"handler bug on {request.name}")
        return api_versions_resp.ApiVersionsResponse(
            error_code=ErrorCode.none, throttle_time=datetime.timedelta(0),
            api_keys=(api_versions_resp.ApiVersion(api_key=18, min_version=0, max_version=3),))


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def header(api_key: int, version: int, correlation_id: int = 5) -> bytes:
    client_id = b"bad-client"
    return struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id


def valid_metadata_v12() -> bytes:
    return encode_request(metadata_req.MetadataRequest(
        topics=None, include_topic_authorized_operations=False), 5, "bad-client")[4:]


def valid_join_group_v9() -> bytes:
    return encode_request(join_group_req.JoinGroupRequest(
        group_id="g", session_timeout=datetime.timedelta(seconds=10),
        rebalance_timeout=datetime.timedelta(seconds=30), member_id="", group_instance_id=None,
        protocol_type="consumer", protocols=(join_group_req.JoinGroupRequestProtocol(
            name="range", metadata=b"\x00\x01"),), reason=None), 5, "bad-client")[4:]


def valid_offset_fetch_v8() -> bytes:
    return encode_request(offset_fetch_req.OffsetFetchRequest(
        groups=(offset_fetch_req.OffsetFetchRequestGroup(group_id="g", topics=None),),
        require_stable=False), 5, "bad-client")[4:]


# Each sends bytes that must get its connection closed; the label names the log line.
BAD_INPUTS: dict[str, tuple[bytes, str]] = {
    "garbage body": (frame(header(18, 3) + b"\x00\xff\xff\xff\xff\xff\xff\xff"), "malformed"),
    # A compact array claiming 2**32 topics: kio's reader alone would abort the process.
    "huge array length": (frame(header(3, 12) + b"\x00" + b"\x81\x80\x80\x80\x10"), "malformed"),
    "truncated body": (frame(valid_metadata_v12()[:-2]), "malformed"),
    "header shorter than its fixed part": (frame(b"\x00\x12\x00"), "shorter than a header"),
    "absurd size": (struct.pack(">i", 2**31 - 1) + b"\x00" * 16, "frame size"),
    "negative size": (struct.pack(">i", -4) + b"\x00" * 16, "frame size"),
    "unknown api key": (frame(header(999, 0)), "unsupported API key"),
    "api minibroker lacks": (frame(header(17, 1)), "unsupported API key"),  # SaslHandshake
    "unsupported version": (frame(header(3, 0)), "unsupported version"),
    "handler crash": (frame(valid_metadata_v12()), "METADATA v12"),
    # The group coordinator's APIs get the same rule.
    "truncated JoinGroup": (frame(valid_join_group_v9()[:-4]), "malformed JOIN_GROUP"),
    "JoinGroup with a huge protocols array": (
        frame(valid_join_group_v9()[:-14] + b"\x81\x80\x80\x80\x10"), "malformed JOIN_GROUP"),
    "OffsetFetch with a huge groups array": (
        frame(valid_offset_fetch_v8()[:-9] + b"\x81\x80\x80\x80\x10"),
        "malformed OFFSET_FETCH"),
    "SyncGroup with a negative assignment length": (
        frame(header(14, 2) + b"\x00\x01g" + b"\x00\x00\x00\x01" + b"\x00\x01m"
              + b"\x00\x00\x00\x01" + b"\x00\x01m" + b"\xff\xff\xff\xf0"),
        "malformed SYNC_GROUP"),
    "OffsetCommit cut inside its topics": (
        frame(header(8, 2) + b"\x00\x01g" + b"\x00\x00\x00\x01" + b"\x00\x01m"
              + b"\x00\x00\x00\x00\x00\x00\x00\x00" + b"\x00\x00\x00\x05"),
        "malformed OFFSET_COMMIT"),
    "JoinGroup version minibroker lacks": (frame(header(11, 10)), "unsupported version"),
    # Metadata v12 with allow_auto_topic_creation = 0x07. kio reads a boolean as 0 or 1
    # only (Kafka's generated readers take any non-zero byte as true): its ValueError must
    # reach the server as a KafkaProtocolError, not as an exception of kio's own.
    "Metadata with a boolean of 7": (
        frame(bytes.fromhex("0003000c000000050001630000070000")), "malformed METADATA"),
}


def run_server(scenario: Callable[[KafkaServer, ApiVersionsOnly], object]) -> ApiVersionsOnly:
    handler = ApiVersionsOnly()

    async def main() -> None:
        server = KafkaServer(handler, config=SocketServerConfig.from_config(
            {"socket.request.max.bytes": str(1 << 20),
             "queued.max.request.bytes": str(1 << 20)}))
        await server.start("127.0.0.1", 0)
        try:
            await asyncio.wait_for(scenario(server, handler), 10)  # type: ignore[arg-type]
        finally:
            await server.stop()

    asyncio.run(main())
    return handler


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_closes_only_its_connection(case: str, caplog: pytest.LogCaptureFixture
                                              ) -> None:
    data, logged = BAD_INPUTS[case]

    async def scenario(server: KafkaServer, _handler: ApiVersionsOnly) -> None:
        bystander = await KafkaConnection.connect("127.0.0.1", server.port)
        assert (await bystander.request(API_VERSIONS)).error_code == ErrorCode.none
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(data)
        assert await reader.read() == b""  # the server closed this connection
        writer.close()
        assert (await bystander.request(API_VERSIONS)).error_code == ErrorCode.none
        newcomer = await KafkaConnection.connect("127.0.0.1", server.port)
        assert (await newcomer.request(API_VERSIONS)).error_code == ErrorCode.none
        bystander.close()
        newcomer.close()

    with caplog.at_level(logging.WARNING, logger="minibroker.network.kafka_server"):
        run_server(scenario)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "closing connection from 127.0.0.1:" in warning
    assert logged in warning
    # Not asyncio's "Unhandled exception in client_connected_cb", nor anything else loud.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_frame_cut_by_the_peer_closing_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(server: KafkaServer, handler: ApiVersionsOnly) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        whole = encode_request(API_VERSIONS, 1, "t")
        writer.write(whole[:-3])
        writer.write_eof()
        assert await reader.read() == b""
        writer.close()
        assert handler.handled == []

    with caplog.at_level(logging.WARNING, logger="minibroker.network.kafka_server"):
        run_server(scenario)
    assert any("connection closed after" in r.getMessage() for r in caplog.records)


def test_errors_carry_the_request_identity(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(server: KafkaServer, _handler: ApiVersionsOnly) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(frame(header(3, 0, correlation_id=31337)))
        assert await reader.read() == b""
        writer.close()

    with caplog.at_level(logging.WARNING, logger="minibroker.network.kafka_server"):
        run_server(scenario)
    message = caplog.records[0].getMessage()
    assert "api_key=3" in message and "api_version=0" in message
    assert "correlation_id=31337" in message


def test_many_requests_on_one_connection_are_answered_in_order() -> None:
    async def scenario(server: KafkaServer, _handler: ApiVersionsOnly) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"".join(encode_request(API_VERSIONS, i, "t") for i in range(50)))
        seen = []
        for _ in range(50):
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            seen.append(struct.unpack(">i", (await reader.readexactly(size))[:4])[0])
        assert seen == list(range(50))
        writer.close()

    handler = run_server(scenario)
    assert [r.client_id for r in handler.handled] == ["t"] * 50


def test_a_connection_s_buffered_requests_take_turns_with_other_connections() -> None:
    """One request of a connection per turn of the loop while more of its requests are
    buffered, as a Processor polls its channels: a request that arrives on another
    connection while the first of five pipelined ones is served is not served after all
    five. (Without the turn the five run in one step: their frames are in the reader's
    buffer, and nothing in reading or answering them waits.)"""
    served: list[str | None] = []
    single: list[asyncio.StreamWriter] = []

    class SendsTheOtherOnTheFirst(ApiVersionsOnly):
        async def handle(self, request: Request) -> api_versions_resp.ApiVersionsResponse:
            served.append(f"{request.client_id}-{request.correlation_id}")
            if served == ["pipelining-0"]:
                single[0].write(encode_request(API_VERSIONS, 0, "single"))
            return await super().handle(request)

    async def main() -> None:
        server = KafkaServer(SendsTheOtherOnTheFirst())
        await server.start("127.0.0.1", 0)
        try:
            _, single_writer = await asyncio.open_connection("127.0.0.1", server.port)
            single.append(single_writer)
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"".join(encode_request(API_VERSIONS, i, "pipelining")
                                  for i in range(5)))
            for _ in range(5):
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                await reader.readexactly(size)
            await asyncio.wait_for(_until(lambda: len(served) == 6), 10)
        finally:
            await server.stop()

    asyncio.run(main())
    assert served.index("single-0") < 5, served


async def _until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"not within {timeout} s"
        await asyncio.sleep(0.01)


def test_stop_closes_open_connections() -> None:
    async def scenario(server: KafkaServer, _handler: ApiVersionsOnly) -> None:
        port = server.port
        conn = await KafkaConnection.connect("127.0.0.1", port)
        await conn.request(API_VERSIONS)
        await server.stop()
        with pytest.raises(KafkaConnectionError):
            await conn.request(API_VERSIONS, timeout=2)
        with pytest.raises(KafkaConnectionError):
            await KafkaConnection.connect("127.0.0.1", port, timeout=2)

    run_server(scenario)
