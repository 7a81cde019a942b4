"""Corrupted request frames: the codec rejects every one with a KafkaProtocolError, and a
real broker closes just the connection that sent it and goes on serving stock clients.

Kafka's ``RequestContext.parseRequest`` turns whatever a message class throws into an
``InvalidRequestException`` and ``SocketServer`` closes that one channel; minibroker's
contract is the same with one error type, ``KafkaProtocolError``. The seeds are one valid
request for every API version the broker advertises in ApiVersions, built with every field
set, every array one element long and every nullable struct present, so each nested
boolean, length prefix and tagged-field section is on the wire to be corrupted. Each seed
is corrupted where a hostile or broken peer would: a bad boolean, a negative or huge
length, a varint that never ends and a tagged field the schema lacks at every byte, a cut
at every byte, and seeded random bit flips, overwritten bytes, inserted or deleted runs
and trailing garbage. A frame that still parses must have been walked by the prescan
exactly as kio read it, since the prescan's length checks guard kio's allocations only if
both read the same layout. Everything is deterministic; a failure names the frame in hex.
"""

from __future__ import annotations

import asyncio
import io
import random
import re
import struct
import subprocess
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from datetime import timedelta
from functools import cache
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from fuzz_cluster import running_cluster
from kio.schema.api_versions.v3 import request as api_versions_req
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12 import request as metadata_req
from kio.schema.request_header.v2 import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_schema_field_type,
)
from kio.static.primitive import Records

from minibroker.network.client import KafkaConnection
from minibroker.network.codec import (
    DEFAULT_MAX_REQUEST_SIZE,
    SUPPORTED_API_VERSIONS,
    ApiKey,
    KafkaProtocolError,
    Request,
    encode_request,
    parse_request,
    read_frame,
    request_schema,
)
from minibroker.network.prescan import Underflow, check_layout

CORRELATION_ID = 7
CLIENT_ID = "fuzz"
HEADER_PREFIX = 8  # api key, api version, correlation id: the parser's own checks read these
RANDOM_SEED = 0x5EED
RANDOM_PER_SEED = 1000
BROKER_SAMPLE = 200  # corrupted frames sent to the real broker, each on its own connection
STARTUP_TIMEOUT_S = 30

# One valid value per Kafka type a request of a supported version carries.
SAMPLE_VALUES: dict[str, object] = {
    "bool": True, "int8": 1, "int16": 1, "int32": 1, "int64": 1, "string": "s", "bytes": b"b",
    "records": Records(b"r"), "uuid": UUID(int=1),
    "timedelta_i32": timedelta(milliseconds=1), "timedelta_i64": timedelta(milliseconds=1),
}

# Overwrites tried at every byte after the fixed header prefix: (name, bytes, how many of
# the seed's bytes they replace). Whatever the byte holds, one of them is the corruption of
# that field's type: a boolean, an int16 or int32 length, a compact length or tag count.
SPLICES: tuple[tuple[str, bytes, int], ...] = (
    ("boolean 0x07", b"\x07", 1),
    ("int16 length -2", b"\xff\xfe", 2),
    ("int16 length 32767", b"\x7f\xff", 2),
    ("int32 length -16", b"\xff\xff\xff\xf0", 4),
    ("int32 length 2**31-1", b"\x7f\xff\xff\xff", 4),
    ("compact length 2**32", b"\x81\x80\x80\x80\x10", 1),
    ("varint that never ends", b"\xff" * 12, 1),
    ("unknown tagged field 99", b"\x01\x63\x00", 1),
    ("tagged field 0 claiming 127 bytes", b"\x01\x00\x7f", 1),
    ("2**28 tagged fields", b"\xff\xff\xff\x7f", 1),
)


def populated(entity_type: type) -> Any:
    """An instance of a kio entity with every field set: arrays of one element, nullable
    fields present, tagged fields given, so its encoding holds every field the version has."""
    values: dict[str, object] = {}
    for schema_field in fields(entity_type):
        match classify_field(schema_field):
            case EntityField(nested):
                value: object = populated(nested)
            case EntityTupleField(nested):
                value = (populated(nested),)
            case PrimitiveField():
                value = SAMPLE_VALUES[get_schema_field_type(schema_field)]
            case PrimitiveTupleField():
                value = (SAMPLE_VALUES[get_schema_field_type(schema_field)],)
        values[schema_field.name] = value
    return entity_type(**values)


def advertised_versions() -> list[tuple[ApiKey, int]]:
    return [(api, version) for api, (low, high) in sorted(SUPPORTED_API_VERSIONS.items())
            for version in range(low, high + 1)]


