"""FindCoordinator, for both of Kafka's coordinators: a consumer group's (key type 0) and a
transactional id's (key type 1), as Kafka 4.2's ``KafkaApis.handleFindCoordinatorRequest``
answers it.

The coordinator of a key is the leader of its partition of the coordinator's topic
(``__consumer_offsets``, ``__transaction_state``; ``partitioner.partition_for``), read
from the metadata image. While the topic does not exist the answer is
COORDINATOR_NOT_AVAILABLE and the broker asks the controller to create it (Kafka's
``AutoTopicCreationManager`` in KRaft), one creation per topic at a time, with the
topic's configured partition count and replication factor (creation fails, and the
clients keep retrying, while fewer brokers are live than that factor, as in Kafka).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from kio.static.protocol import ResponsePayload

from minibroker.cluster.types import ErrorCode, MetadataImage
from minibroker.config import resolve
from minibroker.coordinator.group_metadata_manager import OFFSETS_TOPIC
from minibroker.coordinator.partitioner import partition_for
from minibroker.coordinator.transaction_state_manager import TRANSACTION_STATE_TOPIC
from minibroker.network.codec import ApiKey, Request
from minibroker.network.kafka_server import LISTENER
from minibroker.network.responses import NO_NODE, NO_THROTTLE, build, response_module

__all__ = ["CoordinatorApis", "CoordinatorBroker"]

log = logging.getLogger("minibroker.network.coordinator_apis")


class CoordinatorBroker(Protocol):
    """What FindCoordinator needs of the broker: its metadata and config, and the
    controller (to create a coordinator's topic)."""

    def metadata_image(self) -> MetadataImage: ...

    def broker_config(self) -> dict[str, str]: ...

    async def create_topic(self, name: str, num_partitions: int, replication_factor: int,
                           config: dict[str, str]) -> tuple[ErrorCode, str | None]: ...


@dataclass(frozen=True)
class CoordinatorTopic:
    """A coordinator's topic and the configs it is created with."""

    name: str
    what: str  # what a key names, for the error messages
    partitions: str
    replication_factor: str
    topic_config: Callable[[dict[str, str]], dict[str, str]]


# FindCoordinator's CoordinatorType (FindCoordinatorRequest.CoordinatorType).
COORDINATOR_TOPICS = {
    0: CoordinatorTopic(OFFSETS_TOPIC, "group", "offsets.topic.num.partitions",
                        "offsets.topic.replication.factor",
                        lambda _config: {"cleanup.policy": "compact"}),
    # TransactionLog's topic configs: compacted, its own min.insync.replicas.
    1: CoordinatorTopic(TRANSACTION_STATE_TOPIC, "transactional id",
                        "transaction.state.log.num.partitions",
                        "transaction.state.log.replication.factor",
                        lambda config: {"cleanup.policy": "compact", "min.insync.replicas":
                                        str(resolve("transaction.state.log.min.isr", config))}),
}


class CoordinatorApis:
    """The FindCoordinator handler, for ``KafkaApis``."""

    def __init__(self, broker: CoordinatorBroker) -> None:
        self._broker = broker
        self._creating: dict[str, asyncio.Task[None]] = {}
        self._creation_failed: set[str] = set()  # warned once; clients retry about every second

    async def handle_find_coordinator(self, request: Request) -> ResponsePayload:
        body, version = request.body, request.api_version
        m = response_module(ApiKey.FIND_COORDINATOR, version)
        key_type = getattr(body, "key_type", 0)
        if version >= 4:  # KIP-699: batched
            return m.FindCoordinatorResponse(
                throttle_time=NO_THROTTLE,
                coordinators=tuple(m.Coordinator(key=key, **self._coordinator_of(key_type, key))
                                   for key in body.coordinator_keys))
        return build(m.FindCoordinatorResponse, throttle_time=NO_THROTTLE,
                     **self._coordinator_of(key_type, body.key))

    def _coordinator_of(self, key_type: int, key: str) -> dict[str, Any]:
        def unavailable(error: ErrorCode, message: str) -> dict[str, Any]:
            return {"node_id": NO_NODE, "host": "", "port": -1, "error_code": error,
                    "error_message": message}

        coordinator = COORDINATOR_TOPICS.get(key_type)
        if coordinator is None:
            return unavailable(ErrorCode.invalid_request, f"unknown key type {key_type}")
        if key_type == 1 and not key:  # Kafka: a transactional id must not be empty
            return unavailable(ErrorCode.invalid_request, "empty transactional id")
        image = self._broker.metadata_image()
        topic = image.topics.get(coordinator.name)
        if topic is None or not topic.partitions:
            self._maybe_create(coordinator)
            return unavailable(ErrorCode.coordinator_not_available,
                               f"{coordinator.name} is being created")
        reg = topic.partitions[partition_for(key, len(topic.partitions))]
        leader = image.brokers.get(reg.leader)
        if leader is None:
            return unavailable(ErrorCode.coordinator_not_available,
                               f"the {coordinator.what}'s partition has no live leader")
        address = leader.address(LISTENER.get())
        if address is None:
            return unavailable(ErrorCode.coordinator_not_available,
                               f"the coordinator has no listener {LISTENER.get()}")
        host, port = address
        return {"node_id": leader.broker_id, "host": host, "port": port,
                "error_code": ErrorCode.none, "error_message": None}

    def _maybe_create(self, coordinator: CoordinatorTopic) -> None:
        creating = self._creating.get(coordinator.name)
        if creating is None or creating.done():
            self._creating[coordinator.name] = asyncio.get_running_loop().create_task(
                self._create(coordinator))

    async def _create(self, coordinator: CoordinatorTopic) -> None:
        config = self._broker.broker_config()
        partitions = resolve(coordinator.partitions, config)
        replication_factor = resolve(coordinator.replication_factor, config)
        error, message = await self._broker.create_topic(
            coordinator.name, partitions, replication_factor, coordinator.topic_config(config))
        if error not in (ErrorCode.none, ErrorCode.topic_already_exists):
            log.log(logging.DEBUG if coordinator.name in self._creation_failed
                    else logging.WARNING,
                    "Creating %s (%d partitions, replication factor %d) failed: %s %s",
                    coordinator.name, partitions, replication_factor, error.name, message)
            self._creation_failed.add(coordinator.name)
