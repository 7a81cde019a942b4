"""Sending a transaction's markers to its partitions' leaders: Kafka 4.2's
``TransactionMarkerChannelManager`` and ``TransactionMarkerRequestCompletionHandler``.

Once PrepareCommit or PrepareAbort is in ``__transaction_state``, the outcome is decided;
what is left is to write a marker in every partition of the transaction and then
CompleteCommit or CompleteAbort. Each partition's marker is queued for the broker that
leads it now; one sender per broker drains its queue into WriteTxnMarkers requests (one
entry per transaction, all its partitions on that broker) over a connection it keeps. They
are version 2, which carries the transaction version of the client that decided, so that
the leader checks the marker's epoch by that version's rules.
Per partition, the answer decides:

- NONE: that partition is done; when the last is, the Complete* state is written (retried
  while the log answers COORDINATOR_NOT_AVAILABLE, dropped on NOT_COORDINATOR: the next
  coordinator resends).
- a leader that moved or is not ready (NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION,
  NOT_ENOUGH_REPLICAS(_AFTER_APPEND), REQUEST_TIMED_OUT, KAFKA_STORAGE_ERROR), or a lost
  connection: the marker is queued again after ``RETRY_BACKOFF_MS`` for the leader of the
  moment, as often as it takes;
- INVALID_PRODUCER_EPOCH or TRANSACTION_COORDINATOR_FENCED: this coordinator or epoch is
  stale, the transaction's markers are dropped (a newer coordinator owns it);
- anything else is a bug somewhere, logged, and the markers dropped.

Before each send the transaction must still be this coordinator's in the coordinator epoch
it was decided in; if not (the ``__transaction_state`` partition moved), its markers are
dropped: the new coordinator loads the Prepare* state and sends them itself. So a commit
is completed exactly by whoever owns the transactional id, whatever fails in between.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from kio.schema.write_txn_markers.v2 import request as markers_req
from kio.static.primitive import i8, i16, i32, i64

from minibroker.cluster.scheduler import Scheduler
from minibroker.cluster.types import ErrorCode, MetadataImage, TopicPartition
from minibroker.coordinator.transaction_metadata import TransactionMetadata, TxnTransitMetadata
from minibroker.coordinator.transaction_state_manager import (
    CoordinatorEpochAndTxnMetadata,
    TransactionStateManager,
)
from minibroker.network.client import KafkaClientError, KafkaConnection
from minibroker.storage.control_records import ControlRecordType

__all__ = ["RETRY_BACKOFF_MS", "TransactionMarkerChannelManager"]

log = logging.getLogger("minibroker.coordinator.transaction")

RETRY_BACKOFF_MS = 100  # Kafka's retry.backoff.ms default
_MARKER_TIMEOUT_S = 40.0  # above the leader's request.timeout.ms (30 s) for its acks=-1

_RETRIABLE = frozenset({
    ErrorCode.unknown_topic_or_partition, ErrorCode.not_leader_or_follower,
    ErrorCode.not_enough_replicas, ErrorCode.not_enough_replicas_after_append,
    ErrorCode.request_timed_out, ErrorCode.kafka_storage_error,
    ErrorCode.coordinator_load_in_progress, ErrorCode.coordinator_not_available,
})
_COORDINATOR_STALE = frozenset({ErrorCode.invalid_producer_epoch,
                                ErrorCode.transaction_coordinator_fenced})


@dataclass
class PendingCompleteTxn:
    """One decided transaction whose markers are not all written (Kafka's
    ``PendingCompleteTxn``)."""

    metadata: TransactionMetadata
    coordinator_epoch: int
    result: ControlRecordType
    complete: TxnTransitMetadata
    remaining: set[TopicPartition] = field(default_factory=set)
    dropped: bool = False

    @property
    def transactional_id(self) -> str:
        return self.metadata.transactional_id


class TransactionMarkerChannelManager:
    def __init__(self, broker_id: int, scheduler: Scheduler, *,
                 state_manager: TransactionStateManager,
                 metadata_image: Callable[[], MetadataImage],
                 address_of: Callable[[int], tuple[str, int] | None],
                 spawn: Callable[[Coroutine[Any, Any, None], str], None]) -> None:
        self._broker_id = broker_id
        self._scheduler = scheduler
        self._state_manager = state_manager
        self._image = metadata_image
        self._address_of = address_of
        self._spawn = spawn
        self._queues: dict[int, list[tuple[PendingCompleteTxn, TopicPartition]]] = {}
        self._draining: set[int] = set()
        self._connections: dict[int, KafkaConnection] = {}
        self._pending: dict[str, PendingCompleteTxn] = {}
        self._shutting_down = False

    def add_txn_markers_to_send(self, coordinator_epoch: int, result: ControlRecordType,
                                metadata: TransactionMetadata,
                                complete: TxnTransitMetadata) -> None:
        """Send ``result``'s marker to every partition of the transaction, then write
        ``complete`` (prepared by ``prepare_complete``)."""
        txn = PendingCompleteTxn(metadata, coordinator_epoch, result, complete,
                                 set(metadata.partitions))
        self._pending[txn.transactional_id] = txn
        log.info("Sending %s markers of %s (producer %d epoch %d) to %d partitions",
                 result.name, txn.transactional_id, metadata.producer_id,
                 metadata.producer_epoch, len(txn.remaining))
        if not txn.remaining:
            self._write_complete(txn)
        for tp in sorted(txn.remaining):
            self._enqueue(txn, tp)

    def _enqueue(self, txn: PendingCompleteTxn, tp: TopicPartition) -> None:
        if self._shutting_down or txn.dropped or tp not in txn.remaining:
            return
        topic = self._image().topics.get(tp.topic)
        if topic is None:
            # Kafka's handler: a deleted topic's marker is not needed any more.
            log.info("%s: topic of %s is gone; its marker is not needed",
                     txn.transactional_id, tp)
            self._partition_done(txn, tp)
            return
        reg = topic.partitions.get(tp.partition)
        leader = reg.leader if reg is not None else -1
        if leader < 0 or self._address_of(leader) is None:
            self._retry_later(txn, tp)
            return
        self._queues.setdefault(leader, []).append((txn, tp))
        if leader not in self._draining:
            self._draining.add(leader)
            self._spawn(self._drain(leader), f"txn-markers-to-{leader}")

    def _retry_later(self, txn: PendingCompleteTxn, tp: TopicPartition) -> None:
        self._scheduler.call_later(RETRY_BACKOFF_MS, lambda: self._enqueue(txn, tp))

    async def _drain(self, broker: int) -> None:
        """Send the broker's queued markers, a request at a time, until none is left."""
        try:
            while queue := self._queues.pop(broker, []):
                await self._send(broker, [(txn, tp) for txn, tp in queue
                                          if self._still_ours(txn)])
        finally:
            self._draining.discard(broker)

    def _still_ours(self, txn: PendingCompleteTxn) -> bool:
        """Kafka's check before a send: the id is still this coordinator's, in the epoch the
        outcome was decided in, with the same producer; if not, its markers are dropped."""
        if txn.dropped:
            return False
        state = self._state_manager.get_transaction_state(txn.transactional_id)
        if (isinstance(state, CoordinatorEpochAndTxnMetadata)
                and state.coordinator_epoch == txn.coordinator_epoch
                and state.metadata is txn.metadata):
            return True
        log.info("%s is no longer coordinated here in epoch %d: its markers are left to its "
                 "coordinator", txn.transactional_id, txn.coordinator_epoch)
        self._drop(txn)
        return False

    async def _send(self, broker: int, entries: list[tuple[PendingCompleteTxn, TopicPartition]]
                    ) -> None:
        if not entries:
            return
        by_txn: dict[str, tuple[PendingCompleteTxn, list[TopicPartition]]] = {}
        for txn, tp in entries:
            by_txn.setdefault(txn.transactional_id, (txn, []))[1].append(tp)
        request = markers_req.WriteTxnMarkersRequest(markers=tuple(
            markers_req.WritableTxnMarker(
                producer_id=i64(txn.metadata.producer_id),
                producer_epoch=i16(txn.metadata.producer_epoch),
                transaction_result=txn.result is ControlRecordType.COMMIT,
                coordinator_epoch=i32(txn.coordinator_epoch),
                # v2 (KIP-890): the leader checks a version 2 marker's epoch strictly
                transaction_version=i8(txn.metadata.client_transaction_version),
                topics=tuple(markers_req.WritableTxnMarkerTopic(
                    name=topic, partition_indexes=tuple(
                        i32(tp.partition) for tp in tps if tp.topic == topic))
                    for topic in sorted({tp.topic for tp in tps})))
            for txn, tps in by_txn.values()))
        try:
            response = await self._request(broker, request)
        except (KafkaClientError, OSError) as exc:
            log.info("WriteTxnMarkers to broker %d failed (%s); retrying", broker, exc)
            for txn, tp in entries:
                self._retry_later(txn, tp)
            return
        answered = {(m.producer_id, t.name, p.partition_index): ErrorCode(p.error_code)
                    for m in response.markers for t in m.topics for p in t.partitions}
        for txn, tp in entries:
            error = answered.get((txn.metadata.producer_id, tp.topic, tp.partition),
                                 ErrorCode.unknown_server_error)
            self._on_marker_result(txn, tp, error, broker)

    async def _request(self, broker: int, request: Any) -> Any:
        conn = self._connections.get(broker)
        if conn is None or conn.closed:
            address = self._address_of(broker)
            if address is None:
                raise KafkaClientError(f"no address for broker {broker}")
            conn = self._connections[broker] = await KafkaConnection.connect(
                *address, client_id=f"broker-{self._broker_id}-txn-marker-sender")
        return await conn.request(request, timeout=_MARKER_TIMEOUT_S)

    def _on_marker_result(self, txn: PendingCompleteTxn, tp: TopicPartition,
                          error: ErrorCode, broker: int) -> None:
        """Kafka's ``TransactionMarkerRequestCompletionHandler``, one partition's answer."""
        if error == ErrorCode.none:
            self._partition_done(txn, tp)
        elif error in _RETRIABLE:
            log.info("%s's marker for %s on broker %d: %s; retrying", txn.transactional_id, tp,
                     broker, error.name)
            self._retry_later(txn, tp)
        elif error in _COORDINATOR_STALE:
            log.info("%s's marker for %s was refused by broker %d (%s): a newer coordinator "
                     "or producer epoch owns it", txn.transactional_id, tp, broker, error.name)
            self._drop(txn)
        else:
            log.error("%s's marker for %s on broker %d got %s, which a marker never should; "
                      "its markers are dropped", txn.transactional_id, tp, broker, error.name)
            self._drop(txn)

    def _partition_done(self, txn: PendingCompleteTxn, tp: TopicPartition) -> None:
        txn.remaining.discard(tp)
        if not txn.remaining and not txn.dropped:
            self._write_complete(txn)

    def _drop(self, txn: PendingCompleteTxn) -> None:
        txn.dropped = True
        if self._pending.get(txn.transactional_id) is txn:
            del self._pending[txn.transactional_id]
        if txn.metadata.pending_state is txn.complete.state:
            txn.metadata.abort_pending_transition()

    def _write_complete(self, txn: PendingCompleteTxn) -> None:
        """Every marker is written: CompleteCommit or CompleteAbort (Kafka's
        ``tryAppendToLog``), retried while the log is not available."""
        def written(error: ErrorCode) -> None:
            if error == ErrorCode.none:
                log.info("Completed %s's transaction: %s", txn.transactional_id,
                         txn.complete.state.state_name)
                if self._pending.get(txn.transactional_id) is txn:
                    del self._pending[txn.transactional_id]
            elif error == ErrorCode.coordinator_not_available and not self._shutting_down:
                self._scheduler.call_later(RETRY_BACKOFF_MS, lambda: self._retry_complete(txn))
            else:
                log.info("Not completing %s here (%s): its coordinator will",
                         txn.transactional_id, error.name)
                self._drop(txn)

        self._state_manager.append_transaction_to_log(
            txn.transactional_id, txn.coordinator_epoch, txn.complete, written)

    def _retry_complete(self, txn: PendingCompleteTxn) -> None:
        if not self._still_ours(txn):
            return
        txn.complete = txn.metadata.prepare_complete(self._state_manager.now_ms())
        self._write_complete(txn)

    def shutdown(self) -> None:
        self._shutting_down = True
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()
        self._queues.clear()

    def state(self) -> dict[str, object]:
        """For /v1/state: each transaction waiting for markers, and where."""
        return {txn_id: {"result": txn.result.name,
                         "remaining": sorted(f"{tp.topic}-{tp.partition}"
                                             for tp in txn.remaining)}
                for txn_id, txn in sorted(self._pending.items())}
