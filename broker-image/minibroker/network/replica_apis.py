"""The APIs the ``ReplicaManager`` serves: Produce, Fetch, ListOffsets,
OffsetForLeaderEpoch and WriteTxnMarkers, which read and write the replicas (a partition
unknown to the metadata image is answered here, without asking the core; fetch sessions,
in ``fetch_session``; acks=0)."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from types import ModuleType
from typing import Any, Protocol

from kio.static.protocol import ResponsePayload

from minibroker.cluster.types import (
    ErrorCode,
    FetchPartition,
    FetchRequestData,
    FetchResult,
    MetadataImage,
    ProduceResult,
    TopicPartition,
    TxnMarker,
)
from minibroker.config import resolve
from minibroker.coordinator.group_metadata_manager import OFFSETS_TOPIC
from minibroker.network.codec import ApiKey, Request
from minibroker.network.fetch_session import (
    FINAL_EPOCH,
    INVALID_SESSION_ID,
    FetchPosition,
    FetchSessionCache,
    PartitionKey,
)
from minibroker.network.kafka_server import CloseConnection
from minibroker.network.responses import (
    NO_NODE,
    NO_THROTTLE,
    build,
    completion,
    response_module,
)
from minibroker.network.txn_verification import (
    RETRIABLE_VERIFICATION_ERRORS,
    TransactionSupportedOperation,
    TransactionVerifier,
    verify_transactional_append,
)
from minibroker.storage.control_records import ControlRecordType
from minibroker.storage.producer_state import VerificationGuard
from minibroker.storage.records import LOG_OVERHEAD, BatchHeader, CorruptRecordError

# Kafka's AdminUtils.ADMIN_CLIENT_ID: the one client id that may append to internal topics.
_ADMIN_CLIENT_ID = "__admin_client"
_BATCH_LENGTH = struct.Struct(">i")
_BATCH_LENGTH_POS = 8  # after the batch's baseOffset


class ReplicaBroker(TransactionVerifier, Protocol):
    """What ReplicaApis needs of the broker: the ReplicaManager's API.

    Completion callbacks may run synchronously or later, always on the event loop thread.
    """

    def metadata_image(self) -> MetadataImage: ...

    def broker_config(self) -> dict[str, str]: ...

    def append_records(
        self,
        *,
        acks: int,
        timeout_ms: int,
        entries: dict[TopicPartition, bytes],
        on_complete: Callable[[dict[TopicPartition, ProduceResult]], None],
        verification_guards: dict[TopicPartition, VerificationGuard | None] | None = None,
    ) -> None: ...

    def append_end_txn_markers(
        self,
        *,
        marker: TxnMarker,
        timeout_ms: int,
        on_complete: Callable[[dict[TopicPartition, ProduceResult]], None],
    ) -> None: ...

    def complete_txn_offsets(self, producer_id: int, partitions: set[int],
                             commit: bool) -> None:
        """A marker is in these ``__consumer_offsets`` partitions: the group coordinator
        commits or drops the producer's pending offsets there."""
        ...

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


