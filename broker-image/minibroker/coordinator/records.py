"""The records of ``__consumer_offsets``, byte for byte as Kafka writes them.

A group's state lives in the log: every committed offset is one record keyed by (group,
topic, partition), every completed generation one record keyed by the group, and the latest
record of a key wins when a new coordinator replays the partition. Keeping Kafka's exact
formats (group-coordinator/src/main/resources/common/message/: ``OffsetCommitKey`` with key
version 1, ``GroupMetadataKey`` with key version 2, ``OffsetCommitValue`` and
``GroupMetadataValue`` written at value version 3, the highest non-flexible version Kafka
3.9's ``GroupMetadataManager`` writes) means Kafka's own tooling
(``kafka-console-consumer --formatter ...OffsetsMessageFormatter``) could read what
minibroker wrote, and a broken record is a broken Kafka record.

Each key and value starts with its int16 version; strings are int16-length UTF-8 (-1:
null), bytes int32-length. Values 0 to 3 are read (the flexible version 4 only appears
where a Kafka 3.5+ broker wrote tagged fields, which minibroker never does). A null value
is a tombstone.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from minibroker.coordinator.consumer.records import KEY_VERSIONS as CONSUMER_KEY_VERSIONS
from minibroker.coordinator.consumer.records import (
    ConsumerGroupKey,
    CorruptConsumerRecordError,
    decode_consumer_key,
)

__all__ = [
    "CorruptGroupRecordError",
    "GroupMetadataKey",
    "GroupMetadataValue",
    "MemberRecord",
    "OffsetAndMetadata",
    "OffsetCommitKey",
    "decode_assignment",
    "decode_group_value",
    "decode_key",
    "decode_offset_value",
    "encode_group_key",
    "encode_group_value",
    "encode_offset_key",
    "encode_offset_value",
]

# CoordinatorRecordType: key version 0 is the legacy offset key (same layout as 1).
LEGACY_OFFSET_COMMIT_KEY = 0
OFFSET_COMMIT_KEY = 1
GROUP_METADATA_KEY = 2
OFFSET_COMMIT_VALUE_VERSION = 3
GROUP_METADATA_VALUE_VERSION = 3
NO_LEADER_EPOCH = -1  # RecordBatch.NO_PARTITION_LEADER_EPOCH
NO_TIMESTAMP = -1  # OffsetCommitRequest.DEFAULT_TIMESTAMP

_I16, _I32, _I64 = struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")


class CorruptGroupRecordError(ValueError):
    """A key or value of ``__consumer_offsets`` that does not parse."""


@dataclass(frozen=True)
class OffsetCommitKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True)
class GroupMetadataKey:
    group: str


@dataclass(frozen=True)
class OffsetAndMetadata:
    """Kafka's ``OffsetAndMetadata``: the committed offset (the next one to read)."""

    offset: int
    leader_epoch: int = NO_LEADER_EPOCH
    metadata: str = ""
    commit_timestamp: int = NO_TIMESTAMP
    expire_timestamp: int = NO_TIMESTAMP


