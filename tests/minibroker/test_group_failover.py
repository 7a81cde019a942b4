"""The coordinator moves with the leadership of its ``__consumer_offsets`` partition
(``stepper.py``'s three brokers on one manual clock, then real processes and a stock
consumer): an offset commit is answered only
once every ISR member has it (``offsets.commit.required.acks=-1``); when the leader is
fenced, the new leader loads the group from its log (COORDINATOR_LOAD_IN_PROGRESS until
then), the old one answers NOT_COORDINATOR, and the committed offsets and the members'
generation survive."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from stepper import SimCluster
from test_broker_processes import TOPIC, ProcessCluster, wait_for

from minibroker.cluster.types import ErrorCode, TopicPartition
from minibroker.coordinator.consumer.group_manager import HeartbeatRequest, HeartbeatResponse
from minibroker.coordinator.group_coordinator import GroupCoordinator
from minibroker.coordinator.group_metadata_manager import OFFSETS_TOPIC
from minibroker.coordinator.records import OffsetAndMetadata

GROUP = "g"
OFFSETS_TP = TopicPartition(OFFSETS_TOPIC, 0)
TP = TopicPartition("orders", 0)
CONFIG = {"offsets.topic.num.partitions": "1", "group.initial.rebalance.delay.ms": "0"}


def join_and_sync(sim: SimCluster, coordinator: GroupCoordinator) -> tuple[str, int]:
    """One member, generation 1, its assignment written (replicated to the ISR)."""
    answers: list[Any] = []

    def join(member_id: str) -> None:
        coordinator.handle_join_group(
            GROUP, member_id, None, require_known_member_id=True,
            support_skipping_assignment=False, client_id="c", client_host="/h",
            rebalance_timeout_ms=20000, session_timeout_ms=10000, protocol_type="consumer",
            protocols=[("range", b"sub")], callback=answers.append)

    join("")
    join(answers[0].member_id)
    sim.scheduler.advance(0)
    member_id, generation = answers[1].member_id, answers[1].generation_id
    synced: list[Any] = []
    coordinator.handle_sync_group(GROUP, generation, member_id, None, None, None,
                                  {member_id: b"orders-0"}, synced.append)
    sim.replicate()  # the assignment is answered once the ISR has it
    assert synced[0].error == ErrorCode.none
    return member_id, generation


def test_the_coordinator_moves_with_its_partition_and_the_group_survives(
        tmp_path: Path) -> None:
    sim = SimCluster(tmp_path, config=CONFIG)
    sim.create_topic("orders")
    sim.create_topic(OFFSETS_TOPIC, config={"cleanup.policy": "compact"})
    sim.scheduler.advance(0)  # the leader loads its (empty) partition
    old = sim.leader_of(OFFSETS_TP)
    coordinator = sim.coordinators[old]
    member_id, generation = join_and_sync(sim, coordinator)

    committed: list[dict[TopicPartition, ErrorCode]] = []
    coordinator.handle_commit_offsets(GROUP, member_id, None, generation,
                                      {TP: OffsetAndMetadata(17)}, committed.append)
    assert committed == []  # acks=-1: not answered before the followers have it
    sim.replicate()
    assert committed == [{TP: ErrorCode.none}]

    mark = len(sim.events())
    while sim.leader_of(OFFSETS_TP) == old:  # the old leader is cut off from the controller
        sim.advance(250, silent=[old])
    new = sim.leader_of(OFFSETS_TP)
    moved = sim.coordinators[new]
    assert moved.handle_heartbeat(GROUP, member_id, None, generation) == ErrorCode.none
    assert moved.handle_fetch_offsets(GROUP, False, [TP])[0] == \
        ErrorCode.coordinator_load_in_progress
    assert coordinator.handle_fetch_offsets(GROUP, False, [TP])[0] == ErrorCode.not_coordinator
    sim.scheduler.advance(0)  # the new leader's load runs

    error, offsets = moved.handle_fetch_offsets(GROUP, False, [TP])
    assert (error, offsets[TP].offset) == (ErrorCode.none, 17)
    assert moved.handle_heartbeat(GROUP, member_id, None, generation) == ErrorCode.none
    synced: list[Any] = []
    moved.handle_sync_group(GROUP, generation, member_id, None, None, None, {}, synced.append)
    assert (synced[0].error, synced[0].assignment) == (ErrorCode.none, b"orders-0")
    assert coordinator.handle_heartbeat(GROUP, member_id, None, generation) == \
        ErrorCode.not_coordinator

    coordinator_events = [e for e in sim.events()[mark:]
                          if e["type"] in ("coordinator_load", "coordinator_unload")]
    assert [(e["type"], e["node"], e["partition"]) for e in coordinator_events] == [
        ("coordinator_unload", f"broker-{old}", 0), ("coordinator_load", f"broker-{new}", 0)]
    load = coordinator_events[1]
    assert load["leader_epoch"] == sim.registration(OFFSETS_TP).leader_epoch
    assert load["log_end_offset"] == 2  # generation 1's metadata, then the commit
    assert "g (Stable, generation 1, 1 members, 1 offsets)" in load["detail"]


def test_a_restarted_broker_loads_the_groups_it_leads_again(tmp_path: Path) -> None:
    """Kill -9 of the only broker: the group state comes back from the log, and of the
    partition's commits the latest wins (``GroupMetadataManager.doLoadGroupsAndOffsets``
    replays the log in order, each record replacing its key's)."""
    sim = SimCluster(tmp_path, brokers=1, config=CONFIG)
    sim.create_topic(OFFSETS_TOPIC, replication_factor=1)
    sim.create_topic("orders", replication_factor=1)
    sim.scheduler.advance(0)
    member_id, generation = join_and_sync(sim, sim.coordinators[1])
    done: list[Any] = []
    for offset in (5, 9, 7):  # the latest, not the highest
        sim.coordinators[1].handle_commit_offsets(GROUP, member_id, None, generation,
                                                  {TP: OffsetAndMetadata(offset)}, done.append)
    assert done == [{TP: ErrorCode.none}] * 3
    sim.crash(1)
    sim.start(1)
    sim.advance(3500)
    error, offsets = sim.coordinators[1].handle_fetch_offsets(GROUP, False, None)
    assert (error, offsets[TP].offset) == (ErrorCode.none, 7)
    assert sim.coordinators[1].manager.get_group(GROUP).generation_id == generation


