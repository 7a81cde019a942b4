"""Kafka wire format: size-prefixed frames, request/response headers, supported versions.

``SUPPORTED_API_VERSIONS`` is the single source of truth for what minibroker speaks: the
request parser rejects anything outside it and the ApiVersions response is built from it.
Message bodies are kio dataclasses; record batches stay opaque bytes end to end.
"""

from __future__ import annotations

import asyncio
import io
import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from functools import cache
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.request_header.v1 import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2 import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import SerialError
from kio.static.protocol import RequestPayload, ResponsePayload

from minibroker.network.prescan import TooManyElements, check_layout

__all__ = [
    "DEFAULT_MAX_REQUEST_SIZE",
    "SUPPORTED_API_VERSIONS",
    "ApiKey",
    "KafkaProtocolError",
    "Request",
    "check_frame_size",
    "decode_response",
    "encode_request",
    "encode_response",
    "parse_request",
    "read_frame",
    "read_frame_body",
    "request_schema",
    "response_schema",
]

# Kafka's socket.request.max.bytes default.
DEFAULT_MAX_REQUEST_SIZE = 100 * 1024 * 1024

_SIZE = struct.Struct(">i")
_HEADER_PREFIX = struct.Struct(">hhi")  # api key, api version, correlation id


class ApiKey(IntEnum):
    """The Kafka APIs minibroker answers (names from Kafka's ``ApiKeys``)."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    WRITE_TXN_MARKERS = 27
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_CONFIGS = 32
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    INCREMENTAL_ALTER_CONFIGS = 44
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    CONSUMER_GROUP_HEARTBEAT = 68
    CONSUMER_GROUP_DESCRIBE = 69
    DESCRIBE_TOPIC_PARTITIONS = 75


# Inclusive (min, max) version per API. Fetch v13+ address topics by id; v15 carries the
# follower's broker epoch (KIP-903); v16+ (KIP-951 leader hints) is not served.
# InitProducerId: librdkafka 2.x and kafka-python use up to v4; v5 only adds an error code
# that transactional producers may see.
# Produce v10 adds KIP-951's leader hints (tagged, left out), v11 TRANSACTION_ABORTABLE, v12
# transaction version 2 (KIP-890: the broker adds the partition to the transaction); v13
# (topic ids, Kafka 4.1) is not served. The transaction APIs to Kafka 4.2's versions:
# EndTxn v5, AddPartitionsToTxn v5 (v4+ batched, from brokers), TxnOffsetCommit v5 and
# WriteTxnMarkers v2 (with its transaction version) are transaction version 2's.
# The group coordinator's APIs (the classic protocol) at Kafka 3.9's versions, but:
# OffsetCommit from v2 and OffsetFetch from v1 (kio has no older classes; no client in use
# sends them); FindCoordinator to v4 (KIP-699's batch; v5 only adds an error transactional
# producers see), DescribeGroups to v5 (v6 is Kafka 4.0's). OffsetCommit v9 and OffsetFetch
# v9 carry KIP-848's member epoch, which a classic group reads as the generation.
# The admin APIs clients clean up and read configs with at Kafka 4.2's versions: DeleteTopics
# v1-6 (v0 removed in 4.0; v6 names topics by id), DescribeConfigs v1-4 (v0 removed in 4.0),
# CreatePartitions v0-3 and DeleteGroups v0-2; librdkafka 2.x, kafka-python and kafkajs
# 2.2.4 (DeleteTopics v1, DescribeConfigs v2, CreatePartitions v1, DeleteGroups v1) each
# find a version in them.
SUPPORTED_API_VERSIONS: dict[ApiKey, tuple[int, int]] = {
    ApiKey.PRODUCE: (3, 12),
    ApiKey.FETCH: (4, 15),
    ApiKey.LIST_OFFSETS: (1, 7),
    ApiKey.METADATA: (1, 12),
    ApiKey.OFFSET_COMMIT: (2, 9),
    ApiKey.OFFSET_FETCH: (1, 9),
    ApiKey.FIND_COORDINATOR: (0, 4),
    ApiKey.JOIN_GROUP: (0, 9),
    ApiKey.HEARTBEAT: (0, 4),
    ApiKey.LEAVE_GROUP: (0, 5),
    ApiKey.SYNC_GROUP: (0, 5),
    ApiKey.DESCRIBE_GROUPS: (0, 5),
    ApiKey.LIST_GROUPS: (0, 5),
    ApiKey.API_VERSIONS: (0, 4),  # v4: features whose minimum is 0 too (KAFKA-17011)
    ApiKey.CREATE_TOPICS: (2, 7),
    ApiKey.DELETE_TOPICS: (1, 6),
    ApiKey.INIT_PRODUCER_ID: (0, 5),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: (2, 4),
    ApiKey.ADD_PARTITIONS_TO_TXN: (0, 5),
    ApiKey.ADD_OFFSETS_TO_TXN: (0, 4),  # v4 adds TRANSACTION_ABORTABLE (KIP-890)
    ApiKey.END_TXN: (0, 5),  # v4 adds TRANSACTION_ABORTABLE, v5 is transaction version 2
    ApiKey.WRITE_TXN_MARKERS: (1, 2),
    ApiKey.TXN_OFFSET_COMMIT: (0, 5),  # v3: KIP-447's member id and generation
    ApiKey.DESCRIBE_CONFIGS: (1, 4),
    ApiKey.CREATE_PARTITIONS: (0, 3),
    ApiKey.DELETE_GROUPS: (0, 2),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (0, 1),  # topic configs only
    ApiKey.DESCRIBE_TRANSACTIONS: (0, 0),  # KIP-664
    ApiKey.LIST_TRANSACTIONS: (0, 1),  # v1: KIP-994's duration filter; v2's regex is not served
    ApiKey.DESCRIBE_TOPIC_PARTITIONS: (0, 0),  # KIP-966: the only API that shows the ELR
    # KIP-848 (Kafka 4.0+), advertised while group.coordinator.rebalance.protocols has
    # consumer; v1 is KIP-1082's client-generated member id (and the regex, not served).
    ApiKey.CONSUMER_GROUP_HEARTBEAT: (0, 1),
    ApiKey.CONSUMER_GROUP_DESCRIBE: (0, 1),
}


CONSUMER_PROTOCOL_APIS = frozenset({ApiKey.CONSUMER_GROUP_HEARTBEAT,
                                    ApiKey.CONSUMER_GROUP_DESCRIBE})
"""KIP-848's APIs, served only with group.coordinator.rebalance.protocols' consumer."""


class KafkaProtocolError(Exception):
    """A frame or message that does not follow the Kafka protocol.

    Carries whatever of the request's identity could be read before the error, so the
    log line names the request.
    """

    def __init__(
        self,
        message: str,
        *,
        api_key: int | None = None,
        api_version: int | None = None,
        correlation_id: int | None = None,
    ) -> None:
        super().__init__(message)
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id

    def __str__(self) -> str:
        known = [
            f"{name}={value}"
            for name, value in (
                ("api_key", self.api_key),
                ("api_version", self.api_version),
                ("correlation_id", self.correlation_id),
            )
            if value is not None
        ]
        message = super().__str__()
        return f"{message} ({', '.join(known)})" if known else message


@dataclass(frozen=True, slots=True)
class Request:
    """One parsed request. ``body`` is None only for an ApiVersions request newer than
    the broker supports: its body cannot be read, and the answer lists our versions."""

    api_key: ApiKey
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any

    @property
    def name(self) -> str:
        return f"{self.api_key.name} v{self.api_version}"

    @classmethod
    def of(cls, body: Any, correlation_id: int, client_id: str | None) -> Request:
        """A client's request of ``body`` (a kio request payload), as sent."""
        return cls(_API_KEYS[body.__api_key__], body.__version__, correlation_id, client_id,
                   body)


