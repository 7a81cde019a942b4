"""The APIs that touch no replica nor group: what a client asks before it produces or
fetches (ApiVersions, Metadata), answered from the metadata image, and what the broker
forwards to the controller (CreateTopics, DescribeTopicPartitions, IncrementalAlterConfigs)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from types import ModuleType
from typing import Any, Protocol

from kio.static.primitive import i16, i64
from kio.static.protocol import ResponsePayload

from minibroker.cluster.types import ErrorCode, MetadataImage, TopicImage
from minibroker.config import resolve
from minibroker.controller.quorum_controller import MAX_PARTITIONS_PER_BATCH
from minibroker.coordinator.group_metadata_manager import OFFSETS_TOPIC
from minibroker.network.codec import (
    CONSUMER_PROTOCOL_APIS,
    SUPPORTED_API_VERSIONS,
    ApiKey,
    Request,
)
from minibroker.network.kafka_server import LISTENER
from minibroker.network.responses import NO_NODE, NO_THROTTLE, build, response_module

TRANSACTION_VERSION_FEATURE = "transaction.version"  # TransactionVersion.FEATURE_NAME
_AUTHORIZED_OPERATIONS_OMITTED = -(2**31)  # Kafka's "not requested" sentinel
_METADATA_BY_ID = 12  # the first Metadata version that looks topics up by id (KIP-516)
_ZERO_UUID = uuid.UUID(int=0)
_NO_PRODUCER_ID = -1
_NO_PRODUCER_EPOCH = -1
DESCRIBE_PARTITIONS_LIMIT = 2000
_TOPIC_RESOURCE = 2  # Kafka's ConfigResource.Type.TOPIC
_SET, _DELETE = 0, 1  # AlterConfigOp.OpType  # Kafka's max.request.partition.size.limit default


class ClusterBroker(Protocol):
    """What ClusterApis needs of the broker: its id, the metadata image, its config (the
    default partition count, which CreateTopics' cap counts) and what it forwards to the
    controller."""

    broker_id: int

    def metadata_image(self) -> MetadataImage: ...

    def broker_config(self) -> dict[str, str]: ...

    async def create_topic(
        self, name: str, num_partitions: int, replication_factor: int, config: dict[str, str]
    ) -> tuple[ErrorCode, str | None]:
        """Forwarded to the controller. -1 partitions or replication factor (CreateTopics
        v4+) ask for the broker's defaults."""
        ...

    async def alter_topic_config(self, name: str, changes: dict[str, str | None],
                                 validate_only: bool) -> tuple[ErrorCode, str | None]:
        """Forwarded to the controller: each key set (a value) or deleted (None)."""
        ...


class ClusterApis:
    """The handlers of the APIs that touch no replica, for ``KafkaApis``."""

    def __init__(self, broker: ClusterBroker) -> None:
        self._broker = broker

    # -- ApiVersions ---------------------------------------------------------------------

    async def handle_api_versions(self, request: Request) -> ResponsePayload:
        if request.api_version > SUPPORTED_API_VERSIONS[ApiKey.API_VERSIONS][1]:
            # The client learns our range from a v0-form answer and retries (KIP-511).
            version, error = 0, ErrorCode.unsupported_version
        else:
            version, error = request.api_version, ErrorCode.none
        m = response_module(ApiKey.API_VERSIONS, version)
        # KIP-848's APIs only while the coordinator speaks the consumer protocol (Kafka's
        # ApiVersionsManager leaves them out without group.coordinator.rebalance.protocols'
        # consumer).
        consumer = "consumer" in resolve("group.coordinator.rebalance.protocols",
                                         self._broker.broker_config())
        api_keys = tuple(
            m.ApiVersion(api_key=key, min_version=lo, max_version=hi)
            for key, (lo, hi) in sorted(SUPPORTED_API_VERSIONS.items())
            if consumer or key not in CONSUMER_PROTOCOL_APIS
        )
        if version < 3:
            return build(m.ApiVersionsResponse, error_code=error, api_keys=api_keys,
                         throttle_time=NO_THROTTLE)
        # The features (KIP-584), as Kafka 4.2's ApiVersionsResponse gives them: a client on
        # transaction version 2 (the Java client's TransactionManager) uses it only while
        # the cluster has it finalized. Below v4 a supported feature whose minimum is 0 is
        # left out (KAFKA-17011); a feature at level 0 is not finalized. The epoch is the
        # metadata offset, which only grows.
        level: int = resolve("transaction.version", self._broker.broker_config())
        supported = () if version < 4 else (m.SupportedFeatureKey(
            name=TRANSACTION_VERSION_FEATURE, min_version=i16(0), max_version=i16(2)),)
        finalized = () if level == 0 else (m.FinalizedFeatureKey(
            name=TRANSACTION_VERSION_FEATURE, max_version_level=i16(level),
            min_version_level=i16(level)),)
        return m.ApiVersionsResponse(
            error_code=error, api_keys=api_keys, throttle_time=NO_THROTTLE,
            supported_features=supported,
            finalized_features_epoch=i64(max(self._broker.metadata_image().metadata_offset, 0)),
            finalized_features=finalized)

    # -- Metadata ------------------------------------------------------------------------

    async def handle_metadata(self, request: Request) -> ResponsePayload:
        body = request.body
        m = response_module(ApiKey.METADATA, request.api_version)
        if request.api_version < _METADATA_BY_ID and body.topics is not None and any(
                t.name is None or getattr(t, "topic_id", None) not in (None, _ZERO_UUID)
                for t in body.topics):
            return self._metadata_invalid_request(m, body.topics)
        image = self._broker.metadata_image()
        listener = LISTENER.get()
        # Kafka's MetadataCache.getAliveBrokerNodes(listenerName): a broker without this
        # listener is left out, so a client keeps to the listener it came in on.
        reachable = {b.broker_id: address for b in image.brokers.values()
                     if (address := b.address(listener)) is not None}
        brokers = tuple(
            m.MetadataResponseBroker(node_id=broker_id, host=host, port=port, rack=None)
            for broker_id, (host, port) in sorted(reachable.items())
        )
        if body.topics is None:
            topics = tuple(self._topic_metadata(m, image, image.topics[name], reachable)
                           for name in sorted(image.topics))
        else:
            # Each topic once, however often named (Kafka's handleTopicMetadataRequest takes
            # the request's topics as a set): the answer's size is bounded by the cluster's
            # topics, not by the request's.
            requested = {(t.name, getattr(t, "topic_id", None)): t for t in body.topics}
            topics = tuple(self._requested_topic_metadata(m, image, t, reachable)
                           for t in requested.values())
        return build(
            m.MetadataResponse,
            throttle_time=NO_THROTTLE,
            brokers=brokers,
            cluster_id=image.cluster_id or None,
            controller_id=self._broker.broker_id,  # KRaft brokers name any broker
            topics=topics,
            cluster_authorized_operations=_AUTHORIZED_OPERATIONS_OMITTED,
        )

    @staticmethod
    def _metadata_invalid_request(m: ModuleType, topics: Any) -> ResponsePayload:
        """Metadata v10 and v11 carry a topic id and a nullable name but serve neither: a
        request naming a topic by id, or not by name, is invalid (Kafka's
        ``handleTopicMetadataRequest``), and is answered as Kafka's
        ``MetadataRequest.getErrorResponse`` answers it: INVALID_REQUEST for each topic, a
        null name given as "" (the response has no null name before v12)."""
        return build(
            m.MetadataResponse, throttle_time=NO_THROTTLE, brokers=(), cluster_id=None,
            controller_id=NO_NODE, cluster_authorized_operations=_AUTHORIZED_OPERATIONS_OMITTED,
            topics=tuple(build(m.MetadataResponseTopic, error_code=ErrorCode.invalid_request,
                               name=t.name or "", topic_id=getattr(t, "topic_id", None),
                               is_internal=False, partitions=(),
                               topic_authorized_operations=_AUTHORIZED_OPERATIONS_OMITTED)
                         for t in topics))

    def _requested_topic_metadata(self, m: ModuleType, image: MetadataImage, req: Any,
                                  reachable: Mapping[int, object]) -> Any:
        name: str | None = req.name
        if name is not None:
            topic, error = image.topics.get(name), ErrorCode.unknown_topic_or_partition
        else:  # v10+ may name a topic by id only
            topic, error = image.topics_by_id.get(req.topic_id), ErrorCode.unknown_topic_id
        if topic is not None:
            return self._topic_metadata(m, image, topic, reachable)
        return build(
            m.MetadataResponseTopic,
            error_code=error,
            name=name,
            topic_id=getattr(req, "topic_id", None),
            is_internal=False,
            partitions=(),
            topic_authorized_operations=_AUTHORIZED_OPERATIONS_OMITTED,
        )

    @staticmethod
    def _topic_metadata(m: ModuleType, image: MetadataImage, topic: TopicImage,
                        reachable: Mapping[int, object]) -> Any:
        live = image.brokers
        partitions = []
        for index, reg in sorted(topic.partitions.items()):
            leader_alive = reg.leader in live
            if not leader_alive:
                error = ErrorCode.leader_not_available
            elif reg.leader not in reachable:  # alive, but not on this listener
                error = ErrorCode.listener_not_found
            else:
                error = ErrorCode.none
            partitions.append(build(
                m.MetadataResponsePartition,
                error_code=error,
                partition_index=index,
                leader_id=reg.leader if error == ErrorCode.none else NO_NODE,
                leader_epoch=reg.leader_epoch,
                replica_nodes=reg.replicas,
                isr_nodes=reg.isr,
                offline_replicas=tuple(r for r in reg.replicas if r not in live),
            ))
        return build(
            m.MetadataResponseTopic,
            error_code=ErrorCode.none,
            name=topic.name,
            topic_id=uuid.UUID(topic.topic_id),
            is_internal=topic.name == OFFSETS_TOPIC,
            partitions=tuple(partitions),
            topic_authorized_operations=_AUTHORIZED_OPERATIONS_OMITTED,
        )

    # -- DescribeTopicPartitions ---------------------------------------------------------

    async def handle_describe_topic_partitions(self, request: Request) -> ResponsePayload:
        """KIP-966's DescribeTopicPartitions (Kafka's DescribeTopicPartitionsRequestHandler):
        Metadata's partition view plus each partition's ELR and last known ELR, all topics
        (by name) when none is named, paged by a cursor at most
        ``max.request.partition.size.limit`` partitions at a time."""
        body = request.body
        m = response_module(ApiKey.DESCRIBE_TOPIC_PARTITIONS, request.api_version)
        image = self._broker.metadata_image()
        live = image.brokers
        limit = max(1, min(body.response_partition_limit, DESCRIBE_PARTITIONS_LIMIT))
        names = sorted({t.name for t in body.topics} if body.topics else image.topics)
        cursor = body.cursor
        if cursor is not None:
            names = [n for n in names if n >= cursor.topic_name]
        topics, next_cursor = [], None
        for name in names:
            topic = image.topics.get(name)
            if topic is None:
                topics.append(build(m.DescribeTopicPartitionsResponseTopic,
                                    error_code=ErrorCode.unknown_topic_or_partition, name=name,
                                    topic_id=None, partitions=()))
                continue
            first = cursor.partition_index if cursor is not None and name == cursor.topic_name \
                else 0
            indexes = [i for i in sorted(topic.partitions) if i >= first]
            if len(indexes) > limit:
                next_cursor = m.Cursor(topic_name=name, partition_index=indexes[limit])
                indexes = indexes[:limit]
            limit -= len(indexes)
            partitions = tuple(build(
                m.DescribeTopicPartitionsResponsePartition,
                error_code=ErrorCode.none if reg.leader in live
                else ErrorCode.leader_not_available,
                partition_index=i, leader_id=reg.leader, leader_epoch=reg.leader_epoch,
                replica_nodes=reg.replicas, isr_nodes=reg.isr,
                eligible_leader_replicas=reg.elr, last_known_elr=reg.last_known_elr,
                offline_replicas=tuple(r for r in reg.replicas if r not in live))
                for i in indexes for reg in (topic.partitions[i],))
            topics.append(build(
                m.DescribeTopicPartitionsResponseTopic, error_code=ErrorCode.none, name=name,
                topic_id=uuid.UUID(topic.topic_id), is_internal=name == OFFSETS_TOPIC,
                partitions=partitions,
                topic_authorized_operations=_AUTHORIZED_OPERATIONS_OMITTED))
            if next_cursor is not None or limit == 0:
                following = names[names.index(name) + 1:]
                if next_cursor is None and following:
                    next_cursor = m.Cursor(topic_name=following[0], partition_index=0)
                break
        return build(m.DescribeTopicPartitionsResponse, throttle_time=NO_THROTTLE,
                     topics=tuple(topics), next_cursor=next_cursor)

    # -- IncrementalAlterConfigs --------------------------------------------------------

    async def handle_incremental_alter_configs(self, request: Request) -> ResponsePayload:
        """Topic configs, SET and DELETE (Kafka's ConfigAdminManager): minibroker's broker
        configs are static, and it has no list-typed config to APPEND to or SUBTRACT from."""
        body = request.body
        m = response_module(ApiKey.INCREMENTAL_ALTER_CONFIGS, request.api_version)
        results = []
        for resource in body.resources:
            error, message = await self._alter_resource(resource, body.validate_only)
            results.append(build(m.AlterConfigsResourceResponse, error_code=error,
                                 error_message=message, resource_type=resource.resource_type,
                                 resource_name=resource.resource_name))
        return build(m.IncrementalAlterConfigsResponse, throttle_time=NO_THROTTLE,
                     responses=tuple(results))

    async def _alter_resource(self, resource: Any, validate_only: bool
                              ) -> tuple[ErrorCode, str | None]:
        if resource.resource_type != _TOPIC_RESOURCE:
            return (ErrorCode.invalid_request, f"resource type {resource.resource_type} is not "
                    "alterable here: minibroker's broker configs are static")
        changes: dict[str, str | None] = {}
        for config in resource.configs:
            if config.config_operation == _SET and config.value is not None:
                changes[config.name] = config.value
            elif config.config_operation == _DELETE:
                changes[config.name] = None
            else:
                return (ErrorCode.invalid_config, f"config {config.name!r}: operation "
                        f"{config.config_operation} needs a list-typed config (or SET a value)")
        return await self._broker.alter_topic_config(resource.resource_name, changes,
                                                     validate_only)

    # -- CreateTopics --------------------------------------------------------------------

    async def handle_create_topics(self, request: Request) -> ResponsePayload:
        body = request.body
        m = response_module(ApiKey.CREATE_TOPICS, request.api_version)
        timeout = body.timeout.total_seconds()
        # A CreateTopics that would make more is refused whole (POLICY_VIOLATION,
        # Kafka's validateTotalNumberOfPartitions, KAFKA-14996).
        if self._partitions_requested(body.topics) > MAX_PARTITIONS_PER_BATCH:
            outcomes = [(ErrorCode.policy_violation,
                         "Excessively large number of partitions per request.")] * len(body.topics)
        else:
            outcomes = await asyncio.gather(*(self._create_topic(t, body, timeout)
                                              for t in body.topics))
        image = self._broker.metadata_image()
        results = []
        for topic, (error, message) in zip(body.topics, outcomes, strict=True):
            created = image.topics.get(topic.name) if error is ErrorCode.none else None
            num_partitions, replication_factor = topic.num_partitions, topic.replication_factor
            if created is not None and created.partitions:
                num_partitions = len(created.partitions)
                replication_factor = len(next(iter(created.partitions.values())).replicas)
            results.append(build(
                m.CreatableTopicResult,
                name=topic.name,
                topic_id=uuid.UUID(created.topic_id) if created is not None else None,
                error_code=error,
                error_message=message,
                num_partitions=num_partitions,
                replication_factor=replication_factor,
                configs=(),
            ))
        return m.CreateTopicsResponse(throttle_time=NO_THROTTLE, topics=tuple(results))

    def _partitions_requested(self, topics: Any) -> int:
        """Kafka's ``ReplicationControlManager.validateTotalNumberOfPartitions``: what every
        topic of the request would create together, -1 counted as ``num.partitions``."""
        default = resolve("num.partitions", self._broker.broker_config())
        total = 0
        for topic in topics:
            if topic.assignments:
                total += len(topic.assignments)
            elif topic.num_partitions == -1:
                total += default
            elif topic.num_partitions > 0:
                total += topic.num_partitions
        return total

    async def _create_topic(
        self, topic: Any, body: Any, timeout: float
    ) -> tuple[ErrorCode, str | None]:
        if body.validate_only:
            return ErrorCode.invalid_request, "validate_only is not supported"
        if topic.assignments:
            return ErrorCode.invalid_replica_assignment, "manual assignment is not supported"
        config = {c.name: c.value for c in topic.configs if c.value is not None}
        try:
            return await asyncio.wait_for(
                self._broker.create_topic(
                    topic.name, topic.num_partitions, topic.replication_factor, config),
                timeout,
            )
        except TimeoutError:
            return ErrorCode.request_timed_out, f"not created within {timeout:g} s"
