"""``LogManager``: the partition logs in the broker's log directory, as Kafka's LogManager.

It loads each log an earlier process left (``Log`` recovers it from its checkpointed
recovery point; the leader-epoch cache is made to agree with it) or creates it empty,
flushes the logs on time, checkpoints their recovery points, and flushes them all before a
clean shutdown. It records the replication events of loading a log (``minibroker.events``):
``log_recovery``, and the truncation a power loss made when the process that lost power
held more of the log than survived.

Each log directory holds its topic's id (Kafka's ``PartitionMetadataFile``), so a log left
by a deleted topic is never taken for the log of a new topic of the same name: it is a stray
(Kafka's ``LogManager.isStrayReplica``, KAFKA-14616) and is deleted. A deleted log's
directory is renamed ``<topic>-<partition>.<id>-delete`` first and then removed (Kafka's
``LogManager.asyncDelete``; a crash between the two leaves a directory removed at the next
start, as Kafka's ``loadLogs`` does).
"""

from __future__ import annotations

import logging
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from minibroker import environment
from minibroker.config import LogConfig
from minibroker.events import EventType, ReplicationEventLog, TruncationReason
from minibroker.fsutil import fsync_dir
from minibroker.storage.checkpoints import (
    LEADER_EPOCH_CHECKPOINT_FILE,
    RECOVERY_POINT_OFFSET_CHECKPOINT_FILE,
    LeaderEpochCheckpointFile,
    OffsetCheckpointFile,
)
from minibroker.storage.durability import DurabilityTracker
from minibroker.storage.leader_epoch_cache import LeaderEpochCache
from minibroker.storage.log import Log

log = logging.getLogger("minibroker.log")

PARTITION_METADATA_FILE = "partition.metadata"  # Kafka's PartitionMetadataFile
DELETE_DIR_SUFFIX = "-delete"  # Kafka's LogFileUtils.DELETE_DIR_SUFFIX
_PARTITION_METADATA = re.compile(r"version: 0\ntopic_id: ([0-9a-f]{32})\n")


def read_topic_id(directory: Path) -> str | None:
    """The topic id a log directory was created for; None for a log written before the
    file existed, or a file a crash left incomplete (it is written without an fsync: see
    ``LogManager.load_log``), which then counts as not saying."""
    try:
        text = (directory / PARTITION_METADATA_FILE).read_text()
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    match = _PARTITION_METADATA.fullmatch(text)
    return match[1] if match else None


def _recover_epoch_cache(cache: LeaderEpochCache, log_: Log) -> None:
    """Make the cache agree with the recovered log: drop epochs past its end, and add those
    whose batches reached the log before a crash cut the cache update short."""
    cache.truncate_from_end(log_.log_end_offset)
    latest = cache.latest_entry
    start = max(latest.start_offset if latest else 0, log_.log_start_offset)
    for header in log_.batches_from(start):
        if cache.latest_epoch is None or header.partition_leader_epoch > cache.latest_epoch:
            cache.assign(header.partition_leader_epoch, header.base_offset)


def _unrecovered_power_losses(events: ReplicationEventLog
                              ) -> dict[tuple[str, int], dict[str, Any]]:
    """The last ``power_loss`` event of each partition whose log was not loaded since (no
    ``log_recovery`` after it): what an earlier process held in memory when it lost power."""
    losses: dict[tuple[str, int], dict[str, Any]] = {}
    for event in events.events():
        key = (event.get("topic"), event.get("partition"))
        if event["type"] == EventType.POWER_LOSS:
            losses[key] = event
        elif event["type"] == EventType.LOG_RECOVERY:
            losses.pop(key, None)
    return losses


