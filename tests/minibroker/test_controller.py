"""The controller's state machine: persistence, AlterPartition validation, fencing, elections."""

from __future__ import annotations

from pathlib import Path

import pytest

from minibroker.cluster.types import NO_LEADER, ErrorCode, MetadataImage, TopicPartition
from minibroker.controller.quorum_controller import (
    AlterPartitionItem,
    DuplicateBrokerRegistration,
    QuorumController,
)
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
    # The same incarnation registering again amends its listeners.
    c.register_broker(1, "inc-1", "127.0.0.1", 9001, {"CONSUMER_C1": ("127.0.0.1", 29001)})
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


def test_kraft_a_new_incarnation_is_refused_while_the_old_session_lives(
        tmp_path: Path) -> None:
    """Kafka 4.2's ClusterControlManager.registerBroker: a restarted broker (a new incarnation
    id) is refused with DuplicateBrokerRegistrationException while the registered
    incarnation's session is valid (BrokerHeartbeatManager.hasValidSession: a heartbeat
    within broker.session.timeout.ms); nothing changes meanwhile. Once it has expired the new
    incarnation gets a new broker epoch, and the old one leaves the ISR and its leadership."""
    clock = Clock()
    c = controller(tmp_path, clock, **{"broker.session.timeout.ms": "1000"})
    c.create_topic("t", 1, 3, {})
    reg = c.topics["t"].partitions[0]
    old_epoch, offset = c.brokers[reg.leader].broker_epoch, c.metadata_offset
    others = [b for b in (1, 2, 3) if b != reg.leader]
    for now in (0, 500, 1000):  # the last heartbeat was at 0: valid up to 1000 included
        clock.now = now
        for b in others:
            c.heartbeat(b, c.brokers[b].broker_epoch, c.metadata_offset)
        with pytest.raises(DuplicateBrokerRegistration, match="session has not expired"):
            c.register_broker(reg.leader, "new-incarnation", "127.0.0.1", 9999)
        assert c.topics["t"].partitions[0] == reg and c.is_live(reg.leader)
        assert (c.brokers[reg.leader].incarnation_id, c.brokers[reg.leader].broker_epoch) == (
            f"inc-{reg.leader}", old_epoch)
    assert c.metadata_offset == offset
    clock.now = 1001
    epoch = c.register_broker(reg.leader, "new-incarnation", "127.0.0.1", 9999)
    after = c.topics["t"].partitions[0]
    assert epoch > old_epoch and c.brokers[reg.leader].fenced
    assert after.leader != reg.leader and reg.leader not in after.isr


def test_kraft_a_new_incarnation_registers_at_once_when_the_old_has_no_session(
        tmp_path: Path) -> None:
    """The old incarnation's session is gone once it expired (the controller fenced it), and
    a broker fenced at a controller's restart has none (ClusterControlManager.activate
    tracks only unfenced brokers); an unfenced one gets a full session from the restart."""
    clock = Clock()
    c = controller(tmp_path, clock, data_dir=tmp_path,
                   **{"broker.session.timeout.ms": "1000"})
    clock.now = 1500
    for b in (2, 3):
        c.heartbeat(b, c.brokers[b].broker_epoch, c.metadata_offset)
    c.tick()
    assert c.brokers[1].fenced
    assert c.register_broker(1, "inc-1b", "127.0.0.1", 9001) > 0
    restarted = QuorumController(clock_ms=clock, events=ReplicationEventLog(tmp_path),
                                 config={"broker.session.timeout.ms": "1000"},
                                 data_dir=tmp_path)
    assert restarted.register_broker(1, "inc-1c", "127.0.0.1", 9001) > 0  # fenced: at once
    with pytest.raises(DuplicateBrokerRegistration):
        restarted.register_broker(2, "inc-2b", "127.0.0.1", 9002)
    clock.now = 2501
    assert restarted.register_broker(2, "inc-2b", "127.0.0.1", 9002) > 0


