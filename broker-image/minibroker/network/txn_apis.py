"""The transaction coordinator's APIs, as Kafka 4.2's ``KafkaApis`` handles them: so far
InitProducerId, for idempotent and transactional producers alike, and the admin's
DescribeTransactions and ListTransactions (KIP-664, ``kafka-transactions.sh``).

A request without a transactional id gets a fresh producer id at epoch 0 from any broker
(also when it names its current id and epoch, a KIP-360 bump, v3+; naming only one of the
two is INVALID_REQUEST). One with a transactional id goes to the ``TransactionCoordinator``,
which answers NOT_COORDINATOR unless this broker leads the id's ``__transaction_state``
partition. AddPartitionsToTxn (v0-3 from producers, one transaction; v4+ batched, from
brokers, where ``verify_only`` asks KIP-890 part 1's question without changing anything),
AddOffsetsToTxn (the group's offsets partition joins the transaction) and EndTxn go to the
same coordinator. The markers the coordinator sends to partition
leaders (WriteTxnMarkers) are the replicas' API (``replica_apis``).

The client's transaction version is its request's (Kafka 4.2's ``TransactionVersion``):
EndTxn v5+ and AddPartitionsToTxn v4+ run under version 2, older ones under version 0.
Requests older than v2 get INVALID_PRODUCER_EPOCH where Kafka would say PRODUCER_FENCED,
an error they predate.
"""

from __future__ import annotations

import datetime
from typing import Any, Protocol

from kio.static.protocol import ResponsePayload

from minibroker.cluster.types import ErrorCode, MetadataImage, TopicPartition
from minibroker.coordinator.group_coordinator import GroupCoordinator
from minibroker.coordinator.group_metadata_manager import OFFSETS_TOPIC
from minibroker.coordinator.transaction_coordinator import (
    InitProducerIdResult,
    TransactionCoordinator,
)
from minibroker.coordinator.transaction_metadata import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, TV_2
from minibroker.network.codec import ApiKey, Request
from minibroker.network.responses import NO_THROTTLE, build, response_module

__all__ = ["TxnApis", "TxnBroker"]


class TxnBroker(Protocol):
    """What TxnApis needs of the broker: its transaction coordinator and its producer ids."""

    txn_coordinator: TransactionCoordinator
    group_coordinator: GroupCoordinator

    def metadata_image(self) -> MetadataImage: ...

    async def init_producer_id(self) -> tuple[ErrorCode, int]:
        """(error, producer id): an id no producer was given before, on any broker."""
        ...


