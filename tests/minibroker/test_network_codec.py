"""codec and prescan: the version table against kio, header versions, layout checks."""

from __future__ import annotations

import contextlib
import datetime
import io
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.offset_commit.v2.request import OffsetCommitRequest
from kio.schema.request_header.v1 import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2 import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0 import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1 import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import Records, i64Timedelta

from minibroker.network.codec import (
    SUPPORTED_API_VERSIONS,
    ApiKey,
    KafkaProtocolError,
    decode_response,
    encode_request,
    parse_request,
    request_schema,
    response_schema,
)
from minibroker.network.prescan import NullField, Underflow, check_layout

st.register_type_strategy(Records, st.binary(max_size=64).map(Records))

I64_MS_READ = (2**63 - 1) // 1000
"""The largest i64 millisecond count kio's reader turns into a timedelta (it goes through
microseconds in an i64: about 292,000 years), where kio's own strategy draws up to
timedelta.max. A request beyond it is refused as malformed
(`test_a_retention_beyond_what_kio_reads_closes_the_connection_as_malformed`)."""


def _survives_milliseconds(delta: datetime.timedelta) -> bool:
    """The writer sends total_seconds() * 1000, a float: some large values move by 1 ms."""
    return delta == datetime.timedelta(milliseconds=round(delta.total_seconds() * 1000))


st.register_type_strategy(i64Timedelta, st.integers(-I64_MS_READ, I64_MS_READ).map(
    lambda ms: datetime.timedelta(milliseconds=ms)).filter(_survives_milliseconds))

ALL_VERSIONS = [(api, v) for api, (low, high) in SUPPORTED_API_VERSIONS.items()
                for v in range(low, high + 1)]
EDGE_VERSIONS = [(api, v) for api, (low, high) in SUPPORTED_API_VERSIONS.items()
                 for v in sorted({low, high})]


@pytest.mark.parametrize(("api", "version"), ALL_VERSIONS)
def test_every_supported_version_has_kio_schemas_with_the_right_headers(api: ApiKey,
                                                                        version: int) -> None:
    request, response = request_schema(api, version), response_schema(api, version)
    assert request.__flexible__ == response.__flexible__
    flexible = request.__flexible__
    assert request.__header_schema__ is (RequestHeaderV2 if flexible else RequestHeaderV1)
    if api is ApiKey.API_VERSIONS:
        assert response.__header_schema__ is ResponseHeaderV0  # always, so v0 clients read it
    else:
        assert response.__header_schema__ is (ResponseHeaderV1 if flexible else ResponseHeaderV0)


def encode(entity: object) -> bytes:
    buffer = io.BytesIO()
    entity_writer(type(entity))(buffer, entity)
    return buffer.getvalue()


@pytest.mark.parametrize(("api", "version"), EDGE_VERSIONS)
def test_requests_round_trip_through_parse_request(api: ApiKey, version: int) -> None:
    body_type = request_schema(api, version)

    @settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.from_type(body_type), st.integers(0, 2**31 - 1), st.none() | st.text(max_size=8))
    def round_trip(body: object, correlation_id: int, client_id: str | None) -> None:
        frame = encode_request(body, correlation_id, client_id)
        assert struct.unpack_from(">i", frame)[0] == len(frame) - 4
        parsed = parse_request(frame[4:])
        assert (parsed.api_key, parsed.api_version) == (api, version)
        assert (parsed.correlation_id, parsed.client_id) == (correlation_id, client_id)
        assert parsed.body == body

    round_trip()


def test_a_retention_beyond_what_kio_reads_closes_the_connection_as_malformed() -> None:
    """Kafka reads any i64 retention_time_ms (OffsetCommit v2-v4); minibroker, through kio,
    none past I64_MS_READ: such a request is refused like a malformed one (its connection
    closed, the broker serving on), not an error of the broker."""
    for days, readable in ((106_751_991, True), (106_751_992, False)):
        body = OffsetCommitRequest(group_id="g", generation_id_or_member_epoch=-1,
                                   member_id="", retention_time=datetime.timedelta(days=days),
                                   topics=())
        frame = encode_request(body, 7, None)[4:]
        if readable:
            assert parse_request(frame).body == body
        else:
            with pytest.raises(KafkaProtocolError, match="malformed OFFSET_COMMIT request"):
                parse_request(frame)


@pytest.mark.parametrize("api", [ApiKey.FETCH, ApiKey.LIST_OFFSETS])
def test_prescan_agrees_with_kio_on_valid_responses(api: ApiKey) -> None:
    """The follower fetcher decodes these; requests are covered by the round trip above."""
    response_type = response_schema(api, SUPPORTED_API_VERSIONS[api][1])

    @settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.from_type(response_type))
    def agree(response: object) -> None:
        data = encode(response)
        assert check_layout(response_type, data, 0) == len(data)
        assert entity_reader(response_type)(data, 0)[1] == len(data)

    agree()


