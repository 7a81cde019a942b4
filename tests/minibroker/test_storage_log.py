"""Log: appends, reads, segments, truncation, recovery, flush policy and power loss.

Long (about 620 lines): one ``Log`` and its segment files, each of its jobs above a section
of tests, which share the builders at the top."""

from __future__ import annotations

import logging
import os
import random
import struct
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from minibroker.storage.durability import DurabilityTracker
from minibroker.storage.log import Log, OffsetOutOfRangeError, UnexpectedAppendOffsetError
from minibroker.storage.records import (
    BatchHeader,
    CorruptRecordError,
    build_batch,
    decode_values,
    iter_batches,
)

BIG = 1 << 30


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def open_log(directory: Path, tracker: DurabilityTracker | None = None, **kwargs) -> Log:
    return Log(directory, durability=tracker or DurabilityTracker(), **kwargs)


def produce(log: Log, batches: int, per_batch: int, epoch: int = 0) -> list[bytes]:
    """Append ``batches`` batches; every value names the offset the leader should give it."""
    values = []
    for _ in range(batches):
        start = log.log_end_offset
        batch_values = [b"value-%06d" % (start + i) for i in range(per_batch)]
        info = log.append_as_leader(build_batch(batch_values), epoch)
        assert (info.first_offset, info.last_offset) == (start, start + per_batch - 1)
        values.extend(batch_values)
    return values


def offsets_read(log: Log, start: int, max_bytes: int = BIG, max_offset: int | None = None):
    return [offset for offset, _ in decode_values(log.read(start, max_bytes, max_offset))]


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "orders-0"


@pytest.fixture
def log(log_dir: Path):
    opened = open_log(log_dir)
    yield opened
    opened.close()


def test_append_assigns_offsets_and_reads_from_any_offset(log: Log) -> None:
    values = produce(log, 3, 5, epoch=4)

    assert log.log_end_offset == 15
    assert decode_values(log.read(0, BIG)) == list(enumerate(values))
    assert offsets_read(log, 7) == list(range(5, 15))  # from the batch containing 7
    assert offsets_read(log, 10) == list(range(10, 15))
    assert log.read(15, BIG) == b""
    assert all(h.partition_leader_epoch == 4 for h, _ in iter_batches(log.read(0, BIG)))
    for bad in (-1, 16):
        with pytest.raises(OffsetOutOfRangeError, match=f"offset {bad} is out of range"):
            log.read(bad, BIG)


def test_max_offset_returns_only_batches_below_it(log: Log) -> None:
    produce(log, 3, 5)

    assert offsets_read(log, 0, max_offset=10) == list(range(10))
    assert offsets_read(log, 0, max_offset=12) == list(range(10))  # 10..14 not all below
    assert offsets_read(log, 5, max_offset=15) == list(range(5, 15))
    assert log.read(0, BIG, max_offset=3) == b""
    assert log.read(10, BIG, max_offset=10) == b""


def test_max_bytes_returns_whole_batches_and_at_least_one(log: Log) -> None:
    produce(log, 4, 3)
    size = len(log.read(0, BIG)) // 4

    assert offsets_read(log, 0, max_bytes=size) == [0, 1, 2]
    assert offsets_read(log, 0, max_bytes=2 * size - 1) == [0, 1, 2]
    assert offsets_read(log, 0, max_bytes=2 * size) == list(range(6))
    assert offsets_read(log, 3, max_bytes=1) == [3, 4, 5]
    assert offsets_read(log, 3, max_bytes=0) == [3, 4, 5]

    log.append_as_leader(build_batch([b"x" * 1000] * 20), 0)  # one batch over max_bytes
    assert offsets_read(log, 12, max_bytes=100) == list(range(12, 32))


def test_segments_roll_and_reads_cross_them(log_dir: Path) -> None:
    tracker = DurabilityTracker()
    log = open_log(log_dir, tracker, segment_bytes=500)
    values = produce(log, 20, 4)
    bases = log.segment_base_offsets

    assert len(bases) > 3
    assert sorted(p.name for p in log_dir.glob("*.log")) == [f"{b:020d}.log" for b in bases]
    assert all(os.path.getsize(log_dir / f"{b:020d}.log") <= 500 for b in bases)
    assert decode_values(log.read(0, BIG)) == list(enumerate(values))
    middle = bases[2] + 1
    assert offsets_read(log, middle)[0] == bases[2]
    batch_size = len(log.read(0, 1))
    crossing = offsets_read(log, bases[1] - 4, max_bytes=3 * batch_size)
    assert crossing == list(range(bases[1] - 4, bases[1] + 8))
    # Kafka flushes a segment when it is rolled.
    for base in bases[:-1]:
        path = log_dir / f"{base:020d}.log"
        assert tracker.durable_size(path) == os.path.getsize(path)
    assert log.last_flushed_offset == bases[-1]
    log.close()


