"""KafkaApis through a real socket: kio-encoded requests in, each supported version.

The broker core is replaced by ``FakeBroker``, an in-memory implementation of the
``BrokerApi`` protocol that completes acks=all produces and empty fetches later, as the
real purgatories do, so both completion paths of the network layer are exercised.

Long (about 950 lines): one section per API (Produce, Fetch with its sessions, Metadata,
ListOffsets, OffsetForLeaderEpoch, the group APIs), each over every version minibroker
serves, all through the one fake broker and socket harness at the top.
"""

from __future__ import annotations

import asyncio
import datetime
import struct
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import fields, replace
from typing import Any

import pytest
from kio.index import load_payload_module
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32, i64

from minibroker.cluster.types import (
    BrokerEndpoint,
    ErrorCode,
    FetchRequestData,
    FetchResult,
    MetadataImage,
    PartitionRegistration,
    ProduceResult,
    TopicImage,
    TopicPartition,
    TxnMarker,
)
from minibroker.network.apis import KafkaApis
from minibroker.network.client import KafkaConnection, KafkaConnectionError
from minibroker.network.codec import (
    SUPPORTED_API_VERSIONS,
    ApiKey,
    decode_response,
    encode_request,
    response_schema,
)
from minibroker.network.kafka_server import KafkaServer
from minibroker.storage.control_records import ControlRecordType
from minibroker.storage.records import build_batch

CLUSTER_ID = "fake-cluster-id-000001"
ORDERS_ID = uuid.uuid4()
NEVER_ANSWERED = "controller-never-answers"


def versions(api: ApiKey) -> list[int]:
    low, high = SUPPORTED_API_VERSIONS[api]
    return list(range(low, high + 1))


class FakeBroker:
    """In-memory BrokerApi. A log is a list of opaque batches; offset = list index."""

    broker_id = 1

    def __init__(self) -> None:
        self.image = MetadataImage(
            metadata_offset=7,
            cluster_id=CLUSTER_ID,
            brokers={1: BrokerEndpoint(1, "127.0.0.1", 19092),
                     2: BrokerEndpoint(2, "127.0.0.1", 19093)},
            topics={"orders": TopicImage("orders", ORDERS_ID.hex, {}, {
                0: PartitionRegistration((1, 2), (1, 2), 1, 4, 9),
                # Leader 3 is not among the live brokers: the partition is offline.
                1: PartitionRegistration((2, 3), (2,), 3, 2, 5),
            })},
        )
        self.logs: dict[TopicPartition, list[bytes]] = {
            TopicPartition("orders", 0): [], TopicPartition("orders", 1): []}
        self.parked: list[tuple[FetchRequestData, Callable[..., None]]] = []
        self.fetch_requests: list[FetchRequestData] = []
        self.list_offset_calls: list[tuple[Any, ...]] = []
        self.created: list[tuple[Any, ...]] = []
        self.markers: list[tuple[TxnMarker, int]] = []
        self.next_producer_id = 4000
        self.producer_id_error = ErrorCode.none
        self.config: dict[str, str] = {}

    def metadata_image(self) -> MetadataImage:
        return self.image

    def broker_config(self) -> dict[str, str]:
        return self.config

    def append_records(self, *, acks: int, timeout_ms: int, entries: dict[TopicPartition, bytes],
                       on_complete: Callable[[dict[TopicPartition, ProduceResult]], None],
                       verification_guards: object = None) -> None:
        results = {}
        for tp, records in entries.items():
            log = self.logs[tp]
            results[tp] = ProduceResult(ErrorCode.none, base_offset=len(log), log_start_offset=0)
            log.append(records)
        self._complete_parked()
        if acks == -1:  # DelayedProduce: answered once replicated, here on the next tick
            asyncio.get_running_loop().call_soon(on_complete, results)
        else:
            on_complete(results)

    def append_end_txn_markers(
            self, *, marker: TxnMarker, timeout_ms: int,
            on_complete: Callable[[dict[TopicPartition, ProduceResult]], None]) -> None:
        self.markers.append((marker, timeout_ms))
        on_complete({tp: ProduceResult(ErrorCode.none if tp.partition == 0
                                       else ErrorCode.not_leader_or_follower)
                     for tp in marker.partitions})

    def fetch_messages(self, request: FetchRequestData,
                       on_complete: Callable[[dict[TopicPartition, FetchResult]], None]) -> None:
        self.fetch_requests.append(request)
        if request.max_wait_ms > 0 and not self._has_data(request):
            # DelayedFetch: wait for data up to max_wait_ms.
            entry = (request, on_complete)
            self.parked.append(entry)
            asyncio.get_running_loop().call_later(
                request.max_wait_ms / 1000, self._expire, entry)
            return
        on_complete(self._read(request))

    def _has_data(self, request: FetchRequestData) -> bool:
        return any(len(self.logs[p.tp]) > p.fetch_offset for p in request.partitions)

    def _read(self, request: FetchRequestData) -> dict[TopicPartition, FetchResult]:
        results = {}
        for p in request.partitions:
            log = self.logs[p.tp]
            if p.fetch_offset > len(log):
                results[p.tp] = FetchResult(ErrorCode.offset_out_of_range)
            else:
                results[p.tp] = FetchResult(ErrorCode.none, high_watermark=len(log),
                                            last_stable_offset=len(log), log_start_offset=0,
                                            records=b"".join(log[p.fetch_offset:]))
        return results

    def _complete_parked(self) -> None:
        ready = [e for e in self.parked if self._has_data(e[0])]
        for entry in ready:
            self.parked.remove(entry)
            entry[1](self._read(entry[0]))

    def _expire(self, entry: tuple[FetchRequestData, Callable[..., None]]) -> None:
        if entry in self.parked:
            self.parked.remove(entry)
            entry[1](self._read(entry[0]))

    def list_offset(self, tp: TopicPartition, timestamp: int, current_leader_epoch: int,
                    isolation_level: int, replica_id: int = -1) -> tuple[ErrorCode, int, int]:
        self.list_offset_calls.append((tp, timestamp, current_leader_epoch, isolation_level,
                                       replica_id))
        epoch = self.image.topics[tp.topic].partitions[tp.partition].leader_epoch
        return ErrorCode.none, 0 if timestamp == -2 else len(self.logs[tp]), epoch

    def last_offset_for_leader_epoch(self, tp: TopicPartition, current_leader_epoch: int,
                                     leader_epoch: int) -> tuple[ErrorCode, int, int]:
        latest = self.image.topics[tp.topic].partitions[tp.partition].leader_epoch
        if current_leader_epoch not in (-1, latest):
            return ErrorCode.fenced_leader_epoch, -1, -1
        return ErrorCode.none, min(leader_epoch, latest), len(self.logs[tp])

    async def create_topic(self, name: str, num_partitions: int, replication_factor: int,
                           config: dict[str, str]) -> tuple[ErrorCode, str | None]:
        self.created.append((name, num_partitions, replication_factor, config))
        if name == NEVER_ANSWERED:
            await asyncio.Event().wait()
        if name in self.image.topics:
            return ErrorCode.topic_already_exists, f"Topic '{name}' already exists."
        count = 1 if num_partitions == -1 else num_partitions
        replicas = (1, 2)[: 1 if replication_factor == -1 else replication_factor]
        topics = dict(self.image.topics)
        topics[name] = TopicImage(name, uuid.uuid4().hex, config, {
            i: PartitionRegistration(replicas, replicas, replicas[0], 0, 0) for i in range(count)})
        self.image = MetadataImage(self.image.metadata_offset + 1, self.image.brokers, topics,
                                   self.image.cluster_id)
        return ErrorCode.none, None

    async def init_producer_id(self) -> tuple[ErrorCode, int]:
        if self.producer_id_error != ErrorCode.none:
            return self.producer_id_error, -1
        self.next_producer_id += 1
        return ErrorCode.none, self.next_producer_id - 1


