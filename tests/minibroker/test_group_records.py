"""The records of ``__consumer_offsets`` against bytes built by hand from Kafka's schemas
(group-coordinator/src/main/resources/common/message/): OffsetCommitKey (key version 1),
GroupMetadataKey (2), OffsetCommitValue and GroupMetadataValue at every version Kafka
wrote before the flexible version 4."""

from __future__ import annotations

import struct

import pytest

from minibroker.coordinator.records import (
    CorruptGroupRecordError,
    GroupMetadataKey,
    GroupMetadataValue,
    MemberRecord,
    OffsetAndMetadata,
    OffsetCommitKey,
    decode_assignment,
    decode_group_value,
    decode_key,
    decode_offset_value,
    encode_group_key,
    encode_group_value,
    encode_offset_key,
    encode_offset_value,
)


def i16(v: int) -> bytes:
    return struct.pack(">h", v)


def i32(v: int) -> bytes:
    return struct.pack(">i", v)


def i64(v: int) -> bytes:
    return struct.pack(">q", v)


def string(v: str | None) -> bytes:
    return i16(-1) if v is None else i16(len(v.encode())) + v.encode()


def data(v: bytes) -> bytes:
    return i32(len(v)) + v


def test_keys_are_kafkas_bytes() -> None:
    offset_key = i16(1) + string("g") + string("orders") + i32(2)
    assert encode_offset_key("g", "orders", 2) == offset_key
    assert decode_key(offset_key) == OffsetCommitKey("g", "orders", 2)
    legacy = i16(0) + offset_key[2:]  # LegacyOffsetCommitKey: the same layout
    assert decode_key(legacy) == OffsetCommitKey("g", "orders", 2)
    group_key = i16(2) + string("grüppe")
    assert encode_group_key("grüppe") == group_key
    assert decode_key(group_key) == GroupMetadataKey("grüppe")
    # Versions 3-8 are the consumer groups' (KIP-848, consumer/records.py); a version no
    # coordinator here knows is skipped.
    assert decode_key(i16(99) + b"whatever a newer coordinator writes") is None


def test_offset_values_at_every_version() -> None:
    v3 = i16(3) + i64(42) + i32(5) + string("meta") + i64(1700)
    value = OffsetAndMetadata(42, 5, "meta", 1700)
    assert encode_offset_value(value) == v3
    assert decode_offset_value(v3) == value
    v1 = i16(1) + i64(42) + string("") + i64(1700) + i64(9999)
    assert decode_offset_value(v1) == OffsetAndMetadata(42, -1, "", 1700, 9999)
    v0 = i16(0) + i64(42) + string("") + i64(1700)
    assert decode_offset_value(v0) == OffsetAndMetadata(42, -1, "", 1700)
    assert decode_offset_value(None) is None  # a tombstone


def test_group_values_at_every_version() -> None:
    member = MemberRecord("m-1", "i-1", "client", "/127.0.0.1", 30000, 6000, b"sub", b"asg")
    value = GroupMetadataValue("consumer", 3, "range", "m-1", 1700, (member,))
    v3 = (i16(3) + string("consumer") + i32(3) + string("range") + string("m-1") + i64(1700)
          + i32(1) + string("m-1") + string("i-1") + string("client") + string("/127.0.0.1")
          + i32(30000) + i32(6000) + data(b"sub") + data(b"asg"))
    assert encode_group_value(value) == v3
    assert decode_group_value(v3) == value
    v0 = (i16(0) + string("consumer") + i32(3) + string("range") + string("m-1") + i32(1)
          + string("m-1") + string("client") + string("/h") + i32(6000) + data(b"s")
          + data(b""))
    assert decode_group_value(v0) == GroupMetadataValue(
        "consumer", 3, "range", "m-1", -1,
        (MemberRecord("m-1", None, "client", "/h", 6000, 6000, b"s", b""),))
    empty = i16(2) + string("consumer") + i32(4) + string(None) + string(None) + i64(5) + i32(0)
    assert decode_group_value(empty) == GroupMetadataValue("consumer", 4, None, None, 5, ())


@pytest.mark.parametrize("bad", [
    b"\x00",  # no version
    i16(3) + i64(1),  # cut short
    i16(9) + i64(1),  # unknown version
    i16(3) + i64(1) + i32(-1) + i16(200) + b"x",  # a string past the end
])
def test_broken_values_are_errors_not_crashes(bad: bytes) -> None:
    with pytest.raises(CorruptGroupRecordError):
        decode_offset_value(bad)
    with pytest.raises(CorruptGroupRecordError):
        decode_group_value(bad)


def test_a_consumer_assignment_is_summarised() -> None:
    assignment = i16(1) + i32(1) + string("t") + i32(2) + i32(0) + i32(2) + data(b"")
    assert decode_assignment(assignment) == {"t": [0, 2]}
    assert decode_assignment(b"\x00") == {}
