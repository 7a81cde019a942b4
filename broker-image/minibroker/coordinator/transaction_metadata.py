"""One transactional id's state at its coordinator: Kafka's ``TransactionMetadata`` (4.2, with
4.3's handling of the largest epoch, KAFKA-20090).

A change is made in two steps, as in Kafka: ``prepare_*`` checks the transition against
``TransactionState.valid_previous_states`` and returns the new state as a
``TxnTransitMetadata`` (what the record in ``__transaction_state`` will hold), with the
metadata's ``pending_state`` set so that no other change starts meanwhile; once that record
is replicated (``TransactionStateManager.append_transaction_to_log``),
``complete_transition_to`` makes it the state, or ``abort_pending_transition`` drops it
when the write failed. So the coordinator never answers from a state the log may not keep.

A transaction goes Empty (or Complete*) -> Ongoing (AddPartitionsToTxn) -> PrepareCommit
or PrepareAbort (EndTxn, or the coordinator's own abort with a fenced epoch) ->
CompleteCommit or CompleteAbort (once every partition has its marker). Each transition
records the transaction version of the client that made it (``clientTransactionVersion``,
KIP-890): under transaction version 2 the decision (PrepareCommit or PrepareAbort) bumps
the producer epoch, so every transaction runs under an epoch of its own and a request left
over from the one before is fenced; an exhausted epoch moves the id to the next producer id
at the end of the transaction (``nextProducerId``). Under versions 0 and 1 the epoch stays
the same from one transaction to the next.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from minibroker.cluster.types import TopicPartition
from minibroker.coordinator.transaction_log import TransactionLogValue, TransactionState

__all__ = [
    "MAX_EPOCH",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "TV_2",
    "TransactionMetadata",
    "TransitionError",
    "TxnTransitMetadata",
    "is_epoch_exhausted",
    "supports_epoch_bump",
]

log = logging.getLogger("minibroker.coordinator.transaction")

NO_PRODUCER_ID = -1  # RecordBatch.NO_PRODUCER_ID
NO_PRODUCER_EPOCH = -1  # RecordBatch.NO_PRODUCER_EPOCH
MAX_EPOCH = 2**15 - 1  # Short.MAX_VALUE
TV_2 = 2
"""``TransactionVersion.TV_2``: the first that ``supportsEpochBump``."""


def supports_epoch_bump(transaction_version: int) -> bool:
    """``TransactionVersion.supportsEpochBump``."""
    return transaction_version >= TV_2


def is_epoch_exhausted(producer_epoch: int) -> bool:
    """``TransactionMetadata.isEpochExhausted``: one epoch is kept for fencing (KIP-360)."""
    return producer_epoch >= MAX_EPOCH - 1


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
    client_transaction_version: int
    next_producer_id: int = NO_PRODUCER_ID

    def log_value(self) -> TransactionLogValue:
        """What ``TransactionLog.valueToBytes`` writes of it: Kafka 4.3 also writes the
        previous and next producer ids (tagged fields 0 and 1 of the flexible version 1;
        version 0 has no place for them), so that a coordinator that loads a decision
        taken over an exhausted epoch still moves the id to the next producer id at its
        completion, and still knows a retry from the previous one (KAFKA-20310). Kafka 4.2
        wrote only the client's transaction version there: the ids read back as -1."""
        return TransactionLogValue(self.producer_id, self.producer_epoch, self.txn_timeout_ms,
                                   self.state, self.partitions, self.txn_last_update_timestamp,
                                   self.txn_start_timestamp,
                                   previous_producer_id=self.last_producer_id,
                                   next_producer_id=self.next_producer_id,
                                   client_transaction_version=self.client_transaction_version)