class ReplicaApis:
    """The handlers of the replicas' APIs, for ``KafkaApis``."""

    def __init__(self, broker: ReplicaBroker) -> None:
        self._broker = broker
        config = broker.broker_config()
        self._fetch_max_bytes: int = resolve("fetch.max.bytes", config)
        self._request_timeout_ms: int = resolve("request.timeout.ms", config)
        self._verify_transactions: bool = resolve("transaction.partition.verification.enable",
                                                  config)
        self._message_max_bytes: int = resolve("message.max.bytes", config)
        # Partitions unknown to the image a session may keep naming (Kafka keeps them, so
        # that a follower that learnt of a topic before its leader keeps asking): bounded,
        # so that a session cannot be grown without end by naming made-up topic ids.
        self._max_unknown_in_session: int = resolve("max.request.elements", config)
        self.fetch_sessions = FetchSessionCache(
            resolve("max.incremental.fetch.session.cache.slots", config),
            resolve("min.incremental.fetch.session.eviction.ms", config))

    # -- Produce -------------------------------------------------------------------------

    async def handle_produce(self, request: Request) -> ResponsePayload | None:
        body = request.body
        image = self._broker.metadata_image()
        entries: dict[TopicPartition, bytes] = {}
        results: dict[TopicPartition, ProduceResult] = {}
        for topic in body.topic_data:
            for part in topic.partition_data:
                tp = TopicPartition(topic.name, part.index)
                if body.acks not in (-1, 0, 1):
                    results[tp] = ProduceResult(ErrorCode.invalid_required_acks)
                elif not _partition_exists(image, tp):
                    results[tp] = ProduceResult(ErrorCode.unknown_topic_or_partition)
                elif part.records is None:
                    results[tp] = ProduceResult(ErrorCode.invalid_record)
                elif len(part.records) > self._message_max_bytes:
                    results[tp] = ProduceResult(ErrorCode.message_too_large, error_message=(
                        f"The record batch size in the append to {tp} is "
                        f"{len(part.records)} bytes which exceeds the maximum configured "
                        f"value of {self._message_max_bytes}."))
                elif (more := _more_than_one_batch(part.records)) is not None:
                    results[tp] = ProduceResult(ErrorCode.invalid_record, error_message=more)
                elif tp.topic == OFFSETS_TOPIC and request.client_id != _ADMIN_CLIENT_ID:
                    # Kafka's ReplicaManager.appendToLocalLog: only the coordinator writes
                    # its records (a client's would be replayed by the next load).
                    results[tp] = ProduceResult(
                        ErrorCode.invalid_topic_exception,
                        error_message=f"Cannot append to internal topic {tp.topic}")
                else:
                    entries[tp] = part.records
        guards = None
        producer = _transactional_producer(entries) if body.transactional_id is not None \
            else None
        operation = TransactionSupportedOperation.for_produce(request.api_version)
        # Transaction version 2 adds the partitions here, verification enabled or not.
        if producer is not None and (self._verify_transactions
                                     or operation.supports_epoch_bump):
            guards, failed = await verify_transactional_append(
                self._broker, body.transactional_id, *producer, list(entries), operation)
            for tp, error in failed.items():
                results[tp] = _verification_failure(tp, error, operation)
                del entries[tp]
        if entries:
            timeout_ms = int(body.timeout.total_seconds() * 1000)
            results.update(await completion(lambda done: self._broker.append_records(
                acks=body.acks, timeout_ms=timeout_ms, entries=entries, on_complete=done,
                verification_guards=guards)))
        if body.acks == 0:
            failed = {str(tp): r.error.name for tp, r in results.items() if r.error}
            if failed:
                raise CloseConnection(f"acks=0 produce failed: {failed}")
            return None
        m = response_module(ApiKey.PRODUCE, request.api_version)
        return build(
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
            throttle_time=NO_THROTTLE,
        )

    # -- Fetch ---------------------------------------------------------------------------

    async def handle_fetch(self, request: Request) -> ResponsePayload:
        body = request.body
        m = response_module(ApiKey.FETCH, request.api_version)
        by_id = request.api_version >= 13  # v13+ (KIP-516) name topics by id
        # Fetch v15 (KIP-903) moved the follower's id into ReplicaState, with its broker
        # epoch.
        replica = getattr(body, "replica_state", None)
        replica_id = replica.replica_id if replica is not None else body.replica_id
        # Fetch sessions from v7 (KIP-227); an older fetch is sessionless.
        context = self.fetch_sessions.new_context(
            getattr(body, "session_id", INVALID_SESSION_ID),
            getattr(body, "session_epoch", FINAL_EPOCH),
            _requested_partitions(body.topics, by_id), _forgotten(body, by_id),
            privileged=replica_id >= 0, now_ms=_now_ms())
        if context.error != ErrorCode.none:
            return _session_error(m, context.error)
        image = self._broker.metadata_image()
        wanted: list[FetchPartition] = []
        results: dict[PartitionKey, FetchResult] = {}
        keys: dict[str, Any] = {}  # a topic's name -> how this request names it
        for (key, index), position in context.partitions.items():
            if by_id:
                known = image.topics_by_id.get(key)
                name = known.name if known is not None else None
            else:
                name = key
            tp = TopicPartition(name or "", index)
            if name is not None and _partition_exists(image, tp):
                keys[name] = key
                wanted.append(FetchPartition(
                    tp=tp, fetch_offset=position.fetch_offset,
                    current_leader_epoch=position.current_leader_epoch,
                    log_start_offset=position.log_start_offset, max_bytes=position.max_bytes))
            else:
                results[key, index] = FetchResult(
                    ErrorCode.unknown_topic_id if name is None
                    else ErrorCode.unknown_topic_or_partition)
        if context.session is not None and len(results) > self._max_unknown_in_session:
            self.fetch_sessions.sessions.pop(context.session.id, None)
            return _session_error(m, ErrorCode.fetch_session_id_not_found)
        if wanted or not results:
            fetch = FetchRequestData(
                replica_id=replica_id,
                max_wait_ms=int(body.max_wait.total_seconds() * 1000),
                min_bytes=body.min_bytes,
                # Kafka's fetch.max.bytes: what one answer may hold, whatever was asked.
                max_bytes=min(body.max_bytes, self._fetch_max_bytes),
                partitions=wanted,
                isolation_level=body.isolation_level,
                replica_epoch=replica.replica_epoch if replica is not None else -1,
            )
            done = await completion(lambda complete: self._broker.fetch_messages(fetch, complete))
            for tp, result in done.items():
                results[keys[tp.topic], tp.partition] = result
        session_id, answered = context.respond(self.fetch_sessions, results, _now_ms())
        by_topic: dict[Any, list[Any]] = {}
        for (key, index), result in answered.items():
            by_topic.setdefault(key, []).append(_fetch_partition(m, index, result))
        return build(
            m.FetchResponse,
            throttle_time=NO_THROTTLE,
            error_code=ErrorCode.none,
            session_id=session_id,
            responses=tuple(
                build(
                    m.FetchableTopicResponse,
                    topic=None if by_id else key,
                    topic_id=key if by_id else None,
                    partitions=tuple(partitions),
                )
                for key, partitions in by_topic.items()
            ),
        )

    # -- ListOffsets ---------------------------------------------------------------------

    async def handle_list_offsets(self, request: Request) -> ResponsePayload:
        body = request.body
        m = response_module(ApiKey.LIST_OFFSETS, request.api_version)
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
                partitions.append(build(
                    m.ListOffsetsPartitionResponse,
                    partition_index=part.partition_index,
                    error_code=error,
                    timestamp=-1,
                    offset=offset,
                    leader_epoch=epoch,
                ))
            topics.append(m.ListOffsetsTopicResponse(name=topic.name, partitions=tuple(partitions)))
        return build(m.ListOffsetsResponse, throttle_time=NO_THROTTLE, topics=tuple(topics))

    # -- WriteTxnMarkers ----------------------------------------------------------------

    async def handle_write_txn_markers(self, request: Request) -> ResponsePayload:
        """The coordinator's markers (Kafka's ``KafkaApis.handleWriteTxnMarkersRequest``):
        each producer's in all its partitions at once, with acks=-1 and the broker's
        request.timeout.ms, answered when every marker is replicated or has failed."""
        m = response_module(ApiKey.WRITE_TXN_MARKERS, request.api_version)
        image = self._broker.metadata_image()

        async def write(entry: Any) -> Any:
            tps = [TopicPartition(topic.name, index)
                   for topic in entry.topics for index in topic.partition_indexes]
            known = tuple(tp for tp in tps if _partition_exists(image, tp))
            results = {tp: ProduceResult(ErrorCode.unknown_topic_or_partition)
                       for tp in tps if tp not in known}
            if known:
                marker = TxnMarker(
                    entry.producer_id, entry.producer_epoch, entry.coordinator_epoch,
                    ControlRecordType.COMMIT if entry.transaction_result
                    else ControlRecordType.ABORT, known,
                    getattr(entry, "transaction_version", 0))  # v2+ (KIP-890)
                results.update(await completion(
                    lambda done: self._broker.append_end_txn_markers(
                        marker=marker, timeout_ms=self._request_timeout_ms,
                        on_complete=done)))
                offsets = {tp.partition for tp in known if tp.topic == OFFSETS_TOPIC
                           and results[tp].error == ErrorCode.none}
                if offsets:
                    self._broker.complete_txn_offsets(
                        entry.producer_id, offsets,
                        marker.control_type is ControlRecordType.COMMIT)
            return m.WritableTxnMarkerResult(
                producer_id=entry.producer_id,
                topics=tuple(
                    m.WritableTxnMarkerTopicResult(name=topic.name, partitions=tuple(
                        m.WritableTxnMarkerPartitionResult(
                            partition_index=index,
                            error_code=results[TopicPartition(topic.name, index)].error)
                        for index in topic.partition_indexes))
                    for topic in entry.topics))

        answers = await asyncio.gather(*(write(entry) for entry in request.body.markers))
        return m.WriteTxnMarkersResponse(markers=tuple(answers))

    # -- OffsetForLeaderEpoch ------------------------------------------------------------

    async def handle_offset_for_leader_epoch(self, request: Request) -> ResponsePayload:
        body = request.body
        m = response_module(ApiKey.OFFSET_FOR_LEADER_EPOCH, request.api_version)
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
        return m.OffsetForLeaderEpochResponse(throttle_time=NO_THROTTLE, topics=tuple(topics))


