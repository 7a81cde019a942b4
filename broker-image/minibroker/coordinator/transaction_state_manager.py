"""Where transactional ids live: Kafka 4.2's ``TransactionStateManager``.

A transactional id belongs to one partition of ``__transaction_state`` (``partition_for``),
and the leader of that partition is its coordinator. Its state is the latest record of its
key in that partition: ``append_transaction_to_log`` writes a prepared transition with
acks=all (``TransactionLog.EnforcedRequiredAcks``; the topic's ``min.insync.replicas`` is
``transaction.state.log.min.isr``), waiting at most the transaction timeout, and the cache
takes the new state only once the write is acknowledged and only if the partition is still
led in the leader epoch the transition was prepared in (Kafka's coordinator epoch):
otherwise the client gets NOT_COORDINATOR and finds the new coordinator.

When this broker becomes the partition's leader it replays the partition from its log start
to its log end (``log_replay``); until then, requests for its ids get
COORDINATOR_LOAD_IN_PROGRESS, and once it stops leading, NOT_COORDINATOR.

An id with no transaction open (Empty, CompleteCommit, CompleteAbort) that nothing updated
for ``transactional.id.expiration.ms`` expires, checked every
``transaction.remove.expired.transaction.cleanup.interval.ms``: a tombstone for its key is
written acks=all, and once acknowledged the id leaves the cache (Kafka's
``removeExpiredTransactionalIds``). That is Kafka's bound on what clients make a coordinator
hold: every id they ever initialized, for at most that long after its last use.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from minibroker import environment
from minibroker.cluster.partition import Partition
from minibroker.cluster.scheduler import Scheduler
from minibroker.cluster.types import ErrorCode, MetadataImage, ProduceResult, TopicPartition
from minibroker.config import resolve
from minibroker.coordinator.group_metadata_manager import AppendRecords, Emit
from minibroker.coordinator.log_replay import replay
from minibroker.coordinator.partitioner import partition_count, partition_for
from minibroker.coordinator.transaction_log import (
    CorruptTransactionRecordError,
    TransactionLogValue,
    TransactionState,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from minibroker.coordinator.transaction_metadata import TransactionMetadata, TxnTransitMetadata
from minibroker.events import EventType
from minibroker.storage.records import BatchHeader, build_batch

__all__ = ["TRANSACTION_STATE_TOPIC", "CoordinatorEpochAndTxnMetadata",
           "TransactionStateManager"]

log = logging.getLogger("minibroker.coordinator.transaction")

TRANSACTION_STATE_TOPIC = "__transaction_state"  # Topic.TRANSACTION_STATE_TOPIC_NAME
ENFORCED_REQUIRED_ACKS = -1  # TransactionLog.EnforcedRequiredAcks
TOMBSTONE_TIMEOUT_MS = 30_000  # Kafka writes them within request.timeout.ms (default 30 s)

# The log append's error as the client sees it (appendTransactionToLog's mapping).
_APPEND_ERRORS = {
    ErrorCode.unknown_topic_or_partition: ErrorCode.coordinator_not_available,
    ErrorCode.not_enough_replicas: ErrorCode.coordinator_not_available,
    ErrorCode.not_enough_replicas_after_append: ErrorCode.coordinator_not_available,
    ErrorCode.request_timed_out: ErrorCode.coordinator_not_available,
    ErrorCode.not_leader_or_follower: ErrorCode.not_coordinator,
    ErrorCode.kafka_storage_error: ErrorCode.not_coordinator,
    ErrorCode.message_too_large: ErrorCode.unknown_server_error,
    ErrorCode.record_list_too_large: ErrorCode.unknown_server_error,
}


@dataclass(frozen=True)
class CoordinatorEpochAndTxnMetadata:
    coordinator_epoch: int
    metadata: TransactionMetadata


@dataclass
class _CacheEntry:
    """Kafka's ``TxnMetadataCacheEntry``: one owned partition's ids, in its leader epoch."""

    coordinator_epoch: int
    by_id: dict[str, TransactionMetadata] = field(default_factory=dict)


class TransactionStateManager:
    def __init__(self, broker_id: int, scheduler: Scheduler, *, config: Mapping[str, str],
                 append: AppendRecords, local_partition: Callable[[TopicPartition],
                                                                  Partition | None],
                 metadata_image: Callable[[], MetadataImage], events: Emit,
                 on_loaded: Callable[[int, list[TransactionMetadata]], None]) -> None:
        self.broker_id = broker_id
        self._on_loaded = on_loaded
        self._scheduler = scheduler
        wall_clock = environment.current().wall_clock  # virtual in simulation
        self.now_ms = lambda: int(wall_clock() * 1000)
        self._config = config
        self._append = append
        self._local_partition = local_partition
        self._image = metadata_image
        self._events = events
        self.max_timeout_ms: int = resolve("transaction.max.timeout.ms", config)
        # The cluster's finalized feature (Kafka's transactionVersionLevel()): the log value
        # version, and the version of the coordinator's own aborts.
        self.transaction_version: int = resolve("transaction.version", config)
        self._expiration_ms: int = resolve("transactional.id.expiration.ms", config)
        self._cache: dict[int, _CacheEntry] = {}
        self._loading: dict[int, int] = {}  # partition -> the leader epoch being loaded
        self._shutting_down = False

    # ---- where a transactional id lives -----------------------------------------------------

    def partition_for(self, transactional_id: str) -> int:
        return partition_for(transactional_id, partition_count(
            self._image(), TRANSACTION_STATE_TOPIC, self._config,
            "transaction.state.log.num.partitions"))

    def validate_transaction_timeout(self, timeout_ms: int) -> bool:
        """``validateTransactionTimeoutMs``: positive, at most ``transaction.max.timeout.ms``."""
        return 0 < timeout_ms <= self.max_timeout_ms

    def get_transaction_state(self, transactional_id: str
                              ) -> ErrorCode | CoordinatorEpochAndTxnMetadata | None:
        """Kafka's ``getTransactionState``: an error when this broker does not (yet)
        coordinate the id, else its metadata with the coordinator epoch (None: unknown id)."""
        partition = self.partition_for(transactional_id)
        if partition in self._loading:
            return ErrorCode.coordinator_load_in_progress
        entry = self._cache.get(partition)
        if entry is None:
            return ErrorCode.not_coordinator
        metadata = entry.by_id.get(transactional_id)
        return None if metadata is None else CoordinatorEpochAndTxnMetadata(
            entry.coordinator_epoch, metadata)

    def put_transaction_state_if_not_exists(self, metadata: TransactionMetadata
                                            ) -> ErrorCode | CoordinatorEpochAndTxnMetadata:
        partition = self.partition_for(metadata.transactional_id)
        if partition in self._loading:
            return ErrorCode.coordinator_load_in_progress
        entry = self._cache.get(partition)
        if entry is None:
            return ErrorCode.not_coordinator
        current = entry.by_id.setdefault(metadata.transactional_id, metadata)
        return CoordinatorEpochAndTxnMetadata(entry.coordinator_epoch, current)

    def list_transaction_states(self, producer_ids: set[int], state_names: set[str],
                                duration_ms: int
                                ) -> tuple[ErrorCode, list[str], list[TransactionMetadata]]:
        """Kafka's ``listTransactionStates``: (error, the state filters no state has, the
        ids this broker coordinates that pass every filter); ``duration_ms`` >= 0 keeps
        only transactions open longer than that. While any partition loads, nothing."""
        if self._loading:
            return ErrorCode.coordinator_load_in_progress, [], []
        by_name = {state.state_name: state for state in TransactionState}
        unknown = sorted(name for name in state_names if name not in by_name)
        wanted = {by_name[name] for name in state_names if name in by_name}
        now = self.now_ms()
        found = [m for entry in self._cache.values() for m in entry.by_id.values()
                 if m.state is not TransactionState.DEAD
                 and (not producer_ids or m.producer_id in producer_ids)
                 and (not state_names or m.state in wanted)
                 and not (duration_ms >= 0 and now - m.txn_start_timestamp <= duration_ms)]
        return ErrorCode.none, unknown, sorted(found, key=lambda m: m.transactional_id)

    # ---- writing ------------------------------------------------------------------------------

    def append_transaction_to_log(self, transactional_id: str, coordinator_epoch: int,
                                  transit: TxnTransitMetadata,
                                  callback: Callable[[ErrorCode], None]) -> None:
        """Write ``transit`` as the id's record; on success (and still its coordinator in
        ``coordinator_epoch``) complete the transition, else drop the pending one."""
        tp = TopicPartition(TRANSACTION_STATE_TOPIC, self.partition_for(transactional_id))
        value_version = 1 if self.transaction_version >= 1 else 0  # transactionLogValueVersion
        batch = build_batch([encode_value(transit.log_value(), value_version)],
                            keys=[encode_key(transactional_id)], timestamp_ms=self.now_ms())

        def done(results: dict[TopicPartition, ProduceResult]) -> None:
            error = _APPEND_ERRORS.get(results[tp].error, results[tp].error)
            state = self.get_transaction_state(transactional_id)
            if not isinstance(state, CoordinatorEpochAndTxnMetadata) \
                    or state.coordinator_epoch != coordinator_epoch:
                # Unloaded or led again meanwhile: the new coordinator replays the log.
                error = ErrorCode.not_coordinator if error == ErrorCode.none else error
            elif error == ErrorCode.none:
                state.metadata.complete_transition_to(transit)
            else:
                state.metadata.abort_pending_transition()
            if error != ErrorCode.none:
                log.info("Writing %s's %s to %s failed: %s", transactional_id,
                         transit.state.state_name, tp, error.name)
            callback(error)

        self._append(acks=ENFORCED_REQUIRED_ACKS, timeout_ms=transit.txn_timeout_ms,
                     entries={tp: batch}, on_complete=done)

    # ---- expiration ----------------------------------------------------------------------------

    def enable_transactional_id_expiration(self) -> None:
        """Check for expired ids every cleanup interval, for as long as the broker runs."""
        interval = resolve("transaction.remove.expired.transaction.cleanup.interval.ms",
                           self._config)

        def run() -> None:
            if self._shutting_down:
                return
            try:
                self.remove_expired_transactional_ids()
            finally:
                self._scheduler.call_later(interval, run)

        self._scheduler.call_later(interval, run)

    def remove_expired_transactional_ids(self) -> None:
        """One tombstone batch per partition for its expired ids; each leaves the cache once
        its tombstone is acknowledged, if nothing changed it meanwhile."""
        now = self.now_ms()
        for partition, entry in list(self._cache.items()):
            expired = [m for m in entry.by_id.values()
                       if m.state.expiration_allowed and not m.pending_transition_in_progress
                       and m.txn_last_update_timestamp <= now - self._expiration_ms]
            if expired:
                self._write_tombstones(partition, entry.coordinator_epoch,
                                       [(m, m.prepare_dead()) for m in expired])

    def _write_tombstones(self, partition: int, coordinator_epoch: int,
                          expired: list[tuple[TransactionMetadata, TxnTransitMetadata]]
                          ) -> None:
        tp = TopicPartition(TRANSACTION_STATE_TOPIC, partition)
        batch = build_batch([None] * len(expired), timestamp_ms=self.now_ms(),
                            keys=[encode_key(m.transactional_id) for m, _ in expired])

        def done(results: dict[TopicPartition, ProduceResult]) -> None:
            error = results[tp].error
            entry = self._cache.get(partition)
            for metadata, transit in expired:
                if (error == ErrorCode.none and entry is not None
                        and entry.coordinator_epoch == coordinator_epoch
                        and metadata.pending_state is TransactionState.DEAD
                        and metadata.producer_epoch == transit.producer_epoch):
                    del entry.by_id[metadata.transactional_id]
                else:
                    log.warning("Could not expire transactional id %s: %s",
                                metadata.transactional_id, error.name)
                    metadata.abort_pending_transition()
            if error == ErrorCode.none:
                log.info("Expired %d transactional ids of %s: %s", len(expired), tp,
                         ", ".join(m.transactional_id for m, _ in expired))

        self._append(acks=ENFORCED_REQUIRED_ACKS, timeout_ms=TOMBSTONE_TIMEOUT_MS,
                     entries={tp: batch}, on_complete=done)

    # ---- loading and unloading ------------------------------------------------------------

    def load_transactions_for_partition(self, partition: int, epoch: int) -> None:
        """Become the coordinator of ``partition``'s ids: loading at once (so requests get
        COORDINATOR_LOAD_IN_PROGRESS), replayed from the log on the scheduler."""
        self._cache.pop(partition, None)
        self._loading[partition] = epoch
        self._scheduler.call_later(0, lambda: self._load(partition, epoch))

    def _load(self, partition: int, epoch: int) -> None:
        if self._shutting_down or self._loading.get(partition) != epoch:
            return  # stopped, or a newer leadership change took over
        tp = TopicPartition(TRANSACTION_STATE_TOPIC, partition)
        replica = self._local_partition(tp)
        values: dict[str, TransactionLogValue | None] = {}

        def apply(key: bytes | None, value: bytes | None, _header: BatchHeader) -> None:
            if key is None:
                raise CorruptTransactionRecordError("a record without a key")
            values[decode_key(key)] = decode_value(value)

        if replica is not None:
            replay(tp, replica, apply, (CorruptTransactionRecordError,))
        entry = _CacheEntry(epoch, {txn_id: TransactionMetadata.loaded(txn_id, value)
                                    for txn_id, value in sorted(values.items())
                                    if value is not None})
        del self._loading[partition]
        self._cache[partition] = entry
        end = replica.log_end_offset if replica is not None else 0
        loaded = [f"{m.transactional_id} ({m.state.state_name}, producer {m.producer_id} "
                  f"epoch {m.producer_epoch})" for m in entry.by_id.values()]
        log.info("Loaded %s to offset %d in epoch %d: %s", tp, end, epoch,
                 ", ".join(loaded) or "no transactional id")
        self._events.emit(EventType.COORDINATOR_LOAD, topic=TRANSACTION_STATE_TOPIC,
                          partition=partition, leader_epoch=epoch, log_end_offset=end,
                          detail=f"loaded {len(loaded)} transactional ids: {', '.join(loaded)}"
                          if loaded else "loaded no transactional id")
        self._on_loaded(epoch, list(entry.by_id.values()))

    def timed_out_transactions(self, now_ms: int) -> list[TransactionMetadata]:
        """Kafka's ``timedOutTransactions``: each Ongoing transaction with no change in
        flight, open longer than its timeout."""
        return [m for entry in self._cache.values() for m in entry.by_id.values()
                if m.state is TransactionState.ONGOING and not m.pending_transition_in_progress
                and m.txn_start_timestamp + m.txn_timeout_ms < now_ms]

    def remove_transactions_for_partition(self, partition: int, epoch: int) -> None:
        """Stop coordinating ``partition``'s ids (this broker no longer leads it)."""
        was_loading = self._loading.pop(partition, None) is not None
        entry = self._cache.pop(partition, None)
        if entry is None and not was_loading:
            return
        removed = sorted(entry.by_id) if entry is not None else []
        log.info("Unloaded %s-%d in epoch %d: %d transactional ids", TRANSACTION_STATE_TOPIC,
                 partition, epoch, len(removed))
        self._events.emit(EventType.COORDINATOR_UNLOAD, topic=TRANSACTION_STATE_TOPIC,
                          partition=partition, leader_epoch=epoch,
                          detail=f"unloaded {len(removed)} transactional ids: "
                                 f"{', '.join(removed)}" if removed
                          else "unloaded no transactional id")

    def shutdown(self) -> None:
        self._shutting_down = True
        self._cache.clear()
        self._loading.clear()

    def state(self) -> dict[str, object]:
        """For /v1/state: the partitions this broker coordinates, and their ids (with the
        transaction's partitions and the transaction version of its last transition)."""
        return {"loading": sorted(self._loading),
                "owned": {p: {m.transactional_id: {
                    "state": m.state.state_name, "producer_id": m.producer_id,
                    "producer_epoch": m.producer_epoch,
                    "partitions": sorted(f"{tp.topic}-{tp.partition}" for tp in m.partitions),
                    "transaction_version": m.client_transaction_version}
                    for m in e.by_id.values()}
                    for p, e in sorted(self._cache.items())}}
