"""The controller's DeleteTopics and CreatePartitions (``QuorumController.delete_topics``,
``create_partitions``), step by step: Kafka 4.2's ``ReplicationControlManager`` answers,
each error with its message, the bound on what one request creates, and that what was done
survives a controller restart."""

from __future__ import annotations

from pathlib import Path

from test_controller import Clock, controller, join

from minibroker.cluster.types import ErrorCode, NewPartitions
from minibroker.controller.quorum_controller import MAX_PARTITIONS_PER_BATCH, QuorumController


def test_delete_by_name_and_by_id_in_one_commit(tmp_path: Path) -> None:
    c = controller(tmp_path, Clock())
    for name in ("a", "b", "c"):
        assert c.create_topic(name, 2, 3, {}) == (ErrorCode.none, None)
    b_id = c.topics["b"].topic_id
    before = c.metadata_offset
    results = c.delete_topics(["a", "nope"], [b_id, "f" * 32])
    assert {(r.name, r.error) for r in results} == {
        ("a", ErrorCode.none), ("b", ErrorCode.none),
        ("nope", ErrorCode.unknown_topic_or_partition), (None, ErrorCode.unknown_topic_id)}
    assert set(c.topics) == {"c"}
    assert c.metadata_offset == before + 1  # RemoveTopicRecords, committed together


def test_a_name_whose_id_was_also_given_is_an_invalid_request(tmp_path: Path) -> None:
    """ControllerApis.deleteTopics: the name's answer is INVALID_REQUEST and the id gets none
    of its own; nothing is deleted."""
    c = controller(tmp_path, Clock())
    c.create_topic("a", 1, 3, {})
    [result] = c.delete_topics(["a"], [c.topics["a"].topic_id])
    assert (result.name, result.error, result.message) == (
        "a", ErrorCode.invalid_request,
        "The provided topic name maps to an ID that was already supplied.")
    assert "a" in c.topics


def test_deletion_disabled_answers_every_topic(tmp_path: Path) -> None:
    c = controller(tmp_path, Clock(), **{"delete.topic.enable": "false"})
    c.create_topic("a", 1, 3, {})
    assert [r.error for r in c.delete_topics(["a"], ["0" * 32])] == [
        ErrorCode.topic_deletion_disabled] * 2
    assert "a" in c.topics


