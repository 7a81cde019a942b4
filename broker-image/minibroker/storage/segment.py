"""``LogSegment``: one ``%020d.log`` file of record batches and its ``%020d.index``.

The layout is Kafka's, so ``kafka-dump-log.sh`` can read both files: the segment is the
batches back to back, named by the base offset of its first batch; the index is sparse
big-endian (int32 offset relative to the base, int32 file position) pairs, one for the first
batch after every ``index.interval.bytes``, keyed like Kafka's by the batch's *last* offset.
Fetches are served from an in-memory array of every batch's base offset and position
(bisect, then one ``pread``), so the index file is only written and kept consistent; a
missing or inconsistent one is rebuilt when the segment is loaded.
"""

from __future__ import annotations

import logging
import os
import struct
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from pathlib import Path

from minibroker.environment import fsync
from minibroker.storage.durability import DurabilityTracker
from minibroker.storage.records import (
    BATCH_HEADER_SIZE,
    BatchHeader,
    CorruptRecordError,
    iter_batches,
)
from minibroker.storage.transaction_index import TransactionIndex

__all__ = ["LogSegment", "index_path", "log_path"]

log = logging.getLogger("minibroker.log")

_INDEX_ENTRY = struct.Struct(">ii")


def log_path(directory: Path, base_offset: int) -> Path:
    return directory / f"{base_offset:020d}.log"


def index_path(directory: Path, base_offset: int) -> Path:
    return directory / f"{base_offset:020d}.index"


