"""Schema-aware request frames: valid requests of every API version a broker advertises,
drawn from the protocol's own schemas, and the same requests corrupted where their layout
says a length, a count, a tag or a varint is.

Long (about 640 lines): the value drawer, the layout-recording encoder and the mutations
are one walk over kio's request classes, and each needs the others' positions.

The byte-level fuzzer (``test_protocol_fuzz.py``) corrupts one fixed request per version,
so past the codec the handlers only ever see that one request's values. Here each frame is
a fresh request: kio's request class for the version is walked field by field (the
dataclass fields and their ``kafka_type``, as kio's own serializer walks them) and every
value is drawn for its type: integers of each width at their boundaries, small or of any
magnitude; strings empty, long, non-ASCII or null where nullable; arrays empty, of one or of
thousands of elements; tagged fields present or absent; record batches valid (with their
CRC), damaged or not batches at all. Names the cluster knows (its topics, their ids, a few
groups) are drawn often, so valid requests reach the handlers' deeper paths rather than
stopping at UNKNOWN_TOPIC_OR_PARTITION.

The encoder is this module's own (the layout rules are Kafka's, as kio's writers apply
them; ``test_schema_fuzz.py`` checks that kio reads back what it wrote) because it records
where each length, count, boolean, nullable-struct marker, tag and string lies in the
frame. Half the frames are then corrupted beyond their types at one of those places, or
as a whole (``frame_mutations``). Every frame is a pure function of (seed, index), so a
failure names the one frame that reproduces it. Elements past the first of a long array
repeat it, so that thousands of elements cost one draw: a request naming one partition
thousands of times is what a careless client's loop sends.

What the broker must do with each (``Expect``): answer a valid request (or hold it, for the
requests that wait: Fetch, Produce with acks=-1, JoinGroup, SyncGroup); close the connection
of a request over ``max.request.elements``; send nothing for a Produce with acks=0; and for
a corrupted frame, either answer (a corruption may still parse, as trailing bytes do) or
close that one connection, as Kafka's ``SocketServer`` does when parsing fails.

What is held back, and why: topics are created only under a few names of a pool, and with
a few partitions or a count Kafka refuses (over its 10,000 per request), so the cluster's
state stays small; likewise CreatePartitions grows only the pool's new topics, to a few
partitions or a count Kafka refuses, and DeleteTopics deletes only those (by name: a topic
id drawn for it is never one of the cluster's), so the topics the fuzzer reads and writes
stay, and so does ``__consumer_offsets``. ``docs/design.md`` ("Resource limits") records
that creating thousands of partitions at once is not bounded yet; a fuzzer that did it would
measure that, not the protocol. Likewise durations that make a request wait (a Fetch's max
wait, a timeout) are short 70% of the time, so that most requests are answered within the
sender's patience.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable, Sequence
from dataclasses import Field, dataclass, fields
from enum import Enum
from functools import cache
from types import UnionType
from typing import Union, get_origin
from uuid import UUID

import crc32c
from frame_mutations import MAX_I64_DURATION_MS, Kind, Slot, mutate, read_uvarint, uvarint
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
)

from minibroker.network.codec import SUPPORTED_API_VERSIONS, ApiKey, request_schema
from minibroker.storage.records import build_batch

__all__ = [
    "MAX_REQUEST_ELEMENTS",
    "Expect",
    "Frame",
    "FrameGenerator",
    "Pools",
    "advertised_versions",
]

MAX_REQUEST_ELEMENTS = 10_000  # the broker's max.request.elements default
KAFKA_PARTITIONS_PER_REQUEST = 10_000  # Kafka's ReplicationControlManager.MAX_PARTITIONS_PER_BATCH

_I8, _I16, _I32, _I64 = (struct.Struct(f">{c}") for c in "bhiq")
_PACKERS = {"int8": _I8, "int16": _I16, "int32": _I32, "int64": _I64,
            "timedelta_i32": _I32, "timedelta_i64": _I64}
_ARRAY_BYTES = 1 << 20  # the most one array's repeated elements take
_BITS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64, "timedelta_i32": 32}


class Expect(Enum):
    """What the broker owes the sender of a frame."""

    ANSWER = "answer"  # a valid request: an answer, or held while it waits
    NOTHING = "nothing"  # Produce with acks=0: no answer; a failed one closes the connection
    CLOSE = "close"  # valid but over max.request.elements: the connection is closed
    EITHER = "either"  # corrupted: an answer if it still parses, else the connection closed


@dataclass(frozen=True, slots=True)
class Frame:
    """One request as sent: ``data`` starts with its size prefix. ``mutation`` says how it
    was corrupted (None: a valid request). A ``single_use`` frame is followed by the end of
    the connection (its size prefix lies, or it gets no answer), so nothing else shares it."""

    index: int
    api_key: int
    api_version: int
    data: bytes
    mutation: str | None
    expect: Expect
    single_use: bool


@dataclass(frozen=True)
class Pools:
    """Names the cluster knows, drawn often so that valid requests reach past the lookup:
    ``topics`` exist (``topic_ids`` are theirs), ``new_topics`` are the only names a
    CreateTopics may create."""

    topics: tuple[str, ...] = ("fuzz-0", "fuzz-1", "__consumer_offsets")
    topic_ids: tuple[UUID, ...] = ()
    new_topics: tuple[str, ...] = tuple(f"fuzz-new-{i}" for i in range(6))
    groups: tuple[str, ...] = tuple(f"fuzz-group-{i}" for i in range(4))


def advertised_versions() -> list[tuple[ApiKey, int]]:
    return [(api, version) for api, (low, high) in sorted(SUPPORTED_API_VERSIONS.items())
            for version in range(low, high + 1)]


# -- the layout map -------------------------------------------------------------------------

class _Out:
    """The frame being written (header and body, no size prefix) and its layout map."""

    __slots__ = ("buf", "elements", "slots")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.slots: list[Slot] = []
        self.elements = 0  # array elements and tagged fields, as the broker's prescan counts

    def mark(self, kind: Kind, start: int, nullable: bool = False) -> None:
        self.slots.append(Slot(kind, start, len(self.buf), nullable))

    def uvarint(self, value: int, kind: Kind | None = None, nullable: bool = False) -> None:
        start = len(self.buf)
        self.buf += uvarint(value)
        if kind is not None:
            self.mark(kind, start, nullable)


# -- drawing values -------------------------------------------------------------------------

Hint = Callable[["_Draw"], object]

_CONFIG_KEYS = ("min.insync.replicas", "retention.ms", "retention.bytes", "cleanup.policy",
                "max.message.bytes", "unclean.leader.election.enable", "flush.messages",
                "segment.ms", "no.such.config")
_CONFIG_VALUES = ("1", "2", "3", "-1", "0", "compact", "delete", "true", "false", "1048576",
                  "86400000", "", "x")
_GROUP_STATES = ("Stable", "Empty", "PreparingRebalance", "CompletingRebalance", "Dead", "?")
_NAME_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"


def _small_index(d: _Draw) -> int:
    return d.rng.choice((0, 0, 1, 2, -1))


def _offset(d: _Draw) -> int:
    return d.rng.choice((-1, 0, 0, 1, d.rng.randint(0, 100)))


def _epoch(d: _Draw) -> int:
    return d.rng.choice((-1, 0, 1, 2))


# Field hints: the values a real client sends, drawn 70% of the time (else any value of the
# type). Looked up by "Entity.field", then by the field's type name, then by its name.
_INT_HINTS: dict[str, Hint] = {
    "partition": _small_index, "partition_index": _small_index, "index": _small_index,
    "partitions": _small_index, "partition_indexes": _small_index,
    "replica_id": lambda d: d.rng.choice((-1, -1, -1, 1, 2, 3)),
    "broker_ids": lambda d: d.rng.choice((1, 2, 3)),
    "acks": lambda d: d.rng.choice((-1, -1, 1, 0)),
    "replication_factor": lambda d: d.rng.choice((1, 2, 3, -1)),
    "generation_id": _epoch, "generation_id_or_member_epoch": _epoch, "member_epoch": _epoch,
    "producer_id": lambda d: d.rng.choice((-1, -1, d.rng.randint(0, 50))),
    "producer_epoch": lambda d: d.rng.choice((-1, 0, 1)),
    "isolation_level": lambda d: d.rng.choice((0, 1)),
    "key_type": lambda d: d.rng.choice((0, 0, 1)),
    "config_operation": lambda d: d.rng.choice((0, 0, 1, 2, 3)),
    "resource_type": lambda d: d.rng.choice((2, 2, 4)),
    "timestamp": lambda d: d.rng.choice((-1, -2, -3, -4, -5, 0)),
    "fetch_offset": _offset, "log_start_offset": _offset, "committed_offset": _offset,
    "leader_epoch": _epoch, "current_leader_epoch": _epoch, "last_fetched_epoch": _epoch,
    "committed_leader_epoch": _epoch,
    "session_id": lambda d: 0, "session_epoch": lambda d: d.rng.choice((-1, 0)),
    "max_bytes": lambda d: d.rng.choice((1 << 20, 1024, 0)),
    "partition_max_bytes": lambda d: d.rng.choice((1 << 20, 1024, 0)),
    "min_bytes": lambda d: d.rng.choice((0, 1)),
    "response_partition_limit": lambda d: d.rng.choice((1, 2, 2000)),
    "replica_epoch": lambda d: -1,
}
# Durations in milliseconds: short, so that a request that waits answers soon.
_DURATION_HINTS: dict[str, Hint] = {
    "max_wait": lambda d: d.rng.randint(0, 100),
    "timeout": lambda d: d.rng.randint(0, 500),
    "rebalance_timeout": lambda d: d.rng.randint(0, 3000),
    "session_timeout": lambda d: d.rng.choice((6000, 10000, d.rng.randint(0, 100))),
    "transaction_timeout": lambda d: 60000,
    "retention_time": lambda d: -1,
}
_STRING_HINTS: dict[str, Hint] = {
    "TopicName": lambda d: d.rng.choice(d.pools.topics),
    "GroupId": lambda d: d.rng.choice(d.pools.groups),
    "key": lambda d: d.rng.choice(d.pools.groups),
    "coordinator_keys": lambda d: d.rng.choice(d.pools.groups),
    "member_id": lambda d: d.rng.choice(("", "", f"fuzz-member-{d.rng.randint(0, 3)}")),
    "group_instance_id": lambda d: d.rng.choice(
        (None, None, f"fuzz-instance-{d.rng.randint(0, 2)}")),
    "protocol_type": lambda d: d.rng.choice(("consumer", "consumer", "connect", "")),
    "protocol_name": lambda d: d.rng.choice(("range", "roundrobin", None)),
    "JoinGroupRequestProtocol.name": lambda d: d.rng.choice(("range", "roundrobin")),
    "CreatableTopic.name": lambda d: d.rng.choice(d.pools.new_topics + d.pools.topics),
    "CreatePartitionsTopic.name": lambda d: d.rng.choice(d.pools.new_topics),
    "DeleteTopicState.name": lambda d: d.rng.choice(d.pools.new_topics),
    "DeleteTopicsRequest.topic_names": lambda d: d.rng.choice(d.pools.new_topics),
    "CreatableTopicConfig.name": lambda d: d.rng.choice(_CONFIG_KEYS),
    "AlterableConfig.name": lambda d: d.rng.choice(_CONFIG_KEYS),
    "CreatableTopicConfig.value": lambda d: d.rng.choice(_CONFIG_VALUES),
    "AlterableConfig.value": lambda d: d.rng.choice(_CONFIG_VALUES),
    "resource_name": lambda d: d.rng.choice((*d.pools.topics, "1")),
    "transactional_id": lambda d: None,
    "client_id": lambda d: d.rng.choice(("fuzz", None, "")),
    "rack_id": lambda d: d.rng.choice(("", "rack-1")),
    "states_filter": lambda d: d.rng.choice(_GROUP_STATES),
    "types_filter": lambda d: d.rng.choice(("classic", "consumer")),
}
# Partitions to create: few, or a count that Kafka refuses outright (see the docstring).
_NUM_PARTITIONS = (1, 2, 3, -1, 0, -2, 32, -(2**31), 2**31 - 1, KAFKA_PARTITIONS_PER_REQUEST + 1)
# A topic's new partition count (CreatePartitions): a few more, none more, or refused.
_PARTITION_COUNTS = (1, 2, 3, 4, 6, 0, -1, -(2**31), 2**31 - 1,
                     KAFKA_PARTITIONS_PER_REQUEST + 4)
# The topic names that may only be the pool's new topics (see ``_only_a_new_topic``).
_NEW_TOPICS_ONLY = frozenset({("CreatePartitionsTopic", "name"), ("DeleteTopicState", "name"),
                              ("DeleteTopicsRequest", "topic_names")})


class _Draw:
    """The random choices of one frame."""

    __slots__ = ("pools", "rng")

    def __init__(self, rng: random.Random, pools: Pools) -> None:
        self.rng = rng
        self.pools = pools

    def integer(self, bits: int, hint: Hint | None) -> int:
        rng = self.rng
        if hint is not None and rng.random() < 0.7:
            return int(hint(self))  # type: ignore[call-overload]
        low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        r = rng.random()
        if r < 0.3:
            return rng.choice((low, low + 1, -1, 0, 1, high - 1, high))
        if r < 0.6:
            return rng.randint(-1, 16)
        magnitude = rng.getrandbits(rng.randint(1, bits - 1))
        return -magnitude if rng.random() < 0.3 else magnitude

    def text(self, hint: Hint | None, nullable: bool) -> str | None:
        rng = self.rng
        if hint is not None and rng.random() < 0.7:
            value = hint(self)
            return value if nullable or value is not None else ""  # type: ignore[return-value]
        if nullable and rng.random() < 0.15:
            return None
        r = rng.random()
        if r < 0.2:
            return ""
        if r < 0.55:
            return "".join(rng.choices(_NAME_CHARS, k=rng.randint(1, 24)))
        if r < 0.8:
            return "".join(map(chr, (rng.randint(0x20, 0x7E)
                                     for _ in range(rng.getrandbits(rng.randint(1, 9))))))
        if r < 0.99:
            return "".join(map(_codepoint, (rng.random() for _ in range(rng.randint(1, 40)))))
        return "x" * rng.randint(250, 32767)

    def blob(self, nullable: bool) -> bytes | None:
        rng = self.rng
        r = rng.random()
        if nullable and r < 0.1:
            return None
        if r < 0.3:
            return b""
        if r < 0.95:
            return rng.randbytes(rng.randint(1, 64))
        return rng.randbytes(rng.getrandbits(rng.randint(7, 14)))

    def records(self) -> bytes | None:
        """A record batch: valid (its CRC right) 60%, with a header field then changed
        (length, magic, codec, counts; the CRC recomputed or not), random bytes, or null."""
        rng = self.rng
        r = rng.random()
        if r < 0.05:
            return None
        if r < 0.15:
            return rng.randbytes(rng.randint(0, 80))
        count = rng.randint(1, 5)
        values = [None if rng.random() < 0.1 else rng.randbytes(rng.randint(0, 100))
                  for _ in range(count)]
        keys = [rng.randbytes(rng.randint(0, 8)) for _ in range(count)] \
            if rng.random() < 0.5 else None
        idempotent = rng.random() < 0.3
        batch = build_batch(
            values, keys=keys, timestamp_ms=rng.choice((0, -1, 1_700_000_000_000)),
            producer_id=rng.randint(0, 50) if idempotent else -1,
            producer_epoch=rng.choice((0, 1)) if idempotent else -1,
            base_sequence=rng.choice((0, 0, 5, 2**31 - 1)) if idempotent else -1)
        if r < 0.75:
            return batch
        return _damaged_batch(bytearray(batch), rng)

    def uuid(self) -> UUID:
        rng = self.rng
        r = rng.random()
        if r < 0.6 and self.pools.topic_ids:
            return rng.choice(self.pools.topic_ids)
        if r < 0.8:
            return UUID(int=0)
        return UUID(int=rng.getrandbits(128))

    def foreign_uuid(self) -> UUID:
        """The zero id or a random one: not one of the cluster's topics."""
        rng = self.rng
        return UUID(int=0) if rng.random() < 0.5 else UUID(int=rng.getrandbits(128))

    def count(self, depth: int, nullable: bool) -> int | None:
        rng = self.rng
        if nullable and rng.random() < 0.1:
            return None
        r = rng.random()
        if r < 0.15:
            return 0
        if r < 0.6:
            return 1
        if r < 0.8 or depth > 1:
            return rng.randint(2, 3)
        if r < 0.97 or depth > 0:  # many elements only in the outermost arrays
            return rng.randint(4, 16)
        if r < 0.997:
            return rng.randint(17, 300)
        return rng.randint(MAX_REQUEST_ELEMENTS - 100, MAX_REQUEST_ELEMENTS + 2000)


