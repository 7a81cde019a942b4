"""The controller's state machine: persistence, AlterPartition validation, fencing, elections."""

from __future__ import annotations

from pathlib import Path

from minibroker.cluster.types import NO_LEADER, ErrorCode, TopicPartition
from minibroker.controller.quorum_controller import QuorumController

TP = TopicPartition("t", 0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def controller(tmp_path: Path | None, clock: Clock, **config: str) -> QuorumController:
    c = QuorumController(clock_ms=clock, config=config, data_dir=tmp_path)
    for broker_id in (1, 2, 3):
        c.register_broker(broker_id, f"inc-{broker_id}", "127.0.0.1", 9000 + broker_id)
    return c


def test_state_survives_a_controller_restart(tmp_path: Path) -> None:
    clock = Clock()
    c = controller(tmp_path, clock)
    assert c.create_topic("t", 2, 3, {"min.insync.replicas": "2"}) == (ErrorCode.none, None)
    reg = c.topics["t"].partitions[0]
    assert c.alter_partition(reg.leader, TP, reg.leader_epoch, reg.partition_epoch,
                             (reg.leader, reg.replicas[1]))[0] == ErrorCode.none
    restarted = QuorumController(clock_ms=clock, data_dir=tmp_path)
    assert restarted.image().topics == c.image().topics
    assert restarted.metadata_offset == c.metadata_offset
    assert restarted.topics["t"].config == {"min.insync.replicas": "2"}
    # Brokers get a full session from the restart before they are fenced.
    clock.now += 2000
    restarted.tick()
    assert all(not b.fenced for b in restarted.brokers.values())


def test_alter_partition_needs_the_current_partition_epoch(tmp_path: Path) -> None:
    c = controller(None, Clock())
    c.create_topic("t", 1, 3, {})
    reg = c.topics["t"].partitions[0]
    shrink = (reg.leader, reg.replicas[1])
    error, updated = c.alter_partition(reg.leader, TP, reg.leader_epoch, reg.partition_epoch,
                                       shrink)
    assert error == ErrorCode.none and updated.partition_epoch == reg.partition_epoch + 1
    stale = c.alter_partition(reg.leader, TP, reg.leader_epoch, reg.partition_epoch, reg.isr)
    assert stale[0] == ErrorCode.invalid_update_version
    not_leader = c.alter_partition(reg.replicas[1], TP, reg.leader_epoch,
                                   updated.partition_epoch, reg.isr)
    assert not_leader[0] == ErrorCode.not_leader_or_follower
    without_leader = c.alter_partition(reg.leader, TP, reg.leader_epoch,
                                       updated.partition_epoch, (reg.replicas[1],))
    assert without_leader[0] == ErrorCode.invalid_request


def test_session_expiry_fences_and_moves_leadership() -> None:
    clock = Clock()
    c = controller(None, clock, **{"broker.session.timeout.ms": "1000"})
    c.create_topic("t", 1, 3, {})
    leader = c.topics["t"].partitions[0].leader
    clock.now = 1500
    for broker_id in (1, 2, 3):
        if broker_id != leader:
            assert c.heartbeat(broker_id, f"inc-{broker_id}") == ErrorCode.none
    c.tick()
    reg = c.topics["t"].partitions[0]
    assert c.brokers[leader].fenced
    assert reg.leader not in (leader, NO_LEADER) and leader not in reg.isr
    assert reg.leader_epoch == 1
    assert c.heartbeat(leader, f"inc-{leader}") == ErrorCode.broker_id_not_registered


def test_a_restarted_broker_is_fenced_out_of_the_isr_first() -> None:
    c = controller(None, Clock())
    c.create_topic("t", 1, 3, {})
    reg = c.topics["t"].partitions[0]
    c.register_broker(reg.leader, "new-incarnation", "127.0.0.1", 9999)
    after = c.topics["t"].partitions[0]
    assert after.leader != reg.leader and reg.leader not in after.isr
    assert not c.brokers[reg.leader].fenced


def test_create_topic_defaults_and_validation() -> None:
    c = controller(None, Clock(), **{"num.partitions": "2", "default.replication.factor": "3"})
    assert c.create_topic("defaults", -1, -1, {})[0] == ErrorCode.none
    assert len(c.topics["defaults"].partitions) == 2
    assert c.create_topic("defaults", 1, 1, {})[0] == ErrorCode.topic_already_exists
    assert c.create_topic("big", 1, 4, {})[0] == ErrorCode.invalid_replication_factor
    error, message = c.create_topic("bad", 1, 1, {"no.such.config": "1"})
    assert error == ErrorCode.invalid_config and "no.such.config" in message
    assert c.create_topic("bad name!", 1, 1, {})[0] == ErrorCode.invalid_topic_exception


def test_preferred_leader_election_restores_the_first_replica() -> None:
    clock = Clock()
    c = controller(None, clock, **{"leader.imbalance.check.interval.ms": "1000"})
    c.create_topic("t", 1, 3, {})
    preferred = c.topics["t"].partitions[0].replicas[0]
    c.fence_broker(preferred, "test")
    moved = c.topics["t"].partitions[0]
    assert moved.leader != preferred
    c.register_broker(preferred, f"inc-{preferred}", "127.0.0.1", 9000)
    # Back, but not in the ISR yet: no election.
    clock.now = 1500
    c.tick()
    assert c.topics["t"].partitions[0].leader == moved.leader
    # The leader adds it back to the ISR; at the next check it leads again.
    reg = c.topics["t"].partitions[0]
    c.alter_partition(reg.leader, TP, reg.leader_epoch, reg.partition_epoch,
                      (*reg.isr, preferred))
    clock.now = 3000
    c.tick()
    after = c.topics["t"].partitions[0]
    assert after.leader == preferred and after.leader_epoch == moved.leader_epoch + 1


def test_no_rebalance_when_disabled() -> None:
    clock = Clock()
    c = controller(None, clock, **{"auto.leader.rebalance.enable": "false",
                                    "leader.imbalance.check.interval.ms": "1000"})
    c.create_topic("t", 1, 3, {})
    preferred = c.topics["t"].partitions[0].replicas[0]
    c.fence_broker(preferred, "test")
    c.register_broker(preferred, f"inc-{preferred}", "127.0.0.1", 9000)
    reg = c.topics["t"].partitions[0]
    c.alter_partition(reg.leader, TP, reg.leader_epoch, reg.partition_epoch,
                      (*reg.isr, preferred))
    clock.now = 5000
    c.tick()
    assert c.topics["t"].partitions[0].leader != preferred
