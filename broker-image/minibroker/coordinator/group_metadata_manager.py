"""Where groups live: Kafka 3.9's ``GroupMetadataManager``.

A group belongs to one partition of ``__consumer_offsets`` (``partition_for``: Java's
``String.hashCode`` of the group id, as ``Utils.abs(groupId.hashCode) % partitions``), and
the leader of that partition is its coordinator. Its state is records in that partition:
``store_group`` appends a generation's metadata and ``store_offsets`` a commit, each as one
RecordBatch v2 through the ``ReplicaManager`` with ``offsets.commit.required.acks`` (all
ISR by default), and the cache changes only once the write is acknowledged. The partition
replicates like any other (ISR, high watermark, leader epochs), so every fault the harness
injects applies to group state too.

When this broker becomes the partition's leader it replays the partition from its log
start to its log end (``log_replay``) and owns its groups from then on; until the load is
done, requests for them are answered COORDINATOR_LOAD_IN_PROGRESS. When it stops leading,
the groups are unloaded (marked Dead, their parked requests answered NOT_COORDINATOR) and
requests for them get NOT_COORDINATOR. Loads and unloads carry the partition's leader epoch (Kafka's
coordinator epoch), so a load overtaken by a newer leadership change does nothing.

Simplified against Kafka: offsets never expire (no ``offsets.retention.minutes``), nothing
is compacted (minibroker has no log cleaner; the topic's ``cleanup.policy=compact`` is
recorded only), and offsets are deleted only with their group (DeleteGroups, ``delete_group``).

It is long because it is Kafka's GroupMetadataManager for the classic protocol: the join and
sync state machine, the offsets and their records and loading change one group's state
together, as in Kafka's own class.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from minibroker import environment
from minibroker.cluster.partition import Partition
from minibroker.cluster.scheduler import Scheduler
from minibroker.cluster.types import ErrorCode, MetadataImage, ProduceResult, TopicPartition
from minibroker.config import resolve
from minibroker.coordinator.consumer.consumer_group import ConsumerGroup
from minibroker.coordinator.consumer.records import (
    ConsumerGroupKey,
    CorruptConsumerRecordError,
    consumer_group_tombstones,
    decode_consumer_value,
    replay_consumer_groups,
)
from minibroker.coordinator.group_metadata import (
    CONSUMER_PROTOCOL_TYPE,
    CachedOffset,
    GroupMetadata,
    GroupState,
    GroupType,
    MemberMetadata,
)
from minibroker.coordinator.log_replay import replay
from minibroker.coordinator.partitioner import partition_count, partition_for
from minibroker.coordinator.records import (
    CorruptGroupRecordError,
    GroupMetadataKey,
    GroupMetadataValue,
    MemberRecord,
    OffsetAndMetadata,
    OffsetCommitKey,
    decode_group_value,
    decode_key,
    decode_offset_value,
    encode_group_key,
    encode_group_value,
    encode_offset_key,
    encode_offset_value,
)
from minibroker.events import EventType
from minibroker.storage.control_records import EndTransactionMarker
from minibroker.storage.producer_state import AppendOrigin, VerificationGuard
from minibroker.storage.records import TRANSACTIONAL_FLAG, BatchHeader, build_batch

__all__ = ["OFFSETS_TOPIC", "CommittedOffset", "GroupMetadataManager", "partition_for"]

log = logging.getLogger("minibroker.coordinator")

OFFSETS_TOPIC = "__consumer_offsets"  # Topic.GROUP_METADATA_TOPIC_NAME
OFFSET_METADATA_MAX_BYTES = 4096  # offset.metadata.max.bytes
NO_OFFSET = -1  # OffsetFetchResponse.INVALID_OFFSET


class CommittedOffset(NamedTuple):
    offset: int
    leader_epoch: int
    metadata: str
    error: ErrorCode


Guards = dict[TopicPartition, VerificationGuard | None]
"""A transactional write's verification guards (KIP-890 part 1), by partition."""