@dataclass(frozen=True)
class MemberRecord:
    """``GroupMetadataValue.MemberMetadata``: a member as the generation stored it."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout: int
    session_timeout: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True)
class GroupMetadataValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int
    members: tuple[MemberRecord, ...]


# ---- writing ------------------------------------------------------------------------


def _string(value: str | None) -> bytes:
    if value is None:
        return _I16.pack(-1)
    data = value.encode()
    return _I16.pack(len(data)) + data


def _bytes(value: bytes) -> bytes:
    return _I32.pack(len(value)) + value


def encode_offset_key(group: str, topic: str, partition: int) -> bytes:
    return (_I16.pack(OFFSET_COMMIT_KEY) + _string(group) + _string(topic)
            + _I32.pack(partition))


def encode_group_key(group: str) -> bytes:
    return _I16.pack(GROUP_METADATA_KEY) + _string(group)


def encode_offset_value(value: OffsetAndMetadata) -> bytes:
    """Version 3: offset, leaderEpoch, metadata, commitTimestamp (Kafka writes version 1,
    with an expireTimestamp, only for a commit that set a retention; minibroker ignores
    OffsetCommit's retention_time, as Kafka 2.1+ does for the default -1)."""
    return (_I16.pack(OFFSET_COMMIT_VALUE_VERSION) + _I64.pack(value.offset)
            + _I32.pack(value.leader_epoch) + _string(value.metadata)
            + _I64.pack(value.commit_timestamp))


def encode_group_value(value: GroupMetadataValue) -> bytes:
    out = [_I16.pack(GROUP_METADATA_VALUE_VERSION), _string(value.protocol_type),
           _I32.pack(value.generation), _string(value.protocol), _string(value.leader),
           _I64.pack(value.current_state_timestamp), _I32.pack(len(value.members))]
    for m in value.members:
        out += [_string(m.member_id), _string(m.group_instance_id), _string(m.client_id),
                _string(m.client_host), _I32.pack(m.rebalance_timeout),
                _I32.pack(m.session_timeout), _bytes(m.subscription), _bytes(m.assignment)]
    return b"".join(out)


# ---- reading ------------------------------------------------------------------------


class _Reader:
    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def _take(self, size: int) -> bytes:
        end = self._pos + size
        if size < 0 or end > len(self._data):
            raise CorruptGroupRecordError(f"{size} bytes claimed at byte {self._pos} of a "
                                          f"{len(self._data)}-byte record")
        chunk, self._pos = self._data[self._pos:end], end
        return chunk

    def int16(self) -> int:
        return _I16.unpack(self._take(2))[0]

    def int32(self) -> int:
        return _I32.unpack(self._take(4))[0]

    def int64(self) -> int:
        return _I64.unpack(self._take(8))[0]

    def nullable_string(self) -> str | None:
        size = self.int16()
        if size == -1:
            return None
        try:
            return self._take(size).decode()
        except UnicodeDecodeError as exc:
            raise CorruptGroupRecordError(f"a string that is not UTF-8: {exc}") from None

    def string(self) -> str:
        value = self.nullable_string()
        if value is None:
            raise CorruptGroupRecordError("a null string where the schema has none")
        return value

    def bytes(self) -> bytes:
        return self._take(self.int32())


def decode_key(data: bytes) -> OffsetCommitKey | GroupMetadataKey | ConsumerGroupKey | None:
    """The key's record (a consumer group's, KIP-848, from ``consumer.records``), or None
    for a key version this coordinator does not know (Kafka's ``UnknownKey``: skipped when
    loading, e.g. a newer coordinator's record type)."""
    reader = _Reader(data)
    version = reader.int16()
    if version in (LEGACY_OFFSET_COMMIT_KEY, OFFSET_COMMIT_KEY):
        return OffsetCommitKey(reader.string(), reader.string(), reader.int32())
    if version == GROUP_METADATA_KEY:
        return GroupMetadataKey(reader.string())
    if version in CONSUMER_KEY_VERSIONS:
        try:
            return decode_consumer_key(version, data[2:])
        except CorruptConsumerRecordError as exc:
            raise CorruptGroupRecordError(str(exc)) from None
    return None


def _version(reader: _Reader, what: str) -> int:
    version = reader.int16()
    if not 0 <= version <= 3:
        raise CorruptGroupRecordError(f"unknown {what} version {version}")
    return version


def decode_offset_value(data: bytes | None) -> OffsetAndMetadata | None:
    """None for a tombstone."""
    if data is None:
        return None
    reader = _Reader(data)
    version = _version(reader, "offset commit value")
    offset = reader.int64()
    leader_epoch = reader.int32() if version >= 3 else NO_LEADER_EPOCH
    metadata = reader.string()
    commit_timestamp = reader.int64()
    expire_timestamp = reader.int64() if version == 1 else NO_TIMESTAMP
    return OffsetAndMetadata(offset, leader_epoch, metadata, commit_timestamp,
                             expire_timestamp)


def decode_group_value(data: bytes | None) -> GroupMetadataValue | None:
    """None for a tombstone. Version 0 has no rebalance timeout: the session timeout
    stands in, as in Kafka's ``readGroupMessageValue``."""
    if data is None:
        return None
    reader = _Reader(data)
    version = _version(reader, "group metadata value")
    protocol_type = reader.string()
    generation = reader.int32()
    protocol = reader.nullable_string()
    leader = reader.nullable_string()
    timestamp = reader.int64() if version >= 2 else NO_TIMESTAMP
    members = []
    for _ in range(reader.int32()):
        member_id = reader.string()
        instance_id = reader.nullable_string() if version >= 3 else None
        client_id, client_host = reader.string(), reader.string()
        rebalance_timeout = reader.int32() if version >= 1 else None
        session_timeout = reader.int32()
        members.append(MemberRecord(
            member_id, instance_id, client_id, client_host,
            session_timeout if rebalance_timeout is None else rebalance_timeout,
            session_timeout, reader.bytes(), reader.bytes()))
    return GroupMetadataValue(protocol_type, generation, protocol, leader, timestamp,
                              tuple(members))


def decode_assignment(data: bytes) -> dict[str, list[int]]:
    """The partitions of a ``consumer`` protocol assignment (ConsumerProtocolAssignment,
    any version: each starts with the topics), for logs and events; empty if unreadable."""
    reader = _Reader(data)
    try:
        reader.int16()
        topics: dict[str, list[int]] = {}
        for _ in range(reader.int32()):
            topic = reader.string()
            topics[topic] = [reader.int32() for _ in range(reader.int32())]
    except (CorruptGroupRecordError, struct.error):
        return {}
    return topics