def test_truncate_inside_a_batch_removes_the_whole_batch(log: Log) -> None:
    produce(log, 4, 5)

    assert log.truncate_to(12) == 10
    assert log.log_end_offset == 10
    assert offsets_read(log, 0) == list(range(10))
    assert log.truncate_to(5) == 5  # exactly at a boundary
    assert log.truncate_to(7) == 5  # at or past the end: nothing to do
    produce(log, 1, 2, epoch=1)
    assert offsets_read(log, 0) == list(range(7))


def test_truncate_deletes_later_segments_and_reopens_consistently(log_dir: Path) -> None:
    log = open_log(log_dir, segment_bytes=600)
    values = produce(log, 12, 3)
    bases = log.segment_base_offsets
    cut = bases[1]  # exactly the base of the second segment

    assert log.truncate_to(cut) == cut
    assert log.segment_base_offsets == bases[:2]
    assert sorted(p.name for p in log_dir.iterdir()) == sorted(
        f"{b:020d}.{ext}" for b in bases[:2] for ext in ("log", "index"))
    produce(log, 2, 3)
    log.close()

    reopened = open_log(log_dir, segment_bytes=600)
    assert reopened.log_end_offset == cut + 6
    assert [v for _, v in decode_values(reopened.read(0, BIG))][:cut] == values[:cut]
    reopened.close()


def test_reopen_gives_the_same_log(log_dir: Path) -> None:
    log = open_log(log_dir, segment_bytes=2000)
    produce(log, 30, 4)
    contents, end, bases = log.read(0, BIG), log.log_end_offset, log.segment_base_offsets
    log.close()

    reopened = open_log(log_dir, segment_bytes=2000)
    assert (reopened.log_end_offset, reopened.segment_base_offsets) == (end, bases)
    assert reopened.read(0, BIG) == contents
    produce(reopened, 1, 1)
    assert reopened.log_end_offset == end + 1
    reopened.close()


def active_segment(log_dir: Path) -> Path:
    return max(log_dir.glob("*.log"))


@pytest.mark.parametrize("tail", [
    b"\x00" * 100,
    os.urandom(7),
    build_batch([b"torn"] * 10, base_offset=12)[:-9],
    build_batch([b"torn"] * 10, base_offset=12)[:30],
], ids=["zeros", "garbage", "half-batch", "half-header"])
def test_recovery_cuts_a_torn_tail(log_dir: Path, tail: bytes, caplog) -> None:
    log = open_log(log_dir)
    produce(log, 4, 3)
    good = log.read(0, BIG)
    log.close()
    with open(active_segment(log_dir), "ab") as f:
        f.write(tail)

    with caplog.at_level(logging.WARNING, logger="minibroker.log"):
        recovered = open_log(log_dir)
    assert recovered.log_end_offset == 12
    assert recovered.read(0, BIG) == good
    assert os.path.getsize(active_segment(log_dir)) == len(good)
    assert f"recovery cut segment 00000000000000000000.log at byte {len(good)}" in caplog.text
    produce(recovered, 1, 1)
    assert recovered.log_end_offset == 13
    recovered.close()


def test_corrupt_batch_in_the_middle_cuts_from_there(log_dir: Path, caplog) -> None:
    log = open_log(log_dir, segment_bytes=500)
    produce(log, 20, 2)
    bases = log.segment_base_offsets
    victim = log_dir / f"{bases[1]:020d}.log"
    headers = [h for h, _ in iter_batches(victim.read_bytes())]
    log.close()
    with open(victim, "r+b") as f:  # flip a bit inside the records of the second batch
        f.seek(headers[0].size_in_bytes + 70)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x10]))

    with caplog.at_level(logging.WARNING, logger="minibroker.log"):
        recovered = open_log(log_dir, segment_bytes=500)
    assert recovered.log_end_offset == headers[1].base_offset
    assert recovered.segment_base_offsets == bases[:2]
    assert not (log_dir / f"{bases[2]:020d}.log").exists()
    assert "CRC mismatch" in caplog.text
    assert offsets_read(recovered, 0) == list(range(headers[1].base_offset))
    recovered.close()