def _codepoint(r: float) -> str:
    """Any Unicode scalar value, surrogates excepted (they have no UTF-8 form)."""
    code = int(r * 0x10F800)
    return chr(code + 0x800 if code >= 0xD800 else code)


_BATCH_FIELDS = (  # (offset, struct) of RecordBatch v2 header fields a corruption rewrites
    (8, _I32),  # batchLength
    (16, _I8),  # magic
    (21, _I16),  # attributes: the compression codec, transactional, control bits
    (23, _I32),  # lastOffsetDelta
    (43, _I64),  # producerId
    (53, _I32),  # baseSequence
    (57, _I32),  # recordsCount
)


def _damaged_batch(batch: bytearray, rng: random.Random) -> bytes:
    offset, packer = rng.choice(_BATCH_FIELDS)
    bits = packer.size * 8
    packer.pack_into(batch, offset, rng.choice(
        (0, 1, -1, 2, 3, 7, -(1 << (bits - 1)), (1 << (bits - 1)) - 1)))
    if rng.random() < 0.5:  # the CRC recomputed, so only the field is wrong
        struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    if rng.random() < 0.2:
        del batch[rng.randrange(len(batch)):]
    return bytes(batch)


# -- writing a request from its schema ------------------------------------------------------

Step = Callable[[_Draw, _Out, int], None]