Scenario = Callable[[FakeBroker, int], Awaitable[None]]


def run(scenario: Scenario, broker: FakeBroker | None = None) -> FakeBroker:
    broker = broker or FakeBroker()

    async def main() -> None:
        server = KafkaServer(KafkaApis(broker))
        await server.start("127.0.0.1", 0)
        try:
            await asyncio.wait_for(scenario(broker, server.port), 10)
        finally:
            await server.stop()

    asyncio.run(main())
    return broker


def build(entity_type: type, **values: Any) -> Any:
    """An entity of one version from a superset of fields (as KafkaApis builds them)."""
    names = {f.name for f in fields(entity_type)}
    return entity_type(**{k: v for k, v in values.items() if k in names})


def request_module(api: ApiKey, version: int) -> Any:
    return load_payload_module(api, version, EntityType.request)


async def call(port: int, request: Any) -> Any:
    conn = await KafkaConnection.connect("127.0.0.1", port, client_id="test")
    try:
        return await conn.request(request, timeout=5)
    finally:
        conn.close()


def produce_request(version: int, acks: int, batches: dict[tuple[str, int], bytes],
                    transactional_id: str | None = None) -> Any:
    m = request_module(ApiKey.PRODUCE, version)
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), records in batches.items():
        by_topic.setdefault(topic, []).append(m.PartitionProduceData(index=partition,
                                                                     records=records))
    return m.ProduceRequest(
        transactional_id=transactional_id, acks=acks,
        timeout=datetime.timedelta(seconds=5),
        topic_data=tuple(m.TopicProduceData(name=t, partition_data=tuple(ps))
                         for t, ps in by_topic.items()))


# Fetch v13+ names topics by id: "gone" stands for an id the broker does not know.
TOPIC_IDS = {"orders": ORDERS_ID, "gone": uuid.UUID(int=7)}


def fetch_request(version: int, offsets: dict[tuple[str, int], int], *, max_wait_ms: int = 0,
                  session_id: int = 0, session_epoch: int = -1, replica_id: int = -1,
                  replica_epoch: int = -1, isolation_level: int = 0,
                  forgotten: list[tuple[str, int]] = ()) -> Any:
    m = request_module(ApiKey.FETCH, version)
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), offset in offsets.items():
        by_topic.setdefault(topic, []).append(build(
            m.FetchPartition, partition=partition, current_leader_epoch=-1, fetch_offset=offset,
            last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20))
    replica = ({"replica_state": m.ReplicaState(replica_id=replica_id,
                                                replica_epoch=replica_epoch)}
               if version >= 15 else {"replica_id": replica_id})
    return build(
        m.FetchRequest, **replica,
        max_wait=datetime.timedelta(milliseconds=max_wait_ms), min_bytes=1, max_bytes=1 << 24,
        isolation_level=isolation_level, session_id=session_id, session_epoch=session_epoch,
        forgotten_topics_data=tuple(
            build(m.ForgottenTopic, topic=t, topic_id=TOPIC_IDS[t], partitions=(p,))
            for t, p in forgotten),
        rack_id="",
        topics=tuple(build(m.FetchTopic, topic=t, topic_id=TOPIC_IDS[t], partitions=tuple(ps))
                     for t, ps in by_topic.items()))


def partitions_of(response: Any) -> dict[tuple[str, int], Any]:
    """Produce/Fetch response partitions keyed by (topic, partition)."""
    found = {}
    names = {topic_id: name for name, topic_id in TOPIC_IDS.items()}
    for topic in response.responses:
        name = (getattr(topic, "name", None) or getattr(topic, "topic", None)
                or names[topic.topic_id])
        for p in getattr(topic, "partition_responses", None) or topic.partitions:
            found[(name, getattr(p, "index", getattr(p, "partition_index", None)))] = p
    return found


# -- ApiVersions ------------------------------------------------------------------------


@pytest.mark.parametrize("version", versions(ApiKey.API_VERSIONS))
def test_api_versions_lists_the_supported_table(version: int) -> None:
    async def scenario(_broker: FakeBroker, port: int) -> None:
        m = request_module(ApiKey.API_VERSIONS, version)
        response = await call(port, build(m.ApiVersionsRequest, client_software_name="t",
                                          client_software_version="1"))
        assert response.error_code == ErrorCode.none
        advertised = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
        assert advertised == {int(k): v for k, v in SUPPORTED_API_VERSIONS.items()}

    run(scenario)


