"""One transactional id's state at its coordinator: Kafka 4.2's ``TransactionMetadata``.

A change is made in two steps, as in Kafka: ``prepare_*`` checks the transition against
``TransactionState.valid_previous_states`` and returns the new state as a
``TxnTransitMetadata`` (what the record in ``__transaction_state`` will hold), with the
metadata's ``pending_state`` set so that no other change starts meanwhile; once that record
is replicated (``TransactionStateManager.append_transaction_to_log``),
``complete_transition_to`` makes it the state, or ``abort_pending_transition`` drops it
when the write failed. So the coordinator never answers from a state the log may not keep.

Transaction version 1 only (KIP-890's epoch bump per transaction is transaction version 2):
the previous and next producer ids of the flexible log value are not kept. A transaction
goes Empty (or Complete*) -> Ongoing (AddPartitionsToTxn) -> PrepareCommit or
PrepareAbort (EndTxn, or the coordinator's own abort with a fenced epoch) -> CompleteCommit
or CompleteAbort (once every partition has its marker).
"""

from __future__ import annotations

from dataclasses import dataclass

from minibroker.cluster.types import TopicPartition
from minibroker.coordinator.transaction_log import TransactionLogValue, TransactionState

__all__ = [
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "TransactionMetadata",
    "TransitionError",
    "TxnTransitMetadata",
    "is_epoch_exhausted",
]

NO_PRODUCER_ID = -1  # RecordBatch.NO_PRODUCER_ID
NO_PRODUCER_EPOCH = -1  # RecordBatch.NO_PRODUCER_EPOCH
_MAX_EPOCH = 2**15 - 1  # Short.MAX_VALUE


def is_epoch_exhausted(producer_epoch: int) -> bool:
    """``TransactionMetadata.isEpochExhausted``: one epoch is kept for fencing (KIP-360)."""
    return producer_epoch >= _MAX_EPOCH - 1


class TransitionError(Exception):
    """A transition the state machine forbids; ``fenced``: the producer's epoch is stale
    (PRODUCER_FENCED to the client), otherwise a coordinator bug."""

    def __init__(self, message: str, *, fenced: bool = False) -> None:
        super().__init__(message)
        self.fenced = fenced


@dataclass(frozen=True)
class TxnTransitMetadata:
    """The state a prepared transition leads to (Kafka's ``TxnTransitMetadata``)."""

    producer_id: int
    last_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    txn_timeout_ms: int
    state: TransactionState
    partitions: frozenset[TopicPartition]
    txn_start_timestamp: int
    txn_last_update_timestamp: int

    def log_value(self) -> TransactionLogValue:
        return TransactionLogValue(self.producer_id, self.producer_epoch, self.txn_timeout_ms,
                                   self.state, self.partitions, self.txn_last_update_timestamp,
                                   self.txn_start_timestamp)


