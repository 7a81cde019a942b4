"""The partition side of transactions on a real 3-broker cluster, read by stock consumers.

The test plays the transaction coordinator over the wire (its Produce of transactional
batches, then its WriteTxnMarkers; the cluster runs with
``transaction.partition.verification.enable=false``, as there is no coordinator to verify
with), so what is checked is the leader's: the last stable
offset stays at the first open transaction's first offset while it is open (Fetch and
ListOffsets with READ_COMMITTED), the markers move it once the high watermark passes
them, and a ``read_committed`` consumer (librdkafka, kafka-python) gets the committed and
non-transactional records but never the aborted ones, which a ``read_uncommitted`` one
gets. Offsets, derived by hand: A's transaction 0-1, a plain batch 2, B's transaction 3,
A's ABORT marker 4, B's COMMIT marker 5."""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition
from kio.schema.fetch.v12 import request as fetch_req
from kio.schema.init_producer_id.v4 import request as init_req
from kio.schema.list_offsets.v7 import request as list_req
from kio.schema.produce.v9 import request as produce_req
from kio.schema.write_txn_markers.v1 import request as markers_req
from kio.static.primitive import i8, i16, i32, i64
from test_broker_processes import get_json, wait_for
from test_interop_clients import BROKERS, Cluster, _minibroker, running_cluster
from test_txn_interop import ask

from minibroker.cluster.types import ErrorCode
from minibroker.storage.records import TRANSACTIONAL_FLAG, build_batch

TOPIC = "txn-markers"
READ_UNCOMMITTED, READ_COMMITTED = 0, 1
COMMITTED_VALUES = [b"plain-0", b"b-0"]
ALL_VALUES = [b"a-0", b"a-1", b"plain-0", b"b-0"]
END = 6  # past B's COMMIT marker


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("txn-markers"),
                         "transaction.partition.verification.enable=false") as (cluster, _):
        wait_for(lambda: _minibroker(
            "topics", "create", "--bootstrap", f"127.0.0.1:{cluster.base_port + 1}",
            "--topic", TOPIC, "--partitions", "1",
            "--replication-factor", str(BROKERS)).returncode == 0, 45, f"topic {TOPIC}")
        wait_for(lambda: len(_partition(cluster)["isr"]) == BROKERS, 30, "a full ISR")
        yield cluster


def _partition(cluster: Cluster) -> dict[str, Any]:
    controller = get_json(cluster.base_port + 100)
    return controller["topics"][TOPIC]["partitions"]["0"]


def produce(cluster: Cluster, leader: int, records: bytes) -> int:
    answer = ask(cluster, leader, produce_req.ProduceRequest(
        transactional_id="stand-in", acks=i16(-1), timeout=datetime.timedelta(seconds=10),
        topic_data=(produce_req.TopicProduceData(name=TOPIC, partition_data=(
            produce_req.PartitionProduceData(index=i32(0), records=records),)),)))
    (part,) = answer.responses[0].partition_responses
    assert part.error_code == ErrorCode.none, part
    return part.base_offset


def latest(cluster: Cluster, leader: int, isolation: int) -> int:
    answer = ask(cluster, leader, list_req.ListOffsetsRequest(
        replica_id=i32(-1), isolation_level=i8(isolation), topics=(list_req.ListOffsetsTopic(
            name=TOPIC, partitions=(list_req.ListOffsetsPartition(
                partition_index=i32(0), current_leader_epoch=i32(-1),
                timestamp=i64(-1)),)),)))
    (part,) = answer.topics[0].partitions
    assert part.error_code == ErrorCode.none, part
    return part.offset


def fetch_committed(cluster: Cluster, leader: int) -> Any:
    answer = ask(cluster, leader, fetch_req.FetchRequest(
        replica_id=i32(-1), max_wait=datetime.timedelta(0), min_bytes=i32(1),
        max_bytes=i32(1 << 20), isolation_level=i8(READ_COMMITTED), session_id=i32(0),
        session_epoch=i32(-1), topics=(fetch_req.FetchTopic(topic=TOPIC, partitions=(
            fetch_req.FetchPartition(partition=i32(0), current_leader_epoch=i32(-1),
                                     fetch_offset=i64(0), last_fetched_epoch=i32(-1),
                                     log_start_offset=i64(-1),
                                     partition_max_bytes=i32(1 << 20)),)),),
        forgotten_topics_data=(), rack_id=""))
    return answer.responses[0].partitions[0]