@pytest.mark.parametrize(("level", "version", "finalized", "supported"), [
    (2, 4, [("transaction.version", 2, 2)], [("transaction.version", 0, 2)]),
    (1, 4, [("transaction.version", 1, 1)], [("transaction.version", 0, 2)]),
    (0, 4, [], [("transaction.version", 0, 2)]),  # level 0: not finalized
    (2, 3, [("transaction.version", 2, 2)], []),  # v3 leaves out a feature whose min is 0
])
def test_api_versions_shows_the_transaction_version_feature(
        level: int, version: int, finalized: list[tuple[str, int, int]],
        supported: list[tuple[str, int, int]]) -> None:
    """KIP-584's features as Kafka 4.2 gives them: the Java client uses transaction
    version 2 only while the feature is finalized at 2, with an epoch it has not seen."""
    async def scenario(broker: FakeBroker, port: int) -> None:
        broker.config["transaction.version"] = str(level)
        broker.image = replace(broker.image, metadata_offset=77)
        m = request_module(ApiKey.API_VERSIONS, version)
        response = await call(port, build(m.ApiVersionsRequest, client_software_name="t",
                                          client_software_version="1"))
        assert [(f.name, f.min_version_level, f.max_version_level)
                for f in response.finalized_features] == finalized
        assert [(f.name, f.min_version, f.max_version)
                for f in response.supported_features] == supported
        assert response.finalized_features_epoch == 77

    run(scenario)


def test_too_new_api_versions_gets_a_v0_answer_with_unsupported_version() -> None:
    async def scenario(_broker: FakeBroker, port: int) -> None:
        from kio.schema.api_versions.v4 import request as v4

        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        request = v4.ApiVersionsRequest(client_software_name="t", client_software_version="1")
        # v5, newer than minibroker's: v4's frame (v5 has no schema yet) with its version
        # field (after the 4-byte size and the 2-byte api key) raised.
        frame = bytearray(encode_request(request, 42, "test"))
        assert struct.unpack_from(">hh", frame, 4) == (ApiKey.API_VERSIONS, 4)
        struct.pack_into(">h", frame, 6, 5)
        writer.write(bytes(frame))
        size = struct.unpack(">i", await reader.readexactly(4))[0]
        frame = await reader.readexactly(size)
        # Response header v0 and the v0 body, whatever version was asked for.
        correlation_id, response = decode_response(frame, response_schema(18, 0))
        assert correlation_id == 42
        assert response.error_code == ErrorCode.unsupported_version
        advertised = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
        assert advertised[ApiKey.API_VERSIONS] == SUPPORTED_API_VERSIONS[ApiKey.API_VERSIONS]
        assert len(advertised) == len(SUPPORTED_API_VERSIONS)
        writer.close()

    run(scenario)


# -- Metadata ---------------------------------------------------------------------------


def metadata_request(version: int, names: list[str] | None) -> Any:
    m = request_module(ApiKey.METADATA, version)
    topics = None if names is None else tuple(
        build(m.MetadataRequestTopic, topic_id=None, name=n) for n in names)
    return build(m.MetadataRequest, topics=topics, allow_auto_topic_creation=False,
                 include_cluster_authorized_operations=False,
                 include_topic_authorized_operations=False)


@pytest.mark.parametrize("version", versions(ApiKey.METADATA))
def test_metadata_reports_brokers_topics_and_offline_partitions(version: int) -> None:
    async def scenario(broker: FakeBroker, port: int) -> None:
        response = await call(port, metadata_request(version, None))
        assert {(b.node_id, b.host, b.port) for b in response.brokers} == {
            (1, "127.0.0.1", 19092), (2, "127.0.0.1", 19093)}
        assert response.controller_id == broker.broker_id
        if version >= 2:
            assert response.cluster_id == CLUSTER_ID
        (topic,) = response.topics
        assert (topic.name, topic.error_code) == ("orders", ErrorCode.none)
        if version >= 10:
            assert topic.topic_id == ORDERS_ID
        p0, p1 = sorted(topic.partitions, key=lambda p: p.partition_index)
        assert (p0.error_code, p0.leader_id, p0.replica_nodes, p0.isr_nodes) == (
            ErrorCode.none, 1, (1, 2), (1, 2))
        assert (p1.error_code, p1.leader_id) == (ErrorCode.leader_not_available, -1)
        if version >= 5:
            assert (p0.offline_replicas, p1.offline_replicas) == ((), (3,))
        if version >= 7:
            assert (p0.leader_epoch, p1.leader_epoch) == (4, 2)

    run(scenario)


def describe_topic_partitions_request(names: list[str], limit: int = 2000,
                                      cursor: tuple[str, int] | None = None) -> Any:
    m = request_module(ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0)
    return m.DescribeTopicPartitionsRequest(
        topics=tuple(m.TopicRequest(name=n) for n in names), response_partition_limit=limit,
        cursor=None if cursor is None else m.Cursor(topic_name=cursor[0],
                                                    partition_index=cursor[1]))


def test_describe_topic_partitions_shows_the_elr_and_pages_by_cursor() -> None:
    """KIP-966: the ELR and the last known ELR reach a stock admin client through
    DescribeTopicPartitions (Kafka's Admin.describeTopics since 3.7)."""
    async def scenario(broker: FakeBroker, port: int) -> None:
        orders = broker.image.topics["orders"]
        orders.partitions[1] = PartitionRegistration((2, 3), (), -1, 3, 6, elr=(2,),
                                                     last_known_elr=(3,))
        response = await call(port, describe_topic_partitions_request([]))
        (topic,) = response.topics
        assert (topic.name, topic.topic_id, topic.error_code) == ("orders", ORDERS_ID,
                                                                  ErrorCode.none)
        p0, p1 = topic.partitions
        assert (p0.leader_id, p0.isr_nodes, p0.eligible_leader_replicas) == (1, (1, 2), ())
        assert (p1.error_code, p1.leader_id, p1.isr_nodes, p1.eligible_leader_replicas,
                p1.last_known_elr, p1.offline_replicas) == (
            ErrorCode.leader_not_available, -1, (), (2,), (3,), (3,))
        assert response.next_cursor is None

        first = await call(port, describe_topic_partitions_request(["orders", "nope"], 1))
        assert [t.name for t in first.topics] == ["nope", "orders"]
        assert first.topics[0].error_code == ErrorCode.unknown_topic_or_partition
        assert [p.partition_index for p in first.topics[1].partitions] == [0]
        assert (first.next_cursor.topic_name, first.next_cursor.partition_index) == (
            "orders", 1)
        rest = await call(port, describe_topic_partitions_request(["orders"], 1, ("orders", 1)))
        assert [p.partition_index for p in rest.topics[0].partitions] == [1]
        assert rest.next_cursor is None

    run(scenario)