def test_prescan_rejects_lengths_beyond_the_frame() -> None:
    metadata_v12 = request_schema(ApiKey.METADATA, 12)
    # compact array of 2**32 topics in a 6-byte body
    with pytest.raises(Underflow, match="array of 4294967296 items"):
        check_layout(metadata_v12, b"\x81\x80\x80\x80\x10\x00", 0)
    metadata_v1 = request_schema(ApiKey.METADATA, 1)
    with pytest.raises(Underflow):  # legacy array of -5 items
        check_layout(metadata_v1, struct.pack(">i", -5), 0)
    with pytest.raises(Underflow):  # a 300-byte string in 4 bytes
        check_layout(metadata_v1, struct.pack(">ih", 1, 300) + b"ab", 0)


def test_a_null_array_where_the_schema_has_none_is_a_protocol_error() -> None:
    """kio's reader reads a null count as None whatever the schema says, and the handler
    then iterates None (the schema-aware fuzzer's first find: a TypeError per API). The
    prescan refuses it as Kafka's generated readers do; where the schema allows null
    (Metadata's topics: all topics), null still parses."""
    header = struct.pack(">hhih", ApiKey.LIST_OFFSETS, 4, 7, -1)
    with pytest.raises(KafkaProtocolError, match="non-nullable field topics") as raised:
        parse_request(header + struct.pack(">ibi", -1, 0, -1))  # replica, isolation, topics
    assert isinstance(raised.value.__cause__, NullField)
    flexible = struct.pack(">hhih", ApiKey.DESCRIBE_GROUPS, 5, 7, -1) + b"\x00"  # header tags
    with pytest.raises(KafkaProtocolError, match="non-nullable field groups"):
        parse_request(flexible + b"\x00\x00\x00")  # compact null, the flag, body tags
    everything = parse_request(struct.pack(">hhih", ApiKey.METADATA, 4, 7, -1)
                               + struct.pack(">ib", -1, 0))
    assert everything.body.topics is None


def test_parse_errors_name_the_request() -> None:
    with pytest.raises(KafkaProtocolError) as raised:
        parse_request(struct.pack(">hhih", 1, 12, 99, -1) + b"\x00\x01")
    error = raised.value
    assert (error.api_key, error.api_version, error.correlation_id) == (1, 12, 99)
    assert "malformed FETCH request" in str(error)
    assert "correlation_id=99" in str(error)


def test_too_new_api_versions_parses_without_its_body() -> None:
    frame = struct.pack(">hhih", 18, 9, 4, 3) + b"cli" + b"\x00" + b"unknown future body"
    request = parse_request(frame)
    assert (request.api_key, request.api_version, request.client_id) == (ApiKey.API_VERSIONS, 9,
                                                                         "cli")
    assert request.body is None


def test_truncated_response_is_a_protocol_error() -> None:
    metadata_v12 = response_schema(ApiKey.METADATA, 12)
    with pytest.raises(KafkaProtocolError, match="MetadataResponse v12"):
        decode_response(struct.pack(">i", 7) + b"\x00\x00", metadata_v12)


GROUP_APIS = [ApiKey.FIND_COORDINATOR, ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT,
              ApiKey.LEAVE_GROUP, ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH,
              ApiKey.LIST_GROUPS, ApiKey.DESCRIBE_GROUPS]


@pytest.mark.parametrize(("api", "version"), [(a, v) for a, v in EDGE_VERSIONS
                                              if a in GROUP_APIS])
def test_garbled_group_requests_are_protocol_errors_never_crashes(api: ApiKey,
                                                                  version: int) -> None:
    """A valid request of the group coordinator's APIs, cut short or with bytes
    overwritten: it parses or it is a KafkaProtocolError (the connection is closed), never
    anything else, and never an allocation kio's reader would make from a forged length."""
    body_type = request_schema(api, version)

    @settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.from_type(body_type), st.data())
    def garble(body: object, data: st.DataObject) -> None:
        frame = bytearray(encode_request(body, 1, "fuzz")[4:])
        cut = data.draw(st.integers(8, len(frame)))
        for _ in range(data.draw(st.integers(0, 4))):
            frame[data.draw(st.integers(8, len(frame) - 1))] = data.draw(st.integers(0, 255))
        with contextlib.suppress(KafkaProtocolError):
            parse_request(bytes(frame[:cut]))

    garble()