def _nullable_outer(schema_field: Field) -> bool:
    return get_origin(schema_field.type) in (UnionType, Union)


def _hint(table: dict[str, Hint], owner: str, schema_field: Field, item_type: object
          ) -> Hint | None:
    for key in (f"{owner}.{schema_field.name}", getattr(item_type, "__name__", ""),
                schema_field.name):
        if key in table:
            return table[key]
    return None


def _primitive_step(kafka_type: str, compact: bool, nullable: bool, owner: str,
                    schema_field: Field, item_type: object) -> Step:
    if kafka_type == "bool":
        def write_bool(d: _Draw, out: _Out, _depth: int) -> None:
            start = len(out.buf)
            out.buf.append(d.rng.random() < 0.5)
            out.mark(Kind.BOOL, start)
        return write_bool
    if kafka_type in ("int8", "int16", "int32", "int64"):
        packer, bits = _PACKERS[kafka_type], _BITS[kafka_type]
        hint = _hint(_INT_HINTS, owner, schema_field, item_type)
        if owner == "CreatableTopic" and schema_field.name == "num_partitions":
            def write_partitions(d: _Draw, out: _Out, _depth: int) -> None:
                out.buf += packer.pack(d.rng.choice(_NUM_PARTITIONS))
            return write_partitions
        if owner == "CreatePartitionsTopic" and schema_field.name == "count":
            def write_count(d: _Draw, out: _Out, _depth: int) -> None:
                out.buf += packer.pack(d.rng.choice(_PARTITION_COUNTS))
            return write_count

        def write_int(d: _Draw, out: _Out, _depth: int) -> None:
            out.buf += packer.pack(d.integer(bits, hint))
        return write_int
    if kafka_type == "timedelta_i32":
        hint = _hint(_DURATION_HINTS, owner, schema_field, item_type)

        def write_duration(d: _Draw, out: _Out, _depth: int) -> None:
            out.buf += _I32.pack(d.integer(32, hint))
        return write_duration
    if kafka_type == "timedelta_i64":
        hint = _hint(_DURATION_HINTS, owner, schema_field, item_type)

        def write_long_duration(d: _Draw, out: _Out, _depth: int) -> None:
            start = len(out.buf)
            value = d.integer(64, hint)
            out.buf += _I64.pack(max(-MAX_I64_DURATION_MS, min(value, MAX_I64_DURATION_MS)))
            out.mark(Kind.DURATION64, start)
        return write_long_duration
    if kafka_type == "uuid":
        foreign = owner == "DeleteTopicState"  # never a topic of the cluster's

        def write_uuid(d: _Draw, out: _Out, _depth: int) -> None:
            out.buf += (d.foreign_uuid() if foreign else d.uuid()).bytes
        return write_uuid
    if kafka_type == "string":
        hint = _hint(_STRING_HINTS, owner, schema_field, item_type)
        creatable = owner == "CreatableTopic" and schema_field.name == "name"
        new_only = (owner, schema_field.name) in _NEW_TOPICS_ONLY

        def write_string(d: _Draw, out: _Out, _depth: int) -> None:
            value = d.text(hint, nullable)
            if creatable and value is not None:
                value = _not_a_new_topic(value, d.pools)
            elif new_only and value is not None:
                value = _only_a_new_topic(value, d.pools)
            _write_sized(out, None if value is None else value.encode(), compact, 2, nullable,
                         text=True)
        return write_string
    if kafka_type in ("bytes", "records"):
        def write_bytes(d: _Draw, out: _Out, _depth: int) -> None:
            value = d.records() if kafka_type == "records" else d.blob(nullable)
            _write_sized(out, value, compact, 4, nullable, text=False)
        return write_bytes
    raise TypeError(f"no generator for Kafka type {kafka_type!r} ({owner}.{schema_field.name})")