class AppendRecords(Protocol):
    """``ReplicaManager.append_records`` (the broker's, which waits out a disk stall)."""

    def __call__(self, *, acks: int, timeout_ms: int, entries: dict[TopicPartition, bytes],
                 on_complete: Callable[[dict[TopicPartition, ProduceResult]], None],
                 origin: AppendOrigin = AppendOrigin.CLIENT,
                 verification_guards: Guards | None = None) -> None: ...


@dataclass(frozen=True)
class Replayed:
    """What an offsets partition's log holds: each group's metadata, its committed offsets
    (by group and partition, with the record's offset), and the offsets of transactions
    not yet ended, by producer id."""

    groups: dict[str, GroupMetadataValue]
    offsets: dict[tuple[str, TopicPartition], CachedOffset]
    pending_txn_offsets: dict[int, dict[tuple[str, TopicPartition], CachedOffset]]
    consumer_groups: dict[str, ConsumerGroup] = field(default_factory=dict)
    """The consumer groups (KIP-848) their records make."""


class Emit(Protocol):
    def emit(self, event_type: EventType, /, **fields: object) -> None: ...


# Log append errors as a member sees them (GroupMetadataManager.storeGroup's mapping and
# maybeConvertOffsetCommitError); REQUEST_TIMED_OUT is a rebalance for a group's metadata.
_APPEND_ERRORS = {
    ErrorCode.unknown_topic_or_partition: ErrorCode.coordinator_not_available,
    ErrorCode.not_enough_replicas: ErrorCode.coordinator_not_available,
    ErrorCode.not_enough_replicas_after_append: ErrorCode.coordinator_not_available,
    ErrorCode.not_leader_or_follower: ErrorCode.not_coordinator,
    ErrorCode.kafka_storage_error: ErrorCode.not_coordinator,
}
_TOO_LARGE = (ErrorCode.message_too_large, ErrorCode.record_list_too_large,
              ErrorCode.invalid_fetch_size)


