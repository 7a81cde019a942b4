"""KIP-848's ConsumerGroupHeartbeat on the coordinator, without a network: Kafka 4.2's
``GroupMetadataManagerTest`` scenarios (each test names its Java twin) on the group manager,
a manual clock and a metadata image of two topics."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from manual_scheduler import ManualScheduler
from test_controller import Clock, controller

from minibroker.cluster.types import ErrorCode, MetadataImage, PartitionRegistration, TopicImage
from minibroker.coordinator.consumer.consumer_group import ConsumerGroup, GroupError
from minibroker.coordinator.consumer.group_manager import (
    ConsumerGroupConfig,
    ConsumerGroupManager,
    HeartbeatRequest,
    HeartbeatResponse,
)
from minibroker.coordinator.consumer.member import MemberState
from minibroker.coordinator.consumer.records import (
    ConsumerGroupKey,
    Record,
    decode_consumer_value,
    group_epoch_record,
    replay_consumer_groups,
    target_assignment_member_record,
)
from minibroker.coordinator.records import decode_key
from minibroker.network.group_apis import owned_partitions

FOO, BAR = uuid.UUID(int=1).hex, uuid.UUID(int=2).hex  # topic ids as the image has them
SESSION_MS, REBALANCE_MS = 45000, 30000


def topic(name: str, topic_id: str, partitions: int) -> TopicImage:
    return TopicImage(name, topic_id, {}, {p: PartitionRegistration(
        replicas=(1,), isr=(1,), leader=1, leader_epoch=0, partition_epoch=0)
        for p in range(partitions)})


class Groups:
    """The coordinator's group store, reduced to a dict (``ConsumerGroups``)."""

    def __init__(self) -> None:
        self.groups: dict[str, ConsumerGroup] = {}
        self.classic: set[str] = set()
        self.log: list[Record] = []
        """Every record written, in order (acknowledged at once)."""

    def consumer_group(self, group_id: str) -> ConsumerGroup | None:
        if group_id in self.classic:
            raise GroupError(ErrorCode.group_id_not_found,
                             f"Group {group_id} is not a consumer group.")
        return self.groups.get(group_id)

    def create_consumer_group(self, group_id: str) -> tuple[ConsumerGroup, list[Record]]:
        return self.groups.setdefault(group_id, ConsumerGroup(group_id)), []

    def write(self, group_id: str, records: list[Record],
              done: Callable[[ErrorCode], None]) -> None:
        self.log += records
        done(ErrorCode.none)


class Harness:
    def __init__(self, *, foo: int = 6, bar: int = 3, assignor: str = "range",
                 max_size: int = 2**31 - 1) -> None:
        self.scheduler = ManualScheduler()
        self.image = MetadataImage(topics={"foo": topic("foo", FOO, foo),
                                           "bar": topic("bar", BAR, bar)})
        self.store = Groups()
        ids = (f"member-{i}" for i in itertools.count())
        self.manager = ConsumerGroupManager(
            self.scheduler, ConsumerGroupConfig(
                SESSION_MS, 5000, max_size,
                (assignor, *(a for a in ("uniform", "range") if a != assignor))),
            lambda: self.image, self.store, lambda: next(ids))

    def call(self, request: HeartbeatRequest) -> HeartbeatResponse:
        answers: list[HeartbeatResponse] = []
        self.manager.heartbeat(request, answers.append)
        [answer] = answers
        return answer

    def join(self, member_id: str, topics: tuple[str, ...] = ("foo", "bar")
             ) -> HeartbeatResponse:
        return self.call(HeartbeatRequest("g", member_id, 0, rebalance_timeout_ms=REBALANCE_MS,
                                          subscribed_topic_names=topics, owned={}))

    def beat(self, member_id: str, epoch: int, owned: dict | None = None,
             **fields: object) -> HeartbeatResponse:
        return self.call(HeartbeatRequest("g", member_id, epoch, owned=owned,
                                          **fields))  # type: ignore[arg-type]

    @property
    def group(self) -> ConsumerGroup:
        return self.store.groups["g"]


