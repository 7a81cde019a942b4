"""``Log``: the segments of one partition directory, with Kafka's recovery and flush policy.

Appends only write to the page cache. As in Kafka, nothing is fsynced on the produce path
unless ``log.flush.interval.messages`` / ``log.flush.interval.ms`` ask for it, except that a
segment is flushed when it is rolled; durability comes from replication. Every fsync is
reported to the ``DurabilityTracker`` so a simulated power loss drops exactly the unflushed
tail. Opening a log recovers it: every batch is validated and the first bad one (a torn
write, a flipped bit, a gap in the offsets) and everything after it is cut, the way Kafka
recovers after an unclean shutdown. As in Kafka's LogLoader, recovery flushes nothing: what
lies past the recovery point (the checkpointed offset below which everything was fsynced)
stays exposed to a power loss until a flush moves the recovery point (flush interval, roll,
clean shutdown). Like Kafka's UnifiedLog, the log owns its partition's
``ProducerStateManager``: appends check and record idempotent and transactional producers'
batches and the coordinators' markers; a marker that aborts a transaction goes into the
aborted-transaction index of the segment it lands in. Both are rebuilt from the batches
after recovery and after a truncation, so every way the log can shrink keeps them
consistent.
"""

from __future__ import annotations

import logging
import re
import time
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from minibroker.fsutil import fsync_dir
from minibroker.storage.control_records import (
    ControlRecordType,
    EndTransactionMarker,
    build_end_txn_marker,
    end_txn_marker_of,
)
from minibroker.storage.durability import DurabilityTracker
from minibroker.storage.producer_state import (
    AppendedBatch,
    AppendOrigin,
    ProducerStateManager,
    VerificationGuard,
)
from minibroker.storage.records import BatchHeader, assign_offsets, iter_batches
from minibroker.storage.segment import LogSegment, delete_files, index_path, log_path
from minibroker.storage.transaction_index import AbortedTxn, collect_aborted_txns

__all__ = ["Log", "LogAppendInfo", "OffsetOutOfRangeError", "UnexpectedAppendOffsetError"]

log = logging.getLogger("minibroker.log")

_SEGMENT_FILE = re.compile(r"(\d{20})\.(log|index)")
_MAX_RELATIVE_OFFSET = 2**31 - 1  # index entries store offsets relative to the segment base


class OffsetOutOfRangeError(Exception):
    """A read below the log start offset or past the log end offset."""


class UnexpectedAppendOffsetError(ValueError):
    """Follower batches that do not continue the log exactly at its end offset."""


@dataclass(frozen=True, slots=True)
class LogAppendInfo:
    """What an append wrote; for a producer's retry (``duplicate``) nothing was written and
    the offsets are those of the original batch."""

    first_offset: int
    last_offset: int
    num_records: int
    batches: list[BatchHeader]
    duplicate: bool = False


