"""The transaction coordinator: Kafka 4.2's ``TransactionCoordinator``, transaction versions
0 to 2, with Kafka 4.3's handling of an exhausted epoch on the coordinator's own abort
(KAFKA-20090).

It answers for the transactional ids of the ``__transaction_state`` partitions this broker
leads (``TransactionStateManager``). InitProducerId with a transactional id gives the id its
producer id (one from the controller's blocks, kept for the life of the id) and a producer
epoch one above the last, which fences every instance that initialized before (their
requests with the older epoch get PRODUCER_FENCED). AddPartitionsToTxn puts partitions in
the transaction (Ongoing); EndTxn decides it (PrepareCommit or PrepareAbort), answers the
producer once that is in the log, and hands the markers to the
``TransactionMarkerChannelManager``, which writes Complete* after the last one. The
coordinator aborts a transaction itself, with a fenced epoch, when it has been open longer
than its timeout or a new instance of the producer initializes. Every state is in
``__transaction_state`` before anyone hears of it, so a coordinator that takes over after a
crash continues from it: it resends the markers of any transaction it finds decided but not
completed.

Which transaction version a request runs under is the client's, read from its request
version as Kafka reads it (``TransactionVersion.transactionVersionForEndTxn``: EndTxn v5+,
``transactionVersionForAddPartitionsToTxn``: AddPartitionsToTxn v4+, which only brokers
send, for a Produce v12+ or TxnOffsetCommit v5+ that adds its partitions implicitly). The
coordinator's own aborts run under the cluster's ``transaction.version``. Under version 2,
EndTxn bumps the producer epoch and answers the new one (``endTransaction``); under 0 and 1
the epoch stays (``endTransactionWithTV1``), which is what lets a delayed request of one
transaction land in the next.

It is long because it is Kafka's TransactionCoordinator with its state machine
(TransactionState's transitions, the markers and the timeouts) in one place: each transition
reads next to the others it must agree with.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from minibroker.cluster.partition import Partition
from minibroker.cluster.scheduler import Scheduler
from minibroker.cluster.types import ErrorCode, MetadataImage, TopicPartition
from minibroker.config import resolve
from minibroker.coordinator.group_metadata_manager import AppendRecords, Emit
from minibroker.coordinator.transaction_log import TransactionState
from minibroker.coordinator.transaction_marker_channel_manager import (
    TransactionMarkerChannelManager,
)
from minibroker.coordinator.transaction_metadata import (
    MAX_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    TV_2,
    TransactionMetadata,
    TransitionError,
    TxnTransitMetadata,
    is_epoch_exhausted,
    supports_epoch_bump,
)
from minibroker.coordinator.transaction_state_manager import (
    TRANSACTION_STATE_TOPIC,
    CoordinatorEpochAndTxnMetadata,
    TransactionStateManager,
)
from minibroker.events import EndTxnOutcome, EventType
from minibroker.producer_id_manager import ProducerIdAllocationError
from minibroker.storage.control_records import ControlRecordType

__all__ = ["EndTxnResult", "InitProducerIdResult", "TransactionCoordinator"]

log = logging.getLogger("minibroker.coordinator.transaction")


@dataclass(frozen=True)
class InitProducerIdResult:
    error: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


@dataclass(frozen=True)
class EndTxnResult:
    """EndTxn's answer; under transaction version 2 the producer id and epoch the next
    transaction runs under (none under versions 0 and 1, nor with an error)."""

    error: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


@dataclass(frozen=True)
class _EndTxnRequest:
    """An EndTxn as it arrived: the request's fields and the transaction's state and epoch
    before the coordinator acted on it (the ``end_txn`` event's)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    transaction_version: int
    state: TransactionState
    epoch: int


_ANSWERED = {ErrorCode.none: EndTxnOutcome.RETRY,
             ErrorCode.producer_fenced: EndTxnOutcome.FENCED,
             ErrorCode.invalid_txn_state: EndTxnOutcome.INVALID_STATE}
"""The answers to an EndTxn that decided nothing, as ``end_txn`` outcomes; the others
(CONCURRENT_TRANSACTIONS while markers go out, NOT_COORDINATOR, a wrong producer id) are
retried or refused before the transaction is looked at, and leave no event."""


class TransactionCoordinator:
    def __init__(self, broker_id: int, scheduler: Scheduler, *, config: Mapping[str, str],
                 append: AppendRecords,
                 local_partition: Callable[[TopicPartition], Partition | None],
                 metadata_image: Callable[[], MetadataImage], events: Emit,
                 generate_producer_id: Callable[[], Awaitable[int]],
                 address_of: Callable[[int], tuple[str, int] | None],
                 spawn: Callable[[Coroutine[Any, Any, None], str], None]) -> None:
        self.state_manager = TransactionStateManager(
            broker_id, scheduler, config=config, append=append,
            local_partition=local_partition, metadata_image=metadata_image, events=events,
            on_loaded=self._complete_decided_transactions)
        self.markers = TransactionMarkerChannelManager(
            broker_id, scheduler, state_manager=self.state_manager,
            metadata_image=metadata_image, address_of=address_of, spawn=spawn)
        self._scheduler = scheduler
        self._events = events
        self._abort_interval_ms: int = resolve(
            "transaction.abort.timed.out.transaction.cleanup.interval.ms", config)
        self._generate_producer_id = generate_producer_id
        self._spawn = spawn
        self._shutting_down = False

    def on_leadership_change(self, tp: TopicPartition, is_leader: bool,
                             leader_epoch: int) -> None:
        """The ``ReplicaManager``'s listener: the leader epoch is the coordinator epoch."""
        if tp.topic != TRANSACTION_STATE_TOPIC:
            return
        if is_leader:
            self.state_manager.load_transactions_for_partition(tp.partition, leader_epoch)
        else:
            self.state_manager.remove_transactions_for_partition(tp.partition, leader_epoch)

    def startup(self) -> None:
        """Kafka's ``TransactionCoordinator.startup``: ids expire, and transactions open
        past their timeout are aborted, from now on."""
        self.state_manager.enable_transactional_id_expiration()

        def abort_timed_out() -> None:
            if self._shutting_down:
                return
            try:
                self.abort_timed_out_transactions()
            finally:
                self._scheduler.call_later(self._abort_interval_ms, abort_timed_out)

        self._scheduler.call_later(self._abort_interval_ms, abort_timed_out)

    def shutdown(self) -> None:
        self._shutting_down = True
        self.markers.shutdown()
        self.state_manager.shutdown()

    def _complete_decided_transactions(self, coordinator_epoch: int,
                                       loaded: list[TransactionMetadata]) -> None:
        """Kafka's ``onTransactionLoaded`` callback: a transaction the last coordinator
        decided (Prepare*) but did not complete gets its markers sent again."""
        for metadata in loaded:
            if metadata.state in (TransactionState.PREPARE_COMMIT,
                                  TransactionState.PREPARE_ABORT):
                result = (ControlRecordType.COMMIT
                          if metadata.state is TransactionState.PREPARE_COMMIT
                          else ControlRecordType.ABORT)
                log.info("Completing %s's %s, found in the log", metadata.transactional_id,
                         metadata.state.state_name)
                self.markers.add_txn_markers_to_send(
                    coordinator_epoch, result, metadata,
                    metadata.prepare_complete(self.state_manager.now_ms()))

    def _existing_state(self, transactional_id: str
                        ) -> CoordinatorEpochAndTxnMetadata | ErrorCode:
        """The id's state for a request that needs it initialized: INVALID_REQUEST for an
        empty id, INVALID_PRODUCER_ID_MAPPING for an unknown one."""
        if not transactional_id:
            return ErrorCode.invalid_request
        state = self.state_manager.get_transaction_state(transactional_id)
        return ErrorCode.invalid_producer_id_mapping if state is None else state

    # ---- AddPartitionsToTxn ---------------------------------------------------------------

    async def handle_add_partitions_to_transaction(
            self, transactional_id: str, producer_id: int, producer_epoch: int,
            partitions: frozenset[TopicPartition], client_transaction_version: int
    ) -> ErrorCode:
        """Kafka's ``handleAddPartitionsToTransaction``: a pending change is
        CONCURRENT_TRANSACTIONS before anything else (under version 2 the producer may
        already use the next producer id of a change still pending)."""
        state = self._existing_state(transactional_id)
        if isinstance(state, ErrorCode):
            return state
        metadata = state.metadata
        if metadata.pending_transition_in_progress:
            return ErrorCode.concurrent_transactions
        if metadata.producer_id != producer_id:
            return ErrorCode.invalid_producer_id_mapping
        if metadata.producer_epoch != producer_epoch:
            return ErrorCode.producer_fenced
        if metadata.state in (TransactionState.PREPARE_COMMIT, TransactionState.PREPARE_ABORT):
            return ErrorCode.concurrent_transactions
        if metadata.state is TransactionState.ONGOING and partitions <= metadata.partitions:
            return ErrorCode.none  # a retry: already in the transaction
        transit = metadata.prepare_add_partitions(partitions, self.state_manager.now_ms(),
                                                  client_transaction_version)
        return await _append(self.state_manager, transactional_id, state.coordinator_epoch,
                             transit)

    def verify_partitions_in_transaction(
            self, transactional_id: str, producer_id: int, producer_epoch: int,
            partitions: frozenset[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
        """Kafka's ``handleVerifyPartitionsInTransaction`` (AddPartitionsToTxn v4+ with
        VerifyOnly, KIP-890 part 1): whether each partition is in the ongoing transaction of
        this producer, without changing anything; one that is not is TRANSACTION_ABORTABLE
        (the leader turns it into INVALID_TXN_STATE for a client that predates it)."""
        state = self._existing_state(transactional_id)
        error: ErrorCode | None = None
        if isinstance(state, ErrorCode):
            error = state
        elif state.metadata.producer_id != producer_id:
            error = ErrorCode.invalid_producer_id_mapping
        elif state.metadata.producer_epoch != producer_epoch:
            error = ErrorCode.producer_fenced
        elif state.metadata.state in (TransactionState.PREPARE_COMMIT,
                                      TransactionState.PREPARE_ABORT):
            error = ErrorCode.concurrent_transactions
        if error is not None or not isinstance(state, CoordinatorEpochAndTxnMetadata):
            return dict.fromkeys(partitions, error or ErrorCode.unknown_server_error)
        return {tp: ErrorCode.none if tp in state.metadata.partitions
                else ErrorCode.transaction_abortable for tp in partitions}

    # ---- EndTxn ---------------------------------------------------------------------------

    async def handle_end_transaction(self, transactional_id: str, producer_id: int,
                                     producer_epoch: int, commit: bool, *,
                                     client_transaction_version: int,
                                     from_client: bool = True,
                                     epoch_fence: bool = False) -> EndTxnResult:
        """Kafka's ``endTransaction`` (``endTransactionWithTV1`` below transaction version
        2): decide the transaction (Prepare* in the log), answer, then send the markers.
        ``epoch_fence``: the coordinator's own abort of an Ongoing transaction, whose epoch
        it bumps to fence the producer."""
        state = self._existing_state(transactional_id)
        if isinstance(state, ErrorCode):
            return EndTxnResult(state)
        metadata = state.metadata
        arrived = _EndTxnRequest(transactional_id, producer_id, producer_epoch, commit,
                                 client_transaction_version, metadata.state,
                                 metadata.producer_epoch)
        tv2 = supports_epoch_bump(client_transaction_version)
        if tv2:
            decided = await self._prepare_end_tv2(metadata, producer_id, producer_epoch,
                                                  commit, from_client, epoch_fence)
        else:
            decided = self._prepare_end_tv1(metadata, producer_id, producer_epoch, commit,
                                            from_client)
        if isinstance(decided, EndTxnResult):
            outcome = _ANSWERED.get(decided.error)
            if outcome is not None:
                self._emit_end_txn(arrived, outcome)
            return decided
        written = await _append(self.state_manager, transactional_id, state.coordinator_epoch,
                                decided)
        if written != ErrorCode.none:
            if epoch_fence and not tv2:
                # Under version 2 the fence is not in memory: a retry bumps from the same
                # epoch again (Kafka sets hasFailedEpochFence only for version 1).
                metadata.has_failed_epoch_fence = True
            return EndTxnResult(written)
        log.info("%s %s the transaction of %s (producer %d epoch %d, %d partitions, "
                 "transaction version %d)",
                 "The producer" if from_client else "The coordinator",
                 "commits" if commit else "aborts", transactional_id, metadata.producer_id,
                 metadata.producer_epoch, len(metadata.partitions), client_transaction_version)
        self._emit_end_txn(arrived, EndTxnOutcome.DECIDED if from_client
                           else EndTxnOutcome.TIMED_OUT, metadata.partitions)
        current = self.state_manager.get_transaction_state(transactional_id)
        if not (isinstance(current, CoordinatorEpochAndTxnMetadata)
                and current.coordinator_epoch == state.coordinator_epoch
                and current.metadata is metadata and metadata.state is decided.state):
            return EndTxnResult(ErrorCode.not_coordinator)
        complete = metadata.prepare_complete(self.state_manager.now_ms())
        self.markers.add_txn_markers_to_send(
            state.coordinator_epoch,
            ControlRecordType.COMMIT if commit else ControlRecordType.ABORT, metadata,
            complete)
        if tv2:
            return EndTxnResult(ErrorCode.none, complete.producer_id, complete.producer_epoch)
        return EndTxnResult(ErrorCode.none)

    def _prepare_end_tv1(self, metadata: TransactionMetadata, producer_id: int,
                         producer_epoch: int, commit: bool, from_client: bool
                         ) -> TxnTransitMetadata | EndTxnResult:
        """``endTransactionWithTV1``'s checks: the epoch is the current one (a client's
        request) or newer (the coordinator's fence); a retry of an end already decided the
        same way is answered NONE, or CONCURRENT_TRANSACTIONS while its markers are still
        going out; the other decision, or EndTxn with nothing open, INVALID_TXN_STATE."""
        if metadata.producer_id != producer_id:
            return EndTxnResult(ErrorCode.invalid_producer_id_mapping)
        if (from_client and producer_epoch != metadata.producer_epoch) \
                or producer_epoch < metadata.producer_epoch:
            return self._fenced(metadata, producer_epoch, commit, 0)
        if metadata.pending_transition_in_progress:
            return EndTxnResult(ErrorCode.concurrent_transactions)
        state = metadata.state
        if state is TransactionState.ONGOING:
            return metadata.prepare_abort_or_commit(
                TransactionState.PREPARE_COMMIT if commit else TransactionState.PREPARE_ABORT,
                self.state_manager.now_ms(), client_transaction_version=0)
        same_way = {TransactionState.COMPLETE_COMMIT: (commit, ErrorCode.none),
                    TransactionState.COMPLETE_ABORT: (not commit, ErrorCode.none),
                    TransactionState.PREPARE_COMMIT: (commit,
                                                      ErrorCode.concurrent_transactions),
                    TransactionState.PREPARE_ABORT: (not commit,
                                                     ErrorCode.concurrent_transactions)}
        if state in same_way and same_way[state][0]:
            return EndTxnResult(same_way[state][1])
        return self._invalid_state(metadata, commit)

    async def _prepare_end_tv2(self, metadata: TransactionMetadata, producer_id: int,
                               producer_epoch: int, commit: bool, from_client: bool,
                               epoch_fence: bool) -> TxnTransitMetadata | EndTxnResult:
        """``endTransaction``'s checks under transaction version 2, where the epoch alone
        tells a retry from the next transaction's end: a retry names the epoch before the
        bump its first attempt made (or, over an exhausted epoch, the last epoch of the
        previous producer id). Empty, CompleteAbort and CompleteCommit take a new abort
        with the current epoch (no partition joined); a retry after the decision is
        complete gets NONE with the producer id and epoch to use, and the other decision
        INVALID_TXN_STATE."""
        state = metadata.state
        retry_on_overflow = (not epoch_fence and metadata.last_producer_id == producer_id
                             and producer_epoch == MAX_EPOCH - 1
                             and metadata.producer_epoch == 0)
        retry_on_epoch_bump = not epoch_fence and metadata.producer_epoch == producer_epoch + 1
        if epoch_fence:
            valid_epoch = ((not from_client or producer_epoch == metadata.producer_epoch)
                           and producer_epoch >= metadata.producer_epoch)
        elif state in (TransactionState.PREPARE_COMMIT, TransactionState.PREPARE_ABORT):
            valid_epoch = retry_on_epoch_bump
        elif state in (TransactionState.COMPLETE_COMMIT, TransactionState.COMPLETE_ABORT):
            valid_epoch = (retry_on_epoch_bump or retry_on_overflow
                           or producer_epoch == metadata.producer_epoch)
        else:
            valid_epoch = producer_epoch == metadata.producer_epoch
        is_retry = retry_on_epoch_bump or retry_on_overflow
        if metadata.pending_transition_in_progress:
            return EndTxnResult(ErrorCode.concurrent_transactions)
        if metadata.producer_id != producer_id and not retry_on_overflow:
            return EndTxnResult(ErrorCode.invalid_producer_id_mapping)
        if not valid_epoch:
            return self._fenced(metadata, producer_epoch, commit, TV_2)
        decision = TransactionState.PREPARE_COMMIT if commit else TransactionState.PREPARE_ABORT
        if state is TransactionState.ONGOING:
            return await self._decide_tv2(metadata, decision, epoch_fence, no_partition=False)
        if state in (TransactionState.COMPLETE_COMMIT, TransactionState.COMPLETE_ABORT):
            same_way = commit == (state is TransactionState.COMPLETE_COMMIT)
            if same_way and is_retry:
                return EndTxnResult(ErrorCode.none, metadata.producer_id,
                                    metadata.producer_epoch)
            if not commit and not is_retry:
                return await self._decide_tv2(metadata, decision, epoch_fence,
                                              no_partition=True)
            return self._invalid_state(metadata, commit)
        if state in (TransactionState.PREPARE_COMMIT, TransactionState.PREPARE_ABORT):
            if commit == (state is TransactionState.PREPARE_COMMIT):
                return EndTxnResult(ErrorCode.concurrent_transactions)
            return self._invalid_state(metadata, commit)
        if state is TransactionState.EMPTY and not commit:
            return await self._decide_tv2(metadata, decision, epoch_fence, no_partition=True)
        return self._invalid_state(metadata, commit)

    async def _decide_tv2(self, metadata: TransactionMetadata, decision: TransactionState,
                          epoch_fence: bool, *, no_partition: bool
                          ) -> TxnTransitMetadata | EndTxnResult:
        """``generateTxnTransitMetadataForTxnCompletion``: an exhausted epoch gets the next
        producer id, taken at completion, also when the coordinator aborts with a fenced
        epoch (Kafka 4.3, KAFKA-20090: 4.2 skipped it there, so a transaction timed out at
        epoch 32766 completed at 32767 and the next decision had no epoch left)."""
        next_producer_id = NO_PRODUCER_ID
        if metadata.is_producer_epoch_exhausted:
            try:
                next_producer_id = await self._generate_producer_id()
            except ProducerIdAllocationError:
                return EndTxnResult(ErrorCode.coordinator_load_in_progress)
            if metadata.pending_transition_in_progress:  # another prepared meanwhile
                return EndTxnResult(ErrorCode.concurrent_transactions)
        return metadata.prepare_abort_or_commit(
            decision, self.state_manager.now_ms(), client_transaction_version=TV_2,
            next_producer_id=next_producer_id, no_partition_added=no_partition)

    def _emit_end_txn(self, request: _EndTxnRequest, outcome: EndTxnOutcome,
                      partitions: Collection[TopicPartition] = ()) -> None:
        """The ``end_txn`` event: what the coordinator made of one EndTxn (or of its own
        abort), with the transaction's state and epoch when it arrived, so that a harness
        can tell which of the client's transactions the request ended."""
        decision = "commit" if request.commit else "abort"
        self._events.emit(
            EventType.END_TXN, transactional_id=request.transactional_id,
            producer_id=request.producer_id, producer_epoch=request.producer_epoch,
            decision=decision, reason=outcome, txn_state=request.state.state_name,
            txn_epoch=request.epoch, transaction_version=request.transaction_version,
            txn_partitions=sorted(f"{tp.topic}-{tp.partition}" for tp in partitions) or None,
            detail=f"EndTxn ({decision}) of {request.transactional_id} with producer id "
                   f"{request.producer_id} epoch {request.producer_epoch}: {outcome} (the id "
                   f"was at epoch {request.epoch}, {request.state.state_name}; transaction "
                   f"version {request.transaction_version})")

    @staticmethod
    def _fenced(metadata: TransactionMetadata, producer_epoch: int, commit: bool,
                client_transaction_version: int) -> EndTxnResult:
        """PRODUCER_FENCED, said in the log: a late EndTxn of an earlier transaction (under
        version 2) or of a fenced instance lands here."""
        log.info("EndTxn (%s) of %s with producer epoch %d fenced: the id is at epoch %d, "
                 "%s (transaction version %d)", "commit" if commit else "abort",
                 metadata.transactional_id, producer_epoch, metadata.producer_epoch,
                 metadata.state.state_name, client_transaction_version)
        return EndTxnResult(ErrorCode.producer_fenced)

    @staticmethod
    def _invalid_state(metadata: TransactionMetadata, commit: bool) -> EndTxnResult:
        log.info("EndTxn (%s) of %s in state %s: INVALID_TXN_STATE",
                 "commit" if commit else "abort", metadata.transactional_id,
                 metadata.state.state_name)
        return EndTxnResult(ErrorCode.invalid_txn_state)

    # ---- the coordinator's own aborts -------------------------------------------------------

    def abort_timed_out_transactions(self) -> None:
        """Kafka's ``abortTimedOutTransactions``: every Ongoing transaction open longer than
        its ``transaction.timeout.ms`` is aborted with a fenced producer epoch, so the
        producer that let it hang cannot add to it or commit it."""
        now = self.state_manager.now_ms()
        for metadata in self.state_manager.timed_out_transactions(now):
            log.info("Aborting %s: open for %d ms, its timeout is %d ms",
                     metadata.transactional_id, now - metadata.txn_start_timestamp,
                     metadata.txn_timeout_ms)
            self._spawn(self._abort_quietly(metadata), f"abort-{metadata.transactional_id}")

    async def _abort_quietly(self, metadata: TransactionMetadata) -> None:
        error = await self._abort_with_fenced_epoch(metadata)
        if error != ErrorCode.none:
            log.info("Aborting %s failed (%s); the next check tries again",
                     metadata.transactional_id, error.name)

    async def _abort_with_fenced_epoch(self, metadata: TransactionMetadata) -> ErrorCode:
        """Bump the epoch (fencing the producer) and abort the Ongoing transaction, under
        the cluster's transaction version (Kafka's ``prepareFenceProducerEpoch``, then
        ``endTransaction`` with ``isFromClient = false``). Version 1 bumps the epoch in
        memory at once; version 2's decision bumps it as any version 2 decision does. The
        largest epoch is not bumped: the abort goes through at it (Kafka 4.3's
        ``prepareFenceProducerEpoch``, KAFKA-20090; 4.2 refused it)."""
        if metadata.pending_transition_in_progress:
            return ErrorCode.concurrent_transactions
        server_version = self.state_manager.transaction_version
        if supports_epoch_bump(server_version):
            fenced_epoch = min(metadata.producer_epoch + 1, MAX_EPOCH)
        else:
            metadata.fence_producer_epoch()
            fenced_epoch = metadata.producer_epoch
        result = await self.handle_end_transaction(
            metadata.transactional_id, metadata.producer_id, fenced_epoch, commit=False,
            client_transaction_version=server_version, from_client=False, epoch_fence=True)
        return result.error

    # ---- DescribeTransactions -------------------------------------------------------------

    def handle_describe_transactions(self, transactional_id: str
                                     ) -> ErrorCode | TransactionMetadata:
        """Kafka's ``handleDescribeTransactions``: the id's metadata, or why not (not this
        broker's, loading, or unknown: TRANSACTIONAL_ID_NOT_FOUND, also for a Dead one)."""
        state = self.state_manager.get_transaction_state(transactional_id)
        if isinstance(state, ErrorCode):
            return state
        if state is None or state.metadata.state is TransactionState.DEAD:
            return ErrorCode.transactional_id_not_found
        return state.metadata

    # ---- InitProducerId -------------------------------------------------------------------

    async def handle_init_producer_id(self, transactional_id: str, txn_timeout_ms: int,
                                      expected: tuple[int, int] | None
                                      ) -> InitProducerIdResult:
        """Kafka's ``handleInitProducerId`` for a non-null transactional id; ``expected``:
        the (producer id, epoch) the producer has, when it recovers (KIP-360, v3+)."""
        manager = self.state_manager
        if not transactional_id:
            return InitProducerIdResult(ErrorCode.invalid_request)
        if not manager.validate_transaction_timeout(txn_timeout_ms):
            return InitProducerIdResult(ErrorCode.invalid_transaction_timeout)
        state = manager.get_transaction_state(transactional_id)
        if state is None:
            try:
                producer_id = await self._generate_producer_id()
            except ProducerIdAllocationError as exc:
                log.warning("InitProducerId %s: no producer id block (%s)", transactional_id,
                            exc)
                return InitProducerIdResult(ErrorCode.coordinator_load_in_progress)
            state = manager.put_transaction_state_if_not_exists(TransactionMetadata(
                transactional_id, producer_id, producer_epoch=NO_PRODUCER_EPOCH,
                txn_timeout_ms=txn_timeout_ms, state=TransactionState.EMPTY,
                update_timestamp=manager.now_ms()))
        if not isinstance(state, CoordinatorEpochAndTxnMetadata):
            return InitProducerIdResult(state)
        prepared = await self._prepare_init_producer_id(transactional_id, txn_timeout_ms,
                                                        state.metadata, expected)
        if isinstance(prepared, ErrorCode):
            return InitProducerIdResult(prepared)
        written = await _append(manager, transactional_id, state.coordinator_epoch, prepared)
        if written != ErrorCode.none:
            log.info("InitProducerId %s: %s", transactional_id, written.name)
            return InitProducerIdResult(written)
        log.info("Initialized transactional id %s with producer id %d and epoch %d on %s-%d",
                 transactional_id, prepared.producer_id, prepared.producer_epoch,
                 TRANSACTION_STATE_TOPIC, manager.partition_for(transactional_id))
        return InitProducerIdResult(ErrorCode.none, prepared.producer_id,
                                    prepared.producer_epoch)

    async def _prepare_init_producer_id(self, transactional_id: str, txn_timeout_ms: int,
                                        metadata: TransactionMetadata,
                                        expected: tuple[int, int] | None
                                        ) -> TxnTransitMetadata | ErrorCode:
        """Kafka's ``prepareInitProducerIdTransit``."""
        if metadata.pending_transition_in_progress:
            return ErrorCode.concurrent_transactions
        if expected is not None and not (
                metadata.producer_epoch == NO_PRODUCER_EPOCH
                or expected[0] == metadata.producer_id
                or (expected[0] == metadata.last_producer_id
                    and is_epoch_exhausted(expected[1]))):
            return ErrorCode.producer_fenced
        if metadata.state in (TransactionState.PREPARE_ABORT, TransactionState.PREPARE_COMMIT):
            return ErrorCode.concurrent_transactions
        if metadata.state is TransactionState.ONGOING:
            # Kafka: abort the open transaction with a fenced epoch (never given to anyone),
            # then CONCURRENT_TRANSACTIONS, so the producer retries and bumps it again.
            aborted = await self._abort_with_fenced_epoch(metadata)
            return aborted if aborted != ErrorCode.none else ErrorCode.concurrent_transactions
        if metadata.state not in (TransactionState.EMPTY, TransactionState.COMPLETE_COMMIT,
                                  TransactionState.COMPLETE_ABORT):
            raise TransitionError(f"{transactional_id} is {metadata.state.state_name}: a "
                                  f"state InitProducerId never finds")
        now = self.state_manager.now_ms()
        try:
            if metadata.is_producer_epoch_exhausted and (
                    expected is None or expected[1] == metadata.producer_epoch):
                producer_id = await self._generate_producer_id()
                if metadata.pending_transition_in_progress:  # another prepared meanwhile
                    return ErrorCode.concurrent_transactions
                return metadata.prepare_producer_id_rotation(producer_id, txn_timeout_ms, now,
                                                             expected is not None)
            return metadata.prepare_increment_producer_epoch(
                txn_timeout_ms, None if expected is None else expected[1], now)
        except ProducerIdAllocationError:
            return ErrorCode.coordinator_load_in_progress
        except TransitionError as exc:
            if exc.fenced:
                return ErrorCode.producer_fenced
            raise


async def _append(manager: TransactionStateManager, transactional_id: str,
                  coordinator_epoch: int, transit: TxnTransitMetadata) -> ErrorCode:
    """``append_transaction_to_log``, awaited: the write's error as the client sees it."""
    written: asyncio.Future[ErrorCode] = asyncio.get_running_loop().create_future()

    def done(error: ErrorCode) -> None:
        if not written.done():  # the request may be gone (cancelled) by then
            written.set_result(error)

    manager.append_transaction_to_log(transactional_id, coordinator_epoch, transit, done)
    return await written
