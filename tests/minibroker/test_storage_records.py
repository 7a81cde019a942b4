"""RecordBatch v2 parsing, offset stamping and corruption detection."""

from __future__ import annotations

import struct
import warnings

import pytest

from minibroker.storage.records import (
    BATCH_HEADER_SIZE,
    BatchHeader,
    CorruptRecordError,
    assign_offsets,
    build_batch,
    decode_records,
    decode_values,
    iter_batches,
)

with warnings.catch_warnings():  # kafka-python loads its protocol schemas with deprecated APIs
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder


def kafka_python_batch(values: list[bytes], *, gzip: bool = False) -> bytes:
    """A batch encoded by a real client library (kafka-python), not by our builder."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=1 if gzip else 0,
                                        is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i, value in enumerate(values):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=b"k%d" % i, value=value,
                       headers=[("h", b"x")])
    return bytes(builder.build())


def flip_bit(data: bytes, position: int) -> bytes:
    corrupted = bytearray(data)
    corrupted[position] ^= 0x01
    return bytes(corrupted)


def test_build_then_parse_round_trip() -> None:
    values = [b"a", None, b"", b"x" * 300]
    keys = [b"k0", None, b"k2", b""]
    batch = build_batch(values, keys=keys, base_offset=42, leader_epoch=7, timestamp_ms=1234)

    [(header, view)] = list(iter_batches(batch))

    assert bytes(view) == batch
    assert header == BatchHeader.parse(batch)
    assert (header.base_offset, header.partition_leader_epoch, header.magic) == (42, 7, 2)
    assert header.size_in_bytes == len(batch)
    assert header.records_count == 4
    assert (header.last_offset, header.next_offset) == (45, 46)
    assert (header.base_timestamp, header.max_timestamp) == (1234, 1234)
    assert decode_values(batch) == list(zip(range(42, 46), values, strict=True))
    assert [r.key for r in decode_records(batch)] == keys


def test_our_batches_are_valid_for_a_real_client() -> None:
    batch = build_batch([b"one", b"two"], base_offset=5, leader_epoch=1)
    parsed = DefaultRecordBatch(batch)
    assert parsed.validate_crc()
    assert [(r.offset, r.value) for r in parsed] == [(5, b"one"), (6, b"two")]


@pytest.mark.parametrize("gzip", [False, True], ids=["uncompressed", "gzip"])
def test_client_batches_parse_and_decode(gzip: bool) -> None:
    values = [b"v%d" % i for i in range(20)]
    batch = kafka_python_batch(values, gzip=gzip)

    [(header, _)] = list(iter_batches(batch))
    records = decode_records(batch)

    assert header.records_count == 20
    assert [(r.offset, r.value) for r in records] == list(enumerate(values))
    assert records[3].key == b"k3"
    assert records[3].timestamp == 1_700_000_000_003
    assert records[3].headers == (("h", b"x"),)


def test_assign_offsets_stamps_every_batch_and_keeps_crcs_valid() -> None:
    batches = [build_batch([b"a"] * 3), kafka_python_batch([b"b"] * 5, gzip=True),
               build_batch([b"c"])]
    stamped, headers = assign_offsets(b"".join(batches), 1000, 9)

    assert [(h.base_offset, h.last_offset) for h in headers] == [
        (1000, 1002), (1003, 1007), (1008, 1008)]
    assert all(h.partition_leader_epoch == 9 for h in headers)
    assert [h for h, _ in iter_batches(stamped, validate_crc=True)] == headers
    assert [h.crc for h in headers] == [BatchHeader.parse(b).crc for b in batches]
    assert [offset for offset, _ in decode_values(stamped)] == list(range(1000, 1009))
    position = 0
    for header in headers:
        client_view = DefaultRecordBatch(stamped[position:position + header.size_in_bytes])
        assert client_view.validate_crc()
        assert client_view.base_offset == header.base_offset
        position += header.size_in_bytes


def test_base_offset_and_epoch_are_outside_the_crc() -> None:
    batch = build_batch([b"a"])
    for position in (0, 12):  # baseOffset, partitionLeaderEpoch
        assert len(list(iter_batches(flip_bit(batch, position)))) == 1


@pytest.mark.parametrize("position", [21, 30, BATCH_HEADER_SIZE, -1],
                         ids=["attributes", "timestamp", "first-record", "last-byte"])
def test_bit_flip_under_the_crc_is_detected(position: int) -> None:
    corrupted = flip_bit(build_batch([b"payload"] * 4), position)
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        list(iter_batches(corrupted))
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        assign_offsets(corrupted, 0, 0)
    assert len(list(iter_batches(corrupted, validate_crc=False))) == 1


def test_bad_magic_is_rejected() -> None:
    batch = bytearray(build_batch([b"a"]))
    batch[16] = 1
    with pytest.raises(CorruptRecordError, match="magic 1 is not supported"):
        list(iter_batches(batch, validate_crc=False))


@pytest.mark.parametrize("cut", [1, 30, 70])
def test_truncated_batch_is_corruption_unless_a_partial_tail_is_allowed(cut: int) -> None:
    first = build_batch([b"first"])
    data = first + build_batch([b"second" * 10])[:-cut]
    with pytest.raises(CorruptRecordError, match="truncated") as excinfo:
        list(iter_batches(data))
    assert excinfo.value.position == len(first)
    with pytest.raises(CorruptRecordError, match="truncated"):
        assign_offsets(data, 0, 0)
    assert [bytes(v) for _, v in iter_batches(data, allow_partial_tail=True)] == [first]


def test_corruption_reports_the_position_of_the_bad_batch() -> None:
    first, second = build_batch([b"a"]), build_batch([b"b"])
    with pytest.raises(CorruptRecordError) as excinfo:
        list(iter_batches(first + flip_bit(second, 40)))
    assert excinfo.value.position == len(first)


def test_batch_length_below_the_header_size_is_rejected() -> None:
    batch = bytearray(build_batch([b"a"]))
    struct.pack_into(">i", batch, 8, 10)
    with pytest.raises(CorruptRecordError, match="batchLength 10 is below"):
        list(iter_batches(batch))


def test_assign_offsets_rejects_count_inconsistent_with_offset_range() -> None:
    batch = bytearray(build_batch([b"a", b"b"]))
    struct.pack_into(">i", batch, 57, 5)  # recordsCount; skip the CRC to reach this check
    with pytest.raises(CorruptRecordError, match="recordsCount 5 does not match"):
        assign_offsets(batch, 0, 0, validate_crc=False)


def test_empty_input_has_no_batches() -> None:
    assert list(iter_batches(b"")) == []
    assert assign_offsets(b"", 10, 1) == (b"", [])