@cache
def seeds() -> dict[str, bytes]:
    """A valid frame (without its size prefix) per advertised version, by name; and an
    ApiVersions newer than the broker's, whose header alone is parsed (KIP-511)."""
    frames = {f"{api.name} v{version}": encode_request(
        populated(request_schema(api, version)), CORRELATION_ID, CLIENT_ID)[4:]
        for api, version in advertised_versions()}
    newest = SUPPORTED_API_VERSIONS[ApiKey.API_VERSIONS][1]
    header = RequestHeaderV2(request_api_key=ApiKey.API_VERSIONS, request_api_version=newest + 1,
                             correlation_id=CORRELATION_ID, client_id=CLIENT_ID)
    buffer = io.BytesIO()
    entity_writer(RequestHeaderV2)(buffer, header)
    frames[f"API_VERSIONS v{newest + 1}"] = buffer.getvalue() + b"\x02\x03abc\x00\x00"
    return frames


def splices(seed: bytes) -> Iterator[tuple[str, bytes]]:
    for position in range(HEADER_PREFIX, len(seed)):
        for name, data, width in SPLICES:
            yield f"{name} at byte {position}", seed[:position] + data + seed[position + width:]


def truncations(seed: bytes) -> Iterator[tuple[str, bytes]]:
    for cut in range(len(seed)):
        yield f"cut to {cut} bytes", seed[:cut]


def random_corruptions(seed: bytes, rng: random.Random) -> Iterator[tuple[str, bytes]]:
    mutations: tuple[Callable[[bytearray], str], ...] = (
        lambda frame: _flip_bits(frame, rng), lambda frame: _overwrite(frame, rng),
        lambda frame: _insert(frame, rng), lambda frame: _delete(frame, rng),
        lambda frame: _append(frame, rng),
    )
    for _ in range(RANDOM_PER_SEED):
        frame = bytearray(seed)
        described = [rng.choice(mutations)(frame) for _ in range(rng.randint(1, 3))
                     if len(frame) > HEADER_PREFIX]  # deletions may leave only the prefix
        yield ", ".join(described), bytes(frame)


def _flip_bits(frame: bytearray, rng: random.Random) -> str:
    position = rng.randrange(len(frame))
    bit = rng.randrange(8)
    frame[position] ^= 1 << bit
    return f"bit {bit} of byte {position} flipped"


def _overwrite(frame: bytearray, rng: random.Random) -> str:
    position = rng.randrange(HEADER_PREFIX, len(frame))
    frame[position] = rng.randrange(256)
    return f"byte {position} overwritten"


def _insert(frame: bytearray, rng: random.Random) -> str:
    position = rng.randrange(HEADER_PREFIX, len(frame) + 1)
    frame[position:position] = rng.randbytes(rng.randint(1, 8))
    return f"bytes inserted at {position}"


def _delete(frame: bytearray, rng: random.Random) -> str:
    position = rng.randrange(HEADER_PREFIX, len(frame))
    del frame[position:position + rng.randint(1, 8)]
    return f"bytes deleted at {position}"


def _append(frame: bytearray, rng: random.Random) -> str:
    frame.extend(rng.randbytes(rng.randint(1, 32)))
    return "trailing garbage"


@cache
def corpus() -> tuple[tuple[str, bytes], ...]:
    """Every corrupted frame, labelled with its seed and mutation, in a fixed order."""
    rng = random.Random(RANDOM_SEED)
    frames: list[tuple[str, bytes]] = []
    for name, seed in seeds().items():
        for generate in (splices(seed), truncations(seed), random_corruptions(seed, rng)):
            frames.extend((f"{name}: {how}", frame) for how, frame in generate)
    return tuple(frames)


@dataclass
class Outcomes:
    parsed: int = 0
    rejected: int = 0
    causes: Counter[str] = field(default_factory=Counter)  # the rejections' __cause__ types
    other: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # error -> a frame


def _error_kind(exc: Exception) -> str:
    """The exception's type and message with its numbers (tags, sizes, offsets) elided."""
    cls = type(exc)
    name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__name__}"
    return re.sub(r"\d+", "N", f"{name}: {exc}")


def prescan_disagreement(frame: bytes, request: Request) -> str | None:
    """Where the prescan's walk of an accepted frame ends elsewhere than kio's read."""
    if request.body is None:
        return None  # a too-new ApiVersions: only its header is read
    body_type = request_schema(request.api_key, request.api_version)
    offset = 0
    for entity_type in (body_type.__header_schema__, body_type):
        walked = check_layout(entity_type, frame, offset)
        _, size = entity_reader(entity_type)(frame, offset)
        if walked != offset + size:
            return f"{entity_type.__name__}: the prescan ends at {walked}, kio at {offset + size}"
        offset = walked
    return None


