"""KafkaApis: turns parsed Kafka requests into calls on the broker core and back.

The core (``ReplicaManager``) is callback-based and knows nothing of the wire; this
module owns every protocol detail: version-specific response shapes, partitions unknown
to the metadata image, sessionless fetches, acks=0. One handler per API serves all of
its supported versions: responses are built from a superset of fields and each
version's class keeps the fields it has (``_build``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import fields
from datetime import timedelta
from functools import cache
from types import ModuleType
from typing import Any, Protocol, TypeVar

from kio.index import load_payload_module
from kio.static.constants import EntityType
from kio.static.protocol import ResponsePayload

from minibroker.cluster.types import (
    ErrorCode,
    FetchPartition,
    FetchRequestData,
    FetchResult,
    MetadataImage,
    ProduceResult,
    TopicImage,
    TopicPartition,
)
from minibroker.network.codec import SUPPORTED_API_VERSIONS, ApiKey, Request
from minibroker.network.kafka_server import CloseConnection

__all__ = ["BrokerApi", "KafkaApis"]

T = TypeVar("T")

_NO_THROTTLE = timedelta(0)
_AUTHORIZED_OPERATIONS_OMITTED = -(2**31)  # Kafka's "not requested" sentinel
_NO_NODE = -1
_NO_PRODUCER_ID = -1
_NO_PRODUCER_EPOCH = -1
_TRANSACTIONS_UNSUPPORTED = "minibroker does not support transactional producers"


class BrokerApi(Protocol):
    """What KafkaApis needs of the broker: the ReplicaManager API plus topic creation.

    Completion callbacks may run synchronously or later, always on the event loop thread.
    """

    broker_id: int

    def metadata_image(self) -> MetadataImage: ...

    def append_records(
        self,
        *,
        acks: int,
        timeout_ms: int,
        entries: dict[TopicPartition, bytes],
        on_complete: Callable[[dict[TopicPartition, ProduceResult]], None],
    ) -> None: ...

    def fetch_messages(
        self,
        request: FetchRequestData,
        on_complete: Callable[[dict[TopicPartition, FetchResult]], None],
    ) -> None: ...

    def list_offset(
        self,
        tp: TopicPartition,
        timestamp: int,
        current_leader_epoch: int,
        isolation_level: int,
        replica_id: int = -1,
    ) -> tuple[ErrorCode, int, int]:
        """(error, offset, leader epoch); timestamp -2 is the earliest, -1 the latest."""
        ...

    def last_offset_for_leader_epoch(
        self, tp: TopicPartition, current_leader_epoch: int, leader_epoch: int
    ) -> tuple[ErrorCode, int, int]:
        """(error, leader epoch, end offset)."""
        ...

    async def create_topic(
        self, name: str, num_partitions: int, replication_factor: int, config: dict[str, str]
    ) -> tuple[ErrorCode, str | None]:
        """Forwarded to the controller. -1 partitions or replication factor (CreateTopics
        v4+) ask for the broker's defaults."""
        ...

    async def init_producer_id(self) -> tuple[ErrorCode, int]:
        """(error, producer id): an id no producer was given before, on any broker."""
        ...


@cache
def _response_module(api_key: ApiKey, version: int) -> ModuleType:
    return load_payload_module(api_key, version, EntityType.response)


@cache
def _field_names(entity_type: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(entity_type))


def _build(entity_type: type[T], **values: Any) -> T:
    """Instantiate one version's entity, dropping the fields that version lacks."""
    names = _field_names(entity_type)
    return entity_type(**{k: v for k, v in values.items() if k in names})


async def _completion(start: Callable[[Callable[[T], None]], None]) -> T:
    """Await a core operation that reports through a completion callback."""
    future: asyncio.Future[T] = asyncio.get_running_loop().create_future()

    def complete(result: T) -> None:
        if not future.done():  # the connection may be gone (cancelled) by then
            future.set_result(result)

    start(complete)
    return await future


