"""The workload's client models (``sim/clients.py``) against the real brokers in simulation
(``sim/cluster.py``), every request a Kafka request through the broker's own listener,
codec and API handlers (``sim/kafka_endpoint.py``): a producer at 200 records/s and a
consumer while the leader of partition 0 is cut off from its followers, killed and
restarted, then a drain.

acks=all with min.insync.replicas=2 loses nothing; every acknowledged record is read back
at the offset its acknowledgement gave. The followers' fetches went through the fetcher's
incremental fetch sessions (KIP-227) at the leader's ``FetchSessionCache``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from test_group_member import GROUP, Lines, settings

from minibroker.environment import entered
from minibroker.tools import create_topic, describe_partitions
from undertow.runner.workload import WorkloadConfig
from undertow.sim.clients import SimConsumer, SimProducer
from undertow.sim.cluster import SimulatedCluster, broker_host, until
from undertow.sim.group_member import SimGroupMember
from undertow.sim.kafka_endpoint import KafkaEndpoint
from undertow.sim.virtual_loop import run_simulation

CONFIG = {"min.insync.replicas": "2", "broker.session.timeout.ms": "3000",
          "replica.lag.time.max.ms": "6000"}
TOPIC = "t"


async def workload(tmp: Path, acks: str) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    cluster = SimulatedCluster(loop, tmp, CONFIG)
    await cluster.start()
    sends: list[dict[str, Any]] = []
    reads: list[tuple[str, int, int, str]] = []

    async def client() -> dict[str, Any]:
        bootstrap = cluster.bootstrap
        await until(lambda: _created(bootstrap[0]), 30, "the topic to be created")
        first = await until(lambda: _full_isr(bootstrap[0]), 30, "full ISRs")
        cfg = WorkloadConfig(topic=TOPIC, partitions=2, acks=acks, retries=3,
                             request_timeout_ms=3000, rate=200.0)
        # A client each, with connections of its own, as each is a librdkafka instance.
        endpoints = [KafkaEndpoint(bootstrap, TOPIC) for _ in range(3)]
        producer = SimProducer(0, endpoints[0], cfg, sends.append, loop.time)
        consumer = SimConsumer("c0", endpoints[1], TOPIC, 2,
                               lambda *read: reads.append(read[:4]), loop.time)
        producer.start()
        consumer.start()
        await asyncio.sleep(2.0)
        # Cut the leader of partition 0 off from its followers, then kill it: what it
        # acknowledged in between (it must not: acks=all waits for the ISR) would be lost.
        victim = broker_host(first[0].leader)
        followers = [broker_host(b) for b in first[0].replicas if b != first[0].leader]
        for follower in followers:
            cluster.net.block(victim, follower)
            cluster.net.block(follower, victim)
        await asyncio.sleep(0.5)
        cluster.kill(victim)
        for follower in followers:
            cluster.net.heal(victim, follower)
            cluster.net.heal(follower, victim)
        await asyncio.sleep(2.0)
        await cluster.start_broker(first[0].leader)
        await asyncio.sleep(2.0)
        producer.stop()
        await until(_async(lambda: producer.outstanding == 0), 60, "every send's outcome")
        producer.close()
        consumer.stop()
        healed = await until(lambda: _full_isr(bootstrap[1]), 60, "full ISRs again")
        drained: dict[tuple[int, int], str] = {}
        drain = SimConsumer("drain", endpoints[2], TOPIC, 2,
                            lambda _c, p, o, v, _t: drained.__setitem__((p, o), v), loop.time)
        ends: dict[int, int] = {}
        drain.end_offsets(ends.__setitem__)
        await until(_async(lambda: len(ends) == 2), 30, "the end offsets")
        drain.start()
        await until(_async(lambda: all(drain.positions.get(p, -1) >= ends[p] for p in ends)),
                    30, "the drain to reach the end offsets")
        drain.stop()
        for endpoint in endpoints:
            endpoint.close()
        leader = cluster.brokers[healed[0].leader]
        sessions = [(s.privileged, s.epoch) for s in leader.apis.fetch_sessions.sessions.values()]
        return {"drained": drained, "killed": victim, "sessions": sessions}

    with entered(cluster.environment("client")):
        result = await loop.create_task(client())
    result["sends"], result["reads"] = sends, reads
    return result


def _async(predicate):
    async def condition():
        return predicate()
    return condition


async def _created(bootstrap: tuple[str, int], partitions: int = 2) -> bool:
    return await create_topic(bootstrap, TOPIC, partitions, 3, {}) == 0


async def _full_isr(bootstrap: tuple[str, int]):
    partitions = await describe_partitions(bootstrap, TOPIC)
    return partitions if all(len(p.isr) == 3 for p in partitions) else None


@pytest.fixture(scope="module")
def acks_all(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_simulation(workload(tmp_path_factory.mktemp("acks-all"), "all"))


def test_acks_all_loses_nothing_through_a_leader_kill(acks_all: dict[str, Any]) -> None:
    acked = [s for s in acks_all["sends"] if s["status"] == "ok"]
    assert len(acked) > 900, len(acked)  # 6 s at 200/s
    # The kill held partition 0's sends until the restarted broker lost its leadership
    # (a new incarnation is fenced at once) and the producer, retrying, found the new one.
    assert max(s["t_complete"] - s["t_invoke"] for s in acked) > 1.5
    drained = acks_all["drained"]
    for send in acked:
        assert drained[(send["partition"], send["offset"])] == send["value"], send
    # The live consumer read what it read in offset order, values the producer sent.
    sent = {s["value"] for s in acks_all["sends"]}
    assert acks_all["reads"] and {value for *_, value in acks_all["reads"]} <= sent


def test_the_followers_fetch_in_incremental_sessions(acks_all: dict[str, Any]) -> None:
    """The followers of the leader at the end hold sessions there (privileged: a
    replica's), and fetched in them incrementally: a session's epoch counts its incremental
    fetches. (A killed follower's old session stays until the cache evicts it, as in
    Kafka: its restarted incarnation opened another.)"""
    followers = [epoch for privileged, epoch in acks_all["sessions"] if privileged]
    assert len([epoch for epoch in followers if epoch > 10]) >= 2, acks_all["sessions"]


def test_the_same_run_every_time(acks_all: dict[str, Any], tmp_path: Path) -> None:
    """The real brokers and the client models on the virtual clock repeat exactly: every
    send's outcome and time, every read."""
    again = run_simulation(workload(tmp_path, "all"))
    assert again["sends"] == acks_all["sends"]
    assert again["reads"] == acks_all["reads"]
    assert again["drained"] == acks_all["drained"]


async def group_workload(tmp: Path) -> dict[str, Any]:
    """Three members of group ``g`` read topic ``t`` (3 partitions) with auto commits while a
    producer writes; then the coordinator's state, read at the coordinator."""
    loop = asyncio.get_running_loop()
    cluster = SimulatedCluster(loop, tmp, {**CONFIG, "offsets.topic.num.partitions": "3"})
    await cluster.start()
    lines = Lines()

    async def client() -> dict[str, Any]:
        bootstrap = cluster.bootstrap
        await until(lambda: _created(bootstrap[0], 3), 30, "the topic")
        await until(lambda: _full_isr(bootstrap[0]), 30, "full ISRs")
        producer = SimProducer(0, KafkaEndpoint(bootstrap, TOPIC),
                               WorkloadConfig(TOPIC, 3, rate=100, retries=3),
                               lambda _send: None, loop.time)
        history: Any = lines  # what a HistoryWriter offers the members
        members = [SimGroupMember(f"c{i}", KafkaEndpoint(bootstrap, TOPIC), TOPIC, settings(),
                                  history, loop.time, first=i) for i in range(3)]
        producer.start()
        for member in members:
            member.start()
        await asyncio.sleep(8.0)
        producer.stop()
        groups = [g for broker in cluster.brokers.values()
                  for g in broker.group_coordinator.state()["groups"] if g["group"] == GROUP]
        return {"groups": groups,
                "members": [(m.member_id, m.generation, m.assignment) for m in members]}

    with entered(cluster.environment("client")):
        return await loop.create_task(client())


def test_a_group_joins_splits_the_partitions_and_commits_through_the_handlers(
        tmp_path: Path) -> None:
    """JoinGroup, SyncGroup, Heartbeat, OffsetCommit and OffsetFetch through the broker's
    group API handlers: one stable group of the three members, a partition each, the
    members' reads and commits in the history, the commits at the coordinator."""
    seen = run_simulation(group_workload(tmp_path))
    [group] = seen["groups"]
    assert group["state"] == "Stable" and group["protocol"] == "range", group
    assert sorted(group["members"]) == sorted(m for m, _, _ in seen["members"])
    assert sorted(p for *_, assignment in seen["members"] for p in assignment) == [0, 1, 2]
    assert {generation for _, generation, _ in seen["members"]} == {group["generation"]}
    assert group["committed_offsets"] == 3
