"""Stock Kafka clients against a real 3-broker minibroker cluster.

confluent-kafka (librdkafka), kafka-python and kcat are used unchanged, with the configs a
user would set; each test writes its own topic and reads every record back in order with
the offsets the producer was told. The cluster runs as ``minibroker cluster`` in its own
process group and is torn down with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import tools
from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, Producer
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)
from confluent_kafka.error import KafkaException
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTopicPartition
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12 import request as metadata_req
from ports import free_base_port
from processes import stop_group

from minibroker.network.client import KafkaClientError, KafkaConnection

pytestmark = pytest.mark.slow

BROKERS = 3
RECORDS = 200
STARTUP_TIMEOUT_S = 45
TOPICS = {"confluent": 3, "kafka-python": 3, "kcat": 1}  # topic -> partitions (one per acks)
ACKS = ["0", "1", "all"]


@dataclass(frozen=True)
class Cluster:
    base_port: int
    log: Path

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{self.base_port + i}" for i in range(1, BROKERS + 1))


def _minibroker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "minibroker", *args], capture_output=True,
                          text=True, timeout=30, check=False)


async def _topics_ready(cluster: Cluster) -> set[str]:
    """Topics whose every partition has a live leader and a full ISR."""
    conn = await KafkaConnection.connect("127.0.0.1", cluster.base_port + 1, timeout=2)
    try:
        response = await conn.request(metadata_req.MetadataRequest(
            topics=None, include_topic_authorized_operations=False), timeout=2)
    finally:
        conn.close()
    return {
        t.name for t in response.topics
        if t.error_code == ErrorCode.none and len(t.partitions) == TOPICS.get(t.name)
        and all(p.error_code == ErrorCode.none and p.leader_id >= 0
                and len(p.isr_nodes) == BROKERS for p in t.partitions)
    }


@contextlib.contextmanager
def running_cluster(workdir: Path, *config: str
                    ) -> Iterator[tuple[Cluster, subprocess.Popen[bytes]]]:
    """``minibroker cluster`` (with ``--config`` pairs) in its own process group, torn down
    with it."""
    cluster = Cluster(free_base_port(BROKERS + 1), workdir / "cluster.log")
    with cluster.log.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "minibroker", "cluster", "--brokers", str(BROKERS),
             "--base-port", str(cluster.base_port), "--data-dir", str(workdir / "data"),
             *(arg for pair in config for arg in ("--config", pair))],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield cluster, process
    finally:
        stop_group(process)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("interop")) as (cluster, process):
        _wait_until_ready(cluster, process)
        yield cluster


def _wait_until_ready(cluster: Cluster, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    base = cluster.base_port
    pending = dict(TOPICS)
    ready: set[str] = set()
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"cluster exited with {process.returncode}:\n{cluster.log.read_text()}")
        for topic, partitions in list(pending.items()):
            created = _minibroker("topics", "create", "--bootstrap", f"127.0.0.1:{base + 1}",
                                  "--topic", topic, "--partitions", str(partitions),
                                  "--replication-factor", str(BROKERS))
            if created.returncode == 0 or "TOPIC_ALREADY_EXISTS" in created.stderr:
                del pending[topic]
        if not pending:
            try:
                ready = asyncio.run(_topics_ready(cluster))
            except (KafkaClientError, OSError):
                ready = set()
            if ready == set(TOPICS):
                return
        time.sleep(0.2)
    pytest.fail(f"topics not created {sorted(pending)} or not fully replicated "
                f"{sorted(set(TOPICS) - ready)} within {STARTUP_TIMEOUT_S} s:\n"
                f"{cluster.log.read_text()[-5000:]}")


def _payloads(label: str) -> list[bytes]:
    return [f"{label}-{i}".encode() for i in range(RECORDS)]


# -- confluent-kafka (librdkafka) ---------------------------------------------------------


def _confluent_produce(bootstrap: str, acks: str, partition: int) -> list[tuple[object, int]]:
    """(error, offset) of each delivery report, in send order."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 5})
    reports: list[tuple[object, int]] = []

    def on_delivery(err: object, msg: Message) -> None:
        reports.append((err, msg.offset()))

    for value in _payloads(f"ck-acks-{acks}"):
        producer.produce("confluent", value=value, partition=partition, on_delivery=on_delivery)
    assert producer.flush(30) == 0
    return reports


def test_confluent_kafka_produces_with_every_acks_and_reads_back_in_order(cluster: Cluster
                                                                         ) -> None:
    for partition, acks in enumerate(ACKS):
        reports = _confluent_produce(cluster.bootstrap, acks, partition)
        assert [err for err, _ in reports] == [None] * RECORDS
        if acks != "0":  # acks=0 gets no offsets back
            assert [offset for _, offset in reports] == list(range(RECORDS))

    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "interop-ck",
                         "enable.auto.commit": False})
    try:
        for partition, acks in enumerate(ACKS):
            consumer.assign([CkTopicPartition("confluent", partition, OFFSET_BEGINNING)])
            read: list[tuple[int, bytes]] = []
            deadline = time.monotonic() + 20
            while len(read) < RECORDS and time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is None:
                    continue
                assert message.error() is None, message.error()
                assert message.partition() == partition
                read.append((message.offset(), message.value()))
            assert read == list(enumerate(_payloads(f"ck-acks-{acks}")))
            low, high = consumer.get_watermark_offsets(
                CkTopicPartition("confluent", partition), timeout=10)
            assert (low, high) == (0, RECORDS)
    finally:
        consumer.close()