def parts(response: HeartbeatResponse) -> dict[str, list[int]]:
    assert response.assignment is not None
    return {"foo" if t == FOO else "bar": sorted(ps) for t, ps in response.assignment.items()}


def test_a_member_joins_an_empty_group_and_gets_everything() -> None:
    """``testMemberJoinsEmptyConsumerGroup``: epoch 1, the whole target at once."""
    h = Harness()
    answer = h.join("m1")
    assert (answer.error, answer.member_id, answer.member_epoch) == (ErrorCode.none, "m1", 1)
    assert parts(answer) == {"foo": [0, 1, 2, 3, 4, 5], "bar": [0, 1, 2]}
    assert answer.heartbeat_interval_ms == 5000
    assert (h.group.group_epoch, h.group.assignment_epoch, h.group.state) == (1, 1, "Stable")


def test_the_reconciliation_of_a_second_member() -> None:
    """``testReconciliationProcess``, two members: m2's partitions are unreleased until m1,
    asked to revoke them, stops reporting them; m1 stays at its epoch meanwhile, and every
    partition has one owner at a time."""
    h = Harness()
    h.join("m1")
    joined = h.join("m2")
    assert (joined.member_epoch, parts(joined)) == (2, {}), "all of m2's target is m1's"
    assert h.group.members["m2"].state is MemberState.UNRELEASED_PARTITIONS
    target = h.group.target_assignment
    m1_target = {t: set(ps) for t, ps in target["m1"].items()}
    # m1 is asked to revoke what is now m2's; it keeps its epoch until it has.
    asked = h.beat("m1", 1, owned={FOO: frozenset(range(6)), BAR: frozenset(range(3))})
    assert asked.member_epoch == 1
    assert {t: set(ps) for t, ps in (asked.assignment or {}).items()} == m1_target
    assert h.group.members["m1"].state is MemberState.UNREVOKED_PARTITIONS
    still = h.beat("m2", 2, owned={})
    assert (still.member_epoch, still.assignment) == (2, None), "nothing released yet"
    # m1 revoked: at epoch 2 with its target; m2 gets its partitions on its next beat.
    done = h.beat("m1", 1, owned=dict(asked.assignment or {}))
    assert (done.member_epoch, h.group.members["m1"].state) == (2, MemberState.STABLE)
    got = h.beat("m2", 2, owned={})
    assert {t: set(ps) for t, ps in (got.assignment or {}).items()} == {
        t: set(ps) for t, ps in target["m2"].items()}
    assert h.group.state == "Stable"
    owned = [(t, p) for m in h.group.members.values()
             for t, ps in m.assigned_partitions.items() for p in ps]
    assert sorted(owned) == sorted({(t, p) for t, ps in owned for p in [ps]}) and \
        len(owned) == 9


def test_member_epochs_are_fenced_as_kafka_fences_them() -> None:
    """``testConsumerGroupMemberEpochValidation``: a greater epoch, or a smaller one that
    is not the previous with a subset of the assignment, is FENCED_MEMBER_EPOCH; the
    previous epoch with a subset is accepted (its answer was lost)."""
    h = Harness()
    h.join("m1")
    h.join("m2")
    h.beat("m1", 1, owned={FOO: frozenset(range(6)), BAR: frozenset(range(3))})
    answer = h.beat("m1", 1, owned=h.group.members["m1"].assigned_partitions)
    assert answer.member_epoch == 2 and h.group.members["m1"].previous_member_epoch == 1
    assert h.beat("m1", 3).error is ErrorCode.fenced_member_epoch
    lost_answer = h.beat("m1", 1, owned=h.group.members["m1"].assigned_partitions)
    assert (lost_answer.error, lost_answer.member_epoch) == (ErrorCode.none, 2)
    assert h.beat("m1", 1, owned={FOO: frozenset(range(6))}).error is \
        ErrorCode.fenced_member_epoch, "not a subset"
    # Only the previous epoch: two behind is fenced even with a subset.
    m1 = h.group.members["m1"]
    h.group.update_member(replace(m1, member_epoch=5, previous_member_epoch=4))
    assert h.beat("m1", 3, owned=m1.assigned_partitions).error is ErrorCode.fenced_member_epoch
    assert h.beat("m1", 4, owned=m1.assigned_partitions).error is ErrorCode.none
    assert h.beat("m1", 0, owned={}, rebalance_timeout_ms=REBALANCE_MS,
                  subscribed_topic_names=("foo", "bar")).error is ErrorCode.none, "rejoin"


