"""A consumer group's records in ``__consumer_offsets`` (KIP-848), byte for byte as Kafka 4.2
writes them (group-coordinator/src/main/resources/common/message/``ConsumerGroup*``), so that
a new coordinator rebuilds the group, its members and their epochs from the log.

Five record types, the latest of each key wins on replay and a null value deletes it:

- ``ConsumerGroupMetadata`` (key version 3): the group epoch (and KIP-1101's metadata hash,
  a tagged field);
- ``ConsumerGroupMemberMetadata`` (5): a member's subscription, rebalance timeout, assignor,
  client;
- ``ConsumerGroupTargetAssignmentMetadata`` (6): the epoch the target assignment was
  computed for;
- ``ConsumerGroupTargetAssignmentMember`` (7): one member's target;
- ``ConsumerGroupCurrentMemberAssignment`` (8): one member's epochs, reconciliation state,
  partitions and partitions pending revocation.

Keys are non-flexible (int16 version, int16-length strings); values are value version 0 in
the flexible encoding (unsigned-varint lengths plus one, tagged fields). Kafka 4.0's
``ConsumerGroupPartitionMetadata`` (key version 4) is read and ignored, as Kafka 4.1+ does.

``MetadataHash`` holds minibroker's own hash of the subscribed topics' ids and partition
counts (Kafka's is a Murmur3 over its topic images): what it is for, telling a new
coordinator whether the topics changed while the group moved, needs only that both ends
agree.
"""

from __future__ import annotations

import hashlib
import struct
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace

from minibroker.coordinator.consumer.consumer_group import ConsumerGroup
from minibroker.coordinator.consumer.member import (
    Assignment,
    ConsumerGroupMember,
    MemberState,
    assignment_of,
)
from minibroker.coordinator.kafka_encoding import compact_string, string16, uvarint

__all__ = [
    "ConsumerGroupKey",
    "CurrentAssignmentValue",
    "GroupMetadataValue",
    "MemberMetadataValue",
    "Record",
    "consumer_group_tombstones",
    "current_assignment_record",
    "decode_consumer_key",
    "decode_consumer_value",
    "group_epoch_record",
    "member_metadata_record",
    "metadata_hash",
    "replay_consumer_groups",
    "target_assignment_epoch_record",
    "target_assignment_member_record",
    "tombstone",
]

GROUP_METADATA = 3
PARTITION_METADATA = 4  # Kafka 4.0's, no longer written
MEMBER_METADATA = 5
TARGET_ASSIGNMENT_METADATA = 6
TARGET_ASSIGNMENT_MEMBER = 7
CURRENT_MEMBER_ASSIGNMENT = 8
KEY_VERSIONS = frozenset({GROUP_METADATA, PARTITION_METADATA, MEMBER_METADATA,
                          TARGET_ASSIGNMENT_METADATA, TARGET_ASSIGNMENT_MEMBER,
                          CURRENT_MEMBER_ASSIGNMENT})
_WITH_MEMBER = frozenset({MEMBER_METADATA, TARGET_ASSIGNMENT_MEMBER, CURRENT_MEMBER_ASSIGNMENT})
_STATE_BYTES = {MemberState.STABLE: 0, MemberState.UNREVOKED_PARTITIONS: 1,
                MemberState.UNRELEASED_PARTITIONS: 2, MemberState.UNKNOWN: 127}
_STATES = {v: k for k, v in _STATE_BYTES.items()}
_I8, _I16, _I32, _I64 = (struct.Struct(f) for f in (">b", ">h", ">i", ">q"))

Record = tuple[bytes, bytes | None]
"""A key and its value (None: a tombstone)."""


class CorruptConsumerRecordError(ValueError):
    """A consumer group key or value that does not parse."""


@dataclass(frozen=True)
class ConsumerGroupKey:
    """A key of one of the five types; ``member_id`` for the per-member ones."""

    version: int
    group_id: str
    member_id: str | None = None


@dataclass(frozen=True)
class GroupMetadataValue:
    epoch: int
    metadata_hash: int = 0


@dataclass(frozen=True)
class MemberMetadataValue:
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    rebalance_timeout_ms: int
    server_assignor: str | None


@dataclass(frozen=True)
class CurrentAssignmentValue:
    member_epoch: int
    previous_member_epoch: int
    state: MemberState
    assigned_partitions: Assignment
    partitions_pending_revocation: Assignment


# ---- writing ------------------------------------------------------------------------------


def _key(version: int, group_id: str, member_id: str | None = None) -> bytes:
    out = _I16.pack(version) + string16(group_id)
    return out + string16(member_id) if member_id is not None else out


_NO_TAGS = uvarint(0)