def _write_all(fd: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class LogSegment:
    """The batches of offsets [base_offset, next_offset) of one partition."""

    def __init__(self, directory: Path, base_offset: int, durability: DurabilityTracker,
                 index_interval_bytes: int) -> None:
        self.base_offset = base_offset
        self.next_offset = base_offset
        self.size = 0
        self.log_path = log_path(directory, base_offset)
        self.index_path = index_path(directory, base_offset)
        self._durability = durability
        self._index_interval_bytes = index_interval_bytes
        self._offsets = array("q")  # base offset of every batch
        self._positions = array("q")  # file position of every batch
        self._index_positions = array("q")  # file position of every index entry
        self._bytes_since_index_entry = 0
        self._fd = -1
        self._index_fd: int | None = None
        self.txn_index = TransactionIndex()

    @classmethod
    def create(cls, directory: Path, base_offset: int, durability: DurabilityTracker,
               index_interval_bytes: int) -> LogSegment:
        segment = cls(directory, base_offset, durability, index_interval_bytes)
        segment._fd = os.open(segment.log_path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL,
                              0o644)
        durability.register(segment.log_path)
        os.close(os.open(segment.index_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
        durability.register(segment.index_path)
        return segment

    @classmethod
    def load(cls, directory: Path, base_offset: int, durability: DurabilityTracker,
             index_interval_bytes: int) -> tuple[LogSegment, str | None]:
        """Open an existing segment, validating every batch (magic, CRC, contiguous offsets
        starting at the file's base offset). The file is cut at the first bad batch; the
        reason is returned (None when the whole file was valid)."""
        segment = cls(directory, base_offset, durability, index_interval_bytes)
        segment._fd = os.open(segment.log_path, os.O_RDWR | os.O_APPEND)
        durability.register(segment.log_path)
        durability.register(segment.index_path)
        file_size = os.fstat(segment._fd).st_size
        data = os.pread(segment._fd, file_size, 0)
        reason = None
        index_entries = bytearray()
        try:
            for header, _ in iter_batches(data, allow_partial_tail=True):
                if header.base_offset != segment.next_offset:
                    reason = (f"batch at byte {segment.size} has baseOffset {header.base_offset}, "
                              f"expected {segment.next_offset}")
                    break
                segment._add_batch(header, segment.size, index_entries)
                segment.size += header.size_in_bytes
                segment.next_offset = header.next_offset
        except CorruptRecordError as exc:
            reason = str(exc)
        if segment.size < file_size:
            reason = reason or (f"partial batch of {file_size - segment.size} bytes at byte "
                                f"{segment.size}")
            os.ftruncate(segment._fd, segment.size)
        segment._load_index(bytes(index_entries))
        return segment, reason

    def _load_index(self, expected: bytes) -> None:
        try:
            existing = self.index_path.read_bytes()
        except FileNotFoundError:
            existing = None
        if existing == expected:
            return
        if existing is None:
            log.info("%s: index missing, rebuilt with %d entries", self.index_path,
                     len(self._index_positions))
        elif expected.startswith(existing):
            log.info("%s: index lacked its last %d entries, rebuilt", self.index_path,
                     (len(expected) - len(existing)) // _INDEX_ENTRY.size)
        else:
            log.warning("%s: index does not match the segment, rebuilt with %d entries",
                        self.index_path, len(self._index_positions))
        fd = os.open(self.index_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, expected)
        finally:
            os.close(fd)

    @property
    def is_empty(self) -> bool:
        return self.size == 0

    def _index_fd_open(self) -> int:
        if self._index_fd is None:
            self._index_fd = os.open(self.index_path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        return self._index_fd

    def _add_batch(self, header: BatchHeader, position: int, index_entries: bytearray) -> None:
        """Kafka's indexing rule, per batch: an entry once more than index.interval.bytes
        were appended since the previous one. Deterministic, so recovery can check it."""
        if self._bytes_since_index_entry > self._index_interval_bytes:
            index_entries += _INDEX_ENTRY.pack(header.last_offset - self.base_offset, position)
            self._index_positions.append(position)
            self._bytes_since_index_entry = 0
        self._bytes_since_index_entry += header.size_in_bytes
        self._offsets.append(header.base_offset)
        self._positions.append(position)

    def append(self, data: bytes, headers: Sequence[BatchHeader]) -> None:
        """Write batches that start at ``next_offset``; a failed write leaves no partial
        batch behind."""
        position = self.size
        try:
            self._durability.check_space(self.log_path)
            _write_all(self._fd, data)
        except OSError:
            os.ftruncate(self._fd, self.size)
            raise
        index_entries = bytearray()
        for header in headers:
            self._add_batch(header, position, index_entries)
            position += header.size_in_bytes
        if index_entries:
            _write_all(self._index_fd_open(), index_entries)
        self.size = position
        self.next_offset = headers[-1].next_offset

    def position_of(self, offset: int) -> int:
        """The byte position where the batch containing ``offset`` starts (the size when
        ``offset`` is at or past the end)."""
        if offset >= self.next_offset or not self._positions:
            return self.size
        return self._positions[self._batch_containing(offset)]

    def _batch_containing(self, offset: int) -> int:
        return max(bisect_right(self._offsets, offset) - 1, 0)

    def read(self, start_offset: int, max_bytes: int, max_offset: int | None,
             min_one_batch: bool) -> tuple[bytes, bool]:
        """Whole batches from the one containing ``start_offset``; returns the bytes and
        whether they reach the end of this segment (the log then goes on to the next)."""
        offsets, positions = self._offsets, self._positions
        count = len(offsets)
        first = self._batch_containing(start_offset)
        if max_offset is None or self.next_offset <= max_offset:
            end = count
        else:
            end = bisect_right(offsets, max_offset) - 1  # batches before end lie below it
            if end <= first:
                return b"", False
        start_pos = positions[first]
        end_pos = positions[end] if end < count else self.size
        if end_pos - start_pos > max_bytes:
            fit = bisect_right(positions, start_pos + max(max_bytes, 0), first + 1, end) - 1
            if fit > first:
                end = fit
            elif min_one_batch:
                end = first + 1
            else:
                return b"", False
            end_pos = positions[end] if end < count else self.size
        data = os.pread(self._fd, end_pos - start_pos, start_pos)
        if len(data) != end_pos - start_pos:
            raise OSError(f"{self.log_path}: short read of {len(data)} bytes at {start_pos}, "
                          f"expected {end_pos - start_pos} (file truncated behind the log?)")
        return data, end == count

    def headers_from(self, offset: int) -> Iterator[BatchHeader]:
        for i in range(self._batch_containing(offset), len(self._positions)):
            yield BatchHeader.parse(os.pread(self._fd, BATCH_HEADER_SIZE, self._positions[i]))

    def read_batch(self, header: BatchHeader) -> bytes:
        """The whole batch ``header`` heads (a marker's record, when the log is rebuilt)."""
        position = self._positions[self._batch_containing(header.base_offset)]
        return os.pread(self._fd, header.size_in_bytes, position)

    def truncate_to(self, offset: int) -> None:
        """Remove the batch containing ``offset`` and everything after it."""
        first_removed = self._batch_containing(offset)
        cut = self._positions[first_removed]
        self.next_offset = self._offsets[first_removed]
        del self._offsets[first_removed:]
        del self._positions[first_removed:]
        os.ftruncate(self._fd, cut)
        self._durability.on_truncate(self.log_path, cut)
        self.size = cut
        kept = bisect_left(self._index_positions, cut)
        del self._index_positions[kept:]
        os.ftruncate(self._index_fd_open(), kept * _INDEX_ENTRY.size)
        self._durability.on_truncate(self.index_path, kept * _INDEX_ENTRY.size)
        self._bytes_since_index_entry = cut - (self._index_positions[-1] if kept else 0)
        self.txn_index.truncate_to(self.next_offset)

    def flush(self) -> None:
        self._durability.check_space(self.log_path)
        fsync(self._fd)
        self._durability.mark_durable(self.log_path, self.size)
        fsync(self._index_fd_open())
        self._durability.mark_durable(self.index_path,
                                      len(self._index_positions) * _INDEX_ENTRY.size)

    def close_index(self) -> None:
        """The segment stopped being the active one: its index no longer changes."""
        if self._index_fd is not None:
            os.close(self._index_fd)
            self._index_fd = None

    def close(self) -> None:
        self.close_index()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def delete(self) -> None:
        self.close()
        delete_files(self.log_path, self.index_path, self._durability)


def delete_files(segment_log: Path, segment_index: Path, durability: DurabilityTracker) -> None:
    for path in (segment_log, segment_index):
        path.unlink(missing_ok=True)
        durability.forget(path)
