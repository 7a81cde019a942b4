"""Kafka 4.2's server-side ``UniformAssignor`` (``uniform``, the default): partitions spread
so that members' counts differ by at most one (balance), keeping as much of each member's
current target assignment as that allows (stickiness). All members subscribed to the same
topics take ``UniformHomogeneousAssignmentBuilder`` (here); otherwise
``UniformHeterogeneousAssignmentBuilder`` (``uniform_heterogeneous``). Neither is rack aware in
Kafka 4.2, so neither is here."""

from __future__ import annotations

from minibroker.coordinator.consumer.assignor_api import (
    GroupAssignment,
    GroupSpec,
    PartitionAssignorError,
    SubscribedTopicDescriber,
    SubscriptionType,
    freeze,
    member_order,
    topic_order,
)
from minibroker.coordinator.consumer.uniform_heterogeneous import build_heterogeneous

__all__ = ["UniformAssignor", "build_homogeneous"]


def build_homogeneous(group: GroupSpec, topics: SubscribedTopicDescriber) -> GroupAssignment:
    """``UniformHomogeneousAssignmentBuilder.build``.

    Each member may hold ``total // members`` partitions, and ``total % members`` of them one
    more. Walking the members in order, a member keeps its current partitions up to its quota
    and gives back the rest; a member left with room gives up its claim to an extra partition
    unless it is one of the last members that must take one. The partitions nobody holds, then
    those given back, fill the members with room, in member order.

    Kafka iterates ``groupSpec.memberIds()``, the subscribed topics and a member's current
    topics and partitions in ``HashMap``/``HashSet`` order; here members go by member id, topics
    by :func:`topic_order` and partitions ascending."""
    member_ids = sorted(group.members, key=member_order)
    subscribed = sorted(group.members[member_ids[0]].subscribed_topic_ids, key=topic_order)
    if not subscribed:
        return {}
    # GroupSpec.isPartitionAssigned: held in some member's current target assignment.
    assigned = {(topic_id, partition)
                for member in group.members.values()
                for topic_id, partitions in member.assignment.items()
                for partition in partitions}
    unassigned: list[tuple[str, int]] = []
    total = 0
    for topic_id in subscribed:
        count = topics.num_partitions(topic_id)
        if count == -1:
            raise PartitionAssignorError(
                f"Members are subscribed to topic {topic_id} which doesn't exist in the topic "
                "metadata.")
        unassigned.extend((topic_id, partition) for partition in range(count)
                          if (topic_id, partition) not in assigned)
        total += count

    min_quota, extra_left = divmod(total, len(member_ids))
    subscribed_set = frozenset(subscribed)
    target: dict[str, dict[str, set[int]]] = {}
    unfilled: list[tuple[str, int]] = []

    # maybeRevokePartitions
    for index, member_id in enumerate(member_ids):
        old = group.members[member_id].assignment
        kept: dict[str, set[int]] = {}
        quota = min_quota
        has_extra = extra_left > 0
        if has_extra:
            quota += 1
        for topic_id in sorted(old, key=topic_order):
            if topic_id not in subscribed_set:
                continue  # the whole topic is revoked
            partitions = old[topic_id]
            if len(partitions) <= quota:
                quota -= len(partitions)
                if partitions:
                    kept[topic_id] = set(partitions)
                continue
            for partition in sorted(partitions):
                if quota > 0:
                    quota -= 1
                    kept.setdefault(topic_id, set()).add(partition)
                else:
                    unassigned.append((topic_id, partition))
        if quota > 0 and has_extra and len(member_ids) - index > extra_left:
            # Give up the extra partition for another member to claim, unless this member is
            # one of the last extra_left members and must take it.
            quota -= 1
            has_extra = False
        if quota > 0:
            unfilled.append((member_id, quota))
        if has_extra:
            extra_left -= 1
        target[member_id] = kept

    # assignRemainingPartitions
    next_index = 0
    for member_id, quota in unfilled:
        taken = unassigned[next_index:next_index + quota]
        next_index += len(taken)
        for topic_id, partition in taken:
            target[member_id].setdefault(topic_id, set()).add(partition)
    if next_index < len(unassigned):
        raise PartitionAssignorError("Partitions were left unassigned")
    return freeze(target)


class UniformAssignor:
    """``org.apache.kafka.coordinator.group.assignor.UniformAssignor``."""

    name = "uniform"

    def assign(self, group: GroupSpec, topics: SubscribedTopicDescriber) -> GroupAssignment:
        """``assign``: no entry at all when no member subscribes to anything (Kafka answers an
        empty ``GroupAssignment``); otherwise one for every member."""
        if not group.members:
            return {}
        if group.subscription_type == SubscriptionType.HOMOGENEOUS:
            return build_homogeneous(group, topics)
        return build_heterogeneous(group, topics)
