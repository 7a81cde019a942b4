"""What a server-side assignor sees and answers: Kafka 4.2's
``org.apache.kafka.coordinator.group.api.assignor`` (``ConsumerGroupPartitionAssignor``,
``GroupSpec``, ``MemberSubscription``, ``SubscribedTopicDescriber``, ``SubscriptionType``,
``PartitionAssignorException``), with the orders Java's comparisons give.

Topic ids are minibroker's ``topic_id`` (``str(uuid.UUID)``); a member's assignment maps a
topic id to its partitions. Where Kafka iterates a ``HashMap`` or ``HashSet`` (an order Java
leaves unspecified and that would differ between our string ids and Kafka's ``Uuid``), the
assignors here iterate in the orders below, so the same group gives the same assignment in
every run whatever Python's hash seed."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

__all__ = [
    "Assignment",
    "ConsumerGroupPartitionAssignor",
    "GroupAssignment",
    "GroupSpec",
    "MemberSubscription",
    "PartitionAssignorError",
    "SubscribedTopicDescriber",
    "SubscriptionType",
    "freeze",
    "member_order",
    "topic_order",
]

Assignment = Mapping[str, frozenset[int]]
"""A member's partitions, keyed by topic id (``MemberAssignment.partitions``)."""

GroupAssignment = dict[str, dict[str, frozenset[int]]]
"""The new target assignment, keyed by member id (``GroupAssignment.members``)."""


class PartitionAssignorError(ValueError):
    """Kafka's ``PartitionAssignorException``: the target assignment cannot be computed
    (a member subscribes to a topic the metadata does not have)."""


class SubscriptionType(StrEnum):
    """``SubscriptionType``: whether every member subscribes to the same topics, which picks
    the uniform assignor's algorithm and the range assignor's."""

    HOMOGENEOUS = "homogeneous"
    HETEROGENEOUS = "heterogeneous"


@dataclass(frozen=True)
class MemberSubscription:
    """``MemberSubscriptionAndAssignmentImpl``: a member's subscription and its current target
    assignment, which the assignors keep as much of as balance allows (stickiness).

    ``instance_id`` is ``group.instance.id`` (static membership): the range assignor orders
    static members first, by instance id, so a static member that rejoins under a new member id
    gets its ranges back. ``rack_id`` is carried as Kafka's interface carries it, but neither
    of Kafka 4.2's built-in assignors reads it (nor ``racksForPartition``)."""

    rack_id: str | None
    subscribed_topic_ids: frozenset[str]
    assignment: Assignment
    instance_id: str | None = None


@dataclass(frozen=True)
class GroupSpec:
    """``GroupSpecImpl``: the members, keyed by member id, and the group's subscription type.

    Kafka's ``isPartitionAssigned`` reads the group's inverted target assignment; here it is
    the union of the members' assignments, which is the same thing once a departed member's
    target assignment tombstone has been replayed (as it is before Kafka computes the next
    target assignment)."""

    members: Mapping[str, MemberSubscription]
    subscription_type: SubscriptionType


class SubscribedTopicDescriber(Protocol):
    """``SubscribedTopicDescriber``: the subscribed topics' metadata."""

    def num_partitions(self, topic_id: str) -> int:
        """The topic's partition count, -1 when the topic is unknown."""
        ...

    def racks_for_partition(self, topic_id: str, partition: int) -> frozenset[str]:
        """The racks of the partition's replicas (empty when unknown)."""
        ...


class ConsumerGroupPartitionAssignor(Protocol):
    """``ConsumerGroupPartitionAssignor``: a named server-side assignor
    (``group.consumer.assignors``)."""

    name: str

    def assign(self, group: GroupSpec, topics: SubscribedTopicDescriber) -> GroupAssignment:
        """The group's new target assignment; raises :class:`PartitionAssignorError`."""
        ...


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >> 63 else value


@functools.lru_cache(maxsize=1 << 16)
def topic_order(topic_id: str) -> tuple[int, int]:
    """Kafka's ``Uuid.compareTo``: the most significant 64 bits, then the least, each compared
    as a signed ``long`` (so ids with the top bit set sort first, unlike their hex strings).
    Remembered for the last 65,536 ids: a large group sorts the same ids for every member."""
    try:
        value = uuid.UUID(topic_id).int
    except ValueError:
        raise PartitionAssignorError(f"topic id {topic_id!r} is not a UUID") from None
    return _signed64(value >> 64), _signed64(value & ((1 << 64) - 1))


def member_order(member_id: str) -> bytes:
    """Java's ``String.compareTo`` (UTF-16 code units), for member and instance ids."""
    return member_id.encode("utf-16-be", "surrogatepass")


def freeze(assignment: Mapping[str, Mapping[str, Iterable[int]]]) -> GroupAssignment:
    """The answer in one order (members by :func:`member_order`, topics by
    :func:`topic_order`) so that whoever writes it out writes the same bytes every run."""
    return {
        member_id: {topic_id: frozenset(assignment[member_id][topic_id])
                    for topic_id in sorted(assignment[member_id], key=topic_order)}
        for member_id in sorted(assignment, key=member_order)
    }
