"""Stock group consumers against a real 3-broker minibroker cluster: confluent-kafka
(librdkafka 2.x), kafka-python and ``kcat -G`` subscribe to a 3-partition topic, read every
record, commit, and a restarted consumer of the same group resumes from the committed
offsets (it reads nothing committed twice); three members of one group share the three
partitions, and when one leaves the other two take its partition over, within the
configured session and rebalance timeouts. The coordinator's own view (``/v1/state``) is
checked beside what the clients saw."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import tools
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka import KafkaConsumer
from test_interop_clients import BROKERS, STARTUP_TIMEOUT_S, Cluster, running_cluster

TOPIC = "groups"
PARTITIONS = 3
SESSION_MS = 6000
REBALANCE_MS = 10000  # max.poll.interval.ms, the members' rebalance timeout


@contextlib.contextmanager
def cluster_with_topic(workdir: Path, topic: str, partitions: int, *config: str
                       ) -> Iterator[Cluster]:
    """``running_cluster`` once ``topic`` exists (created with the minibroker CLI)."""
    with running_cluster(workdir, *config) as (cluster, process):
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while subprocess.run(
                [sys.executable, "-m", "minibroker", "topics", "create", "--bootstrap",
                 cluster.bootstrap.split(",")[0], "--topic", topic, "--partitions",
                 str(partitions), "--replication-factor", str(BROKERS)],
                capture_output=True, timeout=30).returncode:
            assert time.monotonic() < deadline and process.poll() is None, \
                cluster.log.read_text()[-3000:]
            time.sleep(0.2)
        yield cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with cluster_with_topic(tmp_path_factory.mktemp("groups"), TOPIC, PARTITIONS,
                            "group.initial.rebalance.delay.ms=500") as cluster:
        yield cluster


def produce(cluster: Cluster, label: str, per_partition: int) -> None:
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 5})
    for partition in range(PARTITIONS):
        for i in range(per_partition):
            producer.produce(TOPIC, f"{label}-{partition}-{i}".encode(), partition=partition)
    assert producer.flush(30) == 0


def end_offsets(cluster: Cluster) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "watermarks"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1]
                for p in range(PARTITIONS)}
    finally:
        consumer.close()


def coordinated(cluster: Cluster, group: str) -> dict:
    """The group as its coordinator's ``/v1/state`` shows it."""
    for broker in range(1, BROKERS + 1):
        url = f"http://127.0.0.1:{cluster.base_port + 100 + broker}/v1/state"
        with urllib.request.urlopen(url, timeout=5) as response:
            for found in json.load(response)["group_coordinator"]["groups"]:
                if found["group"] == group:
                    return found
    raise AssertionError(f"no broker coordinates {group}")


def ck_consumer(cluster: Cluster, group: str, **config: object) -> Consumer:
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 500,
                         "max.poll.interval.ms": REBALANCE_MS, **config})
    consumer.subscribe([TOPIC])
    return consumer


def ck_read(consumer: Consumer, count: int, timeout: float = 30) -> list[tuple[int, int]]:
    """(partition, offset) of ``count`` records."""
    read: list[tuple[int, int]] = []
    deadline = time.monotonic() + timeout
    while len(read) < count and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None:
            assert message.error() is None, message.error()
            read.append((message.partition(), message.offset()))
    return read


def resumed_where_committed(first: list[tuple[int, int]], second: list[tuple[int, int]],
                            before: dict[int, int]) -> None:
    """The second consumer read exactly the records produced after the first committed."""
    assert sorted(first) == [(p, o) for p in range(PARTITIONS) for o in range(before[p])]
    assert min(o for _, o in second) >= min(before.values())
    assert not set(first) & set(second)


def test_confluent_kafka_group_reads_commits_and_resumes(cluster: Cluster) -> None:
    produce(cluster, "ck", 30)
    before = end_offsets(cluster)
    consumer = ck_consumer(cluster, "ck")
    first = ck_read(consumer, sum(before.values()))
    consumer.commit(asynchronous=False)
    consumer.close()
    assert coordinated(cluster, "ck")["committed_offsets"] == PARTITIONS
    produce(cluster, "ck-more", 5)
    consumer = ck_consumer(cluster, "ck")
    second = ck_read(consumer, 15)
    consumer.close()
    resumed_where_committed(first, second, before)
    assert len(second) == 15


