"""Asking a transaction's coordinator whether a partition is in it, or adding it: Kafka
4.2's ``AddPartitionsToTxnManager`` (KIP-890), as a leader uses it before it appends a
client's first transactional batch of a transaction.

The coordinator is the leader of the transactional id's ``__transaction_state`` partition,
read from this broker's metadata; the request is AddPartitionsToTxn v5, with
``verify_only`` unless the client's request adds partitions itself (transaction version
2), over a connection kept per coordinator broker. The answers are mapped as Kafka maps
them: PRODUCER_FENCED becomes INVALID_PRODUCER_EPOCH, TRANSACTION_ABORTABLE becomes
INVALID_TXN_STATE for a client that predates it (``DEFAULT_ERROR``), a lost connection
NETWORK_EXCEPTION (which the produce path, like every coordinator error, turns into the
retriable NOT_ENOUGH_REPLICAS).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from kio.schema.add_partitions_to_txn.v5 import request as add_req
from kio.static.primitive import i16, i32, i64

from minibroker.cluster.types import ErrorCode, TopicPartition
from minibroker.network.client import KafkaClientError, KafkaConnection
from minibroker.network.txn_verification import TransactionSupportedOperation

__all__ = ["AddPartitionsToTxnManager"]

_VERIFY_TIMEOUT_S = 30.0  # Kafka's request.timeout.ms for its inter-broker sends


class AddPartitionsToTxnManager:
    def __init__(self, broker_id: int, *, coordinator_for: Callable[[str], int | None],
                 address_of: Callable[[int], tuple[str, int] | None]) -> None:
        self._broker_id = broker_id
        self._coordinator_for = coordinator_for
        self._address_of = address_of
        self._connections: dict[int, KafkaConnection] = {}

    async def verify_transaction(self, transactional_id: str, producer_id: int,
                                 producer_epoch: int, partitions: Iterable[TopicPartition],
                                 operation: TransactionSupportedOperation
                                 ) -> dict[TopicPartition, ErrorCode]:
        """Each partition's answer: NONE when it is in the producer's ongoing transaction
        (``addOrVerifyTransaction``), once the coordinator added it if ``operation`` adds."""
        tps = sorted(set(partitions))
        coordinator = self._coordinator_for(transactional_id)
        address = None if coordinator is None else self._address_of(coordinator)
        if coordinator is None or address is None:
            return dict.fromkeys(tps, ErrorCode.coordinator_not_available)
        topics = sorted({tp.topic for tp in tps})
        request = add_req.AddPartitionsToTxnRequest(transactions=(
            add_req.AddPartitionsToTxnTransaction(
                transactional_id=transactional_id, producer_id=i64(producer_id),
                producer_epoch=i16(producer_epoch),
                verify_only=not operation.supports_epoch_bump,
                topics=tuple(add_req.AddPartitionsToTxnTopic(
                    name=topic, partitions=tuple(i32(tp.partition) for tp in tps
                                                 if tp.topic == topic))
                    for topic in topics)),))
        try:
            conn = self._connections.get(coordinator)
            if conn is None or conn.closed:
                conn = self._connections[coordinator] = await KafkaConnection.connect(
                    *address, client_id=f"broker-{self._broker_id}-txn-verification")
            response = await conn.request(request, timeout=_VERIFY_TIMEOUT_S)
        except (KafkaClientError, OSError):
            return dict.fromkeys(tps, ErrorCode.network_exception)
        if response.error_code != ErrorCode.none:
            error = (ErrorCode.invalid_txn_state
                     if response.error_code == ErrorCode.cluster_authorization_failed
                     else ErrorCode(response.error_code))
            return dict.fromkeys(tps, error)
        answers = dict.fromkeys(tps, ErrorCode.none)
        for result in response.results_by_transaction:
            for topic in result.topic_results:
                for part in topic.results_by_partition:
                    tp = TopicPartition(topic.name, part.partition_index)
                    code = ErrorCode(part.partition_error_code)
                    if code == ErrorCode.producer_fenced:
                        code = ErrorCode.invalid_producer_epoch
                    elif (code == ErrorCode.transaction_abortable
                          and operation is TransactionSupportedOperation.DEFAULT_ERROR):
                        code = ErrorCode.invalid_txn_state
                    if tp in answers:
                        answers[tp] = code
        return answers

    def shutdown(self) -> None:
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()
