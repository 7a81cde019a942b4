"""The transaction coordinator's APIs, as Kafka 4.2's ``KafkaApis`` handles them: so far
InitProducerId, for idempotent and transactional producers alike.

A request without a transactional id gets a fresh producer id at epoch 0 from any broker
(also when it names its current id and epoch, a KIP-360 bump, v3+; naming only one of the
two is INVALID_REQUEST). One with a transactional id goes to the ``TransactionCoordinator``,
which answers NOT_COORDINATOR unless this broker leads the id's ``__transaction_state``
partition. The transaction APIs themselves (AddPartitionsToTxn, AddOffsetsToTxn, EndTxn,
TxnOffsetCommit, WriteTxnMarkers) are not served yet: ApiVersions leaves them out, so a
client sees that this broker cannot run transactions, rather than a retry loop.
"""

from __future__ import annotations

from typing import Protocol

from kio.static.protocol import ResponsePayload

from minibroker.cluster.types import ErrorCode
from minibroker.coordinator.transaction_coordinator import (
    InitProducerIdResult,
    TransactionCoordinator,
)
from minibroker.coordinator.transaction_metadata import NO_PRODUCER_EPOCH, NO_PRODUCER_ID
from minibroker.network.codec import ApiKey, Request
from minibroker.network.responses import NO_THROTTLE, response_module

__all__ = ["TxnApis", "TxnBroker"]


class TxnBroker(Protocol):
    """What TxnApis needs of the broker: its transaction coordinator and its producer ids."""

    txn_coordinator: TransactionCoordinator

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
            error_code=result.error,
            producer_id=result.producer_id,
            producer_epoch=result.producer_epoch,
        )