class KafkaApis:
    """The request handler of ``KafkaServer`` (Kafka's ``KafkaApis``)."""

    def __init__(self, broker: BrokerApi) -> None:
        self._broker = broker
        self._handlers = {
            ApiKey.PRODUCE: self._handle_produce,
            ApiKey.FETCH: self._handle_fetch,
            ApiKey.LIST_OFFSETS: self._handle_list_offsets,
            ApiKey.METADATA: self._handle_metadata,
            ApiKey.FIND_COORDINATOR: self._handle_find_coordinator,
            ApiKey.API_VERSIONS: self._handle_api_versions,
            ApiKey.CREATE_TOPICS: self._handle_create_topics,
            ApiKey.INIT_PRODUCER_ID: self._handle_init_producer_id,
            ApiKey.OFFSET_FOR_LEADER_EPOCH: self._handle_offset_for_leader_epoch,
        }

    async def handle(self, request: Request) -> ResponsePayload | None:
        return await self._handlers[request.api_key](request)

    # -- ApiVersions ---------------------------------------------------------------------

    async def _handle_api_versions(self, request: Request) -> ResponsePayload:
        if request.api_version > SUPPORTED_API_VERSIONS[ApiKey.API_VERSIONS][1]:
            # The client learns our range from a v0-form answer and retries (KIP-511).
            version, error = 0, ErrorCode.unsupported_version
        else:
            version, error = request.api_version, ErrorCode.none
        m = _response_module(ApiKey.API_VERSIONS, version)
        api_keys = tuple(
            m.ApiVersion(api_key=key, min_version=lo, max_version=hi)
            for key, (lo, hi) in sorted(SUPPORTED_API_VERSIONS.items())
        )
        return _build(
            m.ApiVersionsResponse, error_code=error, api_keys=api_keys, throttle_time=_NO_THROTTLE
        )

    # -- Metadata ------------------------------------------------------------------------

    async def _handle_metadata(self, request: Request) -> ResponsePayload:
        body = request.body
        m = _response_module(ApiKey.METADATA, request.api_version)
        image = self._broker.metadata_image()
        brokers = tuple(
            m.MetadataResponseBroker(node_id=b.broker_id, host=b.host, port=b.port, rack=None)
            for _, b in sorted(image.brokers.items())
        )
        if body.topics is None:
            topics = tuple(self._topic_metadata(m, image, image.topics[name])
                           for name in sorted(image.topics))
        else:
            topics = tuple(self._requested_topic_metadata(m, image, t) for t in body.topics)
        return _build(
            m.MetadataResponse,
            throttle_time=_NO_THROTTLE,
            brokers=brokers,
            cluster_id=image.cluster_id or None,
            controller_id=self._broker.broker_id,  # KRaft brokers name any broker
            topics=topics,
            cluster_authorized_operations=_AUTHORIZED_OPERATIONS_OMITTED,
        )

    def _requested_topic_metadata(self, m: ModuleType, image: MetadataImage, req: Any) -> Any:
        name: str | None = req.name
        if name is not None:
            topic, error = image.topics.get(name), ErrorCode.unknown_topic_or_partition
        else:  # v10+ may name a topic by id only
            topic = next((t for t in image.topics.values()
                          if uuid.UUID(t.topic_id) == req.topic_id), None)
            error = ErrorCode.unknown_topic_id
        if topic is not None:
            return self._topic_metadata(m, image, topic)
        return _build(
            m.MetadataResponseTopic,
            error_code=error,
            name=name,
            topic_id=getattr(req, "topic_id", None),
            is_internal=False,
            partitions=(),
            topic_authorized_operations=_AUTHORIZED_OPERATIONS_OMITTED,
        )

    @staticmethod
    def _topic_metadata(m: ModuleType, image: MetadataImage, topic: TopicImage) -> Any:
        live = image.brokers
        partitions = []
        for index, reg in sorted(topic.partitions.items()):
            leader_alive = reg.leader in live
            partitions.append(_build(
                m.MetadataResponsePartition,
                error_code=ErrorCode.none if leader_alive else ErrorCode.leader_not_available,
                partition_index=index,
                leader_id=reg.leader if leader_alive else _NO_NODE,
                leader_epoch=reg.leader_epoch,
                replica_nodes=reg.replicas,
                isr_nodes=reg.isr,
                offline_replicas=tuple(r for r in reg.replicas if r not in live),
            ))
        return _build(
            m.MetadataResponseTopic,
            error_code=ErrorCode.none,
            name=topic.name,
            topic_id=uuid.UUID(topic.topic_id),
            is_internal=False,
            partitions=tuple(partitions),
            topic_authorized_operations=_AUTHORIZED_OPERATIONS_OMITTED,
        )

    # -- Produce -------------------------------------------------------------------------

    async def _handle_produce(self, request: Request) -> ResponsePayload | None:
        body = request.body
        image = self._broker.metadata_image()
        entries: dict[TopicPartition, bytes] = {}
        results: dict[TopicPartition, ProduceResult] = {}
        for topic in body.topic_data:
            for part in topic.partition_data:
                tp = TopicPartition(topic.name, part.index)
                if body.transactional_id is not None:
                    results[tp] = ProduceResult(
                        ErrorCode.invalid_request, error_message=_TRANSACTIONS_UNSUPPORTED)
                elif body.acks not in (-1, 0, 1):
                    results[tp] = ProduceResult(ErrorCode.invalid_required_acks)
                elif not _partition_exists(image, tp):
                    results[tp] = ProduceResult(ErrorCode.unknown_topic_or_partition)
                elif part.records is None:
                    results[tp] = ProduceResult(ErrorCode.invalid_record)
                else:
                    entries[tp] = part.records
        if entries:
            timeout_ms = int(body.timeout.total_seconds() * 1000)
            results.update(await _completion(lambda done: self._broker.append_records(
                acks=body.acks, timeout_ms=timeout_ms, entries=entries, on_complete=done)))
        if body.acks == 0:
            failed = {str(tp): r.error.name for tp, r in results.items() if r.error}
            if failed:
                raise CloseConnection(f"acks=0 produce failed: {failed}")
            return None
        m = _response_module(ApiKey.PRODUCE, request.api_version)
        return _build(
            m.ProduceResponse,
            responses=tuple(
                m.TopicProduceResponse(
                    name=topic.name,
                    partition_responses=tuple(
                        _produce_partition(m, part.index,
                                           results[TopicPartition(topic.name, part.index)])
                        for part in topic.partition_data
                    ),
                )
                for topic in body.topic_data
            ),
            throttle_time=_NO_THROTTLE,
        )

    # -- Fetch ---------------------------------------------------------------------------

    async def _handle_fetch(self, request: Request) -> ResponsePayload:
        body = request.body
        m = _response_module(ApiKey.FETCH, request.api_version)
        # No fetch sessions (KIP-227): a full fetch gets session id 0, which tells the
        # client no session was created; an incremental one is refused so it starts over.
        if getattr(body, "session_epoch", -1) > 0:
            return _build(
                m.FetchResponse,
                throttle_time=_NO_THROTTLE,
                error_code=ErrorCode.fetch_session_id_not_found,
                session_id=0,
                responses=(),
            )
        image = self._broker.metadata_image()
        by_id = request.api_version >= 13  # v13+ (KIP-516) name topics by id
        names = {uuid.UUID(t.topic_id): t.name for t in image.topics.values()} if by_id else {}
        wanted: list[FetchPartition] = []
        results: dict[tuple[Any, int], FetchResult] = {}
        for topic in body.topics:
            key = topic.topic_id if by_id else topic.topic
            name = names.get(topic.topic_id) if by_id else topic.topic
            for part in topic.partitions:
                tp = TopicPartition(name or "", part.partition)
                if name is not None and _partition_exists(image, tp):
                    wanted.append(FetchPartition(
                        tp=tp,
                        fetch_offset=part.fetch_offset,
                        current_leader_epoch=getattr(part, "current_leader_epoch", -1),
                        log_start_offset=getattr(part, "log_start_offset", -1),
                        max_bytes=part.partition_max_bytes,
                    ))
                else:
                    results[key, part.partition] = FetchResult(
                        ErrorCode.unknown_topic_id if name is None
                        else ErrorCode.unknown_topic_or_partition)
        if wanted or not results:
            # Fetch v15 (KIP-903) moved the follower's id into ReplicaState, with its broker
            # epoch.
            replica = getattr(body, "replica_state", None)
            fetch = FetchRequestData(
                replica_id=replica.replica_id if replica is not None else body.replica_id,
                max_wait_ms=int(body.max_wait.total_seconds() * 1000),
                min_bytes=body.min_bytes,
                max_bytes=body.max_bytes,
                partitions=wanted,
                isolation_level=body.isolation_level,
                replica_epoch=replica.replica_epoch if replica is not None else -1,
            )
            done = await _completion(lambda complete: self._broker.fetch_messages(fetch, complete))
            for tp, result in done.items():
                topic_key = uuid.UUID(image.topics[tp.topic].topic_id) if by_id else tp.topic
                results[topic_key, tp.partition] = result
        return _build(
            m.FetchResponse,
            throttle_time=_NO_THROTTLE,
            error_code=ErrorCode.none,
            session_id=0,
            responses=tuple(
                _build(
                    m.FetchableTopicResponse,
                    topic=getattr(topic, "topic", None),
                    topic_id=getattr(topic, "topic_id", None),
                    partitions=tuple(
                        _fetch_partition(m, part.partition, results[
                            topic.topic_id if by_id else topic.topic, part.partition])
                        for part in topic.partitions
                    ),
                )
                for topic in body.topics
            ),
        )

    # -- ListOffsets ---------------------------------------------------------------------

    async def _handle_list_offsets(self, request: Request) -> ResponsePayload:
        body = request.body
        m = _response_module(ApiKey.LIST_OFFSETS, request.api_version)
        image = self._broker.metadata_image()
        isolation_level = getattr(body, "isolation_level", 0)
        topics = []
        for topic in body.topics:
            partitions = []
            for part in topic.partitions:
                tp = TopicPartition(topic.name, part.partition_index)
                if _partition_exists(image, tp):
                    error, offset, epoch = self._broker.list_offset(
                        tp, part.timestamp, getattr(part, "current_leader_epoch", -1),
                        isolation_level, replica_id=body.replica_id)
                else:
                    error, offset, epoch = ErrorCode.unknown_topic_or_partition, -1, -1
                partitions.append(_build(
                    m.ListOffsetsPartitionResponse,
                    partition_index=part.partition_index,
                    error_code=error,
                    timestamp=-1,
                    offset=offset,
                    leader_epoch=epoch,
                ))
            topics.append(m.ListOffsetsTopicResponse(name=topic.name, partitions=tuple(partitions)))
        return _build(m.ListOffsetsResponse, throttle_time=_NO_THROTTLE, topics=tuple(topics))

    # -- OffsetForLeaderEpoch ------------------------------------------------------------

    async def _handle_offset_for_leader_epoch(self, request: Request) -> ResponsePayload:
        body = request.body
        m = _response_module(ApiKey.OFFSET_FOR_LEADER_EPOCH, request.api_version)
        image = self._broker.metadata_image()
        topics = []
        for topic in body.topics:
            partitions = []
            for part in topic.partitions:
                tp = TopicPartition(topic.topic, part.partition)
                if _partition_exists(image, tp):
                    error, epoch, end_offset = self._broker.last_offset_for_leader_epoch(
                        tp, part.current_leader_epoch, part.leader_epoch)
                else:
                    error, epoch, end_offset = ErrorCode.unknown_topic_or_partition, -1, -1
                partitions.append(m.EpochEndOffset(
                    error_code=error, partition=part.partition,
                    leader_epoch=epoch, end_offset=end_offset,
                ))
            topics.append(m.OffsetForLeaderTopicResult(
                topic=topic.topic, partitions=tuple(partitions)))
        return m.OffsetForLeaderEpochResponse(throttle_time=_NO_THROTTLE, topics=tuple(topics))

    # -- CreateTopics --------------------------------------------------------------------

    async def _handle_create_topics(self, request: Request) -> ResponsePayload:
        body = request.body
        m = _response_module(ApiKey.CREATE_TOPICS, request.api_version)
        timeout = body.timeout.total_seconds()
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
            results.append(_build(
                m.CreatableTopicResult,
                name=topic.name,
                topic_id=uuid.UUID(created.topic_id) if created is not None else None,
                error_code=error,
                error_message=message,
                num_partitions=num_partitions,
                replication_factor=replication_factor,
                configs=(),
            ))
        return m.CreateTopicsResponse(throttle_time=_NO_THROTTLE, topics=tuple(results))

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

    # -- InitProducerId ------------------------------------------------------------------

    async def _handle_init_producer_id(self, request: Request) -> ResponsePayload:
        """Idempotent producers only: there is no transaction coordinator, so a transactional
        id gets INVALID_REQUEST (not retriable: ``init_transactions`` fails at once). As in
        Kafka, a null transactional id always gets a fresh producer id at epoch 0, also when
        the request names its current id and epoch (a KIP-360 epoch bump, v3+); naming only
        one of the two is INVALID_REQUEST."""
        body = request.body
        m = _response_module(ApiKey.INIT_PRODUCER_ID, request.api_version)
        names_id = getattr(body, "producer_id", _NO_PRODUCER_ID) != _NO_PRODUCER_ID
        names_epoch = getattr(body, "producer_epoch", _NO_PRODUCER_EPOCH) != _NO_PRODUCER_EPOCH
        if body.transactional_id is not None or names_id != names_epoch:
            error, producer_id = ErrorCode.invalid_request, _NO_PRODUCER_ID
        else:
            error, producer_id = await self._broker.init_producer_id()
        return m.InitProducerIdResponse(
            throttle_time=_NO_THROTTLE,
            error_code=error,
            producer_id=producer_id,
            producer_epoch=0 if error is ErrorCode.none else _NO_PRODUCER_EPOCH,
        )

    # -- FindCoordinator -----------------------------------------------------------------

    async def _handle_find_coordinator(self, request: Request) -> ResponsePayload:
        """There is no group coordinator: say so, which keeps assign()-only consumers
        (librdkafka always looks one up when group.id is set) quietly retrying."""
        body = request.body
        m = _response_module(ApiKey.FIND_COORDINATOR, request.api_version)
        unavailable = {
            "node_id": _NO_NODE,
            "host": "",
            "port": -1,
            "error_code": ErrorCode.coordinator_not_available,
            "error_message": "minibroker has no group or transaction coordinator",
        }
        if hasattr(m, "Coordinator"):
            return m.FindCoordinatorResponse(
                throttle_time=_NO_THROTTLE,
                coordinators=tuple(m.Coordinator(key=key, **unavailable)
                                   for key in body.coordinator_keys),
            )
        return _build(m.FindCoordinatorResponse, throttle_time=_NO_THROTTLE, **unavailable)


def _partition_exists(image: MetadataImage, tp: TopicPartition) -> bool:
    topic = image.topics.get(tp.topic)
    return topic is not None and tp.partition in topic.partitions


def _produce_partition(m: ModuleType, index: int, result: ProduceResult) -> Any:
    return _build(
        m.PartitionProduceResponse,
        index=index,
        error_code=result.error,
        base_offset=result.base_offset,
        log_append_time=None,
        log_start_offset=result.log_start_offset,
        record_errors=(),
        error_message=result.error_message,
    )


def _fetch_partition(m: ModuleType, index: int, result: FetchResult) -> Any:
    # No transactions, so the last stable offset is the high watermark.
    lso = result.last_stable_offset if result.last_stable_offset >= 0 else result.high_watermark
    return _build(
        m.PartitionData,
        partition_index=index,
        error_code=result.error,
        high_watermark=result.high_watermark,
        last_stable_offset=lso,
        log_start_offset=result.log_start_offset,
        aborted_transactions=(),
        preferred_read_replica=_NO_NODE,
        records=result.records,
    )