def parse_all(frames: tuple[tuple[str, bytes], ...]) -> Outcomes:
    outcomes = Outcomes()
    for label, frame in frames:
        try:
            request = parse_request(frame)
        except KafkaProtocolError as exc:
            outcomes.rejected += 1
            outcomes.causes[type(exc.__cause__).__name__] += 1
        except Exception as exc:  # the contract under test: nothing else escapes
            outcomes.other.setdefault(_error_kind(exc), (label, frame))
        else:
            outcomes.parsed += 1
            if (disagreement := prescan_disagreement(frame, request)) is not None:
                outcomes.other.setdefault(re.sub(r"\d+", "N", disagreement), (label, frame))
    return outcomes


def test_seeds_are_every_advertised_version_and_parse() -> None:
    frames = seeds()
    assert len(frames) == len(advertised_versions()) + 1
    for api, version in advertised_versions():
        request = parse_request(frames[f"{api.name} v{version}"])
        assert (request.api_key, request.api_version) == (api, version)
        assert request.body == populated(request_schema(api, version))


def test_corrupted_frames_parse_or_raise_kafka_protocol_error() -> None:
    frames = corpus()
    outcomes = parse_all(frames)
    assert not outcomes.other, "\n".join(
        ["errors other than KafkaProtocolError, or layouts the prescan reads otherwise than kio:"]
        + [f"{error}\n    from {label}: {frame.hex()}"
           for error, (label, frame) in sorted(outcomes.other.items())])
    assert outcomes.parsed + outcomes.rejected == len(frames) > 50_000
    # The corpus reaches each way a body fails to decode: the prescan's length checks, and
    # the errors kio's reader raises itself (a bad boolean, an unknown tagged field).
    assert {"Underflow", "ValueError", "KeyError"} <= set(outcomes.causes), outcomes.causes
    assert outcomes.parsed > 0  # trailing garbage and harmless flips are still requests


def test_the_example_from_the_field_is_a_protocol_error() -> None:
    """Metadata v12 whose allow_auto_topic_creation byte is 7."""
    with pytest.raises(KafkaProtocolError, match="malformed METADATA request") as raised:
        parse_request(bytes.fromhex("0003000c000000050001630000070000"))
    assert (raised.value.api_key, raised.value.api_version) == (3, 12)
    assert isinstance(raised.value.__cause__, ValueError)
    assert not isinstance(raised.value.__cause__, Underflow)


# -- a real broker -------------------------------------------------------------------------

_WARNING = re.compile(r" WARNING closing connection from 127\.0\.0\.1:(\d+): (.*) "
                      r"\(minibroker\.network\.kafka_server\)$")