class GroupMetadataManager:
    def __init__(self, broker_id: int, scheduler: Scheduler, *, config: Mapping[str, str],
                 append: AppendRecords, local_partition: Callable[[TopicPartition],
                                                                  Partition | None],
                 metadata_image: Callable[[], MetadataImage], events: Emit,
                 wall_clock_ms: Callable[[], float] | None = None) -> None:
        self.broker_id = broker_id
        self._scheduler = scheduler
        # Record, commit and state timestamps are wall-clock time (the scheduler's is not):
        # the node environment's wall clock by default, virtual in simulation.
        wall_clock = environment.current().wall_clock
        self.now_ms = wall_clock_ms or (lambda: wall_clock() * 1000)
        self._config = config
        self._append = append
        self._local_partition = local_partition
        self._image = metadata_image
        self._events = events
        self._commit_acks: int = resolve("offsets.commit.required.acks", config)
        self._commit_timeout_ms: int = resolve("offsets.commit.timeout.ms", config)
        self.groups: dict[str, GroupMetadata] = {}
        self.owned_partitions: set[int] = set()
        self.loading_partitions: set[int] = set()
        self._epochs: dict[int, int] = {}
        self._shutting_down = False

    # ---- where a group lives ------------------------------------------------------------

    def partition_count(self) -> int:
        return partition_count(self._image(), OFFSETS_TOPIC, self._config,
                               "offsets.topic.num.partitions")

    def partition_for(self, group_id: str) -> int:
        return partition_for(group_id, self.partition_count())

    def is_group_local(self, group_id: str) -> bool:
        return self.partition_for(group_id) in self.owned_partitions

    def is_group_loading(self, group_id: str) -> bool:
        return self.partition_for(group_id) in self.loading_partitions

    @property
    def is_loading(self) -> bool:
        return bool(self.loading_partitions)

    def get_group(self, group_id: str) -> GroupMetadata | None:
        return self.groups.get(group_id)

    def get_or_maybe_create_group(self, group_id: str, create: bool) -> GroupMetadata | None:
        group = self.groups.get(group_id)
        if group is None and create:
            group = self.groups[group_id] = GroupMetadata(group_id, self.now_ms)
        return group

    def _tp(self, group_id: str) -> TopicPartition:
        return TopicPartition(OFFSETS_TOPIC, self.partition_for(group_id))

    # ---- writing ------------------------------------------------------------------------

    def _write(self, group_id: str, keys: list[bytes], values: list[bytes | None],
               done: Callable[[ProduceResult], None],
               producer: tuple[int, int] | None = None,
               verification_guards: Guards | None = None) -> None:
        """Append the records; a transaction's (``producer``: its id and epoch) as a
        transactional batch of that producer, which its marker later commits or aborts
        (Kafka writes them with origin COORDINATOR: the epoch is checked, no sequence)."""
        tp = self._tp(group_id)
        if producer is None:
            batch = build_batch(values, keys=keys, timestamp_ms=int(self.now_ms()))
            origin = AppendOrigin.CLIENT
        else:
            batch = build_batch(values, keys=keys, timestamp_ms=int(self.now_ms()),
                                producer_id=producer[0], producer_epoch=producer[1],
                                base_sequence=0, attributes=TRANSACTIONAL_FLAG)
            origin = AppendOrigin.COORDINATOR
        self._append(acks=self._commit_acks, timeout_ms=self._commit_timeout_ms,
                     entries={tp: batch}, on_complete=lambda results: done(results[tp]),
                     origin=origin, verification_guards=verification_guards)

    def store_group(self, group: GroupMetadata, assignment: dict[str, bytes],
                    callback: Callable[[ErrorCode], None]) -> None:
        """Append the group's generation (members, their subscriptions and ``assignment``);
        ``callback`` gets the error a member should see."""
        protocol = group.protocol_name
        value = GroupMetadataValue(
            group.protocol_type or "", group.generation_id, protocol, group.leader_id,
            group.current_state_timestamp,
            tuple(MemberRecord(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                               m.rebalance_timeout_ms, m.session_timeout_ms,
                               m.metadata(protocol) if protocol is not None else b"",
                               assignment[m.member_id])
                  for m in group.members.values()))

        def done(result: ProduceResult) -> None:
            error = result.error
            if error != ErrorCode.none:
                log.info("Writing the metadata of group %s generation %d failed: %s",
                         group.group_id, value.generation, error.name)
                error = (ErrorCode.rebalance_in_progress
                         if error == ErrorCode.request_timed_out
                         else ErrorCode.unknown_server_error if error in _TOO_LARGE
                         else _APPEND_ERRORS.get(error, error))
            callback(error)

        self._write(group.group_id, [encode_group_key(group.group_id)],
                    [encode_group_value(value)], done)

    def store_offsets(self, group: GroupMetadata, offsets: dict[TopicPartition,
                                                                OffsetAndMetadata],
                      callback: Callable[[dict[TopicPartition, ErrorCode]], None],
                      producer: tuple[int, int] | None = None,
                      verification_guards: Guards | None = None) -> None:
        """Append one record per committed partition; the cache takes them once they are
        acknowledged (pending until then, for OffsetFetch's require_stable), or, for a
        transaction's (``producer``), once its COMMIT marker is written."""
        valid = {tp: o for tp, o in offsets.items()
                 if len(o.metadata) <= OFFSET_METADATA_MAX_BYTES}
        if not valid:
            callback(dict.fromkeys(offsets, ErrorCode.offset_metadata_too_large))
            return
        if producer is None:
            group.prepare_offset_commit(valid)
        else:
            group.prepare_txn_offset_commit(producer[0], valid)

        def done(result: ProduceResult) -> None:
            error = result.error
            for tp, offset in valid.items():
                if group.is_(GroupState.DEAD):
                    break  # unloaded meanwhile: the log has it (or not), the cache is gone
                if producer is not None:
                    if error == ErrorCode.none:
                        group.on_txn_offset_commit_append(producer[0], tp, result.base_offset,
                                                          offset)
                    else:
                        group.fail_pending_txn_offset_commit(producer[0], tp)
                elif error == ErrorCode.none:
                    group.on_offset_commit_append(tp, result.base_offset, offset)
                else:
                    group.fail_pending_offset_write(tp, offset)
            if error != ErrorCode.none:
                log.info("Offset commit of group %s failed: %s", group.group_id, error.name)
                error = (ErrorCode.invalid_commit_offset_size if error in _TOO_LARGE
                         else _APPEND_ERRORS.get(error, error))
            callback({tp: error if tp in valid else ErrorCode.offset_metadata_too_large
                      for tp in offsets})

        self._write(group.group_id,
                    [encode_offset_key(group.group_id, tp.topic, tp.partition) for tp in valid],
                    [encode_offset_value(o) for o in valid.values()], done, producer,
                    verification_guards)

    def write_records(self, group_id: str, records: list[tuple[bytes, bytes | None]],
                      callback: Callable[[ErrorCode], None]) -> None:
        """Append a consumer group's records (KIP-848) in one batch; ``callback`` gets the
        error a member should see (Kafka's ``CoordinatorOperationExceptionHelper``)."""
        def done(result: ProduceResult) -> None:
            callback(_APPEND_ERRORS.get(result.error, result.error))

        self._write(group_id, [k for k, _ in records], [v for _, v in records], done)

    def delete_group(self, group: GroupMetadata, callback: Callable[[ErrorCode], None]
                     ) -> None:
        """Kafka 4.2's ``GroupCoordinatorShard.deleteGroups`` for one Empty group: a
        tombstone for each committed offset (and each offset an open transaction holds that
        is not committed, ``OffsetMetadataManager.deleteAllOffsets``) and for the group's
        metadata (``createGroupTombstoneRecords``), in one batch. The group is Dead and out
        of the cache at once, so nothing joins it while the tombstones are written;
        ``callback`` gets the write's error as a client sees it. A replay drops a key whose
        last record is a tombstone (``_replay``), so a new coordinator does not load it."""
        group_id = group.group_id
        held = [*group.offsets, *(tp for pending in group.pending_txn_offset_commits.values()
                                  for tp in pending if tp not in group.offsets)]
        keys = [*(encode_offset_key(group_id, tp.topic, tp.partition)
                  for tp in dict.fromkeys(held)), encode_group_key(group_id),
                *(key for key, _ in (consumer_group_tombstones(group_id)
                                     if group.consumer is not None else []))]
        group.transition_to(GroupState.DEAD)
        del self.groups[group_id]
        log.info("Deleting group %s and its %d offsets", group_id, len(keys) - 1)

        def done(result: ProduceResult) -> None:
            if result.error != ErrorCode.none:
                log.info("Writing the tombstones of group %s failed: %s", group_id,
                         result.error.name)
            callback(_APPEND_ERRORS.get(result.error, result.error))

        self._write(group_id, keys, [None] * len(keys), done)

    def handle_txn_completion(self, producer_id: int, partitions: set[int],
                              is_commit: bool) -> None:
        """Kafka's ``handleTxnCompletion``: the marker is in these offsets partitions; the
        producer's pending offsets in their groups are committed or dropped."""
        for group in self.groups.values():
            if (self.partition_for(group.group_id) in partitions
                    and producer_id in group.pending_txn_offset_commits):
                group.complete_pending_txn_offset_commit(producer_id, is_commit)

    # ---- reading ------------------------------------------------------------------------

    def get_offsets(self, group_id: str, require_stable: bool,
                    partitions: list[TopicPartition] | None
                    ) -> dict[TopicPartition, CommittedOffset]:
        """Never a stale offset: the cache is what the log holds, acknowledged."""
        none = CommittedOffset(NO_OFFSET, -1, "", ErrorCode.none)
        group = self.groups.get(group_id)
        if group is None or group.is_(GroupState.DEAD):
            return dict.fromkeys(partitions or (), none)
        result = {}
        for tp in partitions if partitions is not None else list(group.offsets):
            offset = group.offset(tp)
            if require_stable and group.has_pending_offset_commits(tp):
                result[tp] = CommittedOffset(NO_OFFSET, -1, "", ErrorCode.unstable_offset_commit)
            elif offset is None:
                result[tp] = none
            else:
                result[tp] = CommittedOffset(offset.offset, offset.leader_epoch,
                                             offset.metadata, ErrorCode.none)
        return result

    # ---- loading and unloading ------------------------------------------------------------

    def _maybe_update_epoch(self, partition: int, epoch: int | None) -> bool:
        """Kafka's maybeUpdateCoordinatorEpoch: only the newest leadership change acts."""
        current = self._epochs.get(partition)
        if epoch is not None and (current is None or epoch > current):
            self._epochs[partition] = current = epoch
        return epoch is None or epoch == current

    def schedule_load(self, partition: int, epoch: int,
                      on_group_loaded: Callable[[GroupMetadata], None]) -> None:
        """Become the coordinator of ``partition``'s groups: loading at once (so requests get
        COORDINATOR_LOAD_IN_PROGRESS), replayed from the log on the scheduler."""
        if partition not in self.owned_partitions:
            self.loading_partitions.add(partition)
        self._scheduler.call_later(0, lambda: self._load(partition, epoch, on_group_loaded))

    def _load(self, partition: int, epoch: int,
              on_group_loaded: Callable[[GroupMetadata], None]) -> None:
        tp = TopicPartition(OFFSETS_TOPIC, partition)
        if self._shutting_down:
            return
        if not self._maybe_update_epoch(partition, epoch) or partition in self.owned_partitions:
            log.info("Not loading %s in epoch %d (epoch now %s)", tp, epoch,
                     self._epochs.get(partition))
            return
        replica = self._local_partition(tp)
        end = replica.log_end_offset if replica is not None else 0
        try:
            replayed = self._replay(tp, replica) if replica is not None else Replayed({}, {},
                                                                                       {})
        finally:
            self.loading_partitions.discard(partition)
            self.owned_partitions.add(partition)
        loaded = []
        groups, offsets = replayed.groups, replayed.offsets
        in_txns = {g for by_producer in replayed.pending_txn_offsets.values()
                   for g, _ in by_producer}
        for group_id in sorted(set(groups) | set(replayed.consumer_groups)
                               | {g for g, _ in offsets} | in_txns):
            value = groups.get(group_id)
            consumer = replayed.consumer_groups.get(group_id)
            group = self._group_from(group_id, None if consumer is not None else value)
            if consumer is not None:  # KIP-848: a consumer group, with its offsets
                group.group_type = GroupType.CONSUMER
                group.protocol_type = CONSUMER_PROTOCOL_TYPE
                group.consumer = consumer
            group.initialize_offsets({tp_: o for (g, tp_), o in offsets.items()
                                      if g == group_id})
            for producer_id, by_group in replayed.pending_txn_offsets.items():
                mine = {tp_: o for (g, tp_), o in by_group.items() if g == group_id}
                if mine:
                    group.pending_txn_offset_commits[producer_id] = mine
            self.groups.setdefault(group_id, group)
            on_group_loaded(group)
            loaded.append(
                f"{group_id} ({group.state}, generation {group.generation_id}, "
                f"{len(group.members)} members, {len(group.offsets)} offsets)"
                if consumer is None else
                f"{group_id} (consumer group {consumer.state}, epoch {consumer.group_epoch}, "
                f"{len(consumer.members)} members, {len(group.offsets)} offsets)")
        log.info("Loaded %s to offset %d in epoch %d: %s", tp, end, epoch,
                 ", ".join(loaded) or "no group")
        self._events.emit(EventType.COORDINATOR_LOAD, topic=OFFSETS_TOPIC, partition=partition,
                          leader_epoch=epoch, log_end_offset=end,
                          detail=f"loaded {len(loaded)} groups: {', '.join(loaded)}"
                          if loaded else "loaded no group")

    def _replay(self, tp: TopicPartition, replica: Partition) -> Replayed:
        """The latest record of every key, from the log start to the log end; a
        transaction's offsets count once its COMMIT marker is read (Kafka's
        ``doLoadGroupsAndOffsets``), and those of a transaction still open stay pending."""
        groups: dict[str, GroupMetadataValue | None] = {}
        consumer: dict[ConsumerGroupKey, object] = {}
        offsets: dict[tuple[str, TopicPartition], CachedOffset | None] = {}
        pending: dict[int, dict[tuple[str, TopicPartition], CachedOffset]] = {}

        def apply(key: bytes | None, value: bytes | None, header: BatchHeader) -> None:
            if key is None:
                raise CorruptGroupRecordError("a record without a key")
            parsed = decode_key(key)
            if isinstance(parsed, OffsetCommitKey):
                committed = decode_offset_value(value)
                cached = None if committed is None else CachedOffset(header.base_offset,
                                                                    committed)
                where = (parsed.group, TopicPartition(parsed.topic, parsed.partition))
                if not header.is_transactional:
                    offsets[where] = cached
                elif cached is not None:
                    pending.setdefault(header.producer_id, {})[where] = cached
            elif isinstance(parsed, GroupMetadataKey):
                groups[parsed.group] = decode_group_value(value)
            elif isinstance(parsed, ConsumerGroupKey):
                try:
                    consumer[parsed] = decode_consumer_value(parsed, value)
                except CorruptConsumerRecordError as exc:
                    raise CorruptGroupRecordError(str(exc)) from None

        def on_marker(header: BatchHeader, marker: EndTransactionMarker) -> None:
            ended = pending.pop(header.producer_id, {})
            if marker.is_abort:
                return
            for where, cached in ended.items():
                current = offsets.get(where)
                if current is None or current.record_offset < cached.record_offset:
                    offsets[where] = cached

        replay(tp, replica, apply, (CorruptGroupRecordError,), on_marker)
        return Replayed({g: v for g, v in groups.items() if v is not None},
                        {k: v for k, v in offsets.items() if v is not None}, pending,
                        replay_consumer_groups({k: v for k, v in consumer.items()
                                                if v is not None}))

    def _group_from(self, group_id: str, value: GroupMetadataValue | None) -> GroupMetadata:
        """Kafka's ``GroupMetadata.loadGroup``: Stable with its members, or Empty."""
        group = GroupMetadata(group_id, self.now_ms)
        if value is None:
            return group
        group.generation_id = value.generation
        group.protocol_type = value.protocol_type or None
        group.protocol_name = value.protocol
        if value.current_state_timestamp != -1:
            group.current_state_timestamp = value.current_state_timestamp
        for m in value.members:
            group.add(MemberMetadata(m.member_id, m.group_instance_id, m.client_id,
                                     m.client_host, m.rebalance_timeout, m.session_timeout,
                                     value.protocol_type, [(value.protocol or "",
                                                            m.subscription)], m.assignment))
        group.leader_id = value.leader
        group.state = GroupState.STABLE if value.members else GroupState.EMPTY
        return group

    def remove_groups_for_partition(self, partition: int, epoch: int | None,
                                    on_group_unloaded: Callable[[GroupMetadata], None]) -> None:
        """Stop coordinating ``partition``'s groups (this broker no longer leads it)."""
        if not self._maybe_update_epoch(partition, epoch):
            return
        was_coordinator = (partition in self.owned_partitions
                           or partition in self.loading_partitions)
        self.owned_partitions.discard(partition)
        self.loading_partitions.discard(partition)
        removed = [g for g in self.groups.values() if self.partition_for(g.group_id) == partition]
        for group in removed:
            on_group_unloaded(group)
            del self.groups[group.group_id]
        if was_coordinator:
            log.info("Unloaded %s-%d in epoch %s: %d groups", OFFSETS_TOPIC, partition, epoch,
                     len(removed))
            self._events.emit(EventType.COORDINATOR_UNLOAD, topic=OFFSETS_TOPIC,
                              partition=partition, leader_epoch=epoch,
                              detail=f"unloaded {len(removed)} groups: "
                                     f"{', '.join(g.group_id for g in removed)}"
                              if removed else "unloaded no group")

    def shutdown(self) -> None:
        """The broker stops: every group is dropped (marked Dead, so that timers still
        pending find nothing to do), no load runs any more."""
        self._shutting_down = True
        for group in self.groups.values():
            group.state = GroupState.DEAD
        self.groups.clear()
        self.owned_partitions.clear()
        self.loading_partitions.clear()