class Log:
    def __init__(
        self,
        dir: Path,
        *,
        durability: DurabilityTracker,
        segment_bytes: int = 64 << 20,
        flush_interval_messages: int | None = None,
        flush_interval_ms: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        index_interval_bytes: int = 4096,
        recovery_point: int = 0,
    ) -> None:
        if not 0 < segment_bytes <= 2**31 - 1:
            raise ValueError(f"segment.bytes must be in [1, 2^31-1], got {segment_bytes}")
        self._dir = Path(dir)
        self._durability = durability
        self._segment_bytes = segment_bytes
        self._flush_interval_messages = flush_interval_messages
        self._flush_interval_ms = flush_interval_ms
        self._clock = clock
        self._index_interval_bytes = index_interval_bytes
        self._segments: list[LogSegment] = []
        self._base_offsets: list[int] = []
        if not self._dir.is_dir():
            self._dir.mkdir(parents=True)
            fsync_dir(self._dir.parent)
        self._recover(recovery_point)
        self._log_end_offset = self._active.next_offset
        # LogLoader after an unclean shutdown: the recovery point never moves ahead at load.
        self._last_flushed_offset = min(recovery_point, self._log_end_offset)
        self._last_flush_time = clock()
        self.producer_state = ProducerStateManager(self._dir.name)
        self._rebuild_producer_state()

    # ---- views ---------------------------------------------------------------------

    def update_config(self, segment_bytes: int, flush_interval_messages: int | None,
                      flush_interval_ms: int | None) -> None:
        """A topic config change (Kafka's UnifiedLog.updateConfig): from the next append on."""
        self._segment_bytes = segment_bytes
        self._flush_interval_messages = flush_interval_messages
        self._flush_interval_ms = flush_interval_ms

    @property
    def dir(self) -> Path:
        return self._dir

    @property
    def log_start_offset(self) -> int:
        return self._segments[0].base_offset

    @property
    def log_end_offset(self) -> int:
        return self._log_end_offset

    @property
    def last_flushed_offset(self) -> int:
        """The recovery point: every offset below it has been fsynced."""
        return self._last_flushed_offset

    @property
    def size_in_bytes(self) -> int:
        return sum(segment.size for segment in self._segments)

    @property
    def segment_base_offsets(self) -> list[int]:
        return list(self._base_offsets)

    @property
    def _active(self) -> LogSegment:
        return self._segments[-1]

    def __repr__(self) -> str:
        return f"[Log {self._dir.name}]"

    # ---- recovery -------------------------------------------------------------------

    def _recover(self, recovery_point: int) -> None:
        bases: set[int] = set()
        indexes: set[int] = set()
        for path in self._dir.iterdir():
            match = _SEGMENT_FILE.fullmatch(path.name)
            if match:
                (bases if match[2] == "log" else indexes).add(int(match[1]))
        for orphan in sorted(indexes - bases):
            path = index_path(self._dir, orphan)
            log.info("%r deleting index %s that has no segment", self, path.name)
            path.unlink()
        cut = False
        for base in sorted(bases):
            if not cut and self._segments and base != self._active.next_offset:
                log.warning("%r recovery: segment %s starts at offset %d but the log ends at "
                            "%d", self, log_path(self._dir, base).name, base,
                            self._active.next_offset)
                cut = True
            if cut:
                log.warning("%r recovery deleted segment %s", self, log_path(self._dir, base).name)
                delete_files(log_path(self._dir, base), index_path(self._dir, base),
                             self._durability)
                continue
            segment, reason = LogSegment.load(self._dir, base, self._durability,
                                              self._index_interval_bytes)
            self._add_segment(segment)
            if reason is not None:
                log.warning("%r recovery cut segment %s at byte %d (offset %d): %s", self,
                            segment.log_path.name, segment.size, segment.next_offset, reason)
                cut = True
        if not self._segments:
            self._add_segment(LogSegment.create(self._dir, 0, self._durability,
                                                self._index_interval_bytes))
        for segment in self._segments:
            # Below the recovery point an earlier life fsynced everything; past it, nothing
            # is known to be durable, and loading does not make it so.
            self._durability.assume_durable(segment.log_path,
                                            segment.position_of(recovery_point))
            if segment.next_offset <= recovery_point:
                self._durability.assume_durable(segment.index_path,
                                                segment.index_path.stat().st_size)
            if segment is not self._active:
                segment.close_index()
        fsync_dir(self._dir)
        log.info("%r loaded %d segments, log start offset %d, log end offset %d", self,
                 len(self._segments), self.log_start_offset, self._active.next_offset)

    def _add_segment(self, segment: LogSegment) -> None:
        self._segments.append(segment)
        self._base_offsets.append(segment.base_offset)

    # ---- appends --------------------------------------------------------------------

    def append_as_leader(self, records: bytes, leader_epoch: int,
                         origin: AppendOrigin = AppendOrigin.CLIENT, *, verify: bool = False,
                         verification_guard: VerificationGuard | None = None
                         ) -> LogAppendInfo:
        """Validate a producer's batches, give them the next offsets and the leader epoch.

        Raises ``ProducerStateError`` for an idempotent batch that is fenced or out of
        sequence; a retry of a recent batch is not appended again (``duplicate``)."""
        data, headers = assign_offsets(records, self._log_end_offset, leader_epoch)
        original = self.producer_state.check_leader_append(
            headers, origin, verify=verify, verification_guard=verification_guard)
        if original is not None:
            return LogAppendInfo(original.first_offset, original.last_offset, 0, [],
                                 duplicate=True)
        info = self._append(data, headers)
        self._record_in(self._active, [(header, None) for header in headers])
        return info

    def append_end_txn_marker(self, producer_id: int, producer_epoch: int,
                              coordinator_epoch: int, control_type: ControlRecordType,
                              leader_epoch: int, timestamp_ms: int,
                              transaction_version: int = 0) -> LogAppendInfo:
        """Write a transaction marker for the coordinator (WriteTxnMarkers on the leader).

        Raises ``ProducerStateError`` for a marker of an older producer epoch (under
        transaction version 2, not newer) or of a coordinator older than the last
        marker's."""
        marker = EndTransactionMarker(control_type, coordinator_epoch)
        self.producer_state.check_marker_append(producer_id, producer_epoch, marker,
                                                self._log_end_offset, transaction_version)
        data, headers = assign_offsets(
            build_end_txn_marker(producer_id, producer_epoch, coordinator_epoch, control_type,
                                 timestamp_ms), self._log_end_offset, leader_epoch)
        info = self._append(data, headers)
        self._record_in(self._active, [(headers[0], marker)])
        return info

    def append_as_follower(self, records: bytes) -> LogAppendInfo:
        """Append batches fetched from the leader, which already carry offsets and epochs."""
        appended: list[AppendedBatch] = []
        expected = self._log_end_offset
        for header, batch in iter_batches(records):
            if header.base_offset != expected:
                raise UnexpectedAppendOffsetError(
                    f"{self!r} follower append: batch at offset {header.base_offset} where "
                    f"{expected} was expected (log end offset {self._log_end_offset})")
            appended.append((header, end_txn_marker_of(header, batch) if header.is_control
                             else None))
            expected = header.next_offset
        info = self._append(bytes(records), [header for header, _ in appended])
        self._record_in(self._active, appended)
        return info

    def _record_in(self, segment: LogSegment, appended: list[AppendedBatch]) -> None:
        """Kafka's UnifiedLog.append after the write: the producer state takes the batches
        (now in ``segment``), and each transaction a marker closed is indexed (if aborted)
        with the LSO it leaves, and then completed."""
        for txn in self.producer_state.append(appended):
            if txn.is_aborted:
                segment.txn_index.append(AbortedTxn(
                    txn.producer_id, txn.first_offset, txn.last_offset,
                    self.producer_state.last_stable_offset(txn)))
            self.producer_state.complete_txn(txn)

    def _append(self, data: bytes, headers: list[BatchHeader]) -> LogAppendInfo:
        if not headers:
            return LogAppendInfo(self._log_end_offset, self._log_end_offset - 1, 0, [])
        active = self._active
        if not active.is_empty and (
                active.size + len(data) > self._segment_bytes
                or headers[-1].last_offset - active.base_offset > _MAX_RELATIVE_OFFSET):
            self._roll()
        self._active.append(data, headers)
        self._log_end_offset = headers[-1].next_offset
        self.maybe_flush()
        return LogAppendInfo(
            first_offset=headers[0].base_offset,
            last_offset=headers[-1].last_offset,
            num_records=sum(header.records_count for header in headers),
            batches=headers,
        )

    def _roll(self) -> None:
        """Start a segment at the log end offset. Kafka flushes the finished segment then."""
        started = time.monotonic()
        self._flush_to_end()
        self._active.close_index()
        self._add_segment(LogSegment.create(self._dir, self._log_end_offset, self._durability,
                                            self._index_interval_bytes))
        fsync_dir(self._dir)
        log.info("%r rolled new log segment at offset %d in %.1f ms", self,
                 self._log_end_offset, (time.monotonic() - started) * 1000)

    # ---- reads ----------------------------------------------------------------------

    def read(self, start_offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        """Whole batches from the one containing ``start_offset``, none ending past
        ``max_offset``, at most ``max_bytes`` unless the first batch alone is larger (Kafka
        returns it anyway so that a large batch cannot block a consumer)."""
        self._check_offset(start_offset)
        if start_offset == self._log_end_offset:
            return b""
        chunks = []
        remaining = max_bytes
        offset = start_offset
        for i in range(bisect_right(self._base_offsets, start_offset) - 1, len(self._segments)):
            segment = self._segments[i]
            if segment.is_empty:
                break
            data, reached_end = segment.read(offset, remaining, max_offset,
                                             min_one_batch=not chunks)
            if data:
                chunks.append(data)
                remaining -= len(data)
            if not reached_end or remaining <= 0:
                break
            offset = segment.next_offset
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def batches_from(self, offset: int) -> Iterator[BatchHeader]:
        """Headers of the batches from the one containing ``offset`` to the end (for
        rebuilding the leader epoch cache). Do not append while iterating."""
        self._check_offset(offset)
        if offset == self._log_end_offset:
            return
        for i in range(bisect_right(self._base_offsets, offset) - 1, len(self._segments)):
            segment = self._segments[i]
            yield from segment.headers_from(max(offset, segment.base_offset))

    def collect_aborted_txns(self, fetch_offset: int, upper_bound: int) -> list[AbortedTxn]:
        """The aborted transactions a ``read_committed`` fetch from ``fetch_offset`` that
        reads below ``upper_bound`` must send with its records."""
        first = max(bisect_right(self._base_offsets, fetch_offset) - 1, 0)
        return collect_aborted_txns((segment.txn_index for segment in self._segments[first:]),
                                    fetch_offset, upper_bound)

    def first_unstable_offset(self) -> int | None:
        """The first offset of a transaction not yet stable (open, or its marker not yet
        below the high watermark); None when every transaction here is."""
        return self.producer_state.first_unstable_offset()

    def on_high_watermark_updated(self, high_watermark: int) -> None:
        self.producer_state.on_high_watermark_updated(high_watermark)

    def _check_offset(self, offset: int) -> None:
        if not self.log_start_offset <= offset <= self._log_end_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} is out of range for {self._dir.name}: log start offset "
                f"{self.log_start_offset}, log end offset {self._log_end_offset}")

    # ---- truncation -----------------------------------------------------------------

    def truncate_to(self, offset: int) -> int:
        """Remove every offset >= ``offset`` at a batch boundary (the batch containing
        ``offset`` goes too); returns the new log end offset."""
        if offset < 0:
            raise ValueError(f"{self!r} cannot truncate to negative offset {offset}")
        if offset >= self._log_end_offset:
            return self._log_end_offset
        if offset < self.log_start_offset:
            self.truncate_fully_and_start_at(offset)
            return self._log_end_offset
        old_end = self._log_end_offset
        deleted = 0
        while self._active.base_offset > offset:
            self._segments.pop().delete()
            self._base_offsets.pop()
            deleted += 1
        self._active.truncate_to(offset)
        if deleted:
            fsync_dir(self._dir)
        self._log_end_offset = self._active.next_offset
        self._last_flushed_offset = min(self._last_flushed_offset, self._log_end_offset)
        if self.producer_state.knows_offsets_from(self._log_end_offset):
            self._rebuild_producer_state()
        log.info("%r truncated to offset %d (asked %d, was %d, %d segments deleted)", self,
                 self._log_end_offset, offset, old_end, deleted)
        return self._log_end_offset

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete every segment and start empty at ``offset`` (a follower whose log no longer
        overlaps the leader's)."""
        if offset < 0:
            raise ValueError(f"{self!r} cannot start at negative offset {offset}")
        for segment in self._segments:
            segment.delete()
        self._segments.clear()
        self._base_offsets.clear()
        self._add_segment(LogSegment.create(self._dir, offset, self._durability,
                                            self._index_interval_bytes))
        fsync_dir(self._dir)
        self._log_end_offset = offset
        self._last_flushed_offset = offset
        self.producer_state.clear()
        log.info("%r truncated fully, log now starts at offset %d", self, offset)

    def _rebuild_producer_state(self) -> None:
        """Replay every batch (no snapshots: the headers, and a marker's one record, are the
        state's source), and with it the aborted-transaction indexes."""
        started = time.monotonic()
        self.producer_state.clear()
        for segment in self._segments:
            segment.txn_index.entries.clear()
        for segment in self._segments:
            for header in segment.headers_from(segment.base_offset):
                if header.producer_id < 0:
                    continue
                marker = (end_txn_marker_of(header, segment.read_batch(header))
                          if header.is_control else None)
                self._record_in(segment, [(header, marker)])
        if self.producer_state.producers:
            log.info("%r rebuilt the state of %d producers from the log in %.1f ms", self,
                     len(self.producer_state.producers), (time.monotonic() - started) * 1000)

    # ---- flushing -------------------------------------------------------------------

    def flush(self) -> None:
        """fsync everything appended so far."""
        if self._log_end_offset > self._last_flushed_offset:
            self._flush_to_end()

    def _flush_to_end(self) -> None:
        """fsync every segment from the one holding the recovery point to the active one,
        as Kafka's `LocalLog.flush` does (`segments.values(recoveryPoint, offset)`): after
        a restart whose recovery point lagged, segments before the active one hold
        unflushed bytes too, and moving the recovery point past them unflushed would claim
        durability a power loss then takes back."""
        first = max(bisect_right(self._base_offsets, self._last_flushed_offset) - 1, 0)
        for segment in self._segments[first:]:
            segment.flush()
            if segment is not self._active:
                segment.close_index()
        self._last_flushed_offset = self._log_end_offset
        self._last_flush_time = self._clock()

    def maybe_flush(self) -> None:
        """Apply log.flush.interval.messages / log.flush.interval.ms (None: never)."""
        unflushed = self._log_end_offset - self._last_flushed_offset
        if unflushed <= 0:
            return
        by_messages = self._flush_interval_messages
        by_time = self._flush_interval_ms
        if (by_messages is not None and unflushed >= by_messages) or (
                by_time is not None and (self._clock() - self._last_flush_time) * 1000 >= by_time):
            self._flush_to_end()

    def close(self) -> None:
        """Release the files without flushing, so that a simulated crash can close a log and
        still lose its unflushed tail. A clean shutdown calls ``flush()`` first, as Kafka's
        LogManager does."""
        for segment in self._segments:
            segment.close()