def test_deletion_survives_a_restart(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    c = controller(tmp_path, Clock(), data_dir=tmp_path / "state")
    c.create_topic("a", 1, 3, {})
    c.delete_topics(["a"], [])
    restarted = QuorumController(clock_ms=Clock(), events=c._events, data_dir=tmp_path / "state")
    assert restarted.topics == {}


def test_new_partitions_are_placed_over_the_live_brokers(tmp_path: Path) -> None:
    c = controller(tmp_path, Clock())
    c.create_topic("t", 1, 2, {})
    assert c.create_partitions([NewPartitions("t", 4)]) == [(ErrorCode.none, None)]
    partitions = c.topics["t"].partitions
    assert sorted(partitions) == [0, 1, 2, 3]
    for index in (1, 2, 3):
        reg = partitions[index]
        assert len(reg.replicas) == 2 and reg.isr == reg.replicas
        assert (reg.leader, reg.leader_epoch, reg.partition_epoch) == (reg.replicas[0], 0, 0)
    # Round robin: each new partition starts on the next live broker.
    assert [partitions[i].replicas[0] for i in (1, 2, 3)] == [2, 3, 1]


def test_create_partitions_errors_are_kafkas(tmp_path: Path) -> None:
    c = controller(tmp_path, Clock())
    c.create_topic("t", 2, 3, {})
    assert c.create_partitions([
        NewPartitions("nope", 3), NewPartitions("t", 2), NewPartitions("t", 1),
        NewPartitions("t", 4, ((1, 2, 3),)),
    ]) == [
        (ErrorCode.unknown_topic_or_partition, None),
        (ErrorCode.invalid_partitions, "Topic already has 2 partition(s)."),
        (ErrorCode.invalid_partitions,
         "The topic t currently has 2 partition(s); 1 would not be an increase."),
        (ErrorCode.invalid_replica_assignment,
         "Attempted to add 2 additional partition(s), but only 1 assignment(s) were "
         "specified."),
    ]
    assert len(c.topics["t"].partitions) == 2


def test_manual_assignments_are_checked_as_kafka_checks_them(tmp_path: Path) -> None:
    c = controller(tmp_path, Clock())
    c.create_topic("t", 1, 2, {})

    def add(*replicas: int) -> tuple[ErrorCode, str | None]:
        [answer] = c.create_partitions([NewPartitions("t", 2, (replicas,))],
                                       validate_only=True)
        return answer

    assert add() == (ErrorCode.invalid_replica_assignment,
                     "The manual partition assignment includes an empty replica list.")
    assert add(1, 9) == (ErrorCode.invalid_replica_assignment,
                         "The manual partition assignment includes broker 9, but no such "
                         "broker is registered.")
    assert add(2, 2) == (ErrorCode.invalid_replica_assignment,
                         "The manual partition assignment includes the broker 2 more than "
                         "once.")
    assert add(1, 2, 3)[0] == ErrorCode.invalid_replica_assignment  # not the topic's RF
    c.fence_broker(3, "a test")
    c.fence_broker(1, "a test")
    assert add(3, 1) == (ErrorCode.invalid_replica_assignment,
                         "All brokers specified in the manual partition assignment for "
                         "partition 1 are fenced or in controlled shutdown.")
    # A fenced replica is assigned but starts out of the ISR; the first live one leads.
    assert c.create_partitions([NewPartitions("t", 2, ((3, 2),))]) == [(ErrorCode.none, None)]
    reg = c.topics["t"].partitions[1]
    assert (reg.replicas, reg.isr, reg.leader) == ((3, 2), (2,), 2)


def test_validate_only_changes_nothing(tmp_path: Path) -> None:
    c = controller(tmp_path, Clock())
    c.create_topic("t", 1, 3, {})
    offset = c.metadata_offset
    assert c.create_partitions([NewPartitions("t", 3)], validate_only=True) == [
        (ErrorCode.none, None)]
    assert (len(c.topics["t"].partitions), c.metadata_offset) == (1, offset)


def test_more_than_the_batch_bound_is_refused_whole(tmp_path: Path) -> None:
    """QuorumController.MAX_RECORDS_PER_USER_OP: counted over the whole request, checked
    before anything is placed (2**31 - 1 partitions are never built)."""
    c = controller(tmp_path, Clock())
    c.create_topic("a", 1, 1, {})
    c.create_topic("b", 1, 1, {})
    half = MAX_PARTITIONS_PER_BATCH // 2
    refused = (ErrorCode.policy_violation,
               "Unable to perform excessively large batch operation.")
    assert c.create_partitions([NewPartitions("a", 1 + half), NewPartitions("b", 2 + half),
                                NewPartitions("nope", 5)]) == [refused] * 3
    assert c.create_partitions([NewPartitions("a", 2**31 - 1)]) == [refused]
    assert len(c.topics["a"].partitions) == len(c.topics["b"].partitions) == 1
    # At the bound exactly, it is done.
    assert c.create_partitions([NewPartitions("a", 1 + half), NewPartitions("b", 1 + half)]
                               ) == [(ErrorCode.none, None)] * 2


def test_new_partitions_survive_a_restart_and_need_enough_live_brokers(tmp_path: Path
                                                                       ) -> None:
    (tmp_path / "state").mkdir()
    c = controller(tmp_path, Clock(), data_dir=tmp_path / "state")
    c.create_topic("t", 1, 3, {})
    c.create_partitions([NewPartitions("t", 2)])
    restarted = QuorumController(clock_ms=Clock(), events=c._events, data_dir=tmp_path / "state")
    assert restarted.topics["t"].partitions == c.topics["t"].partitions
    c.fence_broker(3, "a test")
    assert c.create_partitions([NewPartitions("t", 3)])[0][0] == \
        ErrorCode.invalid_replication_factor
    join(c, 3, "inc-3-again")
    assert c.create_partitions([NewPartitions("t", 3)]) == [(ErrorCode.none, None)]