@pytest.mark.parametrize("version", [1, 9, 12])
def test_metadata_for_named_topics_marks_unknown_ones(version: int) -> None:
    async def scenario(_broker: FakeBroker, port: int) -> None:
        response = await call(port, metadata_request(version, ["nope", "orders"]))
        errors = {t.name: t.error_code for t in response.topics}
        assert errors == {"nope": ErrorCode.unknown_topic_or_partition, "orders": ErrorCode.none}

    run(scenario)


def test_metadata_answers_each_requested_topic_once() -> None:
    """As Kafka's handleTopicMetadataRequest, which takes the request's topics as a set: a
    request naming a topic 5000 times gets one answer for it, not 5000."""

    async def scenario(_broker: FakeBroker, port: int) -> None:
        response = await call(port, metadata_request(12, ["orders", "nope"] * 2500))
        assert [(t.name, t.error_code) for t in response.topics] == [
            ("orders", ErrorCode.none), ("nope", ErrorCode.unknown_topic_or_partition)]

    run(scenario)


def test_metadata_answers_with_the_addresses_of_the_listener_asked_on() -> None:
    """KIP-103: a client that came in on listener CONSUMER_C1 is told CONSUMER_C1's
    addresses, brokers without that listener are left out, and a partition whose live
    leader lacks it is LISTENER_NOT_FOUND; the default listener still gets host and port."""
    broker = FakeBroker()
    broker.image = replace(broker.image, brokers={
        1: BrokerEndpoint(1, "127.0.0.1", 19092, listeners={"CONSUMER_C1": ("10.0.0.1", 29092)}),
        2: BrokerEndpoint(2, "127.0.0.1", 19093)})

    async def main() -> tuple[Any, Any]:
        default, own = KafkaServer(KafkaApis(broker)), KafkaServer(
            KafkaApis(broker), listener="CONSUMER_C1")
        await default.start("127.0.0.1", 0)
        await own.start("127.0.0.1", 0)
        try:
            return (await call(own.port, metadata_request(12, None)),
                    await call(default.port, metadata_request(12, None)))
        finally:
            await own.stop()
            await default.stop()

    on_own, on_default = asyncio.run(main())
    assert {(b.node_id, b.host, b.port) for b in on_own.brokers} == {(1, "10.0.0.1", 29092)}
    assert {(b.node_id, b.port) for b in on_default.brokers} == {(1, 19092), (2, 19093)}
    # orders-0 is led by broker 1 (on the listener), orders-1 by broker 3 (not alive).
    (topic,) = on_own.topics
    p0, p1 = sorted(topic.partitions, key=lambda p: p.partition_index)
    assert (p0.error_code, p0.leader_id) == (ErrorCode.none, 1)
    assert p1.error_code == ErrorCode.leader_not_available
    broker.image = replace(broker.image, topics={"orders": replace(
        broker.image.topics["orders"], partitions={
            0: PartitionRegistration((2, 1), (2, 1), 2, 5, 10)})})
    on_own, _ = asyncio.run(main())
    (p0,) = on_own.topics[0].partitions
    assert (p0.error_code, p0.leader_id) == (ErrorCode.listener_not_found, -1)


def test_metadata_v12_finds_topics_by_id() -> None:
    async def scenario(_broker: FakeBroker, port: int) -> None:
        from kio.schema.metadata.v12 import request as m

        unknown = uuid.uuid4()
        response = await call(port, m.MetadataRequest(
            topics=(m.MetadataRequestTopic(topic_id=ORDERS_ID, name=None),
                    m.MetadataRequestTopic(topic_id=unknown, name=None)),
            include_topic_authorized_operations=False))
        found = {t.topic_id: (t.name, t.error_code) for t in response.topics}
        assert found == {ORDERS_ID: ("orders", ErrorCode.none),
                         unknown: (None, ErrorCode.unknown_topic_id)}

    run(scenario)


@pytest.mark.parametrize("version", [10, 11])
def test_metadata_v10_and_v11_refuse_topic_ids_and_null_names(version: int) -> None:
    """v10 and v11 carry a topic id and a nullable name but serve neither (Kafka's
    handleTopicMetadataRequest throws InvalidRequestException, answered as
    MetadataRequest.getErrorResponse answers it). A null name once failed to encode in the
    answer, whose name is not nullable before v12, and closed the connection."""
    async def scenario(_broker: FakeBroker, port: int) -> None:
        m = request_module(ApiKey.METADATA, version)
        for topics in ((m.MetadataRequestTopic(topic_id=None, name=None),
                        m.MetadataRequestTopic(topic_id=None, name="orders")),
                       (m.MetadataRequestTopic(topic_id=ORDERS_ID, name="orders"),)):
            response = await call(port, build(
                m.MetadataRequest, topics=topics, allow_auto_topic_creation=False,
                include_cluster_authorized_operations=False,
                include_topic_authorized_operations=False))
            assert [(t.name, t.error_code, t.partitions) for t in response.topics] == [
                (t.name or "", ErrorCode.invalid_request, ()) for t in topics]
            assert response.brokers == ()

    run(scenario)


# -- Produce ----------------------------------------------------------------------------