@pytest.mark.parametrize(("fields", "message"), [
    ({"member_id": "", "member_epoch": 1}, "MemberId can't be empty."),
    ({"group_id": ""}, "GroupId can't be empty."),
    ({"rack_id": ""}, "RackId can't be empty."),
    ({"rebalance_timeout_ms": -1}, "RebalanceTimeoutMs must be provided in first request."),
    ({"owned": {FOO: frozenset({1})}}, "TopicPartitions must be empty when (re-)joining."),
    ({"owned": None}, "TopicPartitions must be empty when (re-)joining."),
    ({"subscribed_topic_names": None},
     "Either SubscribedTopicNames or SubscribedTopicRegex must be non-null when "
     "(re-)joining."),
    ({"member_epoch": -3}, "MemberEpoch is invalid."),
])
def test_an_invalid_heartbeat_names_its_field(fields: dict, message: str) -> None:
    """``GroupCoordinatorService.throwIfConsumerGroupHeartbeatRequestIsInvalid``."""
    request = {"group_id": "g", "member_id": "m1", "member_epoch": 0,
               "rebalance_timeout_ms": REBALANCE_MS, "subscribed_topic_names": ("foo",),
               "owned": {}} | fields
    answer = Harness().call(HeartbeatRequest(**request))
    assert (answer.error, answer.message) == (ErrorCode.invalid_request, message)


def test_an_unknown_assignor_group_or_member_is_refused() -> None:
    h = Harness()
    answer = h.call(HeartbeatRequest(
        "g", "m1", 0, rebalance_timeout_ms=1, subscribed_topic_names=("foo",), owned={},
        server_assignor="sticky"))
    assert answer.error is ErrorCode.unsupported_assignor and "range, uniform" in (
        answer.message or "")
    assert h.beat("m1", 1).error is ErrorCode.group_id_not_found
    h.join("m1")
    assert h.beat("stranger", 1).error is ErrorCode.unknown_member_id
    h.store.classic.add("classic")
    answer = h.call(HeartbeatRequest(
        "classic", "m1", 0, rebalance_timeout_ms=1, subscribed_topic_names=("foo",),
        owned={}))
    assert answer.error is ErrorCode.group_id_not_found


def test_group_consumer_max_size_bounds_the_members_a_client_can_make() -> None:
    """``testNewMemberIsRejectedWithMaximumMembersIsReached`` (group.consumer.max.size):
    a heartbeat at epoch 0 with a member id the group does not know is refused with
    GROUP_MAX_SIZE_REACHED once the group is full, and writes nothing; a member of the group
    goes on heartbeating."""
    h = Harness(max_size=2)
    h.join("m1")
    h.join("m2")
    written = len(h.store.log)
    answer = h.join("m3")
    assert answer.error is ErrorCode.group_max_size_reached
    assert answer.message == "The consumer group has reached its maximum capacity of 2 members."
    assert sorted(h.group.members) == ["m1", "m2"] and len(h.store.log) == written
    assert h.beat("m1", h.group.members["m1"].member_epoch).error is ErrorCode.none


