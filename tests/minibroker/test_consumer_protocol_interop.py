"""Kafka 4's consumer group protocol (KIP-848) with a stock client: confluent-kafka
(librdkafka 2.x) with ``group.protocol=consumer`` against a 3-broker minibroker cluster.
Three members share a 6-partition topic two partitions each, read every record and commit;
``describe_consumer_groups`` answers from ConsumerGroupDescribe (no fallback to the classic
DescribeGroups); a member that leaves has its partitions taken over; a restarted member
resumes from the committed offsets. The coordinator's ``/v1/state`` is checked beside."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    ConsumerGroupType,
    KafkaError,
    KafkaException,
    Producer,
)
from confluent_kafka.admin import AdminClient
from test_group_interop import cluster_with_topic, coordinated
from test_interop_clients import Cluster

TOPIC = "kip848"
PARTITIONS = 6
GROUP = "g-consumer"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # Kafka's defaults are 5 s heartbeats and 45 s sessions; shorter here so that a member's
    # departure is seen within the test's bounds.
    with cluster_with_topic(tmp_path_factory.mktemp("kip848"), TOPIC, PARTITIONS,
                            "group.consumer.heartbeat.interval.ms=500",
                            "group.consumer.min.heartbeat.interval.ms=500",
                            "group.consumer.session.timeout.ms=6000",
                            "group.consumer.min.session.timeout.ms=6000") as cluster:
        yield cluster


def produce(cluster: Cluster, label: str, per_partition: int) -> set[bytes]:
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 5})
    values = set()
    for partition in range(PARTITIONS):
        for i in range(per_partition):
            value = f"{label}-{partition}-{i}".encode()
            producer.produce(TOPIC, value, partition=partition)
            values.add(value)
    assert producer.flush(30) == 0
    return values


def member(cluster: Cluster, logs: list[str] | None = None) -> Consumer:
    config: dict[str, object] = {
        "bootstrap.servers": cluster.bootstrap, "group.id": GROUP,
        "group.protocol": "consumer", "auto.offset.reset": "earliest",
        "enable.auto.commit": False}
    if logs is not None:
        config["logger"] = _Collect(logs)
    consumer = Consumer(config)
    consumer.subscribe([TOPIC])
    return consumer


class _Collect:
    """A librdkafka logger that keeps every line (the fallback warning among them)."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def log(self, _level: int, message: str, *args: object) -> None:
        self.lines.append(message % args if args else message)


Read = dict[int, set[bytes]]
"""What each member (by index) has read."""


def poll_all(members: list[Consumer], read: Read, timeout_s: float) -> None:
    for i, consumer in enumerate(members):
        message = consumer.poll(timeout_s)
        if message is not None and message.error() is None:
            read.setdefault(i, set()).add(message.value())


def read_until(members: list[Consumer], wanted: set[bytes], timeout_s: float,
               read: Read | None = None) -> Read:
    """Poll every member until together they read ``wanted``; what each read, by index
    (``read``: what they read before)."""
    read = read if read is not None else {}
    deadline = time.monotonic() + timeout_s
    while not wanted <= set().union(*read.values()):
        assert time.monotonic() < deadline, (
            f"read {len(set().union(*read.values()) & wanted)} of {len(wanted)} in "
            f"{timeout_s} s")
        poll_all(members, read, 0.1)
    return read


def assigned(members: list[Consumer], timeout_s: float, each: int,
             read: Read | None = None) -> list[set[int]]:
    """Poll (keeping what is read in ``read``) until every member holds ``each`` partitions
    and together all of them."""
    read = read if read is not None else {}
    deadline = time.monotonic() + timeout_s
    while True:
        poll_all(members, read, 0.05)
        held = [{tp.partition for tp in c.assignment()} for c in members]
        if all(len(h) == each for h in held) and set().union(*held) == set(range(PARTITIONS)):
            return held
        assert time.monotonic() < deadline, f"assignments {held} after {timeout_s} s"


def test_three_members_share_six_partitions_commit_and_are_described(cluster: Cluster) -> None:
    values = produce(cluster, "a", 20)
    logs: list[str] = []
    members = [member(cluster, logs if i == 0 else None) for i in range(3)]
    try:
        read: Read = {}
        held = assigned(members, 30, each=2, read=read)
        assert sum(len(h) for h in held) == PARTITIONS, "no partition is held twice"
        read_until(members, values, 60, read)
        for consumer in members:
            consumer.commit(asynchronous=False)
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap,
                             "logger": _Collect(logs)})
        described = admin.describe_consumer_groups([GROUP])[GROUP].result(10)
        assert described.type == ConsumerGroupType.CONSUMER
        assert described.state == ConsumerGroupState.STABLE
        assert sorted(len(m.assignment.topic_partitions) for m in described.members) == [
            2, 2, 2]
        assert not [line for line in logs if "not supported by broker" in line], logs
        state = coordinated(cluster, GROUP)
        assert (state["type"], state["state"], len(state["members"])) == (
            "consumer", "Stable", 3)
        # DeleteGroups refuses a consumer group with members (validateDeleteGroup).
        with pytest.raises(KafkaException) as refused:
            admin.delete_consumer_groups([GROUP])[GROUP].result(10)
        assert refused.value.args[0].code() == KafkaError.NON_EMPTY_GROUP
    finally:
        for consumer in members:
            consumer.close()


def test_a_member_that_leaves_has_its_partitions_taken_over_and_a_new_one_resumes(
        cluster: Cluster) -> None:
    """Committed offsets carry over: a member that starts after the others left reads only
    what was produced after their commits."""
    first, second = member(cluster), member(cluster)
    try:
        read: Read = {}
        assigned([first, second], 30, each=3, read=read)
        values = produce(cluster, "b", 5)
        read_until([first, second], values, 60, read)
        first.commit(asynchronous=False)
        second.commit(asynchronous=False)
        first.close()  # leaves (epoch -1): the group epoch moves
        assigned([second], 30, each=PARTITIONS)
    finally:
        second.close()
    later = produce(cluster, "c", 3)
    resumed = member(cluster)
    try:
        read = read_until([resumed], later, 60)[0]
        assert not read - later
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:  # 3 s more polls: nothing older may follow
            message = resumed.poll(0.2)
            if message is not None and message.error() is None:
                read.add(message.value())
        assert read == later, "only what was produced after the commits"
    finally:
        resumed.close()


def test_a_classic_member_cannot_join_a_consumer_group_with_members(cluster: Cluster) -> None:
    """No online migration (Kafka's group.consumer.migration.policy=disabled): a classic
    JoinGroup to a consumer group with members is INCONSISTENT_GROUP_PROTOCOL."""
    modern = member(cluster)
    classic = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": GROUP,
                        "group.protocol": "classic", "session.timeout.ms": 6000})
    try:
        assigned([modern], 30, each=PARTITIONS)
        classic.subscribe([TOPIC])
        deadline = time.monotonic() + 30
        while True:
            message = classic.poll(0.2)
            modern.poll(0)
            if message is not None and message.error() is not None:
                assert message.error().code() == KafkaError.INCONSISTENT_GROUP_PROTOCOL, \
                    message.error()
                break
            assert time.monotonic() < deadline, "the classic member was never refused"
    finally:
        classic.close()
        modern.close()
