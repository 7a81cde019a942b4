"""The seeds' walkthroughs, step by step, with the exact LEO and HW of every replica.

Run on ``stepper.py``'s cluster: the real controller, ReplicaManager and Partition code
with one manual clock, so each follower fetch happens exactly where the walkthrough puts it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from stepper import SimCluster

from minibroker.cluster.types import TopicPartition

TP = TopicPartition("orders", 0)


def leo_hw(sim: SimCluster, broker_id: int) -> tuple[int, int]:
    replica = sim.replica(broker_id, TP)
    return replica.log_end_offset, replica.high_watermark


def test_seed_000_three_replica_produce_trace(tmp_path: Path) -> None:
    """Seed 000, "LEO/HW Progression": a 3-replica acks=all produce of offset 5."""
    sim = SimCluster(tmp_path, brokers=3)
    sim.create_topic("orders", replication_factor=3)
    leader, f1, f2 = sim.registration(TP).replicas
    for i in range(5):
        assert sim.produce(TP, [f"m{i}"], acks=1).acknowledged
    sim.replicate(rounds=3)
    # Initial state: all replicas synchronized.
    assert [leo_hw(sim, b) for b in (leader, f1, f2)] == [(5, 5), (5, 5), (5, 5)]

    # Step 1: the leader writes offset 5; HW unchanged; DelayedProduce waits in purgatory.
    send = sim.produce(TP, ["m5"], acks=-1)
    assert not send.done
    assert sim.brokers[leader].produce_purgatory.watched() == 1
    assert [leo_hw(sim, b) for b in (leader, f1, f2)] == [(6, 5), (5, 5), (5, 5)]

    # Step 2: Follower1 fetches at 5, writes offset 5, takes HW=5 from the response.
    sim.fetch_round(f1)
    assert [leo_hw(sim, b) for b in (leader, f1, f2)] == [(6, 5), (6, 5), (5, 5)]

    # Step 3: Follower2 does the same.
    sim.fetch_round(f2)
    assert [leo_hw(sim, b) for b in (leader, f1, f2)] == [(6, 5), (6, 5), (6, 5)]
    assert not send.done

    # Step 4: Follower1 fetches at 6: the leader now knows Follower1's LEO=6. The seed's
    # "min(6, 6, 6)" also needs Follower2's LEO=6, which the leader learns only from
    # Follower2's next fetch (step 4b): until then HW stays at 5.
    sim.fetch_round(f1)
    assert sim.replica(leader, TP).remote_replicas[f1].log_end_offset == 6
    assert leo_hw(sim, leader) == (6, 5)
    assert not send.done
    sim.fetch_round(f2)
    # HW = min(6, 6, 6) = 6: the DelayedProduce completes with offset 5, and this fetch
    # response already carries HW=6 to Follower2.
    assert leo_hw(sim, leader) == (6, 6)
    assert send.acknowledged and send.result.base_offset == 5
    assert leo_hw(sim, f2) == (6, 6)

    # Step 5: Follower1's next fetch response carries highWatermark=6.
    assert leo_hw(sim, f1) == (6, 5)
    sim.fetch_round(f1)
    assert leo_hw(sim, f1) == (6, 6)

    # Step 6: a consumer can now read offset 5.
    assert sim.read_committed(TP)[-1] == (5, b"m5")


def test_seed_001_two_replica_trace(tmp_path: Path) -> None:
    """Seed 001: one message through a 2-replica partition; every value starts at 0."""
    sim = SimCluster(tmp_path, brokers=2)
    sim.create_topic("orders", replication_factor=2)
    leader, follower = sim.registration(TP).replicas
    remote = sim.replica(leader, TP).remote_replicas[follower]
    sim.fetch_round(follower)
    assert leo_hw(sim, leader) == (0, 0) and leo_hw(sim, follower) == (0, 0)

    send = sim.produce(TP, ["hello"], acks=-1)
    # The leader wrote the message: LEO=1; nothing else moved.
    assert leo_hw(sim, leader) == (1, 0)
    assert (remote.log_end_offset, leo_hw(sim, follower)) == (0, (0, 0))

    # The follower fetches at 0: it gets the message (LEO=1) but HW stays 0 on both.
    sim.fetch_round(follower)
    assert leo_hw(sim, leader) == (1, 0)
    assert (remote.log_end_offset, leo_hw(sim, follower)) == (0, (1, 0))
    assert not send.done

    # Next round, fetch at 1: remote LEO=1, leader HW=1, and the follower's HW=1.
    sim.fetch_round(follower)
    assert leo_hw(sim, leader) == (1, 1)
    assert (remote.log_end_offset, leo_hw(sim, follower)) == (1, (1, 1))
    assert send.acknowledged and send.result.base_offset == 0


@pytest.mark.parametrize(("mode", "lost"), [("high-watermark", True), ("leader-epoch", False)])
def test_kip_101_truncation_to_high_watermark_loses_an_acknowledged_record(
        tmp_path: Path, mode: str, lost: bool) -> None:
    """KIP-101's bug. A record is acknowledged (acks=all) once every ISR member has it, but
    followers learn the new HW one round later. The leader dies; on becoming a follower of
    the new leader, the third replica truncates to its own stale HW (pre-KIP-101) and so
    drops the record; the new leader dies before it refetches; the truncated replica, still
    in the ISR, is elected cleanly — and the acknowledged record is gone. Asking the leader
    for the end offset of its epoch (KIP-101) keeps it.

    In KRaft a restarted broker is fenced and rejoins the ISR only once its LEO reaches the
    HW and the leader's epoch start, which closes seed 001's restart-based path; a leader
    change without a restart (three replicas) still exposes the old rule.
    """
    sim = SimCluster(tmp_path, brokers=3,
                     config={"replication.truncation.mode": mode, "min.insync.replicas": "2"})
    sim.create_topic("orders", replication_factor=3)
    a, b, c = sim.registration(TP).replicas
    assert sim.produce(TP, ["m0"], acks=-1) is not None
    sim.replicate(rounds=3)
    send = sim.produce(TP, ["m1"], acks=-1)
    sim.fetch_round(b)
    sim.fetch_round(c)
    sim.fetch_round(c)  # the leader learns c's LEO=2; b's is still 1: HW stays 1
    sim.fetch_round(b)  # ... and b's: HW=2, m1 acknowledged; b learns HW=2 at once
    assert send.acknowledged and send.result.base_offset == 1
    assert leo_hw(sim, b) == (2, 2) and leo_hw(sim, c) == (2, 1)

    # The leader dies and is fenced; b, the first live ISR member, is elected.
    sim.crash(a)
    sim.controller.fence_broker(a, "killed")
    assert sim.leader_of(TP) == b
    # c becomes b's follower. Before KIP-101 it truncates to its own HW there and then
    # (Kafka 0.10.2's ReplicaManager.makeFollowers), needing nothing from b, which may be
    # dead already; with leader epochs it keeps everything until b answers.
    assert leo_hw(sim, c)[0] == (1 if lost else 2)
    sim.truncate_followers(c)
    # b dies before c refetches; c is still in the ISR and is elected cleanly.
    sim.crash(b)
    sim.controller.fence_broker(b, "killed")
    assert sim.leader_of(TP) == c
    assert sim.controller.unclean_elections == 0
    # c leads alone (since Kafka 3.7 its HW waits for a second ISR member before consumers
    # see m1), so the acknowledged record survives only if c's truncation kept it.
    kept = [value for _, value in sim.log_values(c, TP)]
    assert (b"m1" not in kept) is lost
    assert b"m0" in kept
