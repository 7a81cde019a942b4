"""The classic group coordinator's state machine on a manual clock: joins (KIP-394's two
steps), static members (KIP-345), rebalances on join, leave, session expiry and rebalance
timeout, the errors Kafka answers, commits and fetches of offsets, and the coordinator's
replication events."""

from __future__ import annotations

from pathlib import Path

from group_harness import GROUP, REBALANCE_MS, SESSION_MS, Harness, group_on

from minibroker.cluster.types import ErrorCode, TopicPartition
from minibroker.coordinator.group_metadata import GroupState
from minibroker.coordinator.group_metadata_manager import partition_for

TP0, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)


def state(h: Harness, group: str = GROUP) -> GroupState:
    found = h.coordinator.manager.get_group(group)
    assert found is not None
    return found.state


# ---- partitionFor ----------------------------------------------------------------------


def test_a_group_lands_where_kafka_puts_it() -> None:
    """Java's String.hashCode: "hello" is 99162322; "polygenelubricants" hashes to
    Integer.MIN_VALUE, which Kafka's Utils.abs maps to 0."""
    assert partition_for("hello", 50) == 99162322 % 50
    assert partition_for("polygenelubricants", 50) == 0
    assert partition_for("", 50) == 0
    assert partition_for("é-group", 7) == partition_for("é-group", 7)


# ---- joins -------------------------------------------------------------------------------