class LogManager:
    """The logs of one log directory, each loaded by ``load_log`` the first time it is
    needed."""

    def __init__(self, broker_id: int, data_dir: Path, *, durability: DurabilityTracker,
                 events: ReplicationEventLog, clock: Callable[[], float]) -> None:
        self.broker_id = broker_id
        self.data_dir = data_dir
        self._durability = durability
        self._events = events
        self._clock = clock
        self._power_losses = _unrecovered_power_losses(events)
        self._logs: dict[tuple[str, int], Log] = {}
        self._recovery_checkpoint = OffsetCheckpointFile(
            data_dir / RECOVERY_POINT_OFFSET_CHECKPOINT_FILE)
        self._checkpointed_recovery_points = dict(self._recovery_checkpoint.read())
        if data_dir.is_dir():
            for left in data_dir.glob(f"*{DELETE_DIR_SUFFIX}"):
                shutil.rmtree(left, ignore_errors=True)

    def load_log(self, topic: str, partition: int, config: LogConfig, *, leader_epoch: int,
                 partition_epoch: int, topic_id: str | None = None
                 ) -> tuple[Log, LeaderEpochCache]:
        """The partition's log and leader-epoch cache (Kafka's getOrCreateLog), loaded once.
        `leader_epoch` and `partition_epoch` are the partition's, from the metadata: above 0,
        the partition is older than a log this directory does not have. A log on disk of
        another ``topic_id`` (a deleted topic's) is deleted and a new one made."""
        directory = self.data_dir / f"{topic}-{partition}"
        stored = read_topic_id(directory) if directory.is_dir() else None
        if topic_id is not None and stored is not None and stored != topic_id:
            log.warning("Deleting the stray log %s: it belongs to topic id %s, not %s",
                        directory, stored, topic_id)
            self._remove(directory, topic, partition)
        loaded = directory.is_dir()
        recovery_point = self._checkpointed_recovery_points.get((topic, partition), 0)
        log_ = Log(
            directory,
            durability=self._durability,
            segment_bytes=config.segment_bytes,
            flush_interval_messages=config.flush_interval_messages,
            flush_interval_ms=config.flush_interval_ms,
            clock=self._clock,
            recovery_point=recovery_point,
        )
        checkpoint = LeaderEpochCheckpointFile(directory / LEADER_EPOCH_CHECKPOINT_FILE)
        cache = LeaderEpochCache(checkpoint)
        _recover_epoch_cache(cache, log_)
        self._logs[topic, partition] = log_
        if topic_id is not None and stored != topic_id:
            # Not fsynced: Kafka flushes the file off the request path
            # (UnifiedLog.initializeTopicId schedules "flush-metadata-file"), and an fsync
            # per new log here would double what creating thousands of logs holds the event
            # loop (about 10 ms more a log). A crash may leave it missing or cut, which reads
            # as no id: the log is then taken as the topic's, as one from before the file.
            self._durability.check_space(directory)
            (directory / PARTITION_METADATA_FILE).write_text(
                f"version: 0\ntopic_id: {topic_id}\n")
        if loaded:
            self._record_log_recovery(topic, partition, log_, recovery_point)
        elif leader_epoch > 0 or partition_epoch > 0:
            # The partition is older than this log: the broker came back with a new or emptied
            # disk (a pod replaced with its emptyDir), which the history must be able to see.
            self._events.emit(
                EventType.LOG_RECOVERY, topic=topic, partition=partition,
                broker=self.broker_id, log_end_offset=log_.log_end_offset,
                detail=f"no log on disk for a partition at leader epoch {leader_epoch}, "
                       f"partition epoch {partition_epoch}: the disk is new or was emptied")
        return log_, cache

    def delete_log(self, topic: str, partition: int) -> None:
        """Kafka's ``LogManager.asyncDelete`` for a partition of a deleted topic: the log is
        closed, forgotten (its recovery point no longer checkpointed) and its directory
        removed."""
        log_ = self._logs.pop((topic, partition), None)
        if log_ is not None:
            log_.close()
        self._remove(self.data_dir / f"{topic}-{partition}", topic, partition)
        log.info("Deleted log for partition %s-%d", topic, partition)

    def _remove(self, directory: Path, topic: str, partition: int) -> None:
        self._checkpointed_recovery_points.pop((topic, partition), None)
        if not directory.is_dir():
            return
        doomed = directory.with_name(
            f"{directory.name}.{environment.new_uuid().hex}{DELETE_DIR_SUFFIX}")
        directory.rename(doomed)
        fsync_dir(self.data_dir)
        shutil.rmtree(doomed)

    def _record_log_recovery(self, topic: str, partition: int, log_: Log,
                             recovery_point: int) -> None:
        """A log an earlier process left was loaded. When that process lost power holding
        more of it in memory than survived (its ``power_loss`` event says how much), the
        difference is a truncation: the unflushed tail the power loss took."""
        leo = log_.log_end_offset
        self._events.emit(
            EventType.LOG_RECOVERY, topic=topic, partition=partition,
            broker=self.broker_id, log_end_offset=leo,
            detail=f"loaded from the recovery point {recovery_point}: log start offset "
                   f"{log_.log_start_offset}, log end offset {leo}")
        loss = self._power_losses.pop((topic, partition), None)
        if loss is None or loss["log_end_offset"] <= leo:
            return
        detail = (f"the unflushed tail past the recovery point {recovery_point} was lost to "
                  f"the power loss")
        log.warning("%r truncated log from %d to %d (%s: %s)", log_,
                    loss["log_end_offset"], leo, TruncationReason.LOG_RECOVERY, detail)
        self._events.emit(
            EventType.TRUNCATION, topic=topic, partition=partition, broker=self.broker_id,
            from_offset=loss["log_end_offset"], to_offset=leo,
            reason=TruncationReason.LOG_RECOVERY, detail=detail)

    def flush_logs_on_time(self) -> None:
        """Each log flushed once its ``log.flush.interval.ms`` has passed."""
        for log_ in self._logs.values():
            log_.maybe_flush()

    def checkpoint_recovery_points(self) -> None:
        """Kafka's LogManager.checkpointLogRecoveryOffsets: where each log's fsynced prefix
        ends, read back at load (``Log(recovery_point=...)``)."""
        points = {key: log_.last_flushed_offset for key, log_ in self._logs.items()}
        if points != self._checkpointed_recovery_points:
            self._durability.check_space(self._recovery_checkpoint.path)
            self._recovery_checkpoint.write(points)
            self._checkpointed_recovery_points = points

    def flush_all(self) -> None:
        """A clean shutdown's first step, as Kafka's LogManager.shutdown: flush every log,
        then checkpoint the recovery points."""
        for log_ in self._logs.values():
            log_.flush()
        self.checkpoint_recovery_points()

    def close(self) -> None:
        """Release the logs without flushing them."""
        for log_ in self._logs.values():
            log_.close()
