"""Batched replication (``replica.fetch.min.bytes`` above one batch) and what it costs acks=all.

Kafka's rules, as read in Kafka 4.1.1 and kept by minibroker:

- A follower's fetch that finds less than ``replica.fetch.min.bytes`` waits in the leader's
  fetch purgatory and is answered after ``replica.fetch.wait.max.ms`` with whatever is there
  (``DelayedFetch.tryComplete`` case G; ``onComplete`` reads the log again).
- The leader takes the follower's log end offset from the fetch when it *arrives*
  (``ReplicaManager.fetchMessages`` -> ``updateFollowerFetchState`` before the purgatory), so
  the high watermark moves, and a ``DelayedProduce`` completes, while that fetch still waits.

So one acks=all produce is acknowledged within one fetch wait plus a round trip. Requests
pipelined on one connection are served one at a time (``SocketServer`` mutes a connection
until its response is sent), so each waits its own fetch wait: a producer with N requests in
flight sees about N fetch waits (benchmarks/acks_all_latency.py).
"""

from __future__ import annotations

from pathlib import Path

from stepper import SimCluster

from minibroker.cluster.types import FetchRequestData, FetchResult, TopicPartition

TP = TopicPartition("orders", 0)
WAIT_MS = 500
BATCHING = {"replica.fetch.min.bytes": str(1 << 20), "replica.fetch.wait.max.ms": str(WAIT_MS),
            "min.insync.replicas": "2"}


def _long_poll(sim: SimCluster, follower_id: int) -> dict[TopicPartition, FetchResult]:
    """A follower's fetch as its ReplicaFetcher sends it with batching: it waits on the
    leader. Returns the dict the answer lands in (empty while the fetch waits)."""
    follower = sim.brokers[follower_id]
    leader = sim.brokers[sim.leader_of(TP)]
    answer: dict[TopicPartition, FetchResult] = {}
    leader.fetch_messages(FetchRequestData(
        replica_id=follower_id, max_wait_ms=WAIT_MS, min_bytes=1 << 20, max_bytes=1 << 20,
        partitions=follower.build_follower_fetch([TP], 1 << 20),
        replica_epoch=sim.broker_epoch(follower_id)), answer.update)
    return answer


def _batching_cluster(tmp_path: Path) -> tuple[SimCluster, int, list[int]]:
    """Three brokers with batched replication, `TP` in sync on all: (cluster, leader,
    followers)."""
    sim = SimCluster(tmp_path, brokers=3, config=BATCHING)
    sim.create_topic(TP.topic, replication_factor=3)
    sim.replicate()
    leader_id = sim.leader_of(TP)
    return sim, leader_id, [b for b in sim.brokers if b != leader_id]


def _answer_and_poll_again(sim: SimCluster, waiting: dict[int, dict[TopicPartition, FetchResult]]
                           ) -> dict[int, dict[TopicPartition, FetchResult]]:
    """Each follower appends what its expired fetch brought and sends its next one."""
    for follower_id, answer in waiting.items():
        sim.brokers[follower_id].on_follower_fetch(TP, answer[TP])
    return {f: _long_poll(sim, f) for f in waiting}


def test_a_follower_fetch_waits_then_answers_with_what_is_there_and_counts_on_arrival(
        tmp_path: Path) -> None:
    sim, leader_id, followers = _batching_cluster(tmp_path)
    waiting = {f: _long_poll(sim, f) for f in followers}

    send = sim.produce(TP, ["a"], acks=-1)
    sim.scheduler.advance(WAIT_MS - 1)
    assert not any(waiting.values()), "a fetch below min.bytes answered before its wait"
    assert not send.done

    sim.scheduler.advance(1)
    for follower_id, answer in waiting.items():
        assert answer[TP].records, f"broker {follower_id}'s fetch expired without the record"
    assert not send.done, "acknowledged before any follower said it had the record"

    # The followers' next fetches carry their new log end offsets: the HW moves, and the
    # produce is answered, when they arrive, while they themselves wait on.
    next_fetches = _answer_and_poll_again(sim, waiting).values()
    assert send.acknowledged
    assert sim.replica(leader_id, TP).high_watermark == 1
    assert not any(next_fetches)


def test_pipelined_produces_each_wait_a_fetch(tmp_path: Path) -> None:
    """What a connection's serial requests cost: the second produce, appended after the
    first was answered, waits for the followers' next fetch to expire."""
    sim, _, followers = _batching_cluster(tmp_path)
    waiting = {f: _long_poll(sim, f) for f in followers}
    first = sim.produce(TP, ["a"], acks=-1)
    sim.scheduler.advance(WAIT_MS)
    waiting = _answer_and_poll_again(sim, waiting)
    assert first.acknowledged

    second = sim.produce(TP, ["b"], acks=-1)
    sim.scheduler.advance(WAIT_MS - 1)
    assert not second.done
    sim.scheduler.advance(1)
    _answer_and_poll_again(sim, waiting)
    assert second.acknowledged


def test_a_waiting_fetch_dies_with_its_broker(tmp_path: Path) -> None:
    """Kafka's ReplicaManager.shutdown shuts the purgatories before the logs close: a follower
    fetch still waiting when the leader stops is dropped, never read from a closed log."""
    sim, leader_id, (follower_id, _) = _batching_cluster(tmp_path)
    sim.produce(TP, ["a"], acks=1)
    waiting = _long_poll(sim, follower_id)
    leader = sim.brokers[leader_id]
    sim.crash(leader_id)
    sim.scheduler.advance(2 * WAIT_MS)
    assert waiting == {}
    assert leader.fetch_purgatory.watched() == 0