@pytest.mark.parametrize("version", versions(ApiKey.PRODUCE))
@pytest.mark.parametrize("acks", [1, -1])
def test_produce_appends_and_reports_base_offsets(version: int, acks: int) -> None:
    async def scenario(broker: FakeBroker, port: int) -> None:
        for n in range(2):
            response = await call(port, produce_request(version, acks, {
                ("orders", 0): f"batch-{n}".encode(), ("orders", 5): b"lost", ("gone", 0): b"x"}))
            parts = partitions_of(response)
            assert (parts[("orders", 0)].error_code, parts[("orders", 0)].base_offset) == (
                ErrorCode.none, n)
            assert parts[("orders", 5)].error_code == ErrorCode.unknown_topic_or_partition
            assert parts[("gone", 0)].error_code == ErrorCode.unknown_topic_or_partition
        assert broker.logs[TopicPartition("orders", 0)] == [b"batch-0", b"batch-1"]

    run(scenario)


def test_acks_zero_produce_gets_no_response_and_keeps_the_connection() -> None:
    async def scenario(broker: FakeBroker, port: int) -> None:
        conn = await KafkaConnection.connect("127.0.0.1", port)
        assert await conn.request(produce_request(9, 0, {("orders", 0): b"fire"})) is None
        # The next response on the same connection answers the next request.
        response = await conn.request(produce_request(9, 1, {("orders", 0): b"and-ack"}))
        assert partitions_of(response)[("orders", 0)].base_offset == 1
        conn.close()
        assert broker.logs[TopicPartition("orders", 0)] == [b"fire", b"and-ack"]

    run(scenario)


