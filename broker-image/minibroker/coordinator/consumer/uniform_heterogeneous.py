"""Kafka 4.2's ``UniformHeterogeneousAssignmentBuilder``: the uniform assignor for members
subscribed to different topics. Members keep their current partitions of topics they still
subscribe to; the partitions nobody holds go, topic by topic, to the topic's least loaded
subscribers; then partitions move from a topic's most loaded subscribers to its least loaded
until no move improves balance (perfect when a topic's subscribers share their subscriptions,
nearly so otherwise) or ``MAX_ITERATION_COUNT`` passes over the topics are done.

Members are numbered in member id order (Kafka: ``groupSpec.memberIds()``, a ``HashMap``'s
order; Kafka's own tests sort them, as here); every other order is Kafka's: topics by partitions
per subscriber (descending), subscriber count, then topic id (``Uuid.compareTo``); members by
assigned partition count, then number."""

from __future__ import annotations

from minibroker.coordinator.consumer.assignor_api import (
    GroupAssignment,
    GroupSpec,
    PartitionAssignorError,
    SubscribedTopicDescriber,
    freeze,
    member_order,
    topic_order,
)

__all__ = ["MAX_ITERATION_COUNT", "build_heterogeneous"]

MAX_ITERATION_COUNT = 16
"""``MAX_ITERATION_COUNT``: passes of the final balancing over the topics (each pass roughly
halves the imbalance of overlapping, non-identical subscriptions)."""


class _MemberAssignmentBalancer:
    """``MemberAssignmentBalancer``: a topic's subscribers sorted by load, with a least loaded
    range that grows rightwards as it receives partitions and a most loaded range that grows
    leftwards as it gives them up; done once the two ranges' counts differ by one or less."""

    def __init__(self, sizes: list[int]) -> None:
        self._sizes = sizes  # the builder's memberTargetAssignmentSizes, shared
        self._sorted: list[int] = []
        self._least_end = 0  # exclusive
        self._least_count = -1
        self._next_least = 0
        self._most_start = 0  # inclusive
        self._most_end = 0  # exclusive
        self._most_count = 1
        self._next_most = -1

    def initialize(self, members: list[int]) -> int:
        """``initialize``: the difference between the most and least loaded members."""
        if not members:
            raise ValueError("Cannot balance an empty subscriber list.")
        sizes = self._sizes
        self._sorted = sorted(members, key=lambda m: (sizes[m], m))
        self._least_end = 0
        self._least_count = sizes[self._sorted[0]] - 1
        self._next_least = 0
        self._most_start = len(self._sorted)
        self._most_end = len(self._sorted)
        self._most_count = sizes[self._sorted[-1]] + 1
        self._next_most = len(self._sorted) - 1
        return sizes[self._sorted[-1]] - sizes[self._sorted[0]]

    def next_least_loaded_member(self) -> int:
        """``nextLeastLoadedMember``: once every member of the range got one, its level rises
        and it takes in the members at that level."""
        if self._next_least >= self._least_end:
            self._least_count += 1
            while (self._least_end < len(self._sorted)
                   and self._sizes[self._sorted[self._least_end]] == self._least_count):
                self._least_end += 1
            self._next_least = 0
        member = self._sorted[self._next_least]
        self._next_least += 1
        return member

    def next_most_loaded_member(self) -> int:
        """``nextMostLoadedMember``: -1 when no member is left to give a partition up."""
        if self._next_most < self._most_start:
            if self._most_end <= self._most_start and self._most_start > 0:
                # Emptied by exclusions: reset the level so that the range does expand.
                self._most_count = self._sizes[self._sorted[self._most_start - 1]]
            else:
                self._most_count -= 1
            while (self._most_start > 0
                   and self._sizes[self._sorted[self._most_start - 1]] == self._most_count):
                self._most_start -= 1
            self._next_most = self._most_end - 1
        if self._next_most < 0:
            return -1
        member = self._sorted[self._next_most]
        self._next_most -= 1
        return member

    def exclude_most_loaded_member(self) -> None:
        """``excludeMostLoadedMember``: the member just returned has nothing of the topic to
        give up; swap it past the end of the most loaded range."""
        i, j = self._next_most + 1, self._most_end - 1
        self._sorted[i], self._sorted[j] = self._sorted[j], self._sorted[i]
        self._most_end -= 1

    def is_balanced(self) -> bool:
        """``isBalanced``."""
        return self._most_count - self._least_count <= 1