def _topic_partitions(assignment: Assignment) -> bytes:
    out = [uvarint(len(assignment) + 1)]
    for topic_id in sorted(assignment):
        partitions = sorted(assignment[topic_id])
        out += [uuid.UUID(topic_id).bytes, uvarint(len(partitions) + 1),
                *(_I32.pack(p) for p in partitions), _NO_TAGS]
    return b"".join(out)


def group_epoch_record(group_id: str, epoch: int, hash_: int) -> Record:
    tags = _NO_TAGS if hash_ == 0 else (uvarint(1) + uvarint(0) + uvarint(8)
                                        + _I64.pack(hash_))
    return _key(GROUP_METADATA, group_id), _I16.pack(0) + _I32.pack(epoch) + tags


def member_metadata_record(group_id: str, m: ConsumerGroupMember) -> Record:
    value = b"".join([
        _I16.pack(0), compact_string(m.instance_id), compact_string(m.rack_id),
        compact_string(m.client_id), compact_string(m.client_host),
        uvarint(len(m.subscribed_topic_names) + 1),
        *(compact_string(n) for n in m.subscribed_topic_names),
        compact_string(None), _I32.pack(m.rebalance_timeout_ms),
        compact_string(m.server_assignor),
        _I8.pack(-1),  # ClassicMemberMetadata: null (no classic member here)
        _NO_TAGS])
    return _key(MEMBER_METADATA, group_id, m.member_id), value


def target_assignment_epoch_record(group_id: str, epoch: int) -> Record:
    return _key(TARGET_ASSIGNMENT_METADATA, group_id), _I16.pack(0) + _I32.pack(epoch) + _NO_TAGS


def target_assignment_member_record(group_id: str, member_id: str,
                                    target: Assignment) -> Record:
    return (_key(TARGET_ASSIGNMENT_MEMBER, group_id, member_id),
            _I16.pack(0) + _topic_partitions(target) + _NO_TAGS)


def current_assignment_record(group_id: str, m: ConsumerGroupMember) -> Record:
    value = b"".join([
        _I16.pack(0), _I32.pack(m.member_epoch), _I32.pack(m.previous_member_epoch),
        _I8.pack(_STATE_BYTES[m.state]), _topic_partitions(m.assigned_partitions),
        _topic_partitions(m.partitions_pending_revocation), _NO_TAGS])
    return _key(CURRENT_MEMBER_ASSIGNMENT, group_id, m.member_id), value


def tombstone(version: int, group_id: str, member_id: str | None = None) -> Record:
    return _key(version, group_id, member_id), None


def consumer_group_tombstones(group_id: str) -> list[Record]:
    """An empty consumer group's own records deleted (its members' are gone already)."""
    return [tombstone(TARGET_ASSIGNMENT_METADATA, group_id), tombstone(GROUP_METADATA, group_id)]


def metadata_hash(subscription: Mapping[str, tuple[str, int]]) -> int:
    """A signed 64-bit hash of the subscribed topics' names, ids and partition counts
    (never 0, Kafka's "none")."""
    text = ";".join(f"{name}:{tid}:{n}" for name, (tid, n) in sorted(subscription.items()))
    value = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big",
                           signed=True)
    return value or 1


# ---- reading ------------------------------------------------------------------------------


class _Reader:
    def __init__(self, data: bytes) -> None:
        self._data, self._pos = data, 0

    def take(self, size: int) -> bytes:
        end = self._pos + size
        if size < 0 or end > len(self._data):
            raise CorruptConsumerRecordError(f"{size} bytes claimed at byte {self._pos} of a "
                                             f"{len(self._data)}-byte record")
        chunk, self._pos = self._data[self._pos:end], end
        return chunk

    def fixed(self, s: struct.Struct) -> int:
        return s.unpack(self.take(s.size))[0]

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            byte = self.take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise CorruptConsumerRecordError("a varint longer than 5 bytes")

    def compact_string(self) -> str | None:
        size = self.uvarint()
        if size == 0:
            return None
        try:
            return self.take(size - 1).decode()
        except UnicodeDecodeError as exc:
            raise CorruptConsumerRecordError(f"a string that is not UTF-8: {exc}") from None

    def string(self) -> str:
        try:
            return self.take(self.fixed(_I16)).decode()
        except UnicodeDecodeError as exc:
            raise CorruptConsumerRecordError(f"a string that is not UTF-8: {exc}") from None

    def count(self) -> int:
        n = self.uvarint() - 1
        if n < 0:
            raise CorruptConsumerRecordError("a null array where the schema has none")
        return n

    def tags(self) -> dict[int, bytes]:
        return {self.uvarint(): self.take(self.uvarint()) for _ in range(self.uvarint())}

    def topic_partitions(self) -> Assignment:
        out: dict[str, list[int]] = {}
        for _ in range(self.count()):
            topic_id = uuid.UUID(bytes=self.take(16)).hex  # the image's form of a topic id
            out[topic_id] = [self.fixed(_I32) for _ in range(self.count())]
            self.tags()
        return assignment_of(out)