def test_a_silent_member_is_fenced_at_its_session_timeout_and_the_epoch_moves() -> None:
    """``testSessionTimeoutExpiration``: no heartbeat for group.consumer.session.timeout.ms
    removes the member and bumps the group epoch; the survivor is then given everything."""
    h = Harness()
    h.join("m1")
    h.join("m2")
    for _ in range(SESSION_MS // 5000 - 1):  # m2 heartbeats every 5 s; m1 says nothing
        h.scheduler.advance(5000)
        h.beat("m2", h.group.members["m2"].member_epoch, owned={})
    assert "m1" in h.group.members, "not before its session timeout"
    h.scheduler.advance(5000)
    assert "m1" not in h.group.members and h.group.group_epoch == 3
    answer = h.beat("m2", h.group.members["m2"].member_epoch, owned={})
    assert (answer.member_epoch, parts(answer)) == (3, {"foo": [0, 1, 2, 3, 4, 5],
                                                        "bar": [0, 1, 2]})


def test_a_member_that_does_not_revoke_is_fenced_at_its_rebalance_timeout() -> None:
    """``testRebalanceTimeoutExpiration``: UNREVOKED_PARTITIONS past the member's rebalance
    timeout fences it, even while it heartbeats."""
    h = Harness()
    h.join("m1")
    h.join("m2")
    everything = {FOO: frozenset(range(6)), BAR: frozenset(range(3))}
    h.beat("m1", 1, owned=everything)
    for _ in range(REBALANCE_MS // 5000 + 1):
        h.scheduler.advance(5000)
        if "m1" in h.group.members:
            h.beat("m1", 1, owned=everything)  # heartbeats, never revokes
        h.beat("m2", h.group.members["m2"].member_epoch, owned={})
    assert "m1" not in h.group.members
    assert h.beat("m1", 1, owned=everything).error is ErrorCode.unknown_member_id


def test_a_member_that_leaves_gives_its_partitions_to_the_others() -> None:
    """``testLeavingMemberBumpsGroupEpoch``: epoch -1 removes the member at once."""
    h = Harness()
    h.join("m1")
    h.join("m2")
    answer = h.beat("m2", -1)
    assert (answer.error, answer.member_epoch) == (ErrorCode.none, -1)
    assert list(h.group.members) == ["m1"] and h.group.group_epoch == 3
    answer = h.beat("m1", 1, owned={FOO: frozenset(range(6)), BAR: frozenset(range(3))})
    assert answer.member_epoch == 3


def test_a_subscription_change_and_a_new_partition_bump_the_group_epoch() -> None:
    """``testUpdatingSubscriptionTriggersNewTargetAssignment`` and
    ``testSubscriptionMetadataRefreshedAfterGroupIsLoaded``: dropping a topic revokes it; a
    subscribed topic that grows is assigned on the next heartbeat."""
    h = Harness()
    h.join("m1")
    answer = h.beat("m1", 1, owned={FOO: frozenset(range(6)), BAR: frozenset(range(3))},
                    subscribed_topic_names=("foo",))
    assert answer.member_epoch == 1 and parts(answer) == {"foo": [0, 1, 2, 3, 4, 5]}
    assert h.group.members["m1"].state is MemberState.UNREVOKED_PARTITIONS
    answer = h.beat("m1", 1, owned={FOO: frozenset(range(6))})
    assert (answer.member_epoch, h.group.group_epoch) == (2, 2)
    h.image = MetadataImage(topics={"foo": topic("foo", FOO, 8), "bar": topic("bar", BAR, 3)})
    answer = h.beat("m1", 2, owned={FOO: frozenset(range(6))})
    assert (answer.member_epoch, parts(answer)) == (3, {"foo": list(range(8))})


def test_the_uniform_assignor_spreads_a_group_evenly() -> None:
    """The default assignor (uniform) gives three members of one 6-partition topic two
    partitions each once reconciled."""
    h = Harness(foo=6, bar=0, assignor="uniform")
    for member_id in ("m1", "m2", "m3"):
        h.join(member_id, ("foo",))
    for _ in range(4):
        for m in list(h.group.members.values()):
            h.beat(m.member_id, m.member_epoch, owned=m.assigned_partitions)
    assert h.group.state == "Stable"
    assert sorted(len(m.assigned_partitions.get(FOO, ())) for m in
                  h.group.members.values()) == [2, 2, 2]


def _replayed(log: list[Record]) -> ConsumerGroup:
    """What a new coordinator makes of the records: the latest of each key, tombstones
    dropped (``GroupMetadataManager._replay``)."""
    latest: dict[ConsumerGroupKey, object] = {}
    for key, value in log:
        parsed = decode_key(key)
        assert isinstance(parsed, ConsumerGroupKey)
        latest[parsed] = decode_consumer_value(parsed, value)
    [group] = replay_consumer_groups({k: v for k, v in latest.items() if v is not None}
                                     ).values()
    return group


def _view(group: ConsumerGroup) -> tuple[object, ...]:
    return (group.group_epoch, group.assignment_epoch, group.metadata_hash, group.members,
            group.target_assignment, group.state,
            [group.current_partition_epoch(t, p) for t in (FOO, BAR) for p in range(6)])


def test_a_new_coordinator_replays_the_group_its_records_describe() -> None:
    """Every step writes its records (``consumer.records``); replaying them gives the same
    group: epochs, members with their epochs and states, targets, partition owners. Checked
    mid-reconciliation and after a member is fenced."""
    h = Harness()
    h.join("m1")
    h.join("m2")
    h.beat("m1", 1, owned={FOO: frozenset(range(6)), BAR: frozenset(range(3))})
    assert h.group.members["m1"].state is MemberState.UNREVOKED_PARTITIONS
    assert _view(_replayed(h.store.log)) == _view(h.group)
    h.beat("m2", -1)
    h.beat("m1", 1, owned=h.group.members["m1"].assigned_partitions)
    assert list(h.group.members) == ["m1"]
    assert _view(_replayed(h.store.log)) == _view(h.group)


def test_the_reconciliation_goes_on_under_a_new_coordinator() -> None:
    """A member waiting for partitions another member was revoking gets them from the next
    coordinator, which has only the records (the topic ids come from its own image, the
    replayed hash says nothing changed): no epoch bump, m2 stable with its target."""
    h = Harness()
    h.join("m1")
    h.join("m2")
    asked = h.beat("m1", 1, owned={FOO: frozenset(range(6)), BAR: frozenset(range(3))})
    h.beat("m1", 1, owned=dict(asked.assignment or {}))  # revoked: m1 at epoch 2
    target = dict(h.group.target_assignment["m2"])
    moved = Harness()
    moved.store.groups["g"] = _replayed(h.store.log)
    got = moved.beat("m2", 2, owned={})
    assert got.member_epoch == 2 and moved.group.group_epoch == 2
    assert dict(got.assignment or {}) == target
    assert moved.group.state == "Stable"


def test_the_records_are_kafkas_bytes() -> None:
    """ConsumerGroupMetadataKey/Value (key version 3, value version 0, flexible: a tagged
    MetadataHash), worked out by hand from Kafka 4.2's message JSON."""
    key, value = group_epoch_record("g", 5, 0)
    assert key == bytes.fromhex("0003" "0001") + b"g"
    assert value == bytes.fromhex("0000" "00000005" "00")
    _, hashed = group_epoch_record("g", 5, 1)
    assert hashed == bytes.fromhex("0000" "00000005" "01" "00" "08" "0000000000000001")
    _, target = target_assignment_member_record("g", "m", {FOO: frozenset({2, 0})})
    assert target == (bytes.fromhex("0000" "02") + uuid.UUID(FOO).bytes
                      + bytes.fromhex("03" "00000000" "00000002" "00" "00"))



def test_owned_partitions_from_the_wire_name_topics_as_the_image_does(tmp_path: Path) -> None:
    """A heartbeat's TopicPartitions carry UUIDs; the coordinator compares them with the
    image's topic ids, so they must come out in the image's form (a mismatch would take
    every owned partition for revoked and hand it to another member at once)."""
    c = controller(tmp_path, Clock())
    c.create_topic("t", 2, 3, {})
    topic_id = c.image().topics["t"].topic_id
    assert owned_partitions([(uuid.UUID(topic_id), (1, 0))]) == {topic_id: frozenset({0, 1})}
