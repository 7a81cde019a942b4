"""The controller's state machine: persistence, AlterPartition validation, fencing, elections."""

from __future__ import annotations

from pathlib import Path

from minibroker.cluster.types import NO_LEADER, ErrorCode, MetadataImage, TopicPartition
from minibroker.controller.quorum_controller import AlterPartitionItem, QuorumController
from minibroker.events import ReplicationEventLog

TP = TopicPartition("t", 0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def join(c: QuorumController, broker_id: int, incarnation: str | None = None) -> int:
    """Register, then heartbeat as a broker that has caught up with the metadata log."""
    epoch = c.register_broker(broker_id, incarnation or f"inc-{broker_id}", "127.0.0.1",
                              9000 + broker_id)
    assert c.heartbeat(broker_id, epoch, c.metadata_offset) == (ErrorCode.none, False)
    return epoch


def controller(events_dir: Path, clock: Clock, *, data_dir: Path | None = None,
               **config: str) -> QuorumController:
    c = QuorumController(clock_ms=clock, events=ReplicationEventLog(events_dir), config=config,
                         data_dir=data_dir)
    for broker_id in (1, 2, 3):
        join(c, broker_id)
    return c


def test_state_survives_a_controller_restart(tmp_path: Path) -> None:
    clock = Clock()
    c = controller(tmp_path, clock, data_dir=tmp_path)
    assert c.create_topic("t", 2, 3, {"min.insync.replicas": "2"}) == (ErrorCode.none, None)
    reg = c.topics["t"].partitions[0]
    assert c.alter_partition(reg.leader, TP, reg.leader_epoch, reg.partition_epoch,
                             (reg.leader, reg.replicas[1]))[0] == ErrorCode.none
    restarted = QuorumController(clock_ms=clock, events=ReplicationEventLog(tmp_path),
                                 data_dir=tmp_path)
    assert restarted.image().topics == c.image().topics
    assert restarted.metadata_offset == c.metadata_offset
    assert restarted.topics["t"].config == {"min.insync.replicas": "2"}
    # Brokers get a full session from the restart before they are fenced.
    clock.now += 2000
    restarted.tick()
    assert all(not b.fenced for b in restarted.brokers.values())


def test_a_brokers_named_listeners_are_in_the_image_and_survive_a_restart(
        tmp_path: Path) -> None:
    clock = Clock()
    c = controller(tmp_path, clock, data_dir=tmp_path)
    epoch = c.register_broker(1, "inc-1b", "127.0.0.1", 9001,
                              {"CONSUMER_C1": ("127.0.0.1", 29001)})
    c.heartbeat(1, epoch, c.metadata_offset)
    assert c.image().brokers[1].address("CONSUMER_C1") == ("127.0.0.1", 29001)
    assert c.image().brokers[1].address("PLAINTEXT") == ("127.0.0.1", 9001)
    assert c.image().brokers[2].address("CONSUMER_C1") is None
    restarted = QuorumController(clock_ms=clock, events=ReplicationEventLog(tmp_path),
                                 data_dir=tmp_path)
    assert restarted.image().brokers == c.image().brokers
    # What a broker receives goes through JSON.
    assert MetadataImage.from_json(c.image().to_json()).brokers == c.image().brokers


def test_alter_partition_needs_the_current_partition_epoch(tmp_path: Path) -> None:
    c = controller(tmp_path, Clock())
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


def test_session_expiry_fences_and_moves_leadership(tmp_path: Path) -> None:
    clock = Clock()
    c = controller(tmp_path, clock, **{"broker.session.timeout.ms": "1000"})
    c.create_topic("t", 1, 3, {})
    leader = c.topics["t"].partitions[0].leader
    clock.now = 1500
    for broker_id in (1, 2, 3):
        if broker_id != leader:
            assert c.heartbeat(broker_id, c.brokers[broker_id].broker_epoch,
                               c.metadata_offset) == (ErrorCode.none, False)
    c.tick()
    reg = c.topics["t"].partitions[0]
    assert c.brokers[leader].fenced
    assert reg.leader not in (leader, NO_LEADER) and leader not in reg.isr
    assert reg.leader_epoch == 1
    # Its session is back (same broker epoch, metadata caught up): unfenced, not leader.
    assert c.heartbeat(leader, c.brokers[leader].broker_epoch, c.metadata_offset) == (
        ErrorCode.none, False)
    assert c.topics["t"].partitions[0] == reg


def test_kraft_a_registered_broker_stays_fenced_until_it_has_caught_up_with_the_metadata(
        tmp_path: Path) -> None:
    """KRaft's BrokerHeartbeatManager: a (re)registered broker is fenced, so it can be neither
    elected nor added to an ISR, until a heartbeat shows its metadata offset has reached its
    registration record (its broker epoch). Before that it has not learnt the current leaders
    and epochs; electing it would act on a stale view of the partition."""
    c = QuorumController(clock_ms=Clock(), events=ReplicationEventLog(tmp_path),
                         config={"unclean.leader.election.enable": "true"})
    first = join(c, 1)
    c.create_topic("t", 1, 1, {})
    c.fence_broker(1, "test")
    assert c.topics["t"].partitions[0].leader == NO_LEADER
    epoch = c.register_broker(1, "inc-1-again", "127.0.0.1", 9001)
    assert epoch > first
    assert c.brokers[1].fenced and 1 not in c.image().brokers
    assert c.heartbeat(1, epoch, epoch - 1) == (ErrorCode.none, True)
    assert c.topics["t"].partitions[0].leader == NO_LEADER
    assert c.heartbeat(1, first, c.metadata_offset) == (ErrorCode.stale_broker_epoch, True)
    assert c.heartbeat(1, epoch, epoch) == (ErrorCode.none, False)
    assert c.topics["t"].partitions[0].leader == 1
    assert c.heartbeat(7, 0, c.metadata_offset)[0] == ErrorCode.broker_id_not_registered


def test_kraft_alter_partition_checks_every_member_of_the_new_isr(tmp_path: Path) -> None:
    """KRaft's ReplicationControlManager checks each replica the new ISR holds, kept or
    added: a fenced one makes the change INELIGIBLE_REPLICA."""
    c = controller(tmp_path, Clock())
    c.create_topic("t", 1, 3, {})
    reg = c.topics["t"].partitions[0]
    kept = reg.isr[-1]
    # Fenced between the leader's view of the ISR and its request (the controller has not
    # yet removed it from this partition's ISR).
    c.brokers[kept].fenced = True
    error, _ = c.alter_partition(reg.leader, TP, reg.leader_epoch, reg.partition_epoch,
                                 (reg.leader, kept))
    assert error == ErrorCode.ineligible_replica


def test_a_restarted_broker_is_fenced_out_of_the_isr_first(tmp_path: Path) -> None:
    c = controller(tmp_path, Clock())
    c.create_topic("t", 1, 3, {})
    reg = c.topics["t"].partitions[0]
    c.register_broker(reg.leader, "new-incarnation", "127.0.0.1", 9999)
    after = c.topics["t"].partitions[0]
    assert after.leader != reg.leader and reg.leader not in after.isr
    assert c.brokers[reg.leader].fenced


def test_create_topic_defaults_and_validation(tmp_path: Path) -> None:
    c = controller(tmp_path, Clock(), **{"num.partitions": "2", "default.replication.factor": "3"})
    assert c.create_topic("defaults", -1, -1, {})[0] == ErrorCode.none
    assert len(c.topics["defaults"].partitions) == 2
    assert c.create_topic("defaults", 1, 1, {})[0] == ErrorCode.topic_already_exists
    assert c.create_topic("big", 1, 4, {})[0] == ErrorCode.invalid_replication_factor
    error, message = c.create_topic("bad", 1, 1, {"no.such.config": "1"})
    assert error == ErrorCode.invalid_config and "no.such.config" in message
    assert c.create_topic("bad name!", 1, 1, {})[0] == ErrorCode.invalid_topic_exception


def test_preferred_leader_election_restores_the_first_replica(tmp_path: Path) -> None:
    clock = Clock()
    c = controller(tmp_path, clock, **{"leader.imbalance.check.interval.ms": "1000"})
    c.create_topic("t", 1, 3, {})
    preferred = c.topics["t"].partitions[0].replicas[0]
    c.fence_broker(preferred, "test")
    moved = c.topics["t"].partitions[0]
    assert moved.leader != preferred
    join(c, preferred, "again")
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


def test_no_rebalance_when_disabled(tmp_path: Path) -> None:
    clock = Clock()
    c = controller(tmp_path, clock, **{"auto.leader.rebalance.enable": "false",
                                        "leader.imbalance.check.interval.ms": "1000"})
    c.create_topic("t", 1, 3, {})
    preferred = c.topics["t"].partitions[0].replicas[0]
    c.fence_broker(preferred, "test")
    join(c, preferred, "again")
    reg = c.topics["t"].partitions[0]
    c.alter_partition(reg.leader, TP, reg.leader_epoch, reg.partition_epoch,
                      (*reg.isr, preferred))
    clock.now = 5000
    c.tick()
    assert c.topics["t"].partitions[0].leader != preferred


def test_kip_903_alter_partition_refuses_a_member_from_an_older_registration(
        tmp_path: Path) -> None:
    """AlterPartition v3 carries the broker epoch each ISR member fetched with; a member that
    has registered again since (a restart) is INELIGIBLE_REPLICA, -1 skips the check."""
    c = controller(tmp_path, Clock())
    c.create_topic("t", 1, 3, {})
    reg = c.topics["t"].partitions[0]
    follower = reg.replicas[1]
    old_epoch = c.brokers[follower].broker_epoch
    shrink = (reg.leader, reg.replicas[2])
    error, reg = c.alter_partition(reg.leader, TP, reg.leader_epoch, reg.partition_epoch,
                                   shrink)
    assert error == ErrorCode.none
    join(c, follower, "restarted")
    reg = c.topics["t"].partitions[0]
    expand = tuple(sorted((*reg.isr, follower)))
    epochs = {r: c.brokers[r].broker_epoch for r in expand}
    stale = tuple(old_epoch if r == follower else epochs[r] for r in expand)
    assert c.alter_partition(reg.leader, TP, reg.leader_epoch, reg.partition_epoch, expand,
                             stale)[0] == ErrorCode.ineligible_replica
    unknown = tuple(-1 if r == follower else epochs[r] for r in expand)
    assert c.alter_partition(reg.leader, TP, reg.leader_epoch, reg.partition_epoch, expand,
                             unknown)[0] == ErrorCode.none


def test_an_alter_partition_batch_answers_each_item_and_commits_once(tmp_path: Path) -> None:
    c = controller(tmp_path, Clock())
    c.create_topic("t", 6, 3, {})
    mine = [i for i, reg in c.topics["t"].partitions.items() if reg.leader == 1]
    other = next(i for i, reg in c.topics["t"].partitions.items() if reg.leader != 1)
    items = [AlterPartitionItem(TopicPartition("t", i), 0, 0, (1,)) for i in mine]
    items.append(AlterPartitionItem(TopicPartition("t", other), 0, 0, (1,)))
    items.append(AlterPartitionItem(TopicPartition("t", mine[0]), 0, 0, (1, 2)))  # stale now
    before = c.metadata_offset
    answers = c.alter_partitions(1, items)
    assert [error for error, _ in answers] == [ErrorCode.none] * len(mine) + [
        ErrorCode.not_leader_or_follower, ErrorCode.invalid_update_version]
    assert all(reg.isr == (1,) for _, reg in answers[:len(mine)])
    assert c.metadata_offset == before + 1
    # A batch of refusals commits nothing.
    assert c.alter_partitions(1, items[-2:])[0][0] == ErrorCode.not_leader_or_follower
    assert c.metadata_offset == before + 1
