"""The transaction coordinator: Kafka 4.2's ``TransactionCoordinator``, transaction version 1.

It answers for the transactional ids of the ``__transaction_state`` partitions this broker
leads (``TransactionStateManager``). So far it initializes producers and describes them:
InitProducerId with a transactional id gives the id its producer id (one from the
controller's blocks, kept for the life of the id) and a producer epoch one above the last,
which fences every instance that initialized before (their requests with the older epoch
get PRODUCER_FENCED); DescribeTransactions and ListTransactions show the ids it
coordinates. The epoch is in ``__transaction_state`` before the producer hears it, so a
coordinator that takes over after a crash continues from it, and a fenced instance stays
fenced.

Not yet: the transaction itself (AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, the markers),
so no transactional id is ever Ongoing or Prepare* here; the branches for those states
answer as Kafka's do.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from minibroker.cluster.partition import Partition
from minibroker.cluster.scheduler import Scheduler
from minibroker.cluster.types import ErrorCode, MetadataImage, TopicPartition
from minibroker.coordinator.group_metadata_manager import AppendRecords, Emit
from minibroker.coordinator.transaction_log import TransactionState
from minibroker.coordinator.transaction_metadata import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    TransactionMetadata,
    TransitionError,
    TxnTransitMetadata,
    is_epoch_exhausted,
)
from minibroker.coordinator.transaction_state_manager import (
    TRANSACTION_STATE_TOPIC,
    CoordinatorEpochAndTxnMetadata,
    TransactionStateManager,
)
from minibroker.producer_id_manager import ProducerIdAllocationError

__all__ = ["InitProducerIdResult", "TransactionCoordinator"]

log = logging.getLogger("minibroker.coordinator.transaction")


@dataclass(frozen=True)
class InitProducerIdResult:
    error: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


class TransactionCoordinator:
    def __init__(self, broker_id: int, scheduler: Scheduler, *, config: Mapping[str, str],
                 append: AppendRecords,
                 local_partition: Callable[[TopicPartition], Partition | None],
                 metadata_image: Callable[[], MetadataImage], events: Emit,
                 generate_producer_id: Callable[[], Awaitable[int]]) -> None:
        self.state_manager = TransactionStateManager(
            broker_id, scheduler, config=config, append=append,
            local_partition=local_partition, metadata_image=metadata_image, events=events)
        self._generate_producer_id = generate_producer_id

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
        """Kafka's ``TransactionCoordinator.startup``: ids expire from now on."""
        self.state_manager.enable_transactional_id_expiration()

    def shutdown(self) -> None:
        self.state_manager.shutdown()

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
        if metadata.state in (TransactionState.PREPARE_ABORT, TransactionState.PREPARE_COMMIT,
                              TransactionState.ONGOING):
            # Ongoing would be fenced by aborting it (PrepareEpochFence), which needs the
            # markers; no transaction gets there before EndTxn exists.
            return ErrorCode.concurrent_transactions
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