def test_kraft_the_same_incarnation_registering_again_keeps_its_broker_epoch(
        tmp_path: Path) -> None:
    """registerBroker's same-incarnation case (a registration whose answer was lost, sent
    again): the registration is amended, with the same broker epoch and fenced state; no
    fencing, no ISR or leader change. A fenced broker is unfenced once it has caught up with
    the amended registration's record (registerBrokerRecordOffsets)."""
    clock = Clock()
    c = controller(tmp_path, clock)
    c.create_topic("t", 1, 3, {})
    reg = c.topics["t"].partitions[0]
    epoch = c.brokers[reg.leader].broker_epoch
    assert c.register_broker(reg.leader, f"inc-{reg.leader}", "127.0.0.1", 7000) == epoch
    assert c.is_live(reg.leader) and c.topics["t"].partitions[0] == reg
    assert c.image().brokers[reg.leader].address("PLAINTEXT") == ("127.0.0.1", 7000)
    assert c.heartbeat(reg.leader, epoch, c.metadata_offset) == (ErrorCode.none, False)
    # Fenced, registered anew (its first answer lost), then registering once more.
    c.fence_broker(1, "test")
    first = c.register_broker(1, "inc-1b", "127.0.0.1", 9001)
    assert c.register_broker(1, "inc-1b", "127.0.0.1", 9001) == first
    assert c.brokers[1].fenced
    assert c.heartbeat(1, first, c.metadata_offset - 1) == (ErrorCode.none, True)
    assert c.heartbeat(1, first, c.metadata_offset) == (ErrorCode.none, False)


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
    c.fence_broker(follower, "it was killed")  # its session is over: it may register again
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


def test_kraft_a_controlled_shutdown_moves_leaderships_before_the_broker_may_stop(
        tmp_path: Path) -> None:
    """Kafka 4.2's BrokerHeartbeatManager.calculateNextBrokerState: an unfenced leader that
    heartbeats with wantShutDown enters CONTROLLED_SHUTDOWN (not fenced, not told to stop):
    it leaves every ISR and its leaderships move (handleBrokerInControlledShutdown), and it
    may neither lead nor rejoin an ISR (isActive). It is told to stop (shouldShutDown, and
    fenced) only once every active broker has reported the metadata offset of that change
    (lowestActiveOffset)."""
    clock = Clock()
    c = controller(tmp_path, clock)
    c.create_topic("t", 3, 3, {})
    leader = c.topics["t"].partitions[0].leader
    led = [i for i, reg in c.topics["t"].partitions.items() if reg.leader == leader]
    for b in (1, 2, 3):
        c.heartbeat(b, c.brokers[b].broker_epoch, c.metadata_offset)
    epoch = c.brokers[leader].broker_epoch
    assert c.heartbeat(leader, epoch, c.metadata_offset, want_shut_down=True) == (
        ErrorCode.none, False)
    shutdown_offset = c.metadata_offset
    for i in led:
        reg = c.topics["t"].partitions[i]
        assert reg.leader not in (leader, NO_LEADER) and leader not in reg.isr
    assert all(leader not in reg.isr for reg in c.topics["t"].partitions.values())
    assert c.brokers[leader].in_controlled_shutdown and not c.is_live(leader)
    reg = c.topics["t"].partitions[led[0]]
    assert c.alter_partition(reg.leader, TopicPartition("t", led[0]), reg.leader_epoch,
                             reg.partition_epoch, (*reg.isr, leader))[0] == \
        ErrorCode.ineligible_replica
    # The other brokers have not seen the change yet: not yet.
    assert c.heartbeat(leader, epoch, c.metadata_offset, want_shut_down=True) == (
        ErrorCode.none, False)
    others = [b for b in (1, 2, 3) if b != leader]
    c.heartbeat(others[0], c.brokers[others[0]].broker_epoch, shutdown_offset)
    assert c.heartbeat(leader, epoch, c.metadata_offset, want_shut_down=True) == (
        ErrorCode.none, False)
    c.heartbeat(others[1], c.brokers[others[1]].broker_epoch, shutdown_offset)
    assert c.heartbeat(leader, epoch, c.metadata_offset, want_shut_down=True) == (
        ErrorCode.none, True)
    assert c.brokers[leader].fenced
    # Its session lives on: a restart within it waits, as after any stop.
    with pytest.raises(DuplicateBrokerRegistration):
        c.register_broker(leader, "restarted", "127.0.0.1", 9999)


def test_kraft_a_broker_that_leads_nothing_is_let_go_at_once(tmp_path: Path) -> None:
    """calculateNextBrokerState: an unfenced broker without leaderships that wants to shut
    down is fenced and told to stop at once (SHUTDOWN_NOW, handleBrokerFenced: out of every
    ISR); so is a fenced one."""
    c = controller(tmp_path, Clock())
    c.create_topic("t", 1, 3, {})
    reg = c.topics["t"].partitions[0]
    follower = reg.isr[-1]
    epoch = c.brokers[follower].broker_epoch
    assert c.heartbeat(follower, epoch, c.metadata_offset, want_shut_down=True) == (
        ErrorCode.none, True)
    after = c.topics["t"].partitions[0]
    assert after.leader == reg.leader and follower not in after.isr
    assert c.heartbeat(follower, epoch, c.metadata_offset, want_shut_down=True) == (
        ErrorCode.none, True)