def test_gap_between_segments_cuts_the_later_segments(log_dir: Path) -> None:
    log = open_log(log_dir, segment_bytes=500)
    produce(log, 20, 2)
    bases = log.segment_base_offsets
    log.close()
    (log_dir / f"{bases[1]:020d}.log").unlink()

    recovered = open_log(log_dir, segment_bytes=500)
    assert recovered.segment_base_offsets == [0]
    assert recovered.log_end_offset == bases[1]
    recovered.close()


def index_entries(path: Path) -> list[tuple[int, int]]:
    data = path.read_bytes()
    return [struct.unpack_from(">ii", data, i) for i in range(0, len(data), 8)]


def test_offset_index_is_kafka_like_and_rebuilt_when_lost_or_corrupt(log_dir: Path) -> None:
    log = open_log(log_dir, index_interval_bytes=256)
    produce(log, 40, 3)
    log.close()
    index = log_dir / "00000000000000000000.index"
    segment = (log_dir / "00000000000000000000.log").read_bytes()
    entries = index_entries(index)

    assert len(entries) > 5
    for relative_offset, position in entries:  # kafka-dump-log's --index-sanity-check
        assert BatchHeader.parse(segment, position).last_offset == relative_offset
    assert entries == sorted(entries)

    index.unlink()
    open_log(log_dir, index_interval_bytes=256).close()
    assert index_entries(index) == entries
    index.write_bytes(b"\x01" * 24)
    open_log(log_dir, index_interval_bytes=256).close()
    assert index_entries(index) == entries


def test_follower_append_copies_the_leader_exactly(tmp_path: Path) -> None:
    leader = open_log(tmp_path / "leader-0")
    follower = open_log(tmp_path / "follower-0")
    produce(leader, 5, 3, epoch=2)

    info = follower.append_as_follower(leader.read(0, BIG, max_offset=9))
    assert (info.first_offset, info.last_offset, info.num_records) == (0, 8, 9)
    follower.append_as_follower(leader.read(9, BIG))
    assert follower.read(0, BIG) == leader.read(0, BIG)
    assert [h.partition_leader_epoch for h in info.batches] == [2, 2, 2]

    produce(leader, 2, 3)
    with pytest.raises(UnexpectedAppendOffsetError, match="batch at offset 18 where 15"):
        follower.append_as_follower(leader.read(18, BIG))
    with pytest.raises(UnexpectedAppendOffsetError, match="batch at offset 12 where 15"):
        follower.append_as_follower(leader.read(12, BIG))
    assert follower.log_end_offset == 15
    leader.close()
    follower.close()


def test_rejected_appends_change_nothing(log: Log) -> None:
    produce(log, 2, 2)
    before = log.read(0, BIG)
    corrupted = bytearray(build_batch([b"a", b"b"]))
    corrupted[-1] ^= 0xFF

    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        log.append_as_leader(bytes(corrupted), 0)
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        log.append_as_follower(bytes(corrupted))
    assert (log.log_end_offset, log.read(0, BIG)) == (4, before)
    assert log.append_as_leader(b"", 0).num_records == 0
    assert log.log_end_offset == 4


def test_truncate_fully_and_start_at(log_dir: Path) -> None:
    log = open_log(log_dir, segment_bytes=500)
    produce(log, 10, 2)

    log.truncate_fully_and_start_at(100)
    assert (log.log_start_offset, log.log_end_offset) == (100, 100)
    assert log.read(100, BIG) == b""
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, BIG)
    produce(log, 1, 2)
    log.close()
    assert sorted(p.name for p in log_dir.glob("*.log")) == ["00000000000000000100.log"]
    reopened = open_log(log_dir)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (100, 102)
    reopened.close()