class TransactionMetadata:
    def __init__(self, transactional_id: str, producer_id: int, *, producer_epoch: int,
                 txn_timeout_ms: int, state: TransactionState, update_timestamp: int,
                 partitions: frozenset[TopicPartition] = frozenset(),
                 txn_start_timestamp: int = -1) -> None:
        self.transactional_id = transactional_id
        self.producer_id = producer_id
        self.last_producer_id = NO_PRODUCER_ID
        self.producer_epoch = producer_epoch
        self.last_producer_epoch = NO_PRODUCER_EPOCH
        self.txn_timeout_ms = txn_timeout_ms
        self.state = state
        self.partitions = partitions
        self.txn_start_timestamp = txn_start_timestamp
        self.txn_last_update_timestamp = update_timestamp
        self.pending_state: TransactionState | None = None
        self.has_failed_epoch_fence = False

    @classmethod
    def loaded(cls, transactional_id: str, value: TransactionLogValue) -> TransactionMetadata:
        """As a new coordinator replays it (``TransactionLog.readTxnRecordValue``)."""
        return cls(transactional_id, value.producer_id, producer_epoch=value.producer_epoch,
                   txn_timeout_ms=value.transaction_timeout_ms, state=value.state,
                   update_timestamp=value.last_update_timestamp_ms,
                   partitions=value.partitions, txn_start_timestamp=value.start_timestamp_ms)

    @property
    def pending_transition_in_progress(self) -> bool:
        return self.pending_state is not None

    @property
    def is_producer_epoch_exhausted(self) -> bool:
        return is_epoch_exhausted(self.producer_epoch)

    # ---- InitProducerId ------------------------------------------------------------------

    def prepare_increment_producer_epoch(self, txn_timeout_ms: int,
                                         expected_epoch: int | None,
                                         now_ms: int) -> TxnTransitMetadata:
        """Kafka's ``prepareIncrementProducerEpoch``: a new producer instance (no expected
        epoch) bumps the epoch and fences every older one; a producer recovering with its
        current epoch (KIP-360) bumps it too; a retry of a bump it never heard of (its
        epoch is the last one) gets the current epoch again; any other epoch is fenced."""
        if self.is_producer_epoch_exhausted:
            raise TransitionError(f"no producer epoch left for producer id {self.producer_id}")
        bumped = self.producer_epoch + 1
        if expected_epoch is None:
            epoch, last_epoch = bumped, NO_PRODUCER_EPOCH
        elif self.producer_epoch == NO_PRODUCER_EPOCH or expected_epoch == self.producer_epoch:
            epoch, last_epoch = bumped, self.producer_epoch
        elif expected_epoch == self.last_producer_epoch:
            epoch, last_epoch = self.producer_epoch, self.last_producer_epoch
        else:
            raise TransitionError(
                f"{self.transactional_id}: expected producer epoch {expected_epoch} is neither "
                f"the current {self.producer_epoch} nor the last {self.last_producer_epoch}",
                fenced=True)
        return self._prepare(TransactionState.EMPTY, self.producer_id, epoch, last_epoch,
                             txn_timeout_ms, now_ms)

    def prepare_producer_id_rotation(self, producer_id: int, txn_timeout_ms: int, now_ms: int,
                                     record_last_epoch: bool) -> TxnTransitMetadata:
        """Kafka's ``prepareProducerIdRotation``: the epochs of the id are used up, so the
        transactional id moves to a new producer id at epoch 0."""
        return self._prepare(TransactionState.EMPTY, producer_id, 0,
                             self.producer_epoch if record_last_epoch else NO_PRODUCER_EPOCH,
                             txn_timeout_ms, now_ms)

    # ---- expiration ---------------------------------------------------------------------------

    def prepare_dead(self) -> TxnTransitMetadata:
        """Kafka's ``prepareDead``: the id expires (its tombstone is written next)."""
        return self._prepare(TransactionState.DEAD, self.producer_id, self.producer_epoch,
                             self.last_producer_epoch, self.txn_timeout_ms,
                             self.txn_last_update_timestamp)

    # ---- a transaction ---------------------------------------------------------------------

    def prepare_add_partitions(self, partitions: frozenset[TopicPartition],
                               now_ms: int) -> TxnTransitMetadata:
        """Kafka's ``prepareAddPartitions``: Ongoing with the partitions added; the first
        partition of a transaction starts its clock (``txn_start_timestamp``), which
        ``transaction.timeout.ms`` counts from."""
        start = now_ms if self.state in (TransactionState.EMPTY,
                                         TransactionState.COMPLETE_ABORT,
                                         TransactionState.COMPLETE_COMMIT) \
            else self.txn_start_timestamp
        return self._prepare(TransactionState.ONGOING, self.producer_id, self.producer_epoch,
                             self.last_producer_epoch, self.txn_timeout_ms, now_ms,
                             partitions=self.partitions | partitions, start=start)

    def prepare_abort_or_commit(self, state: TransactionState,
                                now_ms: int) -> TxnTransitMetadata:
        """Kafka's ``prepareAbortOrCommit`` for transaction version 1: PrepareCommit or
        PrepareAbort, the same producer epoch, partitions and start."""
        return self._prepare(state, self.producer_id, self.producer_epoch,
                             self.last_producer_epoch, self.txn_timeout_ms, now_ms,
                             partitions=self.partitions, start=self.txn_start_timestamp)

    def fence_producer_epoch(self) -> None:
        """Kafka's ``prepareFenceProducerEpoch`` followed by ``endTransactionWithTV1``'s
        epoch fence, in one step: the coordinator aborts an Ongoing transaction itself (its
        timeout expired, or a new instance of the producer initialized), so it bumps the
        epoch in memory at once, fencing the old producer's next request, and the
        PrepareAbort written next carries it. If that write fails the epoch is not bumped
        again (``hasFailedEpochFence``): the bumped one was never given to anyone."""
        if self.producer_epoch >= _MAX_EPOCH:
            raise TransitionError(f"{self.transactional_id}: cannot fence epoch "
                                  f"{self.producer_epoch}")
        if not self.has_failed_epoch_fence:
            self.producer_epoch += 1
        self.last_producer_epoch = NO_PRODUCER_EPOCH

    def prepare_complete(self, now_ms: int) -> TxnTransitMetadata:
        """Kafka's ``prepareComplete``: the markers are written, CompleteCommit or
        CompleteAbort, no partitions."""
        self.has_failed_epoch_fence = False
        state = (TransactionState.COMPLETE_COMMIT if self.state is TransactionState.PREPARE_COMMIT
                 else TransactionState.COMPLETE_ABORT)
        return self._prepare(state, self.producer_id, self.producer_epoch,
                             self.last_producer_epoch, self.txn_timeout_ms, now_ms,
                             start=self.txn_start_timestamp)

    def _prepare(self, state: TransactionState, producer_id: int, epoch: int, last_epoch: int,
                 txn_timeout_ms: int, now_ms: int, *,
                 partitions: frozenset[TopicPartition] = frozenset(),
                 start: int = -1) -> TxnTransitMetadata:
        """Kafka's ``prepareTransitionTo``: checked against the state machine, and pending
        until written."""
        if self.pending_state is not None:
            raise TransitionError(f"{self.transactional_id}: preparing {state.state_name} "
                                  f"while {self.pending_state.state_name} is pending")
        if self.state not in state.valid_previous_states:
            raise TransitionError(f"{self.transactional_id}: {self.state.state_name} cannot "
                                  f"become {state.state_name}")
        if producer_id < 0 or (epoch < 0 and state is not TransactionState.DEAD):
            raise TransitionError(f"{self.transactional_id}: illegal producer id {producer_id} "
                                  f"epoch {epoch}")
        self.pending_state = state
        return TxnTransitMetadata(producer_id, self.producer_id, epoch, last_epoch,
                                  txn_timeout_ms, state, partitions, start, now_ms)

    # ---- after the log write ---------------------------------------------------------------

    def complete_transition_to(self, transit: TxnTransitMetadata) -> None:
        """The prepared transition's record is replicated: it is the state now."""
        if self.pending_state is not transit.state:
            raise TransitionError(f"{self.transactional_id}: completing "
                                  f"{transit.state.state_name}, but "
                                  f"{self.pending_state} is pending")
        epoch_ok = (transit.producer_epoch in (self.producer_epoch, self.producer_epoch + 1)
                    or (transit.producer_id != self.producer_id and transit.producer_epoch == 0))
        same_epoch = (transit.producer_id, transit.producer_epoch) == (self.producer_id,
                                                                       self.producer_epoch)
        state = transit.state
        if (state is TransactionState.EMPTY and (
                not epoch_ok or transit.partitions or transit.txn_start_timestamp != -1)) or (
                state is TransactionState.ONGOING and (
                    not same_epoch or not transit.partitions >= self.partitions)) or (
                state in (TransactionState.PREPARE_COMMIT, TransactionState.PREPARE_ABORT)
                and (not same_epoch or transit.partitions != self.partitions
                     or transit.txn_start_timestamp != self.txn_start_timestamp)) or (
                state in (TransactionState.COMPLETE_COMMIT, TransactionState.COMPLETE_ABORT)
                and (not same_epoch or transit.txn_start_timestamp == -1)):
            raise TransitionError(f"{self.transactional_id}: invalid transition from "
                                  f"{self.state.state_name} to {transit}")
        self.producer_id, self.last_producer_id = transit.producer_id, transit.last_producer_id
        self.producer_epoch = transit.producer_epoch
        self.last_producer_epoch = transit.last_producer_epoch
        self.txn_timeout_ms = transit.txn_timeout_ms
        self.partitions = transit.partitions
        self.txn_start_timestamp = transit.txn_start_timestamp
        self.txn_last_update_timestamp = transit.txn_last_update_timestamp
        self.pending_state = None
        self.state = transit.state

    def abort_pending_transition(self) -> None:
        """The write failed: the state stays what it was (``pendingState = None``)."""
        self.pending_state = None
