"""KIP-890 before a transactional write: Kafka 4.2's
``ReplicaManager.maybeSendPartitionsToTransactionCoordinator``, for a Produce's partitions
and a TxnOffsetCommit's ``__consumer_offsets`` partition alike. Part 1
(``transaction.partition.verification.enable``) asks whether the partition is in the
transaction; part 2 (transaction version 2: Produce v12+, TxnOffsetCommit v5+, which
always go this way) adds it, as the client no longer sends AddPartitionsToTxn.

Each partition where the producer's transaction is not open yet gets a verification guard
from its leader's producer state and is asked about (``AddPartitionsToTxnManager``);
CONCURRENT_TRANSACTIONS (the coordinator between two states) is asked again every
``VERIFY_BACKOFF_S`` for ``VERIFY_RETRY_S``. The caller appends the rest with the guards
and answers the failed partitions with its own API's error mapping.
"""

from __future__ import annotations

import asyncio
import enum
from typing import Protocol

from minibroker.cluster.errors import KafkaApiError
from minibroker.cluster.types import ErrorCode, TopicPartition
from minibroker.storage.producer_state import VerificationGuard

__all__ = ["RETRIABLE_VERIFICATION_ERRORS", "TransactionSupportedOperation",
           "TransactionVerifier", "verify_transactional_append"]

VERIFY_BACKOFF_S = 0.02  # add.partitions.to.txn.retry.backoff.ms (Kafka's default)
VERIFY_RETRY_S = 0.1  # add.partitions.to.txn.retry.backoff.max.ms (Kafka's default)
RETRIABLE_VERIFICATION_ERRORS = frozenset({
    ErrorCode.network_exception, ErrorCode.coordinator_load_in_progress,
    ErrorCode.coordinator_not_available, ErrorCode.not_coordinator,
    ErrorCode.concurrent_transactions})
"""Coordinator errors a write may be retried after (Kafka turns them into retriable ones)."""


class TransactionSupportedOperation(enum.Enum):
    """Kafka's ``AddPartitionsToTxnManager.TransactionSupportedOperation``: what the client's
    request version lets the broker do and answer."""

    DEFAULT_ERROR = "default"
    """Before KIP-890's errors: a partition outside the transaction is INVALID_TXN_STATE."""
    GENERIC_ERROR_SUPPORTED = "generic"
    """Produce v11, TxnOffsetCommit v4: the client knows TRANSACTION_ABORTABLE."""
    ADD_PARTITION = "add"
    """Produce v12+, TxnOffsetCommit v5+ (transaction version 2): the partition is added."""

    @property
    def supports_epoch_bump(self) -> bool:
        return self is TransactionSupportedOperation.ADD_PARTITION

    @classmethod
    def for_produce(cls, version: int) -> TransactionSupportedOperation:
        """``produceRequestVersionToTransactionSupportedOperation``."""
        return (cls.ADD_PARTITION if version > 11 else cls.GENERIC_ERROR_SUPPORTED
                if version > 10 else cls.DEFAULT_ERROR)

    @classmethod
    def for_txn_offset_commit(cls, version: int) -> TransactionSupportedOperation:
        """``txnOffsetCommitRequestVersionToTransactionSupportedOperation``."""
        return (cls.ADD_PARTITION if version > 4 else cls.GENERIC_ERROR_SUPPORTED
                if version > 3 else cls.DEFAULT_ERROR)


class TransactionVerifier(Protocol):
    """The broker's two halves of a verification: the leader's guard, the coordinator's
    answer."""

    def maybe_start_transaction_verification(
            self, tp: TopicPartition, producer_id: int, producer_epoch: int
    ) -> VerificationGuard | None:
        """The guard to verify (None: the transaction is open here already); raises
        ``KafkaApiError``."""
        ...

    async def verify_transaction(self, transactional_id: str, producer_id: int,
                                 producer_epoch: int, partitions: list[TopicPartition],
                                 operation: TransactionSupportedOperation
                                 ) -> dict[TopicPartition, ErrorCode]:
        """The coordinator's answer for each partition (``AddPartitionsToTxnManager``)."""
        ...


async def verify_transactional_append(
        broker: TransactionVerifier, transactional_id: str, producer_id: int,
        producer_epoch: int, partitions: list[TopicPartition],
        operation: TransactionSupportedOperation
) -> tuple[dict[TopicPartition, VerificationGuard | None], dict[TopicPartition, ErrorCode]]:
    """(the guards to append with, the partitions that failed and why)."""
    guards: dict[TopicPartition, VerificationGuard | None] = {}
    failed: dict[TopicPartition, ErrorCode] = {}
    for tp in partitions:
        try:
            guards[tp] = broker.maybe_start_transaction_verification(tp, producer_id,
                                                                     producer_epoch)
        except KafkaApiError as exc:
            failed[tp] = exc.code
    pending = [tp for tp, guard in guards.items() if guard is not None]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + VERIFY_RETRY_S
    while pending:
        answers = await broker.verify_transaction(transactional_id, producer_id,
                                                  producer_epoch, pending, operation)
        pending = [tp for tp in pending if answers[tp] == ErrorCode.concurrent_transactions
                   and loop.time() < deadline]
        failed.update((tp, error) for tp, error in answers.items()
                      if error != ErrorCode.none and tp not in pending)
        if pending:
            await asyncio.sleep(VERIFY_BACKOFF_S)
    return guards, failed