def test_batches_from_lists_headers_for_epoch_rebuilds(log_dir: Path) -> None:
    log = open_log(log_dir, segment_bytes=400)
    for epoch in (0, 0, 3, 3, 5):
        produce(log, 2, 2, epoch=epoch)

    headers = list(log.batches_from(5))
    assert headers[0].base_offset == 4
    assert [h.base_offset for h in headers] == list(range(4, 20, 2))
    assert [h.partition_leader_epoch for h in log.batches_from(0)] == [0] * 4 + [3] * 4 + [5] * 2
    assert list(log.batches_from(20)) == []
    log.close()


def test_default_policy_never_fsyncs_on_append(log_dir: Path) -> None:
    tracker = DurabilityTracker()
    log = open_log(log_dir, tracker)
    baseline = tracker.fsync_count
    produce(log, 50, 10)

    assert tracker.fsync_count == baseline
    assert log.last_flushed_offset == 0
    log.flush()
    assert tracker.fsync_count > baseline
    assert log.last_flushed_offset == 500
    log.close()


def test_flush_interval_messages(log_dir: Path) -> None:
    tracker = DurabilityTracker()
    log = open_log(log_dir, tracker, flush_interval_messages=10)
    segment = log_dir / "00000000000000000000.log"
    baseline = tracker.fsync_count

    produce(log, 2, 4)
    assert (log.last_flushed_offset, tracker.fsync_count) == (0, baseline)
    produce(log, 1, 4)  # 12 unflushed messages >= 10
    assert log.last_flushed_offset == 12
    assert tracker.durable_size(segment) == os.path.getsize(segment)
    flushes = tracker.fsync_count - baseline
    assert flushes > 0
    produce(log, 2, 4)
    assert log.last_flushed_offset == 12
    produce(log, 1, 4)
    assert log.last_flushed_offset == 24
    assert tracker.fsync_count - baseline == 2 * flushes
    log.close()


def test_flush_interval_ms(log_dir: Path) -> None:
    tracker = DurabilityTracker()
    clock = FakeClock()
    log = open_log(log_dir, tracker, flush_interval_ms=1000, clock=clock)

    produce(log, 3, 2)
    log.maybe_flush()
    assert log.last_flushed_offset == 0
    clock.now += 1.0
    log.maybe_flush()
    assert log.last_flushed_offset == 6
    produce(log, 1, 2)
    clock.now += 0.5
    log.maybe_flush()
    assert log.last_flushed_offset == 6
    clock.now += 0.5
    produce(log, 1, 2)  # the check also runs on append
    assert log.last_flushed_offset == 10
    log.close()


def test_power_loss_drops_exactly_the_unflushed_tail(log_dir: Path) -> None:
    tracker = DurabilityTracker()
    log = open_log(log_dir, tracker, segment_bytes=800)
    produce(log, 12, 3)
    log.flush()
    durable = log.read(0, BIG)
    flushed_end = log.log_end_offset
    bases_before = log.segment_base_offsets
    produce(log, 12, 3)  # rolls segments (which Kafka flushes) and leaves an unflushed tail
    rolled_to = log.segment_base_offsets[-1]
    assert rolled_to > flushed_end

    log.close()  # a crash releases the files without flushing them
    lost = tracker.simulate_power_loss()

    assert sum(lost.values()) > 0
    recovered = open_log(log_dir, DurabilityTracker(), segment_bytes=800)
    assert recovered.log_end_offset == rolled_to
    assert recovered.read(0, BIG)[:len(durable)] == durable
    assert recovered.segment_base_offsets[:len(bases_before)] == bases_before
    recovered.close()


def test_power_loss_without_any_flush_loses_everything_unrolled(log_dir: Path) -> None:
    tracker = DurabilityTracker()
    log = open_log(log_dir, tracker)
    produce(log, 5, 5)
    log.close()
    tracker.simulate_power_loss()

    recovered = open_log(log_dir, DurabilityTracker())
    assert (recovered.log_start_offset, recovered.log_end_offset) == (0, 0)
    recovered.close()


