"""``LeaderEpochCache``: where each leader epoch started in this replica's log (KIP-101).

A follower decides how much of its log to truncate by asking the leader for the end offset
of its latest epoch instead of trusting its high watermark, which lags one fetch behind and
lost acknowledged records before KIP-101 (seeds 000 and 001). The answer comes from this
cache: epoch E ends where the next known epoch starts. Every change is written at once to
the ``leader-epoch-checkpoint`` file (durably), because after a crash the epochs must match
the log that survived, which the log's own recovery only ever shortens.
"""

from __future__ import annotations

import logging

from minibroker.storage.checkpoints import EpochEntry, LeaderEpochCheckpointFile

__all__ = ["UNDEFINED_EPOCH", "UNDEFINED_EPOCH_OFFSET", "EpochEntry", "LeaderEpochCache"]

log = logging.getLogger("minibroker.log")

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class LeaderEpochCache:
    """Kafka's LeaderEpochFileCache: entries strictly increasing in epoch and start offset."""

    def __init__(self, checkpoint: LeaderEpochCheckpointFile) -> None:
        self._checkpoint = checkpoint
        self._entries: list[EpochEntry] = []
        for entry in checkpoint.read():
            self._assign(entry.epoch, entry.start_offset)

    @property
    def entries(self) -> list[EpochEntry]:
        return list(self._entries)

    @property
    def latest_entry(self) -> EpochEntry | None:
        return self._entries[-1] if self._entries else None

    @property
    def latest_epoch(self) -> int | None:
        return self._entries[-1].epoch if self._entries else None

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` starts at ``start_offset``; an epoch not newer than the
        latest one is ignored. Earlier entries starting at or after ``start_offset`` are
        removed: they never wrote anything that survived."""
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"{self._checkpoint.path}: invalid leader epoch entry "
                             f"(epoch {epoch}, start offset {start_offset})")
        if self._assign(epoch, start_offset):
            self._flush()

    def _assign(self, epoch: int, start_offset: int) -> bool:
        latest = self.latest_epoch
        if latest is not None and epoch <= latest:
            return False
        removed = []
        while self._entries and self._entries[-1].start_offset >= start_offset:
            removed.append(self._entries.pop())
        if removed and (len(removed) > 1 or removed[0].start_offset != start_offset):
            log.warning("%s: epoch %d at offset %d replaced conflicting entries %s",
                        self._checkpoint.path, epoch, start_offset, removed[::-1])
        self._entries.append(EpochEntry(epoch, start_offset))
        return True

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """OffsetsForLeaderEpoch: (the largest epoch <= ``requested_epoch``, the offset where
        the next higher epoch starts); the latest epoch ends at ``log_end_offset``."""
        if requested_epoch == UNDEFINED_EPOCH:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if requested_epoch == self.latest_epoch:
            return requested_epoch, log_end_offset
        floor = None
        for entry in self._entries:
            if entry.epoch > requested_epoch:
                if floor is None:
                    return requested_epoch, entry.start_offset
                return floor.epoch, entry.start_offset
            floor = entry
        return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET

    def truncate_from_end(self, end_offset: int) -> None:
        """The log was truncated to ``end_offset``: forget epochs that start at or after it."""
        if end_offset < 0 or not self._entries or self._entries[-1].start_offset < end_offset:
            return
        while self._entries and self._entries[-1].start_offset >= end_offset:
            self._entries.pop()
        self._flush()

    def clear_and_flush(self) -> None:
        self._entries = []
        self._flush()

    def _flush(self) -> None:
        self._checkpoint.write(self._entries)