class TxnApis:
    def __init__(self, broker: TxnBroker) -> None:
        self._broker = broker

    async def handle_init_producer_id(self, request: Request) -> ResponsePayload:
        body = request.body
        m = response_module(ApiKey.INIT_PRODUCER_ID, request.api_version)
        producer_id = getattr(body, "producer_id", NO_PRODUCER_ID)
        producer_epoch = getattr(body, "producer_epoch", NO_PRODUCER_EPOCH)
        names_id, names_epoch = producer_id != NO_PRODUCER_ID, producer_epoch != NO_PRODUCER_EPOCH
        if names_id != names_epoch:
            result = InitProducerIdResult(ErrorCode.invalid_request)
        elif body.transactional_id is None:
            error, new_id = await self._broker.init_producer_id()
            result = InitProducerIdResult(error, new_id, 0 if error == ErrorCode.none
                                          else NO_PRODUCER_EPOCH)
        else:
            result = await self._broker.txn_coordinator.handle_init_producer_id(
                body.transactional_id,
                int(body.transaction_timeout.total_seconds() * 1000),
                (producer_id, producer_epoch) if names_id else None)
        return m.InitProducerIdResponse(
            throttle_time=NO_THROTTLE,
            # v4 is the first that knows PRODUCER_FENCED (Kafka's handleInitProducerIdRequest)
            error_code=result.error if request.api_version >= 4
            else _fenced_as_old_clients_know_it(result.error),
            producer_id=result.producer_id,
            producer_epoch=result.producer_epoch,
        )

    async def handle_add_partitions_to_txn(self, request: Request) -> ResponsePayload:
        """Kafka's ``handleAddPartitionsToTxnRequest``: a partition the metadata lacks is
        UNKNOWN_TOPIC_OR_PARTITION and the others OPERATION_NOT_ATTEMPTED, without asking the
        coordinator; otherwise every partition gets the coordinator's one answer (v0-3), or
        each its own (``verify_only``, v4+)."""
        body = request.body
        m = response_module(ApiKey.ADD_PARTITIONS_TO_TXN, request.api_version)
        if request.api_version <= 3:
            results = await self._add_partitions(
                body.v3_and_below_transactional_id, body.v3_and_below_producer_id,
                body.v3_and_below_producer_epoch, body.v3_and_below_topics, verify_only=False,
                client_transaction_version=0)
            if request.api_version < 2:
                results = {tp: _fenced_as_old_clients_know_it(error)
                           for tp, error in results.items()}
            return m.AddPartitionsToTxnResponse(
                throttle_time=NO_THROTTLE,
                results_by_topic_v3_and_below=_topic_results(m, results))
        answers = []
        for txn in body.transactions:
            results = await self._add_partitions(txn.transactional_id, txn.producer_id,
                                                 txn.producer_epoch, txn.topics,
                                                 verify_only=txn.verify_only,
                                                 client_transaction_version=TV_2)
            answers.append(m.AddPartitionsToTxnResult(
                transactional_id=txn.transactional_id,
                topic_results=_topic_results(m, results)))
        return m.AddPartitionsToTxnResponse(throttle_time=NO_THROTTLE,
                                            error_code=ErrorCode.none,
                                            results_by_transaction=tuple(answers))

    async def _add_partitions(self, transactional_id: str, producer_id: int,
                              producer_epoch: int, topics: Any, *, verify_only: bool,
                              client_transaction_version: int
                              ) -> dict[TopicPartition, ErrorCode]:
        image = self._broker.metadata_image()
        wanted = [TopicPartition(topic.name, index) for topic in topics
                  for index in topic.partitions]
        unknown = {tp for tp in wanted if tp.topic not in image.topics
                   or tp.partition not in image.topics[tp.topic].partitions}
        if unknown:
            return {tp: ErrorCode.unknown_topic_or_partition if tp in unknown
                    else ErrorCode.operation_not_attempted for tp in wanted}
        coordinator = self._broker.txn_coordinator
        if verify_only:
            return coordinator.verify_partitions_in_transaction(
                transactional_id, producer_id, producer_epoch, frozenset(wanted))
        error = await coordinator.handle_add_partitions_to_transaction(
            transactional_id, producer_id, producer_epoch, frozenset(wanted),
            client_transaction_version)
        return dict.fromkeys(wanted, error)

    async def handle_add_offsets_to_txn(self, request: Request) -> ResponsePayload:
        """Kafka's ``handleAddOffsetsToTxnRequest``: the group's ``__consumer_offsets``
        partition joins the transaction, so that its marker ends the offsets the producer
        commits next with TxnOffsetCommit."""
        body = request.body
        m = response_module(ApiKey.ADD_OFFSETS_TO_TXN, request.api_version)
        offsets_tp = TopicPartition(
            OFFSETS_TOPIC, self._broker.group_coordinator.manager.partition_for(body.group_id))
        # Always a client below transaction version 2: a client on version 2 lets
        # TxnOffsetCommit v5 add the partition.
        error = await self._broker.txn_coordinator.handle_add_partitions_to_transaction(
            body.transactional_id, body.producer_id, body.producer_epoch,
            frozenset({offsets_tp}), client_transaction_version=0)
        if request.api_version < 2:
            error = _fenced_as_old_clients_know_it(error)
        return m.AddOffsetsToTxnResponse(throttle_time=NO_THROTTLE, error_code=error)

    async def handle_end_txn(self, request: Request) -> ResponsePayload:
        """Kafka's ``handleEndTxnRequest``: v5+ is transaction version 2, whose answer
        carries the producer id and epoch of the next transaction."""
        body = request.body
        m = response_module(ApiKey.END_TXN, request.api_version)
        result = await self._broker.txn_coordinator.handle_end_transaction(
            body.transactional_id, body.producer_id, body.producer_epoch, body.committed,
            client_transaction_version=TV_2 if request.api_version > 4 else 0)
        error = result.error
        if request.api_version < 2:
            error = _fenced_as_old_clients_know_it(error)
        return build(m.EndTxnResponse, throttle_time=NO_THROTTLE, error_code=error,
                     producer_id=result.producer_id, producer_epoch=result.producer_epoch)

    async def handle_describe_transactions(self, request: Request) -> ResponsePayload:
        """Each id is answered by this broker only if it coordinates it (NOT_COORDINATOR
        otherwise: the admin client asks each id's coordinator)."""
        m = response_module(ApiKey.DESCRIBE_TRANSACTIONS, request.api_version)
        coordinator = self._broker.txn_coordinator
        states = []
        for transactional_id in request.body.transactional_ids:
            found = coordinator.handle_describe_transactions(transactional_id)
            if isinstance(found, ErrorCode):
                states.append(m.TransactionState(
                    error_code=found, transactional_id=transactional_id, transaction_state="",
                    transaction_timeout=datetime.timedelta(0), transaction_start_time=_ms(-1),
                    producer_id=NO_PRODUCER_ID, producer_epoch=NO_PRODUCER_EPOCH, topics=()))
                continue
            by_topic: dict[str, list[int]] = {}
            for tp in sorted(found.partitions):
                by_topic.setdefault(tp.topic, []).append(tp.partition)
            states.append(m.TransactionState(
                error_code=ErrorCode.none, transactional_id=transactional_id,
                transaction_state=found.state.state_name,
                transaction_timeout=datetime.timedelta(milliseconds=found.txn_timeout_ms),
                transaction_start_time=_ms(found.txn_start_timestamp),
                producer_id=found.producer_id, producer_epoch=found.producer_epoch,
                topics=tuple(m.TopicData(topic=topic, partitions=tuple(ids))
                             for topic, ids in by_topic.items())))
        return m.DescribeTransactionsResponse(throttle_time=NO_THROTTLE,
                                              transaction_states=tuple(states))

    async def handle_list_transactions(self, request: Request) -> ResponsePayload:
        body = request.body
        m = response_module(ApiKey.LIST_TRANSACTIONS, request.api_version)
        error, unknown, found = self._broker.txn_coordinator.state_manager.\
            list_transaction_states(set(body.producer_id_filters), set(body.state_filters),
                                    getattr(body, "duration_filter", -1))
        return build(m.ListTransactionsResponse, throttle_time=NO_THROTTLE, error_code=error,
                     unknown_state_filters=tuple(unknown),
                     transaction_states=tuple(
                         m.TransactionState(transactional_id=t.transactional_id,
                                            producer_id=t.producer_id,
                                            transaction_state=t.state.state_name)
                         for t in found))


def _fenced_as_old_clients_know_it(error: ErrorCode) -> ErrorCode:
    """PRODUCER_FENCED is INVALID_PRODUCER_EPOCH to a request that predates it (Kafka's
    ``handleEndTxnRequest``, ``handleAddPartitionsToTxnRequest`` and
    ``handleAddOffsetsToTxnRequest`` below v2, ``handleInitProducerIdRequest`` below v4)."""
    return ErrorCode.invalid_producer_epoch if error == ErrorCode.producer_fenced else error


def _topic_results(m: Any, results: dict[TopicPartition, ErrorCode]) -> tuple[Any, ...]:
    by_topic: dict[str, list[Any]] = {}
    for tp, error in results.items():
        by_topic.setdefault(tp.topic, []).append(m.AddPartitionsToTxnPartitionResult(
            partition_index=tp.partition, partition_error_code=error))
    return tuple(m.AddPartitionsToTxnTopicResult(name=topic, results_by_partition=tuple(parts))
                 for topic, parts in by_topic.items())


def _ms(epoch_ms: int) -> datetime.datetime:
    """A timestamp field from Kafka's milliseconds (-1, "none", included)."""
    return datetime.datetime.fromtimestamp(epoch_ms / 1000, datetime.UTC)