def test_loading_flushes_nothing_past_the_recovery_point(log_dir: Path) -> None:
    """Kafka's LogLoader after an unclean shutdown: the unflushed tail is recovered (its CRCs
    checked) but not fsynced, and the recovery point stays where the checkpoint put it. A
    kill leaves the tail in the page cache; a power loss after the restart still drops it.
    (Two power losses in a row cannot show this: the first one leaves nothing unflushed.)"""
    log = open_log(log_dir, DurabilityTracker())
    produce(log, 4, 5)
    log.flush()
    recovery_point = log.last_flushed_offset
    produce(log, 3, 5)  # offsets 20-34, in the page cache only
    log.close()  # kill -9: the page cache keeps them

    tracker = DurabilityTracker()  # the restarted process
    restarted = open_log(log_dir, tracker, recovery_point=recovery_point)
    assert (restarted.log_end_offset, restarted.last_flushed_offset) == (35, 20)
    assert tracker.fsync_count == 0
    restarted.close()
    tracker.simulate_power_loss()

    after = open_log(log_dir, DurabilityTracker(), recovery_point=recovery_point)
    assert after.log_end_offset == recovery_point
    assert offsets_read(after, 0) == list(range(20))
    after.close()


@dataclass(frozen=True)
class ModelBatch:
    base: int
    next: int
    size: int
    values: list[bytes]


@dataclass
class LogModel:
    """What a log must hold by Kafka's rules, worked out from the operations alone: it never
    looks at the log under test. It knows where segments roll and so what was fsynced, and
    so what a crash keeps: a kill keeps everything (the page cache survives), a power loss
    exactly the batches below the recovery point. A flush, and a roll, make the whole log
    durable up to its end, and a restart loads from the recovery point, so what is durable
    is always that prefix of batches."""

    segment_bytes: int
    batches: list[ModelBatch] = field(default_factory=list)
    segment_bases: list[int] = field(default_factory=lambda: [0])
    recovery_point: int = 0
    """Kafka's recovery point: every offset below it was fsynced."""

    @property
    def end(self) -> int:
        return self.batches[-1].next if self.batches else self.segment_bases[-1]

    def records(self) -> list[tuple[int, bytes]]:
        return [pair for batch in self.batches
                for pair in zip(range(batch.base, batch.next), batch.values, strict=True)]

    def append(self, values: list[bytes], size: int) -> None:
        """A batch that does not fit a non-empty active segment rolls a new one at the log
        end, and the finished segment is flushed (Kafka's UnifiedLog.roll, then
        flushUptoOffsetExclusive of the new base offset)."""
        active = sum(b.size for b in self.batches if b.base >= self.segment_bases[-1])
        if active and active + size > self.segment_bytes:
            self.recovery_point = self.end
            self.segment_bases.append(self.end)
        self.batches.append(ModelBatch(self.end, self.end + len(values), size, values))

    def read(self, start: int, max_bytes: int, max_offset: int | None) -> list[tuple[int, bytes]]:
        """Whole batches from the one holding ``start``: none ending past ``max_offset``, and
        within ``max_bytes`` except for the first (Kafka's fetch rules)."""
        expected: list[tuple[int, bytes]] = []
        budget = max_bytes
        for batch in self.batches:
            if batch.next <= start:
                continue
            if (max_offset is not None and batch.next > max_offset) or (
                    expected and batch.size > budget):
                break
            expected.extend(zip(range(batch.base, batch.next), batch.values, strict=True))
            budget -= batch.size
        return expected

    def truncate(self, target: int) -> None:
        """Kafka's UnifiedLog.truncateTo: the batch holding ``target`` and all after it go,
        segments starting past it are deleted, the recovery point cannot stay past the end."""
        if target >= self.end:
            return
        self.batches = [b for b in self.batches if b.next <= target]
        self.segment_bases = [base for base in self.segment_bases if base <= target]
        self.recovery_point = min(self.recovery_point, self.end)

    def flush(self) -> None:
        self.recovery_point = self.end

    def power_loss(self) -> None:
        """Only fsynced bytes survive: the batches below the recovery point. Recovery keeps
        segments while each starts where the log so far ends (Kafka's LogLoader), so a
        segment starting past the recovery point is deleted."""
        self.batches = [b for b in self.batches if b.next <= self.recovery_point]
        self.segment_bases = [base for base in self.segment_bases
                              if base <= self.recovery_point]


