"""Kafka 4.2's server-side ``RangeAssignor`` (``range``): each topic's partitions cut into
contiguous ranges, one a subscriber in member order, the first ``partitions % subscribers``
ranges one longer. Members subscribed to the same topics with the same partition counts get
the same partition numbers of every topic (co-partitioning, for joins). It keeps nothing of
the current assignment: the order of the members decides, and static members come first, by
``group.instance.id``, so a static member that rejoins under a new member id gets its ranges
back."""

from __future__ import annotations

from dataclasses import dataclass

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

__all__ = ["RangeAssignor"]


@dataclass
class _TopicMetadata:
    """``RangeAssignor.TopicMetadata``: a topic's partitions and where the next range starts."""

    topic_id: str
    num_partitions: int
    num_members: int
    min_quota: int = -1
    extra_partitions: int = -1
    next_range: int = 0

    def maybe_compute_quota(self) -> None:
        """``maybeComputeQuota``: once every subscriber is counted."""
        if self.min_quota != -1:
            return
        self.min_quota = self.num_partitions // self.num_members
        self.extra_partitions = self.num_partitions % self.num_members

    def next_partitions(self) -> range:
        """``addPartitionsToAssignment``: the next member's range (empty once none is left)."""
        start = self.next_range
        quota = self.min_quota
        if self.extra_partitions > 0:
            quota += 1
            self.extra_partitions -= 1
        end = min(start + quota, self.num_partitions)
        self.next_range = end
        return range(start, end)


def _describe(topics: SubscribedTopicDescriber, topic_id: str, num_members: int) -> _TopicMetadata:
    num_partitions = topics.num_partitions(topic_id)
    if num_partitions == -1:
        raise PartitionAssignorError(f"Member is subscribed to a non-existent topic {topic_id}")
    return _TopicMetadata(topic_id, num_partitions, num_members)


def _sorted_member_ids(group: GroupSpec) -> list[str]:
    """``sortMemberIds``: static members first, by instance id, then the others by member id.
    (Equal instance ids, which a group never holds, are ordered by member id: Java's stable
    sort would keep the ``HashMap`` order.)"""
    def key(member_id: str) -> tuple[int, bytes, bytes]:
        instance_id = group.members[member_id].instance_id
        if instance_id is not None:
            return 0, member_order(instance_id), member_order(member_id)
        return 1, member_order(member_id), b""
    return sorted(group.members, key=key)


class RangeAssignor:
    """``org.apache.kafka.coordinator.group.assignor.RangeAssignor``."""

    name = "range"

    def assign(self, group: GroupSpec, topics: SubscribedTopicDescriber) -> GroupAssignment:
        """``assign``: every member gets an entry, empty when it has no range."""
        if not group.members:
            return {}
        member_ids = _sorted_member_ids(group)
        metadata: dict[str, _TopicMetadata] = {}
        homogeneous = group.subscription_type == SubscriptionType.HOMOGENEOUS
        if homogeneous:
            # assignHomogeneousGroup: the first member's topics, every member subscribed.
            first = group.members[member_ids[0]].subscribed_topic_ids
            for topic_id in sorted(first, key=topic_order):
                metadata[topic_id] = _describe(topics, topic_id, len(member_ids))
        else:
            # assignHeterogeneousGroup: count each topic's subscribers first.
            for member_id in member_ids:
                for topic_id in sorted(group.members[member_id].subscribed_topic_ids,
                                       key=topic_order):
                    if topic_id not in metadata:
                        metadata[topic_id] = _describe(topics, topic_id, 0)
                    metadata[topic_id].num_members += 1
        assignment: dict[str, dict[str, range]] = {}
        for member_id in member_ids:
            member_topics = (list(metadata) if homogeneous else
                             sorted(group.members[member_id].subscribed_topic_ids, key=topic_order))
            ranges: dict[str, range] = {}
            for topic_id in member_topics:
                topic = metadata[topic_id]
                topic.maybe_compute_quota()
                partitions = topic.next_partitions()
                if partitions:
                    ranges[topic_id] = partitions
            assignment[member_id] = ranges
        return freeze(assignment)