_API_KEYS = {int(key): key for key in ApiKey}
"""``ApiKey`` by number, without the enum's call (a client's every request names one)."""


PREFIX_CUT = "connection closed inside a frame's size prefix"

_CHUNK = 1 << 20
"""The most ``read_frame_body`` takes from the stream at once."""


async def read_frame(reader: asyncio.StreamReader, max_size: int) -> bytes | None:
    """Read one size-prefixed frame; None when the peer closed between frames."""
    try:
        prefix = await reader.readexactly(4)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise KafkaProtocolError(PREFIX_CUT) from None
    return await read_frame_body(reader, check_frame_size(prefix, max_size))


def check_frame_size(prefix: bytes, max_size: int) -> int:
    """The size a frame's 4-byte prefix declares, if within ``0..max_size``
    (``socket.request.max.bytes``): Kafka's NetworkReceive checks it before it allocates."""
    (size,) = _SIZE.unpack(prefix)
    if size < 0 or size > max_size:
        raise KafkaProtocolError(f"frame size {size} outside 0..{max_size}")
    return size


async def read_frame_body(reader: asyncio.StreamReader, size: int,
                          chunks: list[bytes] | None = None) -> bytes:
    """The ``size`` bytes after a frame's prefix, read as they come into ``chunks`` (the
    caller's, to see how much came): nothing is reserved for bytes the peer declared but
    has not sent."""
    chunks = [] if chunks is None else chunks
    received = 0
    while received < size:
        chunk = await reader.read(min(size - received, _CHUNK))
        if not chunk:
            raise KafkaProtocolError(
                f"connection closed after {received} of a frame's {size} bytes")
        chunks.append(chunk)
        received += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


@cache
def request_schema(api_key: int, api_version: int) -> type[RequestPayload]:
    return load_request_schema(api_key, api_version)


@cache
def response_schema(api_key: int, api_version: int) -> type[ResponsePayload]:
    return load_response_schema(api_key, api_version)