def test_failed_acks_zero_produce_closes_the_connection() -> None:
    async def scenario(_broker: FakeBroker, port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(encode_request(produce_request(9, 0, {("gone", 0): b"x"}), 1, "t"))
        assert await reader.read() == b""  # closed: the producer's only error signal
        writer.close()

    run(scenario)


def test_write_txn_markers_reach_the_leaders_with_each_partitions_answer() -> None:
    """WriteTxnMarkers (the coordinator's): each producer's marker goes to the replicas in
    one append with request.timeout.ms; a partition the image lacks is answered
    UNKNOWN_TOPIC_OR_PARTITION without reaching them, and each partition keeps its own
    error."""
    m = request_module(ApiKey.WRITE_TXN_MARKERS, 1)

    async def scenario(broker: FakeBroker, port: int) -> None:
        response = await call(port, m.WriteTxnMarkersRequest(markers=(
            m.WritableTxnMarker(
                producer_id=i64(41), producer_epoch=i16(3), transaction_result=False,
                coordinator_epoch=i32(2), topics=(
                    m.WritableTxnMarkerTopic(name="orders", partition_indexes=(i32(0), i32(1))),
                    m.WritableTxnMarkerTopic(name="gone", partition_indexes=(i32(0),)))),
            m.WritableTxnMarker(
                producer_id=i64(42), producer_epoch=i16(0), transaction_result=True,
                coordinator_epoch=i32(2), topics=(
                    m.WritableTxnMarkerTopic(name="orders", partition_indexes=(i32(0),)),)))))
        answers = {(marker.producer_id, topic.name, part.partition_index): part.error_code
                   for marker in response.markers for topic in marker.topics
                   for part in topic.partitions}
        assert answers == {
            (41, "orders", 0): ErrorCode.none,
            (41, "orders", 1): ErrorCode.not_leader_or_follower,
            (41, "gone", 0): ErrorCode.unknown_topic_or_partition,
            (42, "orders", 0): ErrorCode.none}
        assert broker.markers == [
            (TxnMarker(41, 3, 2, ControlRecordType.ABORT,
                       (TopicPartition("orders", 0), TopicPartition("orders", 1))), 30000),
            (TxnMarker(42, 0, 2, ControlRecordType.COMMIT, (TopicPartition("orders", 0),)),
             30000)]

    run(scenario)


def test_produce_of_more_than_one_batch_per_partition_is_refused() -> None:
    """Kafka's ProduceRequest.validateRecords (v3+): one record batch per partition, so a
    partition's append costs one batch's header work. The first batch's length field says
    where it ends; a second batch after it gets INVALID_RECORD, and nothing is appended."""
    one = build_batch([b"a", b"b"])

    async def scenario(broker: FakeBroker, port: int) -> None:
        response = await call(port, produce_request(9, 1, {("orders", 0): one + one,
                                                           ("orders", 1): one}))
        parts = partitions_of(response)
        assert parts[("orders", 0)].error_code == ErrorCode.invalid_record
        assert "exactly one record batch" in parts[("orders", 0)].error_message
        assert parts[("orders", 1)].error_code == ErrorCode.none
        assert broker.logs == {TopicPartition("orders", 0): [], TopicPartition("orders", 1): [one]}

    run(scenario)


def test_produce_to_the_offsets_topic_is_refused_but_to_the_admin_client() -> None:
    """Kafka's ReplicaManager.appendToLocalLog: a client may not append to an internal
    topic (INVALID_TOPIC_EXCEPTION), unless its client id is the admin client's: the group
    coordinator replays __consumer_offsets on every load, and the fuzzer's records got
    there."""
    offsets = TopicPartition("__consumer_offsets", 0)
    batch = build_batch([b"not a group record"])

    async def scenario(broker: FakeBroker, port: int) -> None:
        broker.image = replace(broker.image, topics={**broker.image.topics, offsets.topic: (
            TopicImage(offsets.topic, uuid.uuid4().hex, {},
                       {0: PartitionRegistration((1,), (1,), 1, 0, 0)}))})
        broker.logs[offsets] = []
        response = await call(port, produce_request(9, 1, {(offsets.topic, 0): batch}))
        part = partitions_of(response)[(offsets.topic, 0)]
        assert part.error_code == ErrorCode.invalid_topic_exception
        assert broker.logs[offsets] == []
        admin = await KafkaConnection.connect("127.0.0.1", port, client_id="__admin_client")
        response = await admin.request(produce_request(9, 1, {(offsets.topic, 0): batch}))
        admin.close()
        assert partitions_of(response)[(offsets.topic, 0)].error_code == ErrorCode.none
        assert broker.logs[offsets] == [batch]

    run(scenario)


def test_produce_of_a_batch_over_message_max_bytes_is_refused() -> None:
    """Kafka's message.max.bytes (1048588 by default): MESSAGE_TOO_LARGE, nothing
    appended."""
    big = build_batch([bytes(1 << 20)])
    assert len(big) > 1048588

    async def scenario(broker: FakeBroker, port: int) -> None:
        response = await call(port, produce_request(9, 1, {("orders", 0): big}))
        part = partitions_of(response)[("orders", 0)]
        assert part.error_code == ErrorCode.message_too_large
        assert "exceeds the maximum configured value of 1048588" in part.error_message
        assert broker.logs[TopicPartition("orders", 0)] == []

    run(scenario)


def test_fetch_answers_hold_at_most_fetch_max_bytes() -> None:
    """Kafka's fetch.max.bytes (55 MiB by default) caps what a request asks for, a
    follower's included."""

    async def scenario(broker: FakeBroker, port: int) -> None:
        request = replace(fetch_request(12, {("orders", 0): 0}, replica_id=2),
                          max_bytes=2**31 - 1)
        await call(port, request)
        await call(port, replace(request, max_bytes=1000))
        assert [r.max_bytes for r in broker.fetch_requests] == [57671680, 1000]

    run(scenario)


@pytest.mark.parametrize("version", [12, 13])
def test_fetch_answers_a_partition_named_again_once(version: int) -> None:
    """Kafka's FetchRequest.fetchData is a map: a partition named again replaces the first
    (its place kept) and is read and answered once. Answered as often as named, 9,000 copies
    of one partition holding 200 KB made a 144 KB request a 1.8 GB answer."""
    async def scenario(broker: FakeBroker, port: int) -> None:
        once = fetch_request(version, {("orders", 0): 0, ("orders", 1): 0})
        (topic,) = once.topics
        first, second = topic.partitions
        again = replace(topic, partitions=(first, second, replace(first, fetch_offset=1)))
        response = await call(port, replace(once, topics=(again, replace(
            topic, partitions=(replace(first, fetch_offset=2),)))))
        (answered,) = response.responses
        assert [p.partition_index for p in answered.partitions] == [0, 1]
        (fetch,) = broker.fetch_requests
        assert [(p.tp.partition, p.fetch_offset) for p in fetch.partitions] == [(0, 2), (1, 0)]

    run(scenario)


def test_produce_with_invalid_acks_is_refused() -> None:
    async def scenario(broker: FakeBroker, port: int) -> None:
        response = await call(port, produce_request(9, 2, {("orders", 0): b"x"}))
        assert partitions_of(response)[("orders", 0)].error_code == ErrorCode.invalid_required_acks
        assert broker.logs[TopicPartition("orders", 0)] == []

    run(scenario)


# -- Fetch ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", versions(ApiKey.FETCH))
def test_fetch_returns_records_and_partition_state(version: int) -> None:
    async def scenario(broker: FakeBroker, port: int) -> None:
        broker.logs[TopicPartition("orders", 0)] += [b"b0", b"b1", b"b2"]
        response = await call(port, fetch_request(
            version, {("orders", 0): 1, ("orders", 7): 0, ("gone", 0): 0}, replica_id=2,
            replica_epoch=11, isolation_level=1))
        if version >= 7:
            assert (response.error_code, response.session_id) == (ErrorCode.none, 0)
        parts = partitions_of(response)
        p0 = parts[("orders", 0)]
        assert (p0.error_code, p0.high_watermark, p0.last_stable_offset) == (ErrorCode.none, 3, 3)
        assert p0.records == b"b1b2"
        assert p0.aborted_transactions is None  # null: a follower reads every record
        if version >= 5:
            assert p0.log_start_offset == 0
        if version >= 11:
            assert p0.preferred_read_replica == -1
        assert parts[("orders", 7)].error_code == ErrorCode.unknown_topic_or_partition
        assert parts[("gone", 0)].error_code == (
            ErrorCode.unknown_topic_id if version >= 13 else ErrorCode.unknown_topic_or_partition)
        (seen,) = broker.fetch_requests
        assert (seen.replica_id, seen.isolation_level) == (2, 1)
        # v15 (KIP-903) carries the follower's broker epoch.
        assert seen.replica_epoch == (11 if version >= 15 else -1)
        assert [p.tp for p in seen.partitions] == [TopicPartition("orders", 0)]

    run(scenario)


def test_fetch_waits_for_data_without_blocking_other_connections() -> None:
    async def scenario(broker: FakeBroker, port: int) -> None:
        waiting = asyncio.create_task(
            call(port, fetch_request(12, {("orders", 0): 0}, max_wait_ms=8000)))
        deadline = asyncio.get_running_loop().time() + 5
        while not broker.parked:  # the fetch waits in the purgatory
            assert asyncio.get_running_loop().time() < deadline, "the fetch was not parked"
            await asyncio.sleep(0.01)
        await call(port, produce_request(9, 1, {("orders", 0): b"late"}))
        response = await waiting
        assert partitions_of(response)[("orders", 0)].records == b"late"

    run(scenario)


@pytest.mark.parametrize("version", [7, 12, 15])
def test_a_fetch_session_names_only_what_changed(version: int) -> None:
    """KIP-227 on the wire: a full fetch opens a session; an incremental one naming nothing
    reads the whole session and is answered with what changed only; a forgotten partition
    is read no more; a wrong epoch or an unknown session is refused with no partition."""
    o0, o1 = TopicPartition("orders", 0), TopicPartition("orders", 1)

    async def scenario(broker: FakeBroker, port: int) -> None:
        broker.logs[o0].append(b"b0")
        opened = await call(port, fetch_request(
            version, {("orders", 0): 0, ("orders", 1): 0}, session_epoch=0, replica_id=2))
        assert opened.error_code == ErrorCode.none and opened.session_id != 0
        assert set(partitions_of(opened)) == {("orders", 0), ("orders", 1)}
        session = opened.session_id
        # The follower took b0 and asks from offset 1; nothing new: the leader reads both
        # partitions (orders-1 at its cached position) and names neither.
        quiet = await call(port, fetch_request(version, {("orders", 0): 1},
                                               session_id=session, session_epoch=1))
        assert (quiet.error_code, quiet.session_id, quiet.responses) == (
            ErrorCode.none, session, ())
        assert {(p.tp, p.fetch_offset) for p in broker.fetch_requests[-1].partitions} == {
            (o0, 1), (o1, 0)}
        # A record arrives in orders-1: an incremental fetch naming nothing gets it.
        broker.logs[o1].append(b"c0")
        moved = await call(port, fetch_request(version, {}, session_id=session,
                                               session_epoch=2))
        parts = partitions_of(moved)
        assert set(parts) == {("orders", 1)}
        assert (parts[("orders", 1)].records, parts[("orders", 1)].high_watermark) == (b"c0", 1)
        # Forgotten, orders-1 is read no more.
        await call(port, fetch_request(version, {}, session_id=session, session_epoch=3,
                                       forgotten=[("orders", 1)]))
        assert [p.tp for p in broker.fetch_requests[-1].partitions] == [o0]
        stale = await call(port, fetch_request(version, {}, session_id=session,
                                               session_epoch=3))
        assert (stale.error_code, stale.responses) == (
            ErrorCode.invalid_fetch_session_epoch, ())
        unknown = await call(port, fetch_request(version, {}, session_id=session + 1,
                                                 session_epoch=1))
        assert unknown.error_code == ErrorCode.fetch_session_id_not_found
        # A sessionless fetch (epoch -1, what librdkafka sends) opens nothing.
        sessionless = await call(port, fetch_request(version, {("orders", 0): 0}))
        assert sessionless.session_id == 0
        assert partitions_of(sessionless)[("orders", 0)].records == b"b0"

    run(scenario)


def test_responses_keep_request_order_on_a_pipelined_connection() -> None:
    async def scenario(broker: FakeBroker, port: int) -> None:
        from kio.schema.api_versions.v3 import request as av

        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(encode_request(fetch_request(12, {("orders", 0): 0}, max_wait_ms=300), 1, "t"))
        writer.write(encode_request(av.ApiVersionsRequest(
            client_software_name="t", client_software_version="1"), 2, "t"))
        order = []
        for _ in range(2):
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            frame = await reader.readexactly(size)
            order.append(struct.unpack_from(">i", frame)[0])
        assert order == [1, 2]
        writer.close()

    run(scenario)


# -- ListOffsets / OffsetForLeaderEpoch ---------------------------------------------------


@pytest.mark.parametrize("version", versions(ApiKey.LIST_OFFSETS))
def test_list_offsets_earliest_and_latest(version: int) -> None:
    async def scenario(broker: FakeBroker, port: int) -> None:
        broker.logs[TopicPartition("orders", 0)] += [b"b0", b"b1"]
        m = request_module(ApiKey.LIST_OFFSETS, version)
        partitions = tuple(build(m.ListOffsetsPartition, partition_index=p, timestamp=ts,
                                 current_leader_epoch=4)
                           for p, ts in ((0, -2), (0, -1), (9, -1)))
        response = await call(port, build(
            m.ListOffsetsRequest, replica_id=-1, isolation_level=1,
            topics=(m.ListOffsetsTopic(name="orders", partitions=partitions),)))
        answers = [(p.partition_index, p.error_code, p.offset)
                   for p in response.topics[0].partitions]
        assert answers == [(0, ErrorCode.none, 0), (0, ErrorCode.none, 2),
                           (9, ErrorCode.unknown_topic_or_partition, -1)]
        if version >= 4:
            assert response.topics[0].partitions[0].leader_epoch == 4
        expected_isolation = 1 if version >= 2 else 0
        expected_epoch = 4 if version >= 4 else -1
        assert broker.list_offset_calls[0] == (
            TopicPartition("orders", 0), -2, expected_epoch, expected_isolation, -1)

    run(scenario)


@pytest.mark.parametrize("version", versions(ApiKey.OFFSET_FOR_LEADER_EPOCH))
def test_offset_for_leader_epoch(version: int) -> None:
    async def scenario(broker: FakeBroker, port: int) -> None:
        broker.logs[TopicPartition("orders", 0)] += [b"b0", b"b1", b"b2"]
        m = request_module(ApiKey.OFFSET_FOR_LEADER_EPOCH, version)
        partitions = tuple(
            m.OffsetForLeaderPartition(partition=p, current_leader_epoch=cur, leader_epoch=e)
            for p, cur, e in ((0, 4, 4), (0, 3, 2), (8, -1, 1)))
        response = await call(port, build(
            m.OffsetForLeaderEpochRequest, replica_id=2,
            topics=(m.OffsetForLeaderTopic(topic="orders", partitions=partitions),)))
        answers = [(p.error_code, p.leader_epoch, p.end_offset)
                   for p in response.topics[0].partitions]
        assert answers == [(ErrorCode.none, 4, 3), (ErrorCode.fenced_leader_epoch, -1, -1),
                           (ErrorCode.unknown_topic_or_partition, -1, -1)]

    run(scenario)


# -- CreateTopics -------------------------------------------------------------------------


def create_topics_request(version: int, *topics: tuple[str, int, int], timeout_ms: int = 5000,
                          validate_only: bool = False, configs: dict[str, str] | None = None
                          ) -> Any:
    m = request_module(ApiKey.CREATE_TOPICS, version)
    return m.CreateTopicsRequest(
        topics=tuple(m.CreatableTopic(
            name=name, num_partitions=partitions, replication_factor=rf, assignments=(),
            configs=tuple(m.CreatableTopicConfig(name=k, value=v)
                          for k, v in (configs or {}).items()))
            for name, partitions, rf in topics),
        timeout=datetime.timedelta(milliseconds=timeout_ms), validate_only=validate_only)


@pytest.mark.parametrize("version", versions(ApiKey.CREATE_TOPICS))
def test_create_topics_forwards_and_reports_each_topic(version: int) -> None:
    async def scenario(broker: FakeBroker, port: int) -> None:
        response = await call(port, create_topics_request(
            version, ("payments", 3, 2), ("orders", 1, 1),
            configs={"min.insync.replicas": "2"}))
        results = {r.name: r for r in response.topics}
        assert results["payments"].error_code == ErrorCode.none
        assert results["orders"].error_code == ErrorCode.topic_already_exists
        assert "already exists" in results["orders"].error_message
        assert broker.created[0] == ("payments", 3, 2, {"min.insync.replicas": "2"})
        if version >= 5:
            assert (results["payments"].num_partitions,
                    results["payments"].replication_factor) == (3, 2)
        if version >= 7:
            assert results["payments"].topic_id == uuid.UUID(
                broker.image.topics["payments"].topic_id)

    run(scenario)


def test_create_topics_with_defaults_reports_what_was_created() -> None:
    async def scenario(broker: FakeBroker, port: int) -> None:
        response = await call(port, create_topics_request(7, ("logs", -1, -1)))
        (result,) = response.topics
        assert (result.error_code, result.num_partitions, result.replication_factor) == (
            ErrorCode.none, 1, 1)
        assert broker.created[0][1:3] == (-1, -1)

    run(scenario)


def test_create_topics_times_out_and_refuses_validate_only() -> None:
    async def scenario(broker: FakeBroker, port: int) -> None:
        slow = await call(port, create_topics_request(7, (NEVER_ANSWERED, 1, 1), timeout_ms=100))
        assert slow.topics[0].error_code == ErrorCode.request_timed_out
        dry = await call(port, create_topics_request(7, ("dry", 1, 1), validate_only=True))
        assert dry.topics[0].error_code == ErrorCode.invalid_request
        assert [c[0] for c in broker.created] == [NEVER_ANSWERED]

    run(scenario)


def test_create_topics_over_kafkas_partition_cap_is_refused_whole() -> None:
    """Kafka's MAX_PARTITIONS_PER_BATCH (10,000, KAFKA-14996): a CreateTopics whose topics
    would make more partitions together is refused whole with POLICY_VIOLATION, and nothing
    reaches the controller. The fuzzer's 10,001 partitions once fenced every broker of a
    3-broker cluster, over and over; its 2**31-1 would have had the controller build them."""
    async def scenario(broker: FakeBroker, port: int) -> None:
        for topics in ((("huge", 2**31 - 1, 1),), (("a", 6000, 1), ("b", 4001, 1))):
            response = await call(port, create_topics_request(7, *topics))
            assert [(r.name, r.error_code, r.error_message) for r in response.topics] == [
                (name, ErrorCode.policy_violation,
                 "Excessively large number of partitions per request.")
                for name, _, _ in topics]
        assert broker.created == []
        response = await call(port, create_topics_request(7, ("a", 6000, 1), ("b", 4000, 1)))
        assert [r.error_code for r in response.topics] == [ErrorCode.none] * 2

    run(scenario)


# -- InitProducerId -----------------------------------------------------------------------


def init_producer_id_request(version: int, transactional_id: str | None = None,
                             producer_id: int = -1, producer_epoch: int = -1) -> Any:
    m = request_module(ApiKey.INIT_PRODUCER_ID, version)
    return build(m.InitProducerIdRequest, transactional_id=transactional_id,
                 transaction_timeout=datetime.timedelta(seconds=60), producer_id=producer_id,
                 producer_epoch=producer_epoch)


@pytest.mark.parametrize("version", versions(ApiKey.INIT_PRODUCER_ID))
def test_init_producer_id_gives_each_idempotent_producer_a_fresh_id(version: int) -> None:
    async def scenario(broker: FakeBroker, port: int) -> None:
        answers = [await call(port, init_producer_id_request(version)) for _ in range(2)]
        assert [(a.error_code, a.producer_id, a.producer_epoch) for a in answers] == [
            (ErrorCode.none, 4000, 0), (ErrorCode.none, 4001, 0)]
        assert broker.next_producer_id == 4002

    run(scenario)


def test_init_producer_id_epoch_bump_gets_a_fresh_id_as_in_kafka() -> None:
    async def scenario(broker: FakeBroker, port: int) -> None:
        bump = await call(port, init_producer_id_request(4, producer_id=4000, producer_epoch=3))
        assert (bump.error_code, bump.producer_id, bump.producer_epoch) == (
            ErrorCode.none, 4000, 0)
        half = await call(port, init_producer_id_request(4, producer_id=4000))
        assert half.error_code == ErrorCode.invalid_request
        broker.producer_id_error = ErrorCode.coordinator_load_in_progress
        waiting = await call(port, init_producer_id_request(4))
        assert (waiting.error_code, waiting.producer_id) == (
            ErrorCode.coordinator_load_in_progress, -1)

    run(scenario)


# -- FindCoordinator ----------------------------------------------------------------------


@pytest.mark.parametrize("version", versions(ApiKey.FIND_COORDINATOR))
def test_find_coordinator_is_unavailable_while_the_offsets_topic_is_created(
        version: int) -> None:
    """Every version; the coordinator found once the topic exists: test_group_apis.py."""
    async def scenario(broker: FakeBroker, port: int) -> None:
        m = request_module(ApiKey.FIND_COORDINATOR, version)
        response = await call(port, build(m.FindCoordinatorRequest, key="group-a", key_type=0,
                                          coordinator_keys=("group-a", "group-b")))
        answers = getattr(response, "coordinators", None) or (response,)
        assert {(a.error_code, a.node_id) for a in answers} == {
            (ErrorCode.coordinator_not_available, -1)}
        if version >= 4:
            assert [c.key for c in answers] == ["group-a", "group-b"]
        for _ in range(500):  # the creation is a task of its own: wait for it, bounded
            if broker.created:
                break
            await asyncio.sleep(0.01)
        assert [c[0] for c in broker.created] == ["__consumer_offsets"]

    run(scenario)


def test_core_failure_closes_only_that_connection() -> None:
    async def scenario(broker: FakeBroker, port: int) -> None:
        def broken(*_args: Any) -> Any:
            raise RuntimeError("core bug")

        broker.last_offset_for_leader_epoch = broken  # type: ignore[method-assign]
        healthy = await KafkaConnection.connect("127.0.0.1", port)
        m = request_module(ApiKey.OFFSET_FOR_LEADER_EPOCH, 4)
        with pytest.raises(KafkaConnectionError):
            await call(port, m.OffsetForLeaderEpochRequest(topics=(m.OffsetForLeaderTopic(
                topic="orders", partitions=(m.OffsetForLeaderPartition(
                    partition=0, leader_epoch=1),)),)))
        response = await healthy.request(metadata_request(12, None))
        assert response.topics[0].name == "orders"
        healthy.close()

    run(scenario)

