"""RecordBatch v2 (magic 2): parse headers, check CRCs, stamp offsets and leader epochs.

The broker stores batches exactly as the producer sent them. It only rewrites baseOffset and
partitionLeaderEpoch, which the batch CRC (CRC-32C from ``attributes`` to the end) does not
cover, so the client's CRC stays valid and nothing is decoded per record on the produce path.
Decoding individual records (``decode_records``) exists for tests and debugging tools.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import crc32c

from minibroker import environment

__all__ = [
    "BATCH_HEADER_SIZE",
    "CONTROL_FLAG",
    "LOG_OVERHEAD",
    "TRANSACTIONAL_FLAG",
    "BatchHeader",
    "CorruptRecordError",
    "DecodedRecord",
    "assign_offsets",
    "build_batch",
    "decode_records",
    "decode_values",
    "iter_batches",
]

MAGIC = 2
LOG_OVERHEAD = 12  # baseOffset + batchLength: the bytes that batchLength does not count
BATCH_HEADER_SIZE = 61  # every fixed field up to and including recordsCount
_CRC_START = 21  # the CRC covers attributes (offset 21) to the end of the batch
_MAGIC_POS = 16
_EPOCH_POS = 12
_MIN_BATCH_LENGTH = BATCH_HEADER_SIZE - LOG_OVERHEAD
_COMPRESSION_MASK = 0x07
TRANSACTIONAL_FLAG = 0x10  # attributes bit 4: the batch belongs to a transaction (KIP-98)
CONTROL_FLAG = 0x20  # attributes bit 5: a control batch (a transaction marker)
_CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

_HEADER = struct.Struct(">qiibIhiqqqhii")
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")


class CorruptRecordError(Exception):
    """Bytes that are not a sequence of valid v2 record batches; ``position`` is where the
    first bad batch starts (log recovery truncates the segment there)."""

    def __init__(self, message: str, position: int = 0) -> None:
        super().__init__(message)
        self.position = position


@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    batch_length: int  # bytes after the batchLength field, as on the wire
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG)

    @property
    def size_in_bytes(self) -> int:
        """The whole batch including the 12-byte baseOffset/batchLength prefix."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @classmethod
    def parse(cls, buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
        """Parse the fixed header at ``pos``; checks the magic and the length field, not the
        CRC nor whether the whole batch is present (``iter_batches`` does both)."""
        available = len(buf) - pos
        if available < BATCH_HEADER_SIZE:
            raise CorruptRecordError(
                f"record batch at byte {pos}: truncated header ({available} of "
                f"{BATCH_HEADER_SIZE} bytes)", pos)
        header = cls(*_HEADER.unpack_from(buf, pos))
        if header.magic != MAGIC:
            raise CorruptRecordError(
                f"record batch at byte {pos}: magic {header.magic} is not supported "
                f"(only magic {MAGIC}, RecordBatch v2)", pos)
        if header.batch_length < _MIN_BATCH_LENGTH:
            raise CorruptRecordError(
                f"record batch at byte {pos}: batchLength {header.batch_length} is below the "
                f"minimum {_MIN_BATCH_LENGTH}", pos)
        if header.last_offset_delta < 0:
            raise CorruptRecordError(
                f"record batch at byte {pos}: negative lastOffsetDelta "
                f"{header.last_offset_delta}", pos)
        return header


def _check_crc(buf: memoryview, pos: int, header: BatchHeader) -> None:
    computed = crc32c.crc32c(buf[pos + _CRC_START:pos + header.size_in_bytes])
    if computed != header.crc:
        raise CorruptRecordError(
            f"record batch at byte {pos} (baseOffset {header.base_offset}): CRC mismatch, "
            f"stored 0x{header.crc:08x}, computed 0x{computed:08x}", pos)


def iter_batches(
    buf: bytes | bytearray | memoryview,
    *,
    validate_crc: bool = True,
    allow_partial_tail: bool = False,
) -> Iterator[tuple[BatchHeader, memoryview]]:
    """Yield (header, batch bytes) for each batch in a concatenation of batches.

    A batch cut short at the end is corruption for Produce data and segment files; with
    ``allow_partial_tail`` the iteration just stops there (log recovery then cuts the tail).
    """
    view = memoryview(buf)
    end = len(view)
    pos = 0
    while pos < end:
        if allow_partial_tail and end - pos < BATCH_HEADER_SIZE:
            return
        header = BatchHeader.parse(view, pos)
        size = header.size_in_bytes
        if pos + size > end:
            if allow_partial_tail:
                return
            raise CorruptRecordError(
                f"record batch at byte {pos} (baseOffset {header.base_offset}): truncated, "
                f"{size} bytes declared but only {end - pos} present", pos)
        if validate_crc:
            _check_crc(view, pos, header)
        yield header, view[pos:pos + size]
        pos += size


def assign_offsets(
    records: bytes | bytearray | memoryview,
    base_offset: int,
    leader_epoch: int,
    *,
    validate_crc: bool = True,
) -> tuple[bytes, list[BatchHeader]]:
    """Stamp consecutive offsets from ``base_offset`` and ``leader_epoch`` on every batch.

    This is the leader's produce hot path: one copy of the bytes, one header parse, one CRC
    and two ``pack_into`` per batch, no per-record work. Batches must be what a producer
    sends (Kafka's LogValidator): at least one record and a count that matches the offset
    range.
    """
    out = bytearray(records)
    view = memoryview(out)
    end = len(out)
    headers: list[BatchHeader] = []
    next_offset = base_offset
    pos = 0
    try:
        while pos < end:
            header = BatchHeader.parse(view, pos)
            size = header.size_in_bytes
            if pos + size > end:
                raise CorruptRecordError(
                    f"record batch at byte {pos}: truncated, {size} bytes declared but only "
                    f"{end - pos} present", pos)
            if header.records_count <= 0 or header.records_count != header.last_offset_delta + 1:
                raise CorruptRecordError(
                    f"record batch at byte {pos}: recordsCount {header.records_count} does not "
                    f"match lastOffsetDelta {header.last_offset_delta}", pos)
            if validate_crc:
                _check_crc(view, pos, header)
            _INT64.pack_into(out, pos, next_offset)
            _INT32.pack_into(out, pos + _EPOCH_POS, leader_epoch)
            headers.append(BatchHeader(
                next_offset, header.batch_length, leader_epoch, header.magic, header.crc,
                header.attributes, header.last_offset_delta, header.base_timestamp,
                header.max_timestamp, header.producer_id, header.producer_epoch,
                header.base_sequence, header.records_count,
            ))
            next_offset += header.last_offset_delta + 1
            pos += size
    finally:
        view.release()
    return bytes(out), headers


# ---- building and decoding records (transaction markers, tests and tools) ---------------


def _write_varint(out: bytearray, value: int) -> None:
    """Kafka's zigzag varint/varlong."""
    value = (value << 1) ^ (value >> 63)
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _read_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise CorruptRecordError(f"record: varint runs past the end at byte {pos}", pos)
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise CorruptRecordError(f"record: varint longer than 10 bytes at byte {pos}", pos)


def _write_bytes(out: bytearray, value: bytes | None) -> None:
    if value is None:
        _write_varint(out, -1)
    else:
        _write_varint(out, len(value))
        out += value


def build_batch(
    values: Sequence[bytes | None],
    *,
    keys: Sequence[bytes | None] | None = None,
    base_offset: int = 0,
    leader_epoch: int = 0,
    timestamp_ms: int | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    attributes: int = 0,
) -> bytes:
    """An uncompressed v2 batch with a valid CRC, as a producer would send it: without a
    producer id (-1) unless it is idempotent; ``attributes`` carries the transactional and
    control flags."""
    if not values:
        raise ValueError("build_batch: a record batch needs at least one record")
    if keys is not None and len(keys) != len(values):
        raise ValueError(f"build_batch: {len(keys)} keys for {len(values)} values")
    timestamp = int(environment.current().wall_clock() * 1000) if timestamp_ms is None \
        else timestamp_ms
    body = bytearray()
    for delta, value in enumerate(values):
        record = bytearray(b"\x00")  # attributes
        _write_varint(record, 0)  # timestampDelta
        _write_varint(record, delta)  # offsetDelta
        _write_bytes(record, None if keys is None else keys[delta])
        _write_bytes(record, value)
        _write_varint(record, 0)  # header count
        _write_varint(body, len(record))
        body += record
    after_crc = bytearray(struct.pack(
        ">hiqqqhii", attributes, len(values) - 1, timestamp, timestamp, producer_id, producer_epoch,
        base_sequence, len(values)))
    after_crc += body
    batch_length = len(after_crc) + (_CRC_START - LOG_OVERHEAD)
    prefix = struct.pack(">qiibI", base_offset, batch_length, leader_epoch, MAGIC,
                         crc32c.crc32c(after_crc))
    return prefix + bytes(after_crc)


@dataclass(frozen=True, slots=True)
class DecodedRecord:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def _read_bytes(buf: bytes, pos: int) -> tuple[bytes | None, int]:
    length, pos = _read_varint(buf, pos)
    if length < 0:
        return None, pos
    if pos + length > len(buf):
        raise CorruptRecordError(f"record: {length} bytes declared at byte {pos}, past the end",
                                 pos)
    return bytes(buf[pos:pos + length]), pos + length


def _records_section(header: BatchHeader, batch: memoryview) -> bytes:
    data = bytes(batch[BATCH_HEADER_SIZE:])
    codec = header.attributes & _COMPRESSION_MASK
    if codec == 0:
        return data
    if codec == 1:
        return zlib.decompress(data, wbits=zlib.MAX_WBITS | 16)
    name = _CODEC_NAMES.get(codec, str(codec))
    raise CorruptRecordError(
        f"record batch at offset {header.base_offset}: compression codec {name} cannot be "
        "decoded here (only none and gzip)")


def decode_records(buf: bytes | bytearray | memoryview) -> list[DecodedRecord]:
    """Every record of every batch in ``buf``, with absolute offsets and timestamps."""
    decoded: list[DecodedRecord] = []
    for header, batch in iter_batches(buf):
        data = _records_section(header, batch)
        pos = 0
        for _ in range(header.records_count):
            length, start = _read_varint(data, pos)
            end = start + length
            pos = start + 1  # attributes
            timestamp_delta, pos = _read_varint(data, pos)
            offset_delta, pos = _read_varint(data, pos)
            key, pos = _read_bytes(data, pos)
            value, pos = _read_bytes(data, pos)
            header_count, pos = _read_varint(data, pos)
            record_headers = []
            for _ in range(header_count):
                name, pos = _read_bytes(data, pos)
                header_value, pos = _read_bytes(data, pos)
                record_headers.append(((name or b"").decode(), header_value))
            if pos != end:
                raise CorruptRecordError(
                    f"record batch at offset {header.base_offset}: record {offset_delta} "
                    f"declares {length} bytes but has {pos - start}")
            decoded.append(DecodedRecord(header.base_offset + offset_delta,
                                         header.base_timestamp + timestamp_delta,
                                         key, value, tuple(record_headers)))
    return decoded


def decode_values(buf: bytes | bytearray | memoryview) -> list[tuple[int, bytes | None]]:
    """(offset, value) of every record in ``buf`` (one or more batches)."""
    return [(record.offset, record.value) for record in decode_records(buf)]
