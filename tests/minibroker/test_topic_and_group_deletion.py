"""What a deletion does on the brokers (``stepper.py``'s brokers on one manual clock): a
deleted topic's replicas stop and their logs go (Kafka's ``ReplicaManager.applyDelta`` with
``stopPartitions(delete)``), a topic created again under the same name starts empty even on
a broker that was down meanwhile (its old log is a stray: ``LogManager.isStrayReplica``), and
a deleted group's tombstones keep it deleted when another broker becomes its coordinator
(``GroupCoordinatorShard.deleteGroups``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stepper import SimCluster
from test_group_failover import CONFIG, GROUP, OFFSETS_TP, TP, join_and_sync

from minibroker.cluster.types import ErrorCode, TopicPartition
from minibroker.coordinator.group_metadata_manager import OFFSETS_TOPIC
from minibroker.coordinator.records import OffsetAndMetadata
from minibroker.storage.log_manager import PARTITION_METADATA_FILE, read_topic_id

T0 = TopicPartition("t", 0)


def _log_dirs(sim: SimCluster, topic: str) -> list[Path]:
    return sorted(p for p in sim.root.glob(f"broker-*/{topic}-*") if p.is_dir())


def test_a_deleted_topics_replicas_stop_and_their_logs_go(tmp_path: Path) -> None:
    sim = SimCluster(tmp_path)
    sim.create_topic("t", partitions=2)
    sim.produce(T0, ["a", "b"])
    sim.replicate()
    for rm in sim.brokers.values():
        rm.checkpoint_high_watermarks()
    assert len(_log_dirs(sim, "t")) == 6
    # An acks=-1 write the followers have not fetched waits in the leader's purgatory.
    waiting = sim.produce(T0, ["c"])
    assert not waiting.done

    [deleted] = sim.controller.delete_topics(["t"], [])
    assert deleted.error == ErrorCode.none  # the metadata reaches every broker at once here
    assert waiting.result is not None and waiting.result.error == \
        ErrorCode.not_leader_or_follower
    for rm in sim.brokers.values():
        assert not [tp for tp in rm.partitions if tp.topic == "t"]
        assert not [tp for tp in rm.follower_states if tp.topic == "t"]
    assert _log_dirs(sim, "t") == []

    # The same name again: another topic, empty, its high watermark not the old one's.
    sim.create_topic("t")
    for broker_id in sim.brokers:
        assert sim.log_values(broker_id, T0) == []
        assert sim.replica(broker_id, T0).high_watermark == 0
    sim.produce(T0, ["new"])
    sim.replicate()
    assert sim.read_committed(T0) == [(0, b"new")]


def test_a_broker_down_while_its_topic_was_replaced_drops_the_old_log(tmp_path: Path
                                                                      ) -> None:
    sim = SimCluster(tmp_path)
    sim.create_topic("t")
    sim.produce(T0, ["old-0", "old-1"])
    sim.replicate()
    sim.stop(3)
    sim.controller.delete_topics(["t"], [])
    sim.create_topic("t")
    new_id = sim.controller.topics["t"].topic_id
    old_dir = tmp_path / "broker-3" / "t-0"
    assert read_topic_id(old_dir) not in (None, new_id)  # broker 3 still has the old log

    sim.start(3)
    sim.advance(3500)  # registered once its old session has expired (Kafka's registerBroker)
    assert sim.log_values(3, T0) == []  # the stray was deleted, not served as the new topic's
    assert read_topic_id(old_dir) == new_id
    sim.produce(T0, ["new"])
    sim.replicate()
    assert sim.log_values(3, T0) == [(0, b"new")]


def test_a_deleted_group_stays_deleted_under_its_next_coordinator(tmp_path: Path) -> None:
    sim = SimCluster(tmp_path, config=CONFIG)
    sim.create_topic("orders")
    sim.create_topic(OFFSETS_TOPIC, config={"cleanup.policy": "compact"})
    sim.scheduler.advance(0)
    old = sim.leader_of(OFFSETS_TP)
    coordinator = sim.coordinators[old]
    member_id, generation = join_and_sync(sim, coordinator)
    committed: list[Any] = []
    coordinator.handle_commit_offsets(GROUP, member_id, None, generation,
                                      {TP: OffsetAndMetadata(17)}, committed.append)
    sim.replicate()
    assert committed == [{TP: ErrorCode.none}]

    answers: list[dict[str, ErrorCode]] = []
    coordinator.handle_delete_groups([GROUP, "unknown"], answers.append)
    assert answers == [{GROUP: ErrorCode.non_empty_group,
                        "unknown": ErrorCode.group_id_not_found}]
    assert coordinator.handle_leave_group(GROUP, [(member_id, None)])[1] == [ErrorCode.none]

    answers.clear()
    coordinator.handle_delete_groups([GROUP, GROUP], answers.append)
    assert answers == []  # acks=-1: answered once every ISR member has the tombstones
    sim.replicate()
    assert answers == [{GROUP: ErrorCode.none}]
    assert coordinator.manager.get_group(GROUP) is None
    assert coordinator.handle_fetch_offsets(GROUP, False, [TP])[1][TP].offset == -1

    while sim.leader_of(OFFSETS_TP) == old:  # the coordinator moves
        sim.advance(250, silent=[old])
    moved = sim.coordinators[sim.leader_of(OFFSETS_TP)]
    sim.scheduler.advance(0)
    assert moved.handle_fetch_offsets(GROUP, False, [TP]) == (
        ErrorCode.none, {TP: moved.handle_fetch_offsets("never", False, [TP])[1][TP]})
    assert moved.manager.get_group(GROUP) is None
    answers.clear()
    moved.handle_delete_groups([GROUP], answers.append)
    assert answers == [{GROUP: ErrorCode.group_id_not_found}]


def test_a_topic_id_file_a_crash_cut_short_says_nothing(tmp_path: Path) -> None:
    """The file is written without an fsync: missing or cut, it names no topic, and the log
    is taken as the topic's (as a log from before the file) rather than deleted."""
    sim = SimCluster(tmp_path)
    sim.create_topic("t")
    sim.produce(T0, ["kept"])
    sim.replicate()
    sim.stop(3)
    topic_id = sim.controller.topics["t"].topic_id
    metadata = tmp_path / "broker-3" / "t-0" / PARTITION_METADATA_FILE
    assert read_topic_id(metadata.parent) == topic_id
    metadata.write_text(metadata.read_text()[:-5])  # cut inside the id
    assert read_topic_id(metadata.parent) is None
    sim.start(3)
    sim.advance(3500)  # registered once its old session has expired (Kafka's registerBroker)
    assert sim.log_values(3, T0) == [(0, b"kept")]
    assert read_topic_id(metadata.parent) == topic_id  # written again


def test_deleting_the_offsets_topic_unloads_its_groups(tmp_path: Path) -> None:
    """Kafka deletes an internal topic for a client allowed to: the coordinators of its
    partitions resign (their groups unloaded, NOT_COORDINATOR) and its logs go."""
    sim = SimCluster(tmp_path, config=CONFIG)
    sim.create_topic("orders")
    sim.create_topic(OFFSETS_TOPIC, config={"cleanup.policy": "compact"})
    sim.scheduler.advance(0)
    coordinator = sim.coordinators[sim.leader_of(OFFSETS_TP)]
    join_and_sync(sim, coordinator)
    assert coordinator.manager.owned_partitions == {0}

    [deleted] = sim.controller.delete_topics([OFFSETS_TOPIC], [])
    assert deleted.error == ErrorCode.none
    for broker in sim.coordinators.values():
        assert broker.manager.owned_partitions == set() and broker.manager.groups == {}
    assert coordinator.handle_fetch_offsets(GROUP, False, [TP])[0] == ErrorCode.not_coordinator
    assert _log_dirs(sim, OFFSETS_TOPIC) == []
