"""LeaderEpochCache: Kafka's OffsetsForLeaderEpoch answers, assignment and truncation."""

from __future__ import annotations

from pathlib import Path

import pytest

from minibroker.storage.checkpoints import (
    LEADER_EPOCH_CHECKPOINT_FILE,
    EpochEntry,
    LeaderEpochCheckpointFile,
)
from minibroker.storage.durability import DurabilityTracker
from minibroker.storage.leader_epoch_cache import (
    UNDEFINED_EPOCH,
    UNDEFINED_EPOCH_OFFSET,
    LeaderEpochCache,
)
from minibroker.storage.log import Log
from minibroker.storage.records import build_batch

UNDEFINED = (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)


def new_cache(directory: Path, *entries: tuple[int, int]) -> LeaderEpochCache:
    cache = LeaderEpochCache(LeaderEpochCheckpointFile(directory / LEADER_EPOCH_CHECKPOINT_FILE))
    for epoch, start_offset in entries:
        cache.assign(epoch, start_offset)
    return cache


def as_pairs(cache: LeaderEpochCache) -> list[tuple[int, int]]:
    return [(e.epoch, e.start_offset) for e in cache.entries]


# Epochs 0, 1 (seed 001's <0, 0> and <1, 120>) and 3; epoch 2 never wrote anything here.
ENTRIES = ((0, 0), (1, 120), (3, 200))
LOG_END = 250


@pytest.mark.parametrize(("requested", "expected"), [
    (UNDEFINED_EPOCH, UNDEFINED),
    (3, (3, LOG_END)),  # the latest epoch ends at the log end offset
    (0, (0, 120)),  # an older epoch ends where the next one starts
    (1, (1, 200)),
    (2, (1, 200)),  # unknown epoch: the largest smaller one, up to the next higher start
    (4, UNDEFINED),  # newer than anything known
])
def test_end_offset_for(tmp_path: Path, requested: int, expected: tuple[int, int]) -> None:
    assert new_cache(tmp_path, *ENTRIES).end_offset_for(requested, LOG_END) == expected


@pytest.mark.parametrize(("requested", "expected"), [
    (0, (0, 50)),  # smaller than every known epoch: (requested, start of the first one)
    (1, (1, 50)),
    (2, (2, 80)),
    (3, (2, 80)),
    (5, (5, 90)),
])
def test_end_offset_for_epochs_below_the_first(
        tmp_path: Path, requested: int, expected: tuple[int, int]) -> None:
    assert new_cache(tmp_path, (2, 50), (5, 80)).end_offset_for(requested, 90) == expected


def test_end_offset_for_empty_cache(tmp_path: Path) -> None:
    cache = new_cache(tmp_path)
    assert cache.latest_epoch is None
    assert cache.latest_entry is None
    assert cache.end_offset_for(0, 10) == UNDEFINED
    assert cache.end_offset_for(UNDEFINED_EPOCH, 10) == UNDEFINED


def test_assign_ignores_epochs_that_are_not_newer(tmp_path: Path) -> None:
    cache = new_cache(tmp_path, *ENTRIES)
    path = tmp_path / LEADER_EPOCH_CHECKPOINT_FILE
    before = path.read_text()

    cache.assign(3, 240)
    cache.assign(2, 400)
    cache.assign(0, 0)

    assert as_pairs(cache) == list(ENTRIES)
    assert path.read_text() == before
    assert cache.latest_entry == EpochEntry(3, 200)


def test_assign_removes_entries_that_start_at_or_after_the_new_one(tmp_path: Path) -> None:
    cache = new_cache(tmp_path, (0, 0), (1, 120))
    cache.assign(2, 120)  # epoch 1 wrote nothing before epoch 2 took over
    assert as_pairs(cache) == [(0, 0), (2, 120)]
    cache.assign(5, 50)
    assert as_pairs(cache) == [(0, 0), (5, 50)]
    with pytest.raises(ValueError, match="invalid leader epoch entry"):
        cache.assign(6, -1)