def _not_a_new_topic(name: str, pools: Pools) -> str:
    """Any name drawn for CreateTopics that is not one of the pool's is made invalid (a
    space), so that only the pool's few topics can ever be created."""
    if name in pools.new_topics or name in pools.topics:
        return name
    if name and len(name) <= 249 and all(c in _NAME_CHARS for c in name):
        return name + " "
    return name


def _only_a_new_topic(name: str, pools: Pools) -> str:
    """A name drawn for CreatePartitions or DeleteTopics that is one of the cluster's own
    topics is made invalid (a space): only the pool's new topics grow or go."""
    return name + " " if name in pools.topics else name


def _write_sized(out: _Out, value: bytes | None, compact: bool, legacy_width: int,
                 nullable: bool, text: bool) -> None:
    start = len(out.buf)
    if compact:
        out.uvarint(0 if value is None else len(value) + 1)
        out.mark(Kind.ULEN, start, nullable)
    else:
        size = -1 if value is None else len(value)
        out.buf += (_I16 if legacy_width == 2 else _I32).pack(size)
        out.mark(Kind.LEN16 if legacy_width == 2 else Kind.LEN32, start, nullable)
    if value:
        start = len(out.buf)
        out.buf += value
        if text:
            out.mark(Kind.TEXT, start)


