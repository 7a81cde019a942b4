"""KIP-704's leader recovery state, as Kafka 4.2 keeps it: an unclean election (the last known
leader's included) marks the partition RECOVERING, the ISR stays the leader alone while it is
(``ReplicationControlManager.validateAlterPartitionData``), and the leader's first
AlterPartition, which carries RECOVERED (``Partition.makeLeader``), ends it."""

from __future__ import annotations

from pathlib import Path

from rule_sets import KAFKA_4_2
from stepper import SimCluster
from test_controller import Clock, join

from minibroker.cluster.types import (
    NO_LEADER,
    ErrorCode,
    LeaderRecoveryState,
    PartitionRegistration,
    TopicPartition,
)
from minibroker.controller.partition_change import build_change
from minibroker.controller.quorum_controller import AlterPartitionItem, QuorumController
from minibroker.events import ElectionKind, ReplicationEventLog

RECOVERED, RECOVERING = LeaderRecoveryState.RECOVERED, LeaderRecoveryState.RECOVERING
TP = TopicPartition("t", 0)


def change(reg: PartitionRegistration, *, target_isr: tuple[int, ...],
           live: tuple[int, ...] = (1, 2, 3), elr: bool = True, unclean: bool = True,
           target_recovery_state: LeaderRecoveryState | None = None):
    return build_change(reg, target_isr=target_isr, min_isr=2,
                        is_acceptable_leader=lambda b: b in live, elr_enabled=elr,
                        unclean_enabled=unclean, target_recovery_state=target_recovery_state)


def test_only_an_unclean_election_marks_the_partition_recovering() -> None:
    """``PartitionChangeBuilder.tryElection``: RECOVERING when ``electionResult.unclean``,
    which the last known leader's election is too; a clean or an ELR election keeps the state
    it finds."""
    base = PartitionRegistration(replicas=(1, 2, 3), isr=(1,), leader=1, leader_epoch=4,
                                 partition_epoch=9)
    unclean = change(base, target_isr=(), live=(3,))
    assert (unclean.election, unclean.registration.leader) == (ElectionKind.UNCLEAN, 3)
    assert unclean.registration.leader_recovery_state is RECOVERING
    last_known = change(PartitionRegistration(
        replicas=(1, 2, 3), isr=(), leader=NO_LEADER, leader_epoch=4, partition_epoch=9,
        last_known_elr=(2,)), target_isr=())
    assert last_known.election is ElectionKind.LAST_KNOWN_LEADER
    assert last_known.registration.leader_recovery_state is RECOVERING
    from_elr = change(PartitionRegistration(
        replicas=(1, 2, 3), isr=(1,), leader=1, leader_epoch=4, partition_epoch=9, elr=(2,)),
        target_isr=(), live=(2, 3))
    assert from_elr.election is ElectionKind.ELR
    assert from_elr.registration.leader_recovery_state is RECOVERED
    clean = change(PartitionRegistration(
        replicas=(1, 2, 3), isr=(1, 2), leader=1, leader_epoch=4, partition_epoch=9,
        leader_recovery_state=RECOVERING), target_isr=(2,), live=(2, 3))
    assert clean.election is ElectionKind.CLEAN
    assert clean.registration.leader_recovery_state is RECOVERING, "kept until the leader says"


def test_the_leaders_recovered_state_is_a_change_of_its_own() -> None:
    """A target state alone changes the registration: a new partition epoch, no new leader
    epoch (``build`` sets the record's field whenever the target differs)."""
    reg = PartitionRegistration(replicas=(1, 2, 3), isr=(3,), leader=3, leader_epoch=5,
                                partition_epoch=10, leader_recovery_state=RECOVERING)
    after = change(reg, target_isr=(3,), target_recovery_state=RECOVERED).registration
    assert (after.leader_recovery_state, after.leader_epoch, after.partition_epoch) == (
        RECOVERED, 5, 11)
    assert change(reg, target_isr=(3,)).registration == reg, "no target, no change"