def test_a_killed_coordinator_moves_and_the_group_keeps_its_commits(tmp_path: Path) -> None:
    """Real processes and a stock consumer: kill -9 the broker coordinating the group; the
    new leader of its partition loads it, the consumer goes on reading and committing, and a
    consumer started afterwards finds every offset the first one committed."""
    cluster = ProcessCluster(tmp_path, {"broker.session.timeout.ms": "2000",
                                        "replica.lag.time.max.ms": "4000",
                                        "group.initial.rebalance.delay.ms": "300",
                                        "offsets.topic.num.partitions": "3"})
    config = {"bootstrap.servers": cluster.bootstrap, "group.id": "fo",
              "auto.offset.reset": "earliest", "enable.auto.commit": False,
              "session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
    consumer = None
    try:
        cluster.create_topic(partitions=3)
        produce_values(cluster.bootstrap, 0, 60)
        consumer = Consumer(config)
        consumer.subscribe([TOPIC])
        assert len(read_values(consumer, 60)) == 60
        consumer.commit(asynchronous=False)
        old = coordinator_of(cluster, "fo")
        cluster.kill(old)
        wait_for(lambda: coordinator_of(cluster, "fo", committed=3) not in (None, old), 30,
                 "another broker to load the group")
        produce_values(cluster.bootstrap, 60, 90)
        assert sorted(read_values(consumer, 30)) == [f"v{i}".encode() for i in range(60, 90)]
        committed = consumer.commit(asynchronous=False)
        assert all(tp.error is None for tp in committed)
        consumer.close()
        consumer = Consumer(config)
        offsets = consumer.committed([KafkaTopicPartition(TOPIC, p) for p in range(3)],
                                     timeout=20)
        assert sum(tp.offset for tp in offsets) == 90
    finally:
        if consumer is not None:
            consumer.close()
        cluster.stop()


def produce_values(bootstrap: str, first: int, end: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2})
    for i in range(first, end):
        producer.produce(TOPIC, f"v{i}".encode(), partition=i % 3)
    assert producer.flush(30) == 0