@dataclass(frozen=True)
class Broker:
    port: int
    log: Path
    process: subprocess.Popen[bytes]

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def warnings_by_port(self) -> dict[int, list[str]]:
        found: dict[int, list[str]] = defaultdict(list)
        for line in self.log.read_text().splitlines():
            if match := _WARNING.search(line):
                found[int(match[1])].append(match[2])
        return found


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A controller and one broker (``minibroker cluster``) in their own process group."""
    # the consumer's group.id makes librdkafka look its coordinator up
    with running_cluster(tmp_path_factory.mktemp("fuzz"), 1,
                         ("offsets.topic.num.partitions=1",)) as cluster:
        yield Broker(cluster.port(1), cluster.log, cluster.process)


def broker_sample() -> list[tuple[str, bytes]]:
    """(label, bytes to send): a deterministic sample of the frames the codec rejects,
    size-prefixed, and size prefixes that are bad themselves."""
    rejected: list[tuple[str, bytes]] = []
    for label, frame in corpus():
        try:
            parse_request(frame)
        except KafkaProtocolError:
            rejected.append((label, struct.pack(">i", len(frame)) + frame))
    metadata = seeds()["METADATA v12"]
    return [*random.Random(RANDOM_SEED).sample(rejected, BROKER_SAMPLE),
            ("negative size", struct.pack(">i", -1) + metadata),
            ("size over socket.request.max.bytes",
             struct.pack(">i", DEFAULT_MAX_REQUEST_SIZE + 1) + metadata),
            ("size claiming more than is sent", struct.pack(">i", len(metadata) + 9) + metadata)]


async def codec_error(data: bytes) -> str:
    """What the broker's codec says of ``data`` arriving on a connection the peer then
    half-closes: the text its warning must carry."""
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    try:
        frame = await read_frame(reader, DEFAULT_MAX_REQUEST_SIZE)
        assert frame is not None
        parse_request(frame)
    except KafkaProtocolError as exc:
        return str(exc)
    raise AssertionError(f"the codec accepts {data.hex()}")


async def send_each_on_its_own_connection(port: int, sample: list[tuple[str, bytes]]
                                          ) -> list[tuple[int, str, str]]:
    """Send each corrupted frame on a fresh connection, then half-close it: the broker must
    close the connection without a byte of answer. Returns (local port, label, the codec's
    error) per connection."""
    sent: list[tuple[int, str, str]] = []
    for label, data in sample:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        local_port = writer.get_extra_info("sockname")[1]
        writer.write(data)
        writer.write_eof()
        try:
            answer = await asyncio.wait_for(reader.read(), 10)
        except ConnectionResetError:
            answer = b""  # closed with some of our bytes unread: an RST instead of a FIN
        writer.close()
        assert answer == b"", f"{label}: the broker answered {answer.hex()}"
        sent.append((local_port, label, await codec_error(data)))
    return sent


def lists_itself(port: int) -> bool:
    """Whether the broker's Metadata names a broker: it does once the controller unfenced
    it, and a stock admin client waits for that to find the controller."""

    async def brokers() -> tuple[object, ...]:
        conn = await KafkaConnection.connect("127.0.0.1", port, client_id="fuzz-check")
        try:
            return (await conn.request(metadata_req.MetadataRequest(
                topics=None, include_topic_authorized_operations=False))).brokers
        finally:
            conn.close()

    try:
        return bool(asyncio.run(brokers()))
    except OSError:  # KafkaClientError's subclasses are OSErrors: not listening yet
        return False


async def advertised(port: int) -> dict[int, tuple[int, int]]:
    conn = await KafkaConnection.connect("127.0.0.1", port, client_id="fuzz-check")
    try:
        response = await conn.request(api_versions_req.ApiVersionsRequest(
            client_software_name="fuzz", client_software_version="1"))
    finally:
        conn.close()
    assert response.error_code == ErrorCode.none
    return {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}


def create_topic(bootstrap: str, topic: str) -> bool:
    """Create ``topic`` with a stock admin client; False if the broker refused it."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    (future,) = admin.create_topics([NewTopic(topic, 1, 1)], request_timeout=5).values()
    try:
        future.result(10)
    except KafkaException:
        return False
    return True


def produce_and_consume(bootstrap: str, topic: str, values: list[bytes]) -> list[bytes]:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    errors: list[object] = []
    for value in values:
        producer.produce(topic, value, partition=0,
                         on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(20) == 0
    assert errors == [None] * len(values)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "fuzz-survivor",
                         "enable.auto.commit": False})
    read: list[bytes] = []
    try:
        consumer.assign([CkTopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 20
        while len(read) < len(values) and time.monotonic() < deadline:
            for message in consumer.consume(len(values), 0.5):
                assert message.error() is None, message.error()
                read.append(message.value())
    finally:
        consumer.close()
    return read


@pytest.mark.slow
def test_a_broker_closes_each_corrupted_connection_and_serves_a_stock_client(broker: Broker
                                                                             ) -> None:
    for what, ready in (("the broker to be unfenced", lambda: lists_itself(broker.port)),
                        ("a topic", lambda: create_topic(broker.bootstrap, "after"))):
        wait_for(lambda ready=ready: broker.process.poll() is not None or ready(),
                 STARTUP_TIMEOUT_S, what)
        assert broker.process.poll() is None, broker.log.read_text()[-3000:]
    # The seeds above are exactly what this broker advertises.
    assert asyncio.run(advertised(broker.port)) == {
        api: range_ for api, range_ in SUPPORTED_API_VERSIONS.items()}

    sample = broker_sample()
    sent = asyncio.run(send_each_on_its_own_connection(broker.port, sample))

    # One warning per connection, naming the peer and what the codec found: the API, its
    # version and the correlation id when the header was readable.
    wait_for(lambda: sum(map(len, broker.warnings_by_port().values())) >= len(sent), 10,
             "a warning for every corrupted connection")
    logged = broker.warnings_by_port()
    for local_port, label, error in sent:
        assert error in logged[local_port], f"{label}: {error!r} not in {logged[local_port]}"
        logged[local_port].remove(error)
    assert not any(logged.values()), logged

    values = [f"after-fuzz-{i}".encode() for i in range(20)]
    assert produce_and_consume(broker.bootstrap, "after", values) == values
    assert broker.process.poll() is None
    text = broker.log.read_text()
    for sign in (" ERROR ", "Traceback", "Unhandled exception"):
        assert sign not in text, text[max(text.index(sign) - 200, 0):][:3000]