def test_the_controller_keeps_a_recovering_isr_to_its_leader(tmp_path: Path) -> None:
    """``validateAlterPartitionData``: an AlterPartition that says RECOVERING with more than
    the leader in the ISR is INVALID_REQUEST, as is one that would take a recovered partition
    back to RECOVERING; the leader's RECOVERED with the expanded ISR ends the recovery, and
    the controller writes an event for each state."""
    events = ReplicationEventLog(tmp_path)
    c = QuorumController(clock_ms=Clock(), events=events,
                         config={"unclean.leader.election.enable": "true"})
    for broker_id in (1, 2):
        join(c, broker_id)
    c.create_topic("t", 1, 2, {})
    reg = c.topics["t"].partitions[0]
    leader, follower = reg.leader, next(r for r in reg.replicas if r != reg.leader)
    error, reg = c.alter_partition(leader, TP, reg.leader_epoch, reg.partition_epoch, (leader,))
    assert error is ErrorCode.none
    c.fence_broker(leader, "test")
    reg = c.topics["t"].partitions[0]
    assert (reg.leader, reg.isr, reg.leader_recovery_state) == (follower, (follower,),
                                                                RECOVERING)
    assert c.heartbeat(leader, c.brokers[leader].broker_epoch, c.metadata_offset)[0] is (
        ErrorCode.none)

    def alter(isr: tuple[int, ...], state: LeaderRecoveryState
              ) -> tuple[ErrorCode, PartitionRegistration | None]:
        now = c.topics["t"].partitions[0]
        [answer] = c.alter_partitions(follower, [AlterPartitionItem(
            TP, now.leader_epoch, now.partition_epoch, isr, leader_recovery_state=state)])
        return answer

    assert alter((follower, leader), RECOVERING)[0] is ErrorCode.invalid_request
    assert c.topics["t"].partitions[0] == reg, "a refused change changes nothing"
    assert alter((follower,), RECOVERING)[0] is ErrorCode.none, "the leader alone may stay"
    error, after = alter((follower, leader), RECOVERED)
    assert error is ErrorCode.none
    assert (after.isr, after.leader_recovery_state) == (reg.replicas, RECOVERED)
    assert alter((follower,), RECOVERING)[0] is ErrorCode.invalid_request
    recoveries = [(e["leader"], e["leader_recovery_state"], e["broker"])
                  for e in events.read()["events"] if e["type"] == "leader_recovery"]
    assert recoveries == [(follower, "RECOVERING", follower), (follower, "RECOVERED", follower)]


def test_a_partition_is_recovering_from_its_unclean_election_until_the_isr_grows(
        tmp_path: Path) -> None:
    """On brokers: the uncleanly elected leader marks itself RECOVERED at once (Kafka 4.2's
    ``Partition.makeLeader``); the registration stays RECOVERING, its ISR the leader alone,
    until the leader's AlterPartition that adds a caught-up follower, which also says
    RECOVERED."""
    sim = SimCluster(tmp_path, brokers=3, config={
        "min.insync.replicas": "2", "replica.lag.time.max.ms": "3000",
        "unclean.leader.election.enable": "true", **KAFKA_4_2})
    sim.create_topic("t", replication_factor=3)
    send = sim.produce(TP, ["a"], acks=-1)
    sim.replicate(rounds=2)
    assert send.acknowledged
    for broker_id in (3, 2, 1):
        sim.crash(broker_id)
        sim.advance(3500)
        if broker_id == 3:
            sim.start(3)  # back, out of the ISR, not fetching: the unclean candidate
    reg = sim.registration(TP)
    assert (reg.leader, reg.isr, reg.leader_recovery_state) == (3, (3,), RECOVERING)
    assert sim.brokers[3].partitions[TP].leader_recovery_state is RECOVERED
    sim.start(1)
    sim.advance(100)
    assert sim.registration(TP).leader_recovery_state is RECOVERING, "nothing has fetched yet"
    sim.replicate(rounds=3)
    reg = sim.registration(TP)
    assert (reg.leader, reg.leader_recovery_state) == (3, RECOVERED)
    assert 1 in reg.isr
    states = [e["leader_recovery_state"] for e in sim.events()
              if e["type"] == "leader_recovery"]
    assert states == ["RECOVERING", "RECOVERED"]
