"""Kafka 4.2's ``CurrentAssignmentBuilder``: one step of a member's reconciliation towards the
group's target assignment, the heart of KIP-848.

A member never owns a partition another member still owns. Moving towards a new target it
first keeps only what it has of the target and is asked to revoke the rest: it stays at its
epoch, UNREVOKED_PARTITIONS, until a heartbeat no longer reports any of those partitions
(or its rebalance timeout fences it). Then it moves to the target's epoch and is given the
new partitions that are free (no member holds them at any epoch: ``current_partition_epoch``
is -1); those still held elsewhere wait (UNRELEASED_PARTITIONS) and are given once released.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import replace

from minibroker.coordinator.consumer.member import (
    Assignment,
    ConsumerGroupMember,
    MemberState,
    assignment_of,
)

__all__ = ["FencedMemberEpochError", "build_current_assignment"]

CurrentPartitionEpoch = Callable[[str, int], int]
"""(topic id, partition) -> the epoch of the member that holds it, -1 when none does."""


class FencedMemberEpochError(Exception):
    """Kafka's ``FencedMemberEpochException`` (FENCED_MEMBER_EPOCH): the member must give up
    its partitions and rejoin with epoch 0."""


def _owns_any(owned: Assignment | None, partitions: Assignment) -> bool:
    """``ownsRevokedPartitions``: an unknown ownership (a heartbeat that did not say) counts
    as owning them."""
    if owned is None:
        return True
    return any(p in partitions.get(topic_id, ()) for topic_id, ps in owned.items() for p in ps)


def build_current_assignment(
        member: ConsumerGroupMember, *, target_epoch: int, target: Assignment,
        subscribed_topic_ids: Collection[str], has_subscription_changed: bool,
        current_partition_epoch: CurrentPartitionEpoch,
        owned: Assignment | None) -> ConsumerGroupMember:
    """The member after this heartbeat (``build``). ``owned``: the partitions the heartbeat
    reports (None: it did not say)."""
    subscribed = frozenset(subscribed_topic_ids)
    match member.state:
        case MemberState.STABLE:
            if member.member_epoch != target_epoch:
                return _next_assignment(member, member.member_epoch, target_epoch, target,
                                        subscribed, current_partition_epoch, owned)
            if has_subscription_changed:
                return _update_current_assignment(member, subscribed, owned)
            return member
        case MemberState.UNREVOKED_PARTITIONS:
            if _owns_any(owned, member.partitions_pending_revocation):
                if has_subscription_changed:
                    return _update_current_assignment(member, subscribed, owned)
                return member
            return _next_assignment(member, member.member_epoch, target_epoch, target,
                                    subscribed, current_partition_epoch, owned)
        case MemberState.UNRELEASED_PARTITIONS:
            return _next_assignment(member, member.member_epoch, target_epoch, target,
                                    subscribed, current_partition_epoch, owned)
        case MemberState.UNKNOWN:
            # Only a member that gave up everything may start again from scratch.
            if owned is None or any(owned.values()):
                raise FencedMemberEpochError(
                    "The consumer group member is in a unknown state. The member must "
                    "abandon all its partitions and rejoin.")
            return _next_assignment(member, target_epoch, target_epoch, target, subscribed,
                                    current_partition_epoch, owned)
    raise AssertionError(member.state)


def _update_current_assignment(member: ConsumerGroupMember, subscribed: frozenset[str],
                               owned: Assignment | None) -> ConsumerGroupMember:
    """``updateCurrentAssignment``: drop the topics the member no longer subscribes to,
    asking for their revocation when it may still own them."""
    assigned = dict(member.assigned_partitions)
    pending = {t: set(ps) for t, ps in member.partitions_pending_revocation.items()}
    removed = [t for t in assigned if t not in subscribed]
    if not removed:
        return member
    for topic_id in removed:
        pending.setdefault(topic_id, set()).update(assigned.pop(topic_id))
    new_pending = assignment_of(pending)
    if new_pending and _owns_any(owned, new_pending):
        return replace(member, state=MemberState.UNREVOKED_PARTITIONS,
                       assigned_partitions=assignment_of(assigned),
                       partitions_pending_revocation=new_pending)
    # Removed, but already revoked: the same state with fewer partitions.
    return replace(member, assigned_partitions=assignment_of(assigned))


def _next_assignment(member: ConsumerGroupMember, member_epoch: int, target_epoch: int,
                     target: Assignment, subscribed: frozenset[str],
                     current_partition_epoch: CurrentPartitionEpoch,
                     owned: Assignment | None) -> ConsumerGroupMember:
    """``computeNextAssignment``."""
    assigned: dict[str, set[int]] = {}
    revoking: dict[str, set[int]] = {}
    assigning: dict[str, set[int]] = {}
    unreleased = False
    current = member.assigned_partitions
    for topic_id in sorted(set(target) | set(current)):
        wanted = set(target.get(topic_id, ())) if topic_id in subscribed else set()
        have = set(current.get(topic_id, ()))
        kept = have & wanted
        revoked_here = member.partitions_pending_revocation.get(topic_id, frozenset())
        to_assign = set()
        for p in sorted(wanted - kept):
            # Held by another member (at any epoch): unreleased, unless it is this member's
            # own partition pending revocation (only one member holds a partition at a time).
            if current_partition_epoch(topic_id, p) != -1 and p not in revoked_here:
                unreleased = True
            else:
                to_assign.add(p)
        assigned[topic_id] = kept
        revoking[topic_id] = have - kept
        assigning[topic_id] = to_assign
    new_revoking = assignment_of(revoking)
    if new_revoking and _owns_any(owned, new_revoking):
        # Revoke first: same epoch, and wait for the member to let them go.
        return member.with_epoch(member_epoch, state=MemberState.UNREVOKED_PARTITIONS,
                                 assigned_partitions=assignment_of(assigned),
                                 partitions_pending_revocation=new_revoking)
    for topic_id, partitions in assigning.items():
        assigned[topic_id] |= partitions
    state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
    return member.with_epoch(target_epoch, state=state,
                             assigned_partitions=assignment_of(assigned),
                             partitions_pending_revocation={})