class TransactionMetadata:
    def __init__(self, transactional_id: str, producer_id: int, *, producer_epoch: int,
                 txn_timeout_ms: int, state: TransactionState, update_timestamp: int,
                 partitions: frozenset[TopicPartition] = frozenset(),
                 txn_start_timestamp: int = -1, client_transaction_version: int = 0) -> None:
        self.transactional_id = transactional_id
        self.producer_id = producer_id
        self.last_producer_id = NO_PRODUCER_ID
        self.next_producer_id = NO_PRODUCER_ID
        self.client_transaction_version = client_transaction_version
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
        metadata = cls(transactional_id, value.producer_id,
                       producer_epoch=value.producer_epoch,
                       txn_timeout_ms=value.transaction_timeout_ms, state=value.state,
                       update_timestamp=value.last_update_timestamp_ms,
                       partitions=value.partitions,
                       txn_start_timestamp=value.start_timestamp_ms,
                       client_transaction_version=value.client_transaction_version)
        metadata.last_producer_id = value.previous_producer_id
        metadata.next_producer_id = value.next_producer_id
        return metadata

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

    def prepare_add_partitions(self, partitions: frozenset[TopicPartition], now_ms: int,
                               client_transaction_version: int) -> TxnTransitMetadata:
        """Kafka's ``prepareAddPartitions``: Ongoing with the partitions added; the first
        partition of a transaction starts its clock (``txn_start_timestamp``), which
        ``transaction.timeout.ms`` counts from."""
        start = now_ms if self.state in (TransactionState.EMPTY,
                                         TransactionState.COMPLETE_ABORT,
                                         TransactionState.COMPLETE_COMMIT) \
            else self.txn_start_timestamp
        return self._prepare(TransactionState.ONGOING, self.producer_id, self.producer_epoch,
                             self.last_producer_epoch, self.txn_timeout_ms, now_ms,
                             partitions=self.partitions | partitions, start=start,
                             client_transaction_version=client_transaction_version)

    def prepare_abort_or_commit(self, state: TransactionState, now_ms: int, *,
                                client_transaction_version: int,
                                next_producer_id: int = NO_PRODUCER_ID,
                                no_partition_added: bool = False) -> TxnTransitMetadata:
        """Kafka's ``prepareAbortOrCommit``: PrepareCommit or PrepareAbort with the same
        partitions. Transaction version 2 bumps the epoch (the one before becomes the last
        epoch, which a retry of this EndTxn names) and may abort with no partition added,
        its start then being now; versions 0 and 1 keep the epoch. An abort at the largest
        epoch (a state only a bug leaves behind) keeps it rather than overflow, so that the
        id recovers by moving to the next producer id (Kafka 4.3, KAFKA-20090; Kafka 4.2
        overflowed to a negative epoch and refused the transition)."""
        if supports_epoch_bump(client_transaction_version):
            stuck = self.producer_epoch >= MAX_EPOCH and state is TransactionState.PREPARE_ABORT
            if stuck:
                log.error("Aborting %s (producer id %d) with epoch equal to Short.MaxValue: "
                          "this must not happen unless there is a bug",
                          self.transactional_id, self.producer_id)
            epoch = self.producer_epoch if stuck else self.producer_epoch + 1
            last_epoch = self.producer_epoch
        else:
            epoch, last_epoch = self.producer_epoch, self.last_producer_epoch
        return self._prepare(state, self.producer_id, epoch, last_epoch, self.txn_timeout_ms,
                             now_ms, partitions=self.partitions,
                             start=now_ms if no_partition_added else self.txn_start_timestamp,
                             client_transaction_version=client_transaction_version,
                             next_producer_id=next_producer_id)

    def fence_producer_epoch(self) -> None:
        """Kafka's ``prepareFenceProducerEpoch`` followed by ``endTransactionWithTV1``'s
        epoch fence, in one step: the coordinator aborts an Ongoing transaction itself (its
        timeout expired, or a new instance of the producer initialized), so it bumps the
        epoch in memory at once, fencing the old producer's next request, and the
        PrepareAbort written next carries it. If that write fails the epoch is not bumped
        again (``hasFailedEpochFence``): the bumped one was never given to anyone. At the
        largest epoch it is not bumped either (Kafka 4.3, KAFKA-20090: logged, no longer
        refused)."""
        if self.producer_epoch >= MAX_EPOCH:
            log.error("Fencing %s (producer id %d) with epoch equal to Short.MaxValue: this "
                      "must not happen unless there is a bug", self.transactional_id,
                      self.producer_id)
        elif not self.has_failed_epoch_fence:
            self.producer_epoch += 1
        self.last_producer_epoch = NO_PRODUCER_EPOCH

    def prepare_complete(self, now_ms: int) -> TxnTransitMetadata:
        """Kafka's ``prepareComplete``: the markers are written, CompleteCommit or
        CompleteAbort, no partitions. Under transaction version 2 an exhausted epoch moves
        to the next producer id at epoch 0 here (the last epoch stays the one the client
        saw last)."""
        self.has_failed_epoch_fence = False
        state = (TransactionState.COMPLETE_COMMIT if self.state is TransactionState.PREPARE_COMMIT
                 else TransactionState.COMPLETE_ABORT)
        if (supports_epoch_bump(self.client_transaction_version)
                and self.next_producer_id != NO_PRODUCER_ID):
            producer_id, epoch = self.next_producer_id, 0
        else:
            producer_id, epoch = self.producer_id, self.producer_epoch
        return self._prepare(state, producer_id, epoch, self.last_producer_epoch,
                             self.txn_timeout_ms, now_ms, start=self.txn_start_timestamp,
                             next_producer_id=NO_PRODUCER_ID)

    def _prepare(self, state: TransactionState, producer_id: int, epoch: int, last_epoch: int,
                 txn_timeout_ms: int, now_ms: int, *,
                 partitions: frozenset[TopicPartition] = frozenset(),
                 start: int = -1, client_transaction_version: int | None = None,
                 next_producer_id: int | None = None) -> TxnTransitMetadata:
        """Kafka's ``prepareTransitionTo``: checked against the state machine, and pending
        until written; the client's transaction version and the next producer id stay the
        metadata's unless given."""
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
        return TxnTransitMetadata(
            producer_id, self.producer_id, epoch, last_epoch, txn_timeout_ms, state, partitions,
            start, now_ms,
            self.client_transaction_version if client_transaction_version is None
            else client_transaction_version,
            self.next_producer_id if next_producer_id is None else next_producer_id)

    # ---- after the log write ---------------------------------------------------------------

    def complete_transition_to(self, transit: TxnTransitMetadata) -> None:
        """The prepared transition's record is replicated: it is the state now (Kafka's
        ``completeTransitionTo``, with its ``validProducerEpoch``)."""
        if self.pending_state is not transit.state:
            raise TransitionError(f"{self.transactional_id}: completing "
                                  f"{transit.state.state_name}, but "
                                  f"{self.pending_state} is pending")
        state = transit.state
        if (state is TransactionState.EMPTY and (
                not self._valid_epoch_bump(transit) or transit.partitions
                or transit.txn_start_timestamp != -1)) or (
                state is TransactionState.ONGOING and (
                    not self._valid_producer_epoch(transit)
                    or not transit.partitions >= self.partitions)) or (
                state in (TransactionState.PREPARE_COMMIT, TransactionState.PREPARE_ABORT)
                and (not self._valid_producer_epoch(transit)
                     or transit.partitions != self.partitions
                     or not self._valid_decision_start(transit))) or (
                state in (TransactionState.COMPLETE_COMMIT, TransactionState.COMPLETE_ABORT)
                and (not self._valid_producer_epoch(transit)
                     or transit.txn_start_timestamp == -1)):
            raise TransitionError(f"{self.transactional_id}: invalid transition from "
                                  f"{self.state.state_name} to {transit}")
        self.producer_id, self.last_producer_id = transit.producer_id, transit.last_producer_id
        self.next_producer_id = transit.next_producer_id
        self.producer_epoch = transit.producer_epoch
        self.last_producer_epoch = transit.last_producer_epoch
        self.txn_timeout_ms = transit.txn_timeout_ms
        self.partitions = transit.partitions
        self.txn_start_timestamp = transit.txn_start_timestamp
        self.txn_last_update_timestamp = transit.txn_last_update_timestamp
        self.client_transaction_version = transit.client_transaction_version
        self.pending_state = None
        self.state = transit.state

    def _valid_epoch_bump(self, transit: TxnTransitMetadata) -> bool:
        """``validProducerEpochBump`` (or the same epoch): InitProducerId's Empty."""
        return (transit.producer_epoch in (self.producer_epoch, self.producer_epoch + 1)
                or (transit.producer_id != self.producer_id and transit.producer_epoch == 0))

    def _valid_producer_epoch(self, transit: TxnTransitMetadata) -> bool:
        """``validProducerEpoch``: the same producer id and epoch, except under transaction
        version 2 for a decision (its last epoch is the current one: the bump) and for a
        completion that moved to the next producer id (epoch 0, the previous id ours)."""
        if supports_epoch_bump(transit.client_transaction_version):
            if (transit.state in (TransactionState.COMPLETE_COMMIT,
                                  TransactionState.COMPLETE_ABORT)
                    and transit.producer_epoch == 0):
                return (transit.last_producer_epoch == self.last_producer_epoch
                        and transit.last_producer_id == self.producer_id)
            if transit.state in (TransactionState.PREPARE_COMMIT,
                                 TransactionState.PREPARE_ABORT):
                return (transit.last_producer_epoch == self.producer_epoch
                        and transit.producer_id == self.producer_id)
        return (transit.producer_id, transit.producer_epoch) == (self.producer_id,
                                                                 self.producer_epoch)

    def _valid_decision_start(self, transit: TxnTransitMetadata) -> bool:
        """A decision keeps the transaction's start, except transaction version 2's abort
        of a transaction no partition joined (from Empty or Complete*)."""
        return transit.txn_start_timestamp == self.txn_start_timestamp or (
            transit.state is TransactionState.PREPARE_ABORT
            and supports_epoch_bump(transit.client_transaction_version)
            and self.state in (TransactionState.EMPTY, TransactionState.COMPLETE_COMMIT,
                               TransactionState.COMPLETE_ABORT))

    def abort_pending_transition(self) -> None:
        """The write failed: the state stays what it was (``pendingState = None``)."""
        self.pending_state = None