class _Builder:
    """The builder's state: members numbered 0..M-1, each topic's subscribers (ascending), the
    target assignment, each member's partition count and each partition's owner (-1: none)."""

    def __init__(self, group: GroupSpec, topics: SubscribedTopicDescriber) -> None:
        self.group = group
        self.topics = topics
        self.member_ids = sorted(group.members, key=member_order)
        self.subscribers: dict[str, list[int]] = {}
        self.partition_counts: dict[str, int] = {}
        for index, member_id in enumerate(self.member_ids):
            for topic_id in sorted(group.members[member_id].subscribed_topic_ids,
                                   key=topic_order):
                count = topics.num_partitions(topic_id)
                if count == -1:
                    raise PartitionAssignorError(
                        f"Members are subscribed to topic {topic_id} which doesn't exist in the "
                        "topic metadata.")
                self.partition_counts[topic_id] = count
                self.subscribers.setdefault(topic_id, []).append(index)
        self.target: dict[str, dict[str, set[int]]] = {}
        self.sizes = [0] * len(self.member_ids)
        self.owners = {topic_id: [-1] * count for topic_id, count in self.partition_counts.items()}

    def sort_topic_ids(self, topic_ids: list[str]) -> list[str]:
        """``sortTopicIds``: partitions per subscriber (a Java ``double``) descending, then
        subscriber count ascending, then topic id."""
        def key(topic_id: str) -> tuple[float, int, tuple[int, int]]:
            subscribers = len(self.subscribers[topic_id])
            return (-(self.partition_counts[topic_id] / subscribers), subscribers,
                    topic_order(topic_id))
        return sorted(topic_ids, key=key)

    def maybe_revoke_partitions(self) -> None:
        """``maybeRevokePartitions``: a member keeps its partitions of the topics it still
        subscribes to, loses the others."""
        for index, member_id in enumerate(self.member_ids):
            member = self.group.members[member_id]
            kept: dict[str, set[int]] = {}
            for topic_id in sorted(member.assignment, key=topic_order):
                if topic_id not in member.subscribed_topic_ids:
                    continue
                partitions = member.assignment[topic_id]
                owners = self.owners[topic_id]
                for partition in sorted(partitions):
                    if not 0 <= partition < len(owners):
                        # Kafka fails here too (ArrayIndexOutOfBoundsException).
                        raise PartitionAssignorError(
                            f"member {member_id} holds partition {partition} of topic "
                            f"{topic_id}, which has {len(owners)} partitions")
                    owners[partition] = index
                self.sizes[index] += len(partitions)
                if partitions:
                    kept[topic_id] = set(partitions)
            self.target[member_id] = kept

    def assign_remaining_partitions(self) -> None:
        """``computeUnassignedPartitions`` and ``assignRemainingPartitions``: topic by topic
        (sorted), each partition nobody holds to the least loaded subscriber."""
        unassigned = {topic_id: [p for p, owner in enumerate(owners) if owner == -1]
                      for topic_id, owners in self.owners.items()}
        balancer = _MemberAssignmentBalancer(self.sizes)
        for topic_id in self.sort_topic_ids([t for t, ps in unassigned.items() if ps]):
            balancer.initialize(self.subscribers[topic_id])
            for partition in unassigned[topic_id]:
                self.assign_partition(topic_id, partition, balancer.next_least_loaded_member())

    def balance(self) -> None:
        """``balance`` and ``balanceTopics``: loop over the topics with two or more subscribers
        until a whole loop moves nothing, or ``MAX_ITERATION_COUNT`` loops."""
        topic_ids = self.sort_topic_ids(
            [t for t, members in self.subscribers.items() if len(members) >= 2])
        if not topic_ids:
            return
        last_rebalanced = -1
        balancer = _MemberAssignmentBalancer(self.sizes)
        for _ in range(MAX_ITERATION_COUNT):
            for topic_index, topic_id in enumerate(topic_ids):
                if topic_index == last_rebalanced:
                    return  # a whole loop since this topic moved anything
                if self.balance_topic(topic_id, balancer) > 0 or last_rebalanced == -1:
                    last_rebalanced = topic_index

    def balance_topic(self, topic_id: str, balancer: _MemberAssignmentBalancer) -> int:
        """``balanceTopic``: move the topic's partitions from its most loaded subscribers (their
        highest partition first) to its least loaded; the number moved."""
        if balancer.initialize(self.subscribers[topic_id]) <= 1:
            return 0
        owners = self.owners[topic_id]
        # The partitions grouped by owner, so a member's partitions are a range of the list.
        partitions = sorted(range(len(owners)), key=lambda p: (owners[p], p))
        start: dict[int, int] = {}
        end: dict[int, int] = {}  # exclusive
        for i, partition in enumerate(partitions):
            start.setdefault(owners[partition], i)
            end[owners[partition]] = i + 1
        moved = 0
        while not balancer.is_balanced():
            while True:
                most = balancer.next_most_loaded_member()
                if most == -1:
                    break
                if most not in end or end[most] - start[most] <= 0:
                    balancer.exclude_most_loaded_member()
                    continue
                break
            if most == -1:
                break  # nobody left with a partition of this topic to give up
            end[most] -= 1
            partition = partitions[end[most]]
            least = balancer.next_least_loaded_member()
            if balancer.is_balanced():
                break
            self.assign_partition(topic_id, partition, least)
            moved += 1
        return moved

    def assign_partition(self, topic_id: str, partition: int, index: int) -> None:
        """``assignPartition``: move the partition from its owner, if any, to the member."""
        owners = self.owners[topic_id]
        old = owners[partition]
        if old != -1:
            held = self.target[self.member_ids[old]]
            held_partitions = held.get(topic_id)
            if held_partitions is not None:
                held_partitions.discard(partition)
                if not held_partitions:
                    del held[topic_id]
            self.sizes[old] -= 1
        self.target[self.member_ids[index]].setdefault(topic_id, set()).add(partition)
        owners[partition] = index
        self.sizes[index] += 1


def build_heterogeneous(group: GroupSpec, topics: SubscribedTopicDescriber) -> GroupAssignment:
    """``UniformHeterogeneousAssignmentBuilder.build``: revoke, assign what is left, balance."""
    builder = _Builder(group, topics)
    if not builder.subscribers:
        return {}
    builder.maybe_revoke_partitions()
    builder.assign_remaining_partitions()
    builder.balance()
    return freeze(builder.target)