@pytest.mark.parametrize("seed", range(1, 11))
def test_random_operations_match_a_model(tmp_path: Path, seed: int) -> None:
    """Appends, reads, truncations, flushes, kills and power losses against ``LogModel``.
    After every operation the log end offset, the recovery point and the segments must be
    the model's; after every restart the whole log must be, record by record. Each restart
    loads from the model's recovery point, as LogManager loads from its checkpoint."""
    rng = random.Random(seed)
    directory = tmp_path / "model-0"
    tracker = DurabilityTracker()
    settings = {"segment_bytes": 2000, "index_interval_bytes": 300}
    log = open_log(directory, tracker, **settings)
    model = LogModel(segment_bytes=settings["segment_bytes"])

    for _ in range(200):
        op = rng.choices(["append", "read", "truncate", "flush", "kill", "power loss"],
                         weights=[10, 10, 2, 1, 2, 2])[0]
        if op == "append":
            values = [rng.randbytes(rng.randint(0, 120)) for _ in range(rng.randint(1, 8))]
            batch = build_batch(values)
            log.append_as_leader(batch, rng.randint(0, 3))
            model.append(values, len(batch))
        elif op == "read":
            start = rng.randint(0, model.end)
            max_bytes = rng.randint(0, 1500)
            max_offset = rng.choice([None, rng.randint(0, model.end)])
            assert decode_values(log.read(start, max_bytes, max_offset)) == model.read(
                start, max_bytes, max_offset)
        elif op == "truncate":
            target = rng.randint(0, model.end)
            model.truncate(target)
            assert log.truncate_to(target) == model.end
        elif op == "flush":
            log.flush()
            model.flush()
        else:
            log.close()  # a crash: nothing is flushed on the way down
            if op == "power loss":
                tracker.simulate_power_loss()
                tracker = DurabilityTracker()  # the next process's
                model.power_loss()
            log = open_log(directory, tracker, recovery_point=model.recovery_point,
                           **settings)
            assert decode_values(log.read(0, BIG)) == model.records(), f"after a {op}"
        assert (log.log_start_offset, log.log_end_offset) == (0, model.end), op
        assert log.last_flushed_offset == model.recovery_point, op
        assert log.segment_base_offsets == model.segment_bases, op
    assert decode_values(log.read(0, BIG)) == model.records()
    log.close()


def test_a_full_disk_refuses_appends_and_fsyncs_and_leaves_the_log_as_it_was(
        log_dir: Path) -> None:
    """ENOSPC as a file system with no free blocks gives it: the append fails whole (no
    partial batch, the log end offset unmoved), so nothing is half-written for a restart to
    find; once space is back the same log takes appends again."""
    tracker = DurabilityTracker()
    log = open_log(log_dir, tracker)
    values = produce(log, 2, 3)
    tracker.out_of_space = True
    with pytest.raises(OSError, match="No space left on device") as refused:
        log.append_as_leader(build_batch([b"lost"]), 0)
    assert refused.value.errno == 28
    with pytest.raises(OSError, match="No space left on device"):
        log.flush()
    assert log.log_end_offset == 6
    assert offsets_read(log, 0) == list(range(6))
    tracker.out_of_space = False
    values += produce(log, 1, 2)
    assert offsets_read(log, 0) == list(range(8)) and len(values) == 8


def test_a_flush_after_a_restart_fsyncs_every_segment_past_the_recovery_point(
        log_dir: Path) -> None:
    """Kafka's LocalLog.flush fsyncs the segments from the recovery point to the flush
    offset, not only the active one: a restart whose recovery point lagged (a kill before
    the checkpoint) left whole unflushed segments behind the active one, and a flush that
    skipped them would move the recovery point past bytes a power loss still takes."""
    log = open_log(log_dir, DurabilityTracker(), segment_bytes=800)
    produce(log, 12, 3)  # several segments, none fsynced (rolled segments are, in this life)
    log.close()  # kill -9 before any recovery point was checkpointed: the page cache keeps all

    tracker = DurabilityTracker()  # the restarted process: nothing known to be durable
    restarted = open_log(log_dir, tracker, segment_bytes=800, recovery_point=0)
    assert len(restarted.segment_base_offsets) > 1
    written = restarted.read(0, BIG)
    produce(restarted, 1, 3)
    restarted.flush()
    assert restarted.last_flushed_offset == restarted.log_end_offset
    end = restarted.log_end_offset
    restarted.close()
    tracker.simulate_power_loss()

    after = open_log(log_dir, DurabilityTracker(), segment_bytes=800, recovery_point=end)
    assert after.log_end_offset == end
    assert after.read(0, BIG)[:len(written)] == written
    after.close()