# -- kafka-python -------------------------------------------------------------------------


def _get_state(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/state", timeout=5) as response:
        return json.load(response)


def _producers_on_leader(cluster: Cluster, topic: str, partition: int) -> int:
    """Idempotent producers in the leader's producer state for the partition."""
    controller = _get_state(cluster.base_port + 100)
    leader = controller["topics"][topic]["partitions"][str(partition)]["leader"]
    state = _get_state(cluster.base_port + 100 + leader)
    return next(p["producers"] for p in state["partitions"]
                if (p["topic"], p["partition"]) == (topic, partition))


def test_kafka_python_produces_with_every_acks_and_reads_back_in_order(cluster: Cluster
                                                                      ) -> None:
    for partition, acks in enumerate(ACKS):
        # kafka-python's defaults are an idempotent producer with acks=all; a smaller acks
        # needs idempotence off.
        config = {} if acks == "all" else {"acks": int(acks), "enable_idempotence": False}
        producer = KafkaProducer(bootstrap_servers=cluster.bootstrap, linger_ms=5, **config)
        try:
            futures = [producer.send("kafka-python", value=value, partition=partition)
                       for value in _payloads(f"kp-acks-{acks}")]
            producer.flush(30)
            metadata = [f.get(timeout=10) for f in futures]
        finally:
            producer.close(5)
        if acks != "0":
            assert [m.offset for m in metadata] == list(range(RECORDS))
        # Only the default producer's batches carry a producer id.
        assert _producers_on_leader(cluster, "kafka-python", partition) == (
            1 if acks == "all" else 0)

    for partition, acks in enumerate(ACKS):
        consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap, group_id=None,
                                 enable_auto_commit=False)
        try:
            tp = KpTopicPartition("kafka-python", partition)
            consumer.assign([tp])
            consumer.seek_to_beginning(tp)
            read: list[tuple[int, bytes]] = []
            deadline = time.monotonic() + 20
            while len(read) < RECORDS and time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=500).values():
                    read += [(r.offset, r.value) for r in records]
            assert read == list(enumerate(_payloads(f"kp-acks-{acks}")))
        finally:
            consumer.close()


# -- kcat ---------------------------------------------------------------------------------

def test_kcat_lists_brokers_and_topics(cluster: Cluster) -> None:
    listed = subprocess.run([tools.kcat(), "-b", cluster.bootstrap, "-L", "-J"],
                            capture_output=True, text=True, timeout=30, check=True)
    metadata = json.loads(listed.stdout)
    assert sorted(b["id"] for b in metadata["brokers"]) == [1, 2, 3]
    assert {b["name"] for b in metadata["brokers"]} == {
        f"127.0.0.1:{cluster.base_port + i}" for i in range(1, BROKERS + 1)}
    topics = {t["topic"]: t for t in metadata["topics"]}
    assert set(TOPICS) <= set(topics)
    (partition,) = topics["kcat"]["partitions"]
    assert partition["leader"] in (1, 2, 3)
    assert sorted(r["id"] for r in partition["replicas"]) == [1, 2, 3]
    assert sorted(r["id"] for r in partition["isrs"]) == [1, 2, 3]


def test_kcat_produces_and_consumes(cluster: Cluster) -> None:
    kcat = tools.kcat()
    lines = [f"kcat-line-{i}" for i in range(RECORDS)]
    subprocess.run([kcat, "-b", cluster.bootstrap, "-P", "-t", "kcat", "-p", "0"],
                   input="\n".join(lines) + "\n", text=True, timeout=30, check=True)
    consumed = subprocess.run(
        [kcat, "-b", cluster.bootstrap, "-C", "-t", "kcat", "-p", "0", "-o", "beginning", "-e",
         "-f", "%o %s\n"], capture_output=True, text=True, timeout=30, check=True)
    assert consumed.stdout.splitlines() == [f"{i} {line}" for i, line in enumerate(lines)]


def test_no_client_connection_was_refused(cluster: Cluster) -> None:
    """Runs last (file order): every request the clients above sent was understood."""
    refused = [line for line in cluster.log.read_text().splitlines()
               if "closing connection" in line]
    assert refused == []


def test_confluent_admin_alters_topic_configs_through_the_controller(cluster: Cluster) -> None:
    """IncrementalAlterConfigs from a stock admin client: a topic's min.insync.replicas is
    set through the controller; a bad value, an unknown topic and a broker resource are
    refused, each with Kafka's error."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})

    def alter(kind: ResourceType, name: str, key: str, value: str) -> str | None:
        resource = ConfigResource(kind, name, incremental_configs=[
            ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)])
        try:
            admin.incremental_alter_configs([resource])[resource].result(timeout=10)
        except KafkaException as exc:
            return exc.args[0].name()
        return None

    assert alter(ResourceType.TOPIC, "kcat", "min.insync.replicas", "2") is None
    controller = _get_state(cluster.base_port + 100)
    assert controller["topics"]["kcat"]["config"]["min.insync.replicas"] == "2"
    assert alter(ResourceType.TOPIC, "kcat", "min.insync.replicas", "none") == "INVALID_CONFIG"
    assert alter(ResourceType.TOPIC, "nope", "min.insync.replicas", "2") == \
        "UNKNOWN_TOPIC_OR_PART"
    assert alter(ResourceType.BROKER, "1", "min.insync.replicas", "2") == "INVALID_REQUEST"