# What the decoding step raises for bytes that are not a valid message. Seen: prescan's
# Underflow and NullField (ValueErrors: a null array the schema does not allow, which kio
# would read as None); from kio's native reader its SerialError family (invalid UTF-8, a
# null string or bytes where none may be), a ValueError (a boolean byte other than 0 or 1,
# a varint too long for its type, a duration out of range) and a KeyError (a tagged field
# the schema does not know). The boolean and the unknown tag are refused more strictly than
# by Kafka's generated readers, which take any non-zero byte as true and keep an unknown
# tag in _unknownTaggedFields. kio documents no error contract, so the bounds and range
# errors of the builtins are here too; a TypeError or AttributeError is a bug of ours.
_DECODE_ERRORS: tuple[type[Exception], ...] = (
    SerialError, ValueError, KeyError, IndexError, OverflowError, EOFError, struct.error,
)


def _decode(entity_type: type, frame: bytes, offset: int, max_elements: int | None = None
            ) -> tuple[Any, int]:
    """Layout check first (see prescan), then kio's native reader."""
    check_layout(entity_type, frame, offset, max_elements)
    return entity_reader(entity_type)(frame, offset)


def _describe(exc: Exception) -> str:
    # str(KeyError) is the repr of its argument; the message reads better without quotes.
    detail = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
    return f"{type(exc).__name__}: {detail}"


def parse_request(frame: bytes, max_elements: int | None = None) -> Request:
    """Parse a request frame (without its size prefix).

    Raises ``KafkaProtocolError`` for an unknown API key, an unsupported version (except
    ApiVersions, which clients use to negotiate), a header or body that does not decode
    and a body of more than ``max_elements`` array elements and tagged fields
    (``max.request.elements``), and nothing else for any bytes: like Kafka's
    ``RequestContext.parseRequest``, which turns whatever the message classes throw into an
    ``InvalidRequestException``, so that ``SocketServer`` closes the one connection that
    sent it.
    """
    if len(frame) < _HEADER_PREFIX.size:
        raise KafkaProtocolError(f"request of {len(frame)} bytes is shorter than a header")
    raw_key, version, correlation_id = _HEADER_PREFIX.unpack_from(frame)
    ids = {"api_key": raw_key, "api_version": version, "correlation_id": correlation_id}
    try:
        api_key = ApiKey(raw_key)
    except ValueError:
        raise KafkaProtocolError("unsupported API key", **ids) from None
    low, high = SUPPORTED_API_VERSIONS[api_key]
    body_type: type | None = None
    if low <= version <= high:
        body_type = request_schema(api_key, version)
        header_type = body_type.__header_schema__
    elif api_key is ApiKey.API_VERSIONS and version > high:
        # Flexible versions (3+) carry header v2, as every newer one will.
        header_type = RequestHeaderV2 if version >= 3 else RequestHeaderV1
    else:
        raise KafkaProtocolError(f"unsupported version of {api_key.name}", **ids)
    try:
        header, offset = _decode(header_type, frame, 0, max_elements)
        body = None
        if body_type is not None:
            body, _ = _decode(body_type, frame, offset, max_elements)
    except TooManyElements as exc:
        raise KafkaProtocolError(f"{api_key.name} v{version} request over "
                                 f"max.request.elements: {exc}", **ids) from None
    except _DECODE_ERRORS as exc:
        raise KafkaProtocolError(f"malformed {api_key.name} request: {_describe(exc)}",
                                 **ids) from exc
    return Request(api_key, version, correlation_id, header.client_id, body)


def _frame(write_message: Callable[[io.BytesIO], None]) -> bytes:
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    write_message(buffer)
    size = buffer.tell() - 4
    buffer.seek(0)
    buffer.write(_SIZE.pack(size))
    return buffer.getvalue()


def encode_response(correlation_id: int, response: ResponsePayload) -> bytes:
    """A size-prefixed response frame; the header version follows the payload's class
    (v1 for flexible versions, always v0 for ApiVersions)."""
    header_type = response.__header_schema__

    def write(buffer: io.BytesIO) -> None:
        entity_writer(header_type)(buffer, header_type(correlation_id=correlation_id))
        entity_writer(type(response))(buffer, response)

    return _frame(write)


def encode_request(request: RequestPayload, correlation_id: int, client_id: str | None) -> bytes:
    """A size-prefixed request frame with the header version the payload's class needs."""
    header_type = request.__header_schema__
    header = header_type(
        request_api_key=request.__api_key__,
        request_api_version=request.__version__,
        correlation_id=correlation_id,
        client_id=client_id,
    )

    def write(buffer: io.BytesIO) -> None:
        entity_writer(header_type)(buffer, header)
        entity_writer(type(request))(buffer, request)

    return _frame(write)


def decode_response(frame: bytes, response_type: type[ResponsePayload]) -> tuple[int, Any]:
    """Parse a response frame (without its size prefix): (correlation id, payload)."""
    try:
        header, offset = _decode(response_type.__header_schema__, frame, 0)
        body, _ = _decode(response_type, frame, offset)
    except _DECODE_ERRORS as exc:
        raise KafkaProtocolError(
            f"malformed {response_type.__name__} v{response_type.__version__}: {_describe(exc)}"
        ) from exc
    return header.correlation_id, body