def confluent_read(cluster: Cluster, isolation: str) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"g-{isolation}",
                         "isolation.level": isolation, "enable.auto.commit": False})
    tp = TopicPartition(TOPIC, 0, 0)
    consumer.assign([tp])
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while consumer.position([tp])[0].offset < END and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value())
        assert consumer.position([tp])[0].offset == END
    finally:
        consumer.close()
    return values


def kafka_python_read(cluster: Cluster, isolation: str) -> list[bytes]:
    consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap, isolation_level=isolation,
                             enable_auto_commit=False)
    tp = KafkaTopicPartition(TOPIC, 0)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while consumer.position(tp) < END and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                values.extend(record.value for record in records)
        assert consumer.position(tp) == END
    finally:
        consumer.close()
    return values


def test_aborted_records_never_reach_read_committed_consumers(cluster: Cluster) -> None:
    leader = _partition(cluster)["leader"]
    pid_a, pid_b = (ask(cluster, leader, init_req.InitProducerIdRequest(
        transactional_id=None, transaction_timeout=datetime.timedelta(seconds=60),
        producer_id=i64(-1), producer_epoch=i16(-1))).producer_id for _ in range(2))

    def txn(pid: int, values: list[bytes]) -> bytes:
        return build_batch(values, producer_id=pid, producer_epoch=0, base_sequence=0,
                           attributes=TRANSACTIONAL_FLAG)

    assert produce(cluster, leader, txn(pid_a, [b"a-0", b"a-1"])) == 0
    assert produce(cluster, leader, build_batch([b"plain-0"])) == 2
    assert produce(cluster, leader, txn(pid_b, [b"b-0"])) == 3
    # A's transaction is open from offset 0: nothing is stable yet.
    assert latest(cluster, leader, READ_UNCOMMITTED) == 4
    assert latest(cluster, leader, READ_COMMITTED) == 0
    open_fetch = fetch_committed(cluster, leader)
    assert (open_fetch.high_watermark, open_fetch.last_stable_offset) == (4, 0)
    assert not open_fetch.records

    answer = ask(cluster, leader, markers_req.WriteTxnMarkersRequest(markers=tuple(
        markers_req.WritableTxnMarker(
            producer_id=i64(pid), producer_epoch=i16(0), transaction_result=commit,
            coordinator_epoch=i32(0), topics=(markers_req.WritableTxnMarkerTopic(
                name=TOPIC, partition_indexes=(i32(0),)),))
        for pid, commit in ((pid_a, False), (pid_b, True)))))
    assert [p.error_code for m in answer.markers for t in m.topics for p in t.partitions] == [
        ErrorCode.none, ErrorCode.none]
    # acks=-1: the markers are answered once replicated, so the HW is past both.
    assert latest(cluster, leader, READ_COMMITTED) == END
    stable = fetch_committed(cluster, leader)
    assert (stable.high_watermark, stable.last_stable_offset) == (END, END)
    assert [(t.producer_id, t.first_offset) for t in stable.aborted_transactions] == [
        (pid_a, 0)]

    assert confluent_read(cluster, "read_committed") == COMMITTED_VALUES
    assert confluent_read(cluster, "read_uncommitted") == ALL_VALUES
    assert kafka_python_read(cluster, "read_committed") == COMMITTED_VALUES
    assert kafka_python_read(cluster, "read_uncommitted") == ALL_VALUES


def test_a_marker_from_an_older_coordinator_is_fenced(cluster: Cluster) -> None:
    leader = _partition(cluster)["leader"]
    pid = ask(cluster, leader, init_req.InitProducerIdRequest(
        transactional_id=None, transaction_timeout=datetime.timedelta(seconds=60),
        producer_id=i64(-1), producer_epoch=i16(-1))).producer_id

    def end(coordinator_epoch: int) -> ErrorCode:
        answer = ask(cluster, leader, markers_req.WriteTxnMarkersRequest(markers=(
            markers_req.WritableTxnMarker(
                producer_id=i64(pid), producer_epoch=i16(0), transaction_result=True,
                coordinator_epoch=i32(coordinator_epoch), topics=(
                    markers_req.WritableTxnMarkerTopic(name=TOPIC,
                                                       partition_indexes=(i32(0),)),)),)))
        return answer.markers[0].topics[0].partitions[0].error_code

    assert end(3) == ErrorCode.none
    assert end(2) == ErrorCode.transaction_coordinator_fenced