def test_kafka_python_group_reads_commits_and_resumes(cluster: Cluster) -> None:
    produce(cluster, "kp", 30)
    before = end_offsets(cluster)

    def read(count: int) -> list[tuple[int, int]]:
        consumer = KafkaConsumer(TOPIC, bootstrap_servers=cluster.bootstrap, group_id="kp",
                                 auto_offset_reset="earliest", enable_auto_commit=False,
                                 session_timeout_ms=SESSION_MS, max_poll_interval_ms=REBALANCE_MS)
        records: list[tuple[int, int]] = []
        deadline = time.monotonic() + 30
        try:
            while len(records) < count and time.monotonic() < deadline:
                for batch in consumer.poll(timeout_ms=200).values():
                    records += [(r.partition, r.offset) for r in batch]
            consumer.commit()
        finally:
            consumer.close()
        return records

    first = read(sum(before.values()))
    produce(cluster, "kp-more", 5)
    second = read(15)
    resumed_where_committed(first, second, before)
    assert len(second) == 15


def test_kcat_balanced_consumer_reads_commits_and_resumes(cluster: Cluster) -> None:
    kcat = tools.kcat()
    produce(cluster, "kcat", 30)
    before = end_offsets(cluster)

    def read() -> list[tuple[int, int]]:
        done = subprocess.run(
            [kcat, "-b", cluster.bootstrap, "-G", "kcat", TOPIC, "-e", "-q", "-f", "%p %o\n",
             "-X", "auto.offset.reset=earliest", "-X", f"session.timeout.ms={SESSION_MS}"],
            capture_output=True, text=True, timeout=60, check=True)
        return [(int(p), int(o)) for p, o in (line.split() for line in done.stdout.splitlines())]

    first = read()  # kcat commits what it read when it closes
    produce(cluster, "kcat-more", 5)
    second = read()
    resumed_where_committed(first, second, before)
    assert len(second) == 15


def test_three_members_share_the_partitions_and_two_take_over_when_one_leaves(
        cluster: Cluster) -> None:
    members = [ck_consumer(cluster, "trio") for _ in range(3)]
    try:
        started = time.monotonic()
        deadline = started + 0.5 + REBALANCE_MS / 1000 + SESSION_MS / 1000
        while time.monotonic() < deadline:
            for member in members:
                member.poll(0.1)
            assigned = [{tp.partition for tp in m.assignment()} for m in members]
            if all(len(a) == 1 for a in assigned) and set().union(*assigned) == {0, 1, 2}:
                break
        else:
            raise AssertionError(f"no disjoint assignment in time: {assigned}")
        state = coordinated(cluster, "trio")
        assert (state["state"], len(state["members"])) == ("Stable", 3)
        generation = state["generation"]

        members.pop().close()  # LeaveGroup: the others rebalance at once
        left = time.monotonic()
        while time.monotonic() < left + REBALANCE_MS / 1000 + SESSION_MS / 1000:
            for member in members:
                member.poll(0.1)
            assigned = [{tp.partition for tp in m.assignment()} for m in members]
            if sorted(map(len, assigned)) == [1, 2] and set().union(*assigned) == {0, 1, 2}:
                break
        else:
            raise AssertionError(f"the partition of the member that left was not taken "
                                 f"over: {assigned}")
        state = coordinated(cluster, "trio")
        assert len(state["members"]) == 2 and state["generation"] > generation
    finally:
        for member in members:
            member.close()


def test_a_static_member_that_restarts_takes_its_place_back_without_a_rebalance(
        cluster: Cluster) -> None:
    """KIP-345: librdkafka's static members send no LeaveGroup when they close; the restarted
    instance rejoins under a new member id, fencing the old one, in the same generation."""
    members = {i: ck_consumer(cluster, "static", **{"group.instance.id": f"i{i}"})
               for i in (1, 2)}
    try:
        deadline = time.monotonic() + 0.5 + REBALANCE_MS / 1000
        while time.monotonic() < deadline and not all(m.assignment() for m in members.values()):
            for member in members.values():
                member.poll(0.1)
        before = coordinated(cluster, "static")
        assert before["state"] == "Stable" and len(before["members"]) == 2
        members.pop(2).close()
        members[2] = ck_consumer(cluster, "static", **{"group.instance.id": "i2"})
        deadline = time.monotonic() + SESSION_MS / 1000
        while time.monotonic() < deadline and not members[2].assignment():
            for member in members.values():
                member.poll(0.1)
        after = coordinated(cluster, "static")
        assert after["generation"] == before["generation"]
        assert len(after["members"]) == 2 and after["members"] != before["members"]
        assert [tp.partition for tp in members[2].assignment()]
    finally:
        for member in members.values():
            member.close()


def test_no_group_client_connection_was_refused(cluster: Cluster) -> None:
    """Runs last (file order): every request the clients above sent was understood."""
    assert [line for line in Path(cluster.log).read_text().splitlines()
            if "closing connection" in line] == []
