"""KIP-848's reconciliation, step by step: the cases of Kafka 4.2's
``CurrentAssignmentBuilderTest`` (each test names its Java twin), then the group's indexes
(``ConsumerGroupTest``'s partition epochs and state)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from minibroker.coordinator.consumer.consumer_group import (
    ConsumerGroup,
    ConsumerGroupState,
    GroupError,
)
from minibroker.coordinator.consumer.current_assignment_builder import (
    FencedMemberEpochError,
    build_current_assignment,
)
from minibroker.coordinator.consumer.member import ConsumerGroupMember, MemberState

STABLE = MemberState.STABLE
UNREVOKED = MemberState.UNREVOKED_PARTITIONS
UNRELEASED = MemberState.UNRELEASED_PARTITIONS


def a(t1: tuple[int, ...] = (), t2: tuple[int, ...] = ()) -> dict[str, frozenset[int]]:
    """An assignment over topic ids t1 and t2 (Kafka's ``mkAssignment``)."""
    return {k: frozenset(v) for k, v in (("t1", t1), ("t2", t2)) if v}


def member(state: MemberState, epoch: int, previous: int, assigned: dict,
           pending: dict | None = None) -> ConsumerGroupMember:
    return ConsumerGroupMember("member", subscribed_topic_names=("topic1", "topic2"),
                               member_epoch=epoch, previous_member_epoch=previous, state=state,
                               assigned_partitions=assigned,
                               partitions_pending_revocation=pending or {})


def step(m: ConsumerGroupMember, target_epoch: int, target: dict, *,
         epoch_of: int | Callable[[str, int], int] = -1,
         owned: dict | None = None, subscribed: tuple[str, ...] = ("t1", "t2"),
         subscription_changed: bool = False) -> ConsumerGroupMember:
    return build_current_assignment(
        m, target_epoch=target_epoch, target=target, subscribed_topic_ids=subscribed,
        has_subscription_changed=subscription_changed,
        current_partition_epoch=epoch_of if callable(epoch_of) else lambda _t, _p: epoch_of,
        owned=owned)


@pytest.mark.parametrize(("name", "before", "target_epoch", "target", "epoch_of", "owned",
                          "after"), [
    ("testStableToStable", member(STABLE, 10, 10, a((1, 2, 3), (4, 5, 6))), 11,
     a((1, 2, 3), (4, 5, 6)), -1, None, member(STABLE, 11, 10, a((1, 2, 3), (4, 5, 6)))),
    ("testStableToStableWithNewPartitions", member(STABLE, 10, 10, a((1, 2, 3), (4, 5, 6))),
     11, a((1, 2, 3, 4), (4, 5, 6, 7)), -1, None,
     member(STABLE, 11, 10, a((1, 2, 3, 4), (4, 5, 6, 7)))),
    ("testStableToUnrevokedPartitions", member(STABLE, 10, 10, a((1, 2, 3), (4, 5, 6))), 11,
     a((2, 3, 4), (5, 6, 7)), -1, None,
     member(UNREVOKED, 10, 10, a((2, 3), (5, 6)), a((1,), (4,)))),
    ("testStableToUnreleasedPartitions", member(STABLE, 10, 10, a((1, 2, 3), (4, 5, 6))), 11,
     a((1, 2, 3, 4), (4, 5, 6, 7)), 10, None,
     member(UNRELEASED, 11, 10, a((1, 2, 3), (4, 5, 6)))),
    ("testUnrevokedPartitionsToStable",
     member(UNREVOKED, 10, 10, a((2, 3), (5, 6)), a((1,), (4,))), 11, a((2, 3), (5, 6)), -1,
     a((2, 3), (5, 6)), member(STABLE, 11, 10, a((2, 3), (5, 6)))),
    ("testUnrevokedPartitionsToUnrevokedPartitions",
     member(UNREVOKED, 10, 10, a((2, 3), (5, 6)), a((1,), (4,))), 12, a((3,), (6,)), -1,
     a((2, 3), (5, 6)), member(UNREVOKED, 10, 10, a((3,), (6,)), a((2,), (5,)))),
    ("testUnrevokedPartitionsToUnreleasedPartitions",
     member(UNREVOKED, 11, 10, a((2, 3), (5, 6))), 11, a((2, 3, 4), (5, 6, 7)), 10,
     a((2, 3), (5, 6)), member(UNRELEASED, 11, 11, a((2, 3), (5, 6)))),
    ("testUnreleasedPartitionsToStable", member(UNRELEASED, 11, 11, a((2, 3), (5, 6))), 12,
     a((2, 3), (5, 6)), 10, None, member(STABLE, 12, 11, a((2, 3), (5, 6)))),
    ("testUnreleasedPartitionsToStableWithNewPartitions",
     member(UNRELEASED, 11, 11, a((2, 3), (5, 6))), 11, a((2, 3, 4), (5, 6, 7)), -1, None,
     member(STABLE, 11, 11, a((2, 3, 4), (5, 6, 7)))),
    ("testUnreleasedPartitionsToUnreleasedPartitions",
     member(UNRELEASED, 11, 11, a((2, 3), (5, 6))), 11, a((2, 3, 4), (5, 6, 7)), 10, None,
     member(UNRELEASED, 11, 11, a((2, 3), (5, 6)))),
    ("testUnreleasedPartitionsToUnrevokedPartitions",
     member(UNRELEASED, 11, 11, a((2, 3), (5, 6))), 12, a((3,), (6,)), 10, None,
     member(UNREVOKED, 11, 11, a((3,), (6,)), a((2,), (5,)))),
])
def test_kafkas_reconciliation_cases(name: str, before: ConsumerGroupMember, target_epoch: int,
                                     target: dict, epoch_of: int, owned: dict | None,
                                     after: ConsumerGroupMember) -> None:
    assert step(before, target_epoch, target, epoch_of=epoch_of, owned=owned) == after, name


def test_remains_in_unrevoked_partitions_while_it_owns_any_of_them() -> None:
    """``testRemainsInUnrevokedPartitions``: an unknown ownership counts as owning them."""
    m = member(UNREVOKED, 10, 10, a((2, 3), (5, 6)), a((1,), (4,)))
    for owned in (None, a((1, 2, 3), (5, 6)), a((2, 3), (4, 5, 6))):
        assert step(m, 12, a((3,), (6,)), owned=owned) is m


def test_a_partition_pending_revocation_may_come_back_to_its_owner() -> None:
    """``testUnrevokedPartitionsToStableWithReturnedPartitionsPendingRevocation``: a
    partition this member is revoking is not unreleased to itself."""
    m = member(UNREVOKED, 10, 10, a((2, 3), (5, 6)), a((4,)))
    held = {("t1", 2), ("t1", 3), ("t1", 4), ("t2", 5), ("t2", 6)}  # all by this member
    after = step(m, 12, a((2, 3, 4), (5, 6, 7)),
                 epoch_of=lambda t, p: 10 if (t, p) in held else -1, owned=a((2, 3), (5, 6)))
    assert after == member(STABLE, 12, 10, a((2, 3, 4), (5, 6, 7)))


def test_an_unknown_state_is_fenced_then_starts_again() -> None:
    """``testUnknownState``."""
    m = member(MemberState.UNKNOWN, 11, 11, a((3,), (6,)), a((2,), (5,)))
    with pytest.raises(FencedMemberEpochError):
        step(m, 12, a((3,), (6,)), epoch_of=10)
    assert step(m, 12, a((3,), (6,)), epoch_of=11, owned={}) == member(
        STABLE, 12, 11, a((3,), (6,)))


def test_a_topic_left_by_the_subscription_is_revoked() -> None:
    """``testStableToUnrevokedPartitionsWithAssignmentTopicsNoLongerInSubscription``: at the
    same epoch, a changed subscription asks for the dropped topic's partitions back."""
    m = member(STABLE, 10, 10, a((1, 2, 3), (4, 5, 6)))
    after = step(m, 10, a((1, 2, 3), (4, 5, 6)), subscribed=("t1",),
                 subscription_changed=True, owned=a((1, 2, 3), (4, 5, 6)))
    assert after == replace(m, state=UNREVOKED, assigned_partitions=a((1, 2, 3)),
                            partitions_pending_revocation=a((), (4, 5, 6)))


def test_the_group_indexes_partition_epochs_and_derives_its_state() -> None:
    """``ConsumerGroupTest``: a partition's epoch is its holder's (assigned or revoking);
    two members never hold one at once; the state follows the epochs."""
    group = ConsumerGroup("g")
    assert group.state is ConsumerGroupState.EMPTY
    m1 = member(STABLE, 10, 9, a((1, 2)), a((3,)))
    group.update_member(m1)
    assert [group.current_partition_epoch("t1", p) for p in (1, 2, 3, 4)] == [10, 10, 10, -1]
    with pytest.raises(RuntimeError, match="still owned at epoch 10"):
        group.update_member(replace(m1, member_id="other"))
    group.group_epoch = 11
    assert group.state is ConsumerGroupState.ASSIGNING
    group.assignment_epoch = 11
    assert group.state is ConsumerGroupState.RECONCILING
    group.update_member(member(STABLE, 11, 10, a((1, 2))))
    assert group.state is ConsumerGroupState.STABLE
    assert group.current_partition_epoch("t1", 3) == -1, "released with the revocation"
    group.remove_member("member")
    assert group.current_partition_epoch("t1", 1) == -1
    assert group.state is ConsumerGroupState.EMPTY


def test_offsets_are_committed_at_the_members_epoch() -> None:
    """``ConsumerGroupTest.testValidateOffsetCommit``: STALE_MEMBER_EPOCH at another epoch,
    UNKNOWN_MEMBER_ID for a stranger, anything (epoch -1) to an empty group."""
    group = ConsumerGroup("g")
    group.validate_offset_commit("", -1, transactional=False)
    group.update_member(member(STABLE, 10, 9, a((1,))))
    group.validate_offset_commit("member", 10, transactional=False)
    for member_id, epoch, code in (("member", 9, "stale_member_epoch"),
                                   ("member", 11, "stale_member_epoch"),
                                   ("stranger", 10, "unknown_member_id"),
                                   ("", -1, "unknown_member_id")):
        with pytest.raises(GroupError) as caught:
            group.validate_offset_commit(member_id, epoch, transactional=False)
        assert caught.value.code.name == code
    with pytest.raises(GroupError) as caught:
        group.validate_offset_commit("member", 10, transactional=False, api_version=8)
    assert caught.value.code.name == "unsupported_version"
    group.validate_offset_commit("", -1, transactional=True)