def test_truncate_from_end(tmp_path: Path) -> None:
    cache = new_cache(tmp_path, *ENTRIES)
    cache.truncate_from_end(201)
    assert as_pairs(cache) == list(ENTRIES)
    cache.truncate_from_end(200)
    assert as_pairs(cache) == [(0, 0), (1, 120)]
    cache.truncate_from_end(100)
    assert as_pairs(cache) == [(0, 0)]
    assert as_pairs(new_cache(tmp_path)) == [(0, 0)]




def test_every_change_is_persisted(tmp_path: Path) -> None:
    cache = new_cache(tmp_path, *ENTRIES)
    assert as_pairs(new_cache(tmp_path)) == list(ENTRIES)
    assert (tmp_path / LEADER_EPOCH_CHECKPOINT_FILE).read_text() == "0\n3\n0 0\n1 120\n3 200\n"
    cache.clear_and_flush()
    assert new_cache(tmp_path).entries == []


def test_seed_001_leader_epoch_keeps_offset_1(tmp_path: Path) -> None:
    """Seed 001: A (leader) and B both hold offsets 0 and 1 of epoch 0 but B's HW is still 1.
    B restarts; A dies; B leads epoch 1; A comes back. With the HW rule A and B truncate to
    1 and offset 1 is lost; with leader epochs nobody truncates."""
    logs, caches = {}, {}
    for name in ("a", "b"):
        logs[name] = Log(tmp_path / name / "t-0", durability=DurabilityTracker())
        caches[name] = new_cache(tmp_path / name / "t-0")
    logs["a"].append_as_leader(build_batch([b"m0"]), 0)
    logs["a"].append_as_leader(build_batch([b"m1"]), 0)
    caches["a"].assign(0, 0)
    logs["b"].append_as_follower(logs["a"].read(0, 1 << 20))
    caches["b"].assign(0, 0)
    follower_high_watermark = 1

    # B restarts and asks leader A for the end of its latest epoch (0): A is at LEO 2.
    epoch, end = caches["a"].end_offset_for(caches["b"].latest_epoch, logs["a"].log_end_offset)
    assert (epoch, end) == (0, 2)
    logs["b"].truncate_to(min(end, logs["b"].log_end_offset))
    assert logs["b"].log_end_offset == 2 > follower_high_watermark

    # A dies; B leads epoch 1 from its LEO; seed 001's [Epoch=1, Offset=2].
    caches["b"].assign(1, logs["b"].log_end_offset)
    assert caches["b"].latest_entry == EpochEntry(1, 2)
    # A comes back as a follower and asks B for the end of epoch 0.
    epoch, end = caches["b"].end_offset_for(caches["a"].latest_epoch, logs["b"].log_end_offset)
    assert (epoch, end) == (0, 2)
    logs["a"].truncate_to(min(end, logs["a"].log_end_offset))
    assert logs["a"].log_end_offset == 2

    logs["b"].append_as_leader(build_batch([b"m2"]), 1)
    logs["a"].append_as_follower(logs["b"].read(2, 1 << 20))
    assert logs["a"].read(0, 1 << 20) == logs["b"].read(0, 1 << 20)
    assert [h.partition_leader_epoch for h in logs["a"].batches_from(0)] == [0, 0, 1]
    for log in logs.values():
        log.close()


def test_cache_rebuilt_from_the_log_matches_the_epochs_written(tmp_path: Path) -> None:
    log = Log(tmp_path / "t-0", durability=DurabilityTracker(), segment_bytes=300)
    for epoch, batches in ((0, 3), (2, 2), (7, 4)):
        for _ in range(batches):
            log.append_as_leader(build_batch([b"x", b"y"]), epoch)
    cache = new_cache(tmp_path / "t-0")
    for header in log.batches_from(log.log_start_offset):
        cache.assign(header.partition_leader_epoch, header.base_offset)

    assert as_pairs(cache) == [(0, 0), (2, 6), (7, 10)]
    assert cache.end_offset_for(2, log.log_end_offset) == (2, 10)
    assert cache.end_offset_for(7, log.log_end_offset) == (7, 18)
    log.close()