def _requested_partitions(topics: Any, by_id: bool) -> dict[PartitionKey, FetchPosition]:
    """A Fetch's partitions keyed by (topic name, or id from v13; index), each once: Kafka's
    ``FetchRequest.fetchData`` is a map, where a partition named again replaces the first
    but keeps its place. Repeated, one partition's records would be answered as many times,
    far past fetch.max.bytes (9,000 copies of one partition holding 200 KB: a 144 KB
    request, a 1.8 GB answer)."""
    requested: dict[PartitionKey, FetchPosition] = {}
    for topic in topics:
        key = topic.topic_id if by_id else topic.topic
        for part in topic.partitions:
            requested[key, part.partition] = FetchPosition(
                fetch_offset=part.fetch_offset,
                current_leader_epoch=getattr(part, "current_leader_epoch", -1),
                log_start_offset=getattr(part, "log_start_offset", -1),
                max_bytes=part.partition_max_bytes)
    return requested


def _session_error(m: ModuleType, error: ErrorCode) -> Any:
    """Kafka's ``SessionErrorContext``: the error, no session, no partition."""
    return build(m.FetchResponse, throttle_time=NO_THROTTLE, error_code=error,
                 session_id=INVALID_SESSION_ID, responses=())


def _forgotten(body: Any, by_id: bool) -> list[PartitionKey]:
    """The partitions an incremental Fetch drops from its session (v7+)."""
    return [(topic.topic_id if by_id else topic.topic, index)
            for topic in getattr(body, "forgotten_topics_data", ())
            for index in topic.partitions]