def read_values(consumer: Consumer, count: int) -> list[bytes]:
    values: list[bytes] = []
    deadline = time.monotonic() + 40
    while len(values) < count and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            values.append(message.value())
    return values


def coordinator_of(cluster: ProcessCluster, group: str, committed: int = 0) -> int | None:
    """The live broker that coordinates ``group`` with that many committed offsets."""
    for broker_id in cluster.ports:
        if cluster.procs[f"broker-{broker_id}"].poll() is not None:
            continue
        with contextlib.suppress(OSError):
            state = cluster.broker_state(broker_id)["group_coordinator"]
            if any(g["group"] == group and g["committed_offsets"] >= committed
                   for g in state["groups"]):
                return broker_id
    return None


def test_a_consumer_group_moves_with_its_partition_and_keeps_its_epochs(
        tmp_path: Path) -> None:
    """KIP-848: a heartbeat is answered once its records are on every ISR member; the new
    coordinator replays them, so the members go on at their epochs with their partitions
    (no UNKNOWN_MEMBER_ID, no rejoin), and the target assignment is the same."""
    sim = SimCluster(tmp_path, config=CONFIG)
    sim.create_topic("orders", partitions=4)
    sim.create_topic(OFFSETS_TOPIC, config={"cleanup.policy": "compact"})
    sim.scheduler.advance(0)
    old = sim.leader_of(OFFSETS_TP)

    def beat(coordinator: GroupCoordinator, member_id: str, epoch: int,
             owned: dict[str, frozenset[int]] | None = None) -> HeartbeatResponse:
        answers: list[HeartbeatResponse] = []
        coordinator.handle_consumer_group_heartbeat(HeartbeatRequest(
            GROUP, member_id, epoch, rebalance_timeout_ms=30000 if epoch == 0 else -1,
            subscribed_topic_names=("orders",) if epoch == 0 else None,
            owned={} if epoch == 0 else owned), answers.append)
        if not answers:
            sim.replicate()  # acks=-1: answered once the followers have the records
        [answer] = answers
        assert answer.error == ErrorCode.none, answer
        return answer

    coordinator = sim.coordinators[old]
    first = beat(coordinator, "m1", 0)
    assert (first.member_epoch, sum(map(len, (first.assignment or {}).values()))) == (1, 4)
    second = beat(coordinator, "m2", 0)
    revoking = beat(coordinator, "m1", 1, dict(first.assignment or {}))
    settled = beat(coordinator, "m1", 1, dict(revoking.assignment or {}))
    got = beat(coordinator, "m2", second.member_epoch, {})
    before = coordinator.consumer_group(GROUP)
    assert before is not None and before.state == "Stable"
    snapshot = (before.group_epoch, before.assignment_epoch, dict(before.members),
                dict(before.target_assignment))

    while sim.leader_of(OFFSETS_TP) == old:  # the old leader is cut off from the controller
        sim.advance(250, silent=[old])
    moved = sim.coordinators[sim.leader_of(OFFSETS_TP)]
    sim.scheduler.advance(0)  # the new leader's load runs
    after = moved.consumer_group(GROUP)
    assert after is not None
    assert (after.group_epoch, after.assignment_epoch, dict(after.members),
            dict(after.target_assignment)) == snapshot
    again = beat(moved, "m1", settled.member_epoch, dict(settled.assignment or {}))
    assert again.member_epoch == settled.member_epoch
    assert beat(moved, "m2", got.member_epoch, dict(got.assignment or {})).member_epoch == \
        got.member_epoch
    load = [e for e in sim.events() if e["type"] == "coordinator_load"][-1]
    assert "g (consumer group Stable, epoch 2, 2 members" in load["detail"]