def test_kip_394_a_new_member_gets_its_id_first_then_joins_and_leads(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.lead()
    (first,) = h.join(version=4)
    assert first.error == ErrorCode.member_id_required
    assert first.member_id.startswith("client-")
    assert state(h) is GroupState.EMPTY  # a pending member starts nothing
    joined = h.join(first.member_id, version=4)
    assert joined == []  # parked in InitialDelayedJoin
    h.advance(0)
    (answer,) = joined
    assert (answer.error, answer.generation_id, answer.leader_id) == (
        ErrorCode.none, 1, first.member_id)
    assert answer.members == ((first.member_id, None, b"subscription"),)
    assert state(h) is GroupState.COMPLETING_REBALANCE
    (synced,) = h.sync(first.member_id, 1, {first.member_id: b"t-0"})
    assert (synced.error, synced.assignment) == (ErrorCode.none, b"t-0")
    assert state(h) is GroupState.STABLE
    member = first.member_id
    assert h.events == [
        {"t": 1000.0, "type": "coordinator_load", "broker": 1, "topic": "__consumer_offsets",
         "partition": 0, "leader_epoch": 0, "log_end_offset": 0, "detail": "loaded no group"},
        {"t": 1000.0, "type": "group_rebalance", "broker": 1, "group": GROUP,
         "generation": 0, "member": member, "reason": "member_joined",
         "detail": f"new member {member} joined"},
        {"t": 1000.0, "type": "group_stable", "broker": 1, "group": GROUP, "generation": 1,
         "members": [member], "detail": f"{member}: 3 bytes"},
    ]


def test_a_join_before_v4_gets_its_member_id_at_once(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.lead()
    joined = h.join(version=3)
    h.advance(0)
    assert joined[0].error == ErrorCode.none and joined[0].generation_id == 1


def test_the_initial_delay_waits_for_more_members(tmp_path: Path) -> None:
    """InitialDelayedJoin: a newcomer within the delay buys another delay from its end."""
    h = Harness(tmp_path, **{"group.initial.rebalance.delay.ms": "3000"})
    h.lead()
    a = h.join_new()
    h.advance(2000)
    b = h.join_new()
    h.advance(3000)
    assert a == [] and b == []  # extended by b, to 6 s
    h.advance(1000)
    assert a[0].generation_id == b[0].generation_id == 1


def test_a_protocol_named_twice_is_one_vote(tmp_path: Path) -> None:
    """Kafka's MemberMetadata.protocols is a set: a JoinGroup naming "range" twice supports
    it once. Counted twice, no protocol had as many votes as the group has members, and the
    rebalance's completion raised StopIteration in a timer callback: the join was never
    answered (found by the schema-aware fuzzer)."""
    h = Harness(tmp_path)
    h.lead()
    joined = h.join(version=3, protocols=[("range", b"a"), ("range", b"b")])
    h.advance(0)
    (answer,) = joined
    assert (answer.error, answer.generation_id, answer.protocol_name) == (
        ErrorCode.none, 1, "range")
    second = h.join(version=3, protocols=[("roundrobin", b""), ("range", b"")])
    first_again = h.join(answer.member_id, protocols=[("range", b"a"), ("range", b"b")])
    h.advance(0)
    assert [r.protocol_name for r in (*second, *first_again)] == ["range", "range"]


def test_a_second_member_rebalances_the_group_and_both_join_the_next_generation(
        tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.lead()
    generation, (a,) = h.stable_group("a")
    mark = len(h.events)
    b = h.join_new()
    assert state(h) is GroupState.PREPARING_REBALANCE
    assert h.heartbeat(a, generation) == ErrorCode.rebalance_in_progress
    assert h.sync(a, generation)[0].error == ErrorCode.rebalance_in_progress
    assert b == []  # waits for a to rejoin
    rejoined = h.join(a)
    (ra,), (rb,) = rejoined, b
    assert ra.generation_id == rb.generation_id == generation + 1
    assert ra.leader_id == a and len(ra.members) == 2 and rb.members == ()
    assert h.types(mark) == [("group_rebalance", "member_joined")]
    assert h.events[mark]["generation"] == generation


def test_a_member_that_leaves_rebalances_the_rest(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.lead()
    generation, (a, b) = h.stable_group("a", "b")
    mark = len(h.events)
    assert h.coordinator.handle_leave_group(GROUP, [(b, None)]) == (ErrorCode.none,
                                                                    [ErrorCode.none])
    assert state(h) is GroupState.PREPARING_REBALANCE
    (answer,) = h.join(a)
    assert answer.generation_id == generation + 1 and len(answer.members) == 1
    assert h.types(mark) == [("group_member_removed", "left"),
                             ("group_rebalance", "member_left")]
    assert h.coordinator.handle_leave_group(GROUP, [(b, None)])[1] == [
        ErrorCode.unknown_member_id]


def test_a_member_whose_session_expires_is_removed_and_the_group_rebalances(
        tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.lead()
    generation, (a, b) = h.stable_group("a", "b")
    mark = len(h.events)
    for _ in range(SESSION_MS // 1000 - 1):
        h.advance(1000)
        assert h.heartbeat(a, generation) == ErrorCode.none  # only a heartbeats
    h.advance(1000)
    assert h.types(mark) == [("group_member_removed", "session_expired"),
                             ("group_rebalance", "session_expired")]
    assert h.events[mark]["member"] == b
    assert h.heartbeat(b, generation) == ErrorCode.unknown_member_id
    assert h.heartbeat(a, generation) == ErrorCode.rebalance_in_progress


def test_a_member_that_does_not_rejoin_within_the_rebalance_timeout_is_removed(
        tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.lead()
    generation, (a, b) = h.stable_group("a", "b")
    c = h.join_new()
    assert h.join(a) == []  # a rejoins at once; its answer comes with the generation
    mark = len(h.events)
    for _ in range(REBALANCE_MS // 1000 - 1):
        h.advance(1000)
        # b is alive (it heartbeats) but never rejoins
        assert h.heartbeat(b, generation) == ErrorCode.rebalance_in_progress
    assert c == []
    h.advance(1000)
    assert c[0].generation_id == generation + 1
    assert h.types(mark) == [("group_member_removed", "rebalance_timeout")]
    assert h.events[mark]["member"] == b
    assert set(h.coordinator.manager.get_group(GROUP).members) == {a, c[0].member_id}


def test_members_that_send_no_sync_group_are_removed_after_the_rebalance_timeout(
        tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.lead()
    a, b = h.join_new(rebalance_ms=3000), h.join_new(rebalance_ms=3000)
    h.advance(0)
    leader = a[0].leader_id
    h.sync(leader, 1, {})
    mark = len(h.events)
    h.advance(3000)  # DelayedSync, before the follower's session (6 s) ends
    follower = b[0].member_id if leader == a[0].member_id else a[0].member_id
    assert h.types(mark)[:2] == [("group_member_removed", "rebalance_timeout"),
                                 ("group_rebalance", "sync_failed")]
    assert h.events[mark]["member"] == follower


# ---- errors --------------------------------------------------------------------------------


def test_an_old_generation_is_an_illegal_generation(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.lead()
    generation, (a,) = h.stable_group("a")
    assert h.heartbeat(a, generation - 1) == ErrorCode.illegal_generation
    assert h.sync(a, generation + 1)[0].error == ErrorCode.illegal_generation
    assert h.commit(a, generation - 1, {TP0: 5}) == [{TP0: ErrorCode.illegal_generation}]
    assert h.heartbeat("stranger", generation) == ErrorCode.unknown_member_id
    assert h.commit("stranger", generation, {TP0: 5}) == [{TP0: ErrorCode.unknown_member_id}]


def test_commits_during_a_rebalance(tmp_path: Path) -> None:
    """Preparing: the old generation may still commit (the heartbeat tells it to rejoin).
    Completing: REBALANCE_IN_PROGRESS, its assignment is not out yet."""
    h = Harness(tmp_path)
    h.lead()
    generation, (a,) = h.stable_group("a")
    h.join_new()
    assert h.commit(a, generation, {TP0: 7}) == [{TP0: ErrorCode.none}]
    h.join(a)
    assert state(h) is GroupState.COMPLETING_REBALANCE
    assert h.commit(a, generation + 1, {TP0: 8}) == [{TP0: ErrorCode.rebalance_in_progress}]
    error, offsets = h.coordinator.handle_fetch_offsets(GROUP, False, [TP0])
    assert (error, offsets[TP0].offset) == (ErrorCode.none, 7)


def test_static_member_replaced_fences_the_old_member_id_without_a_rebalance(
        tmp_path: Path) -> None:
    """KIP-345: the same group.instance.id joining without a member id takes the old
    member's place; the old id is FENCED_INSTANCE_ID, and a Stable group does not
    rebalance."""
    h = Harness(tmp_path)
    h.lead()
    first = h.join(instance="i1")
    h.advance(0)
    old = first[0].member_id
    assert old.startswith("i1-")
    h.sync(old, 1, {old: b"t-0"})
    mark = len(h.events)
    (replaced,) = h.join(instance="i1")
    assert replaced.error == ErrorCode.none and replaced.member_id != old
    assert replaced.generation_id == 1
    assert h.heartbeat(old, 1, instance="i1") == ErrorCode.fenced_instance_id
    assert h.heartbeat(replaced.member_id, 1, instance="i1") == ErrorCode.none
    (synced,) = h.sync(replaced.member_id, 1, instance="i1")
    assert synced.assignment == b"t-0"
    assert state(h) is GroupState.STABLE and h.types(mark) == []


def test_a_parked_join_of_a_replaced_static_member_is_fenced(tmp_path: Path) -> None:
    h = Harness(tmp_path, **{"group.initial.rebalance.delay.ms": "3000"})
    h.lead()
    parked = h.join(instance="i1")
    h.join(instance="i1")
    assert parked[0].error == ErrorCode.fenced_instance_id


def test_an_empty_group_and_an_invalid_session_timeout(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.lead()
    assert h.join(session_ms=10)[0].error == ErrorCode.invalid_session_timeout
    generation, (a,) = h.stable_group("a")
    mark = len(h.events)
    h.coordinator.handle_leave_group(GROUP, [(a, None)])
    h.advance(REBALANCE_MS)
    assert h.types(mark) == [("group_member_removed", "left"),
                             ("group_rebalance", "member_left"), ("group_empty", None)]
    assert h.events[-1]["generation"] == generation + 1
    assert state(h) is GroupState.EMPTY


# ---- offsets -------------------------------------------------------------------------------


def test_offsets_are_answered_only_once_written_and_fetched_as_committed(
        tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.lead()
    error, fetched = h.coordinator.handle_fetch_offsets(GROUP, False, [TP0, TP1])
    assert error == ErrorCode.none
    assert [fetched[tp].offset for tp in (TP0, TP1)] == [-1, -1]  # nothing committed
    generation, (a,) = h.stable_group("a")
    h.hold = True
    answer = h.commit(a, generation, {TP0: 42})
    assert answer == []  # waiting for its acks
    assert h.coordinator.handle_fetch_offsets(GROUP, True, [TP0])[1][TP0].error == \
        ErrorCode.unstable_offset_commit
    assert h.coordinator.handle_fetch_offsets(GROUP, False, [TP0])[1][TP0].offset == -1
    h.release()
    assert answer == [{TP0: ErrorCode.none}]
    assert h.coordinator.handle_fetch_offsets(GROUP, True, None)[1][TP0].offset == 42


def test_a_group_without_members_may_commit_with_generation_minus_one(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.lead()
    assert h.commit("", -1, {TP0: 3}) == [{TP0: ErrorCode.none}]
    assert h.coordinator.handle_fetch_offsets(GROUP, False, None)[1][TP0].offset == 3
    assert h.commit("", 4, {TP0: 3}, group="other") == [{TP0: ErrorCode.illegal_generation}]


# ---- where the group is coordinated ----------------------------------------------------------


def test_not_coordinator_and_load_in_progress(tmp_path: Path) -> None:
    h = Harness(tmp_path, partitions=2)
    ours, theirs = group_on(0, 2), group_on(1, 2)
    assert h.join(group=ours)[0].error == ErrorCode.not_coordinator
    h.lead(0, load=False)
    assert h.join(group=ours)[0].error == ErrorCode.coordinator_load_in_progress
    assert h.heartbeat("m", 1, group=ours) == ErrorCode.none  # loading: answered blindly
    assert h.sync("m", 1, group=ours)[0].error == ErrorCode.rebalance_in_progress
    h.advance(0)
    assert h.join(group=ours)[0].error == ErrorCode.member_id_required
    assert h.join(group=theirs)[0].error == ErrorCode.not_coordinator
    assert h.coordinator.handle_list_groups(set(), set())[0] == ErrorCode.none


def test_resigning_unloads_the_groups_and_answers_parked_requests(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.lead()
    generation, (a,) = h.stable_group("a")
    parked = h.join_new()
    h.coordinator.on_leadership_change(TopicPartition("__consumer_offsets", 0), False, 1)
    assert parked[0].error == ErrorCode.not_coordinator
    assert h.heartbeat(a, generation) == ErrorCode.not_coordinator
    assert h.events[-1]["type"] == "coordinator_unload"
    assert h.coordinator.manager.groups == {}


def test_list_and_describe(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.lead()
    h.stable_group("a")
    error, groups = h.coordinator.handle_list_groups({"STABLE"}, set())
    assert (error, groups) == (ErrorCode.none, [(GROUP, "consumer", "Stable", "classic")])
    assert h.coordinator.handle_list_groups({"Empty"}, set())[1] == []
    assert h.coordinator.handle_list_groups(set(), {"consumer"})[1] == []
    error, summary = h.coordinator.handle_describe_group(GROUP)
    assert (summary.state, summary.protocol, len(summary.members)) == ("Stable", "range", 1)
    assert summary.members[0].assignment == b"a"
    assert h.coordinator.handle_describe_group("nope")[1].state == "Dead"