def _array_step(item: Step, compact: bool, nullable: bool) -> Step:
    def write_array(d: _Draw, out: _Out, depth: int) -> None:
        count = d.count(depth, nullable)
        start = len(out.buf)
        if compact:
            out.uvarint(0 if count is None else count + 1)
            out.mark(Kind.ULEN, start, nullable)
        else:
            out.buf += _I32.pack(-1 if count is None else count)
            out.mark(Kind.LEN32, start, nullable)
        if not count:
            return
        out.elements += count
        first, elements_before = len(out.buf), out.elements
        item(d, out, depth + 1)
        if count > 1:  # the rest repeat the first: thousands of elements cost one draw
            element = bytes(out.buf[first:])
            repeats = min(count - 1, _ARRAY_BYTES // max(len(element), 1))
            out.elements += (out.elements - elements_before) * repeats
            out.buf += element * repeats
            if repeats < count - 1:  # as many as fit in _ARRAY_BYTES: the count says so
                out.elements -= count - 1 - repeats
                _set_count(out, start, compact, repeats + 1)
    return write_array


def _set_count(out: _Out, at: int, compact: bool, count: int) -> None:
    """Rewrite the array count at ``at``; the layout map follows if its width changes."""
    if not compact:
        _I32.pack_into(out.buf, at, count)
        return
    _, end = read_uvarint(out.buf, at)
    encoded = uvarint(count + 1)
    out.buf[at:end] = encoded
    shift = len(encoded) - (end - at)
    out.slots = [s if s.start < at else Slot(s.kind, s.start + shift * (s.start > at),
                                              s.end + shift, s.nullable) for s in out.slots]


def _field_step(owner: type, schema_field: Field, flexible: bool, is_tag: bool) -> Step:
    name = owner.__name__
    # RequestHeader.client_id keeps the legacy string form even in flexible headers.
    compact = flexible and not (name == "RequestHeader" and schema_field.name == "client_id")
    nullable = _nullable_outer(schema_field) and not is_tag
    match classify_field(schema_field):
        case PrimitiveField(item_type):
            return _primitive_step(get_schema_field_type(schema_field), compact, nullable,
                                   name, schema_field, item_type)
        case PrimitiveTupleField(item_type):
            item = _primitive_step(get_schema_field_type(schema_field), compact, False, name,
                                   schema_field, item_type)
            return _array_step(item, flexible, nullable)
        case EntityField(nested):
            entity = _entity_step(nested)
            return _nullable_struct(entity) if nullable else entity
        case EntityTupleField(nested):
            return _array_step(_entity_step(nested), flexible, nullable)
    raise TypeError(f"unclassifiable field {name}.{schema_field.name}")


def _nullable_struct(entity: Step) -> Step:
    def write_nullable(d: _Draw, out: _Out, depth: int) -> None:
        start = len(out.buf)
        present = d.rng.random() < 0.85
        out.buf += _I8.pack(1 if present else -1)
        out.mark(Kind.MARKER, start)
        if present:
            entity(d, out, depth)
    return write_nullable


@cache
def _entity_step(entity_type: type) -> Step:
    flexible: bool = entity_type.__flexible__
    steps: list[Step] = []
    tagged: list[tuple[int, Step]] = []
    for schema_field in fields(entity_type):
        if entity_type.__name__ == "RequestHeader" and schema_field.name != "client_id":
            continue  # api key, version and correlation id are the frame's own
        tag = get_field_tag(schema_field)
        step = _field_step(entity_type, schema_field, flexible, tag is not None)
        if tag is None:
            steps.append(step)
        else:
            tagged.append((tag, step))
    tagged.sort(key=lambda pair: pair[0])

    def write_entity(d: _Draw, out: _Out, depth: int) -> None:
        for step in steps:
            step(d, out, depth)
        if flexible:
            _write_tagged(d, out, depth, [pair for pair in tagged if d.rng.random() < 0.5])

    return write_entity


def _write_tagged(d: _Draw, out: _Out, depth: int, present: list[tuple[int, Step]]) -> None:
    out.uvarint(len(present), Kind.TAG_COUNT)
    out.elements += len(present)
    for tag, step in present:
        out.uvarint(tag, Kind.TAG)
        size_at, slots_before = len(out.buf), len(out.slots)
        step(d, out, depth)
        size = uvarint(len(out.buf) - size_at)
        out.buf[size_at:size_at] = size  # the size goes before the value it measures
        out.slots[slots_before:] = [Slot(s.kind, s.start + len(size), s.end + len(size),
                                         s.nullable) for s in out.slots[slots_before:]]
        out.slots.insert(slots_before, Slot(Kind.TAG_SIZE, size_at, size_at + len(size)))


def encode(api_key: int, api_version: int, correlation_id: int, draw: _Draw) -> _Out:
    """A valid request of this version, values drawn by ``draw``: header and body."""
    body_type = request_schema(api_key, api_version)
    out = _Out()
    out.buf += struct.pack(">hhi", api_key, api_version, correlation_id)
    _entity_step(body_type.__header_schema__)(draw, out, 0)
    header_elements, out.elements = out.elements, 0  # the prescan budgets each part
    _entity_step(body_type)(draw, out, 0)
    out.elements = max(out.elements, header_elements)
    return out


# -- frames ---------------------------------------------------------------------------------

class FrameGenerator:
    """Frame ``index`` of a fuzzing run with ``seed``: an advertised (API, version) drawn
    uniformly, a valid request of it, corrupted with probability ``corrupt``."""

    def __init__(self, seed: int, pools: Pools | None = None, corrupt: float = 0.5,
                 max_request_elements: int = MAX_REQUEST_ELEMENTS) -> None:
        self.seed = seed
        self.pools = pools or Pools()
        self.corrupt = corrupt
        self.max_request_elements = max_request_elements
        self.targets: Sequence[tuple[ApiKey, int]] = advertised_versions()

    def frame(self, index: int) -> Frame:
        rng = random.Random(self.seed * 1_000_000_007 + index)
        api_key, api_version = rng.choice(self.targets)
        correlation_id = index & 0x7FFFFFFF
        out = encode(api_key, api_version, correlation_id, _Draw(rng, self.pools))
        if rng.random() < self.corrupt:
            data, how, single_use = mutate(out.buf, out.slots, api_key, api_version, rng)
            return Frame(index, api_key, api_version, data, how, Expect.EITHER, single_use)
        data = _I32.pack(len(out.buf)) + bytes(out.buf)
        if out.elements > self.max_request_elements:
            expect = Expect.CLOSE
        elif api_key == ApiKey.PRODUCE and _acks(out) == 0:
            expect = Expect.NOTHING
        else:
            expect = Expect.ANSWER
        return Frame(index, api_key, api_version, data, None, expect,
                     single_use=expect is Expect.NOTHING)


def _acks(out: _Out) -> int:
    """A Produce request's acks: after the header and the transactional id (v3+)."""
    buf = out.buf
    pos = 8
    (client_id_size,) = _I16.unpack_from(buf, pos)
    pos += 2 + max(client_id_size, 0)
    version = _I16.unpack_from(buf, 2)[0]
    if version >= 9:  # flexible: a header tag section, a compact nullable string
        _, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        pos += max(size - 1, 0)
    else:
        (size,) = _I16.unpack_from(buf, pos)
        pos += 2 + max(size, 0)
    return _I16.unpack_from(buf, pos)[0]