def _more_than_one_batch(records: bytes) -> str | None:
    """Kafka's ``ProduceRequest.validateRecords``: a Produce of v3 or later (all that
    minibroker serves) carries exactly one record batch per partition, so that appending
    one partition's records costs one batch's header work, however large the request. The
    first batch's length field says where it ends; anything after it is refused
    (INVALID_RECORD, as Kafka answers). Whether that one batch is sound is the log's to
    check."""
    if len(records) < LOG_OVERHEAD:
        return None
    (batch_length,) = _BATCH_LENGTH.unpack_from(records, _BATCH_LENGTH_POS)
    if len(records) <= LOG_OVERHEAD + batch_length:
        return None
    return ("Produce requests with version 3 or above are only allowed to contain exactly "
            "one record batch per partition")


def _transactional_producer(entries: dict[TopicPartition, bytes]) -> tuple[int, int] | None:
    """(producer id, epoch) of the first transactional data batch (one producer per
    Produce); None when there is none or it does not parse (the log will say why)."""
    for records in entries.values():
        try:
            header = BatchHeader.parse(records)
        except CorruptRecordError:
            continue
        if header.is_transactional and not header.is_control and header.producer_id >= 0:
            return header.producer_id, header.producer_epoch
    return None


def _verification_failure(tp: TopicPartition, error: ErrorCode,
                          operation: TransactionSupportedOperation) -> ProduceResult:
    """Kafka's ``postVerificationCallback`` mapping: a coordinator error becomes the
    retriable NOT_ENOUGH_REPLICAS, which every client retries, except CONCURRENT_TRANSACTIONS
    for a client on transaction version 2 (common while the last transaction ends, and
    clearer as it is)."""
    if error == ErrorCode.invalid_txn_state:
        return ProduceResult(error, error_message=(
            f"{tp}: Partition was not added to the transaction"))
    if error == ErrorCode.concurrent_transactions and operation.supports_epoch_bump:
        return ProduceResult(error)
    if error in RETRIABLE_VERIFICATION_ERRORS:
        return ProduceResult(ErrorCode.not_enough_replicas, error_message=(
            f"{tp}: Unable to verify the partition has been added to the transaction. "
            f"Underlying error: {error.name.upper()}"))
    return ProduceResult(error)


def _partition_exists(image: MetadataImage, tp: TopicPartition) -> bool:
    topic = image.topics.get(tp.topic)
    return topic is not None and tp.partition in topic.partitions


def _produce_partition(m: ModuleType, index: int, result: ProduceResult) -> Any:
    return build(
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
    aborted = result.aborted_transactions
    return build(
        m.PartitionData,
        partition_index=index,
        error_code=result.error,
        high_watermark=result.high_watermark,
        last_stable_offset=result.last_stable_offset,
        log_start_offset=result.log_start_offset,
        # Kafka sends null to READ_UNCOMMITTED consumers and followers.
        aborted_transactions=None if aborted is None else tuple(
            m.AbortedTransaction(producer_id=txn.producer_id, first_offset=txn.first_offset)
            for txn in aborted),
        preferred_read_replica=NO_NODE,
        records=result.records,
    )


def _now_ms() -> float:
    """The monotonic clock of the fetch sessions' ages (KIP-227's eviction): the loop's,
    which is ``time.monotonic`` in a broker process and the virtual clock in simulation."""
    return asyncio.get_running_loop().time() * 1000