def decode_consumer_key(version: int, rest: bytes) -> ConsumerGroupKey:
    """A key of ``version`` (one of ``KEY_VERSIONS``), from the bytes after its version."""
    reader = _Reader(rest)
    group_id = reader.string()
    member_id = reader.string() if version in _WITH_MEMBER else None
    return ConsumerGroupKey(version, group_id, member_id)


def decode_consumer_value(key: ConsumerGroupKey, data: bytes | None
                          ) -> (GroupMetadataValue | MemberMetadataValue | int | Assignment
                                | CurrentAssignmentValue | None):
    """The value of ``key``'s type; None for a tombstone (or Kafka 4.0's partition
    metadata, which is not read)."""
    if data is None or key.version == PARTITION_METADATA:
        return None
    reader = _Reader(data)
    if (version := reader.fixed(_I16)) != 0:
        raise CorruptConsumerRecordError(f"unknown value version {version} of key type "
                                         f"{key.version}")
    if key.version == GROUP_METADATA:
        epoch = reader.fixed(_I32)
        hashed = reader.tags().get(0)
        return GroupMetadataValue(epoch, _I64.unpack(hashed)[0] if hashed else 0)
    if key.version == MEMBER_METADATA:
        instance_id, rack_id = reader.compact_string(), reader.compact_string()
        client_id, client_host = reader.compact_string() or "", reader.compact_string() or ""
        names = tuple(reader.compact_string() or "" for _ in range(reader.count()))
        regex, timeout = reader.compact_string(), reader.fixed(_I32)
        value = MemberMetadataValue(instance_id, rack_id, client_id, client_host, names,
                                    regex, timeout, reader.compact_string())
        if reader.fixed(_I8) >= 0:
            raise CorruptConsumerRecordError("ClassicMemberMetadata is not read here")
        return value
    if key.version == TARGET_ASSIGNMENT_METADATA:
        return reader.fixed(_I32)
    if key.version == TARGET_ASSIGNMENT_MEMBER:
        return reader.topic_partitions()
    epoch, previous = reader.fixed(_I32), reader.fixed(_I32)
    state_byte = reader.fixed(_I8)
    if state_byte not in _STATES:
        raise CorruptConsumerRecordError(f"unknown member state {state_byte}")
    return CurrentAssignmentValue(epoch, previous, _STATES[state_byte],
                                  reader.topic_partitions(), reader.topic_partitions())


def replay_consumer_groups(records: Mapping[ConsumerGroupKey, object]
                           ) -> dict[str, ConsumerGroup]:
    """The consumer groups the latest record of each key makes (``GroupMetadataManager
    .replay``), tombstones already dropped: a group is there while it has an epoch record,
    a member while it has a metadata record."""
    groups: dict[str, ConsumerGroup] = {}
    for key, value in sorted(records.items(), key=lambda kv: (kv[0].version, kv[0].group_id,
                                                              kv[0].member_id or "")):
        if key.version == GROUP_METADATA and isinstance(value, GroupMetadataValue):
            group = groups.setdefault(key.group_id, ConsumerGroup(key.group_id))
            group.group_epoch, group.metadata_hash = value.epoch, value.metadata_hash
    for key, value in records.items():
        group = groups.get(key.group_id)
        if group is None:
            continue
        if key.version == TARGET_ASSIGNMENT_METADATA and isinstance(value, int):
            group.assignment_epoch = value
        elif key.version == TARGET_ASSIGNMENT_MEMBER and key.member_id is not None:
            group.target_assignment[key.member_id] = value  # type: ignore[assignment]
    for key, value in sorted(records.items(), key=lambda kv: kv[0].member_id or ""):
        group = groups.get(key.group_id)
        if group is None or key.version != MEMBER_METADATA or key.member_id is None \
                or not isinstance(value, MemberMetadataValue):
            continue
        current = records.get(ConsumerGroupKey(CURRENT_MEMBER_ASSIGNMENT, key.group_id,
                                               key.member_id))
        member = ConsumerGroupMember(
            key.member_id, instance_id=value.instance_id, rack_id=value.rack_id,
            rebalance_timeout_ms=value.rebalance_timeout_ms, client_id=value.client_id,
            client_host=value.client_host,
            subscribed_topic_names=tuple(sorted(value.subscribed_topic_names)),
            server_assignor=value.server_assignor)
        if isinstance(current, CurrentAssignmentValue):
            member = replace(member, member_epoch=current.member_epoch,
                             previous_member_epoch=current.previous_member_epoch,
                             state=current.state,
                             assigned_partitions=current.assigned_partitions,
                             partitions_pending_revocation=current.partitions_pending_revocation)
        group.update_member(member)
    return groups
