"""The consumer group protocol's server-side assignors (KIP-848), by name: Kafka 4.2's
``GroupCoordinatorConfig.CONSUMER_GROUP_BUILTIN_ASSIGNORS``. ``group.consumer.assignors``
defaults to ``uniform,range``; the first is the one a member that names none gets."""

from __future__ import annotations

from minibroker.coordinator.consumer.assignor_api import (
    Assignment,
    ConsumerGroupPartitionAssignor,
    GroupAssignment,
    GroupSpec,
    MemberSubscription,
    PartitionAssignorError,
    SubscribedTopicDescriber,
    SubscriptionType,
)
from minibroker.coordinator.consumer.range_assignor import RangeAssignor
from minibroker.coordinator.consumer.uniform_assignor import UniformAssignor

__all__ = [
    "ASSIGNORS",
    "Assignment",
    "ConsumerGroupPartitionAssignor",
    "GroupAssignment",
    "GroupSpec",
    "MemberSubscription",
    "PartitionAssignorError",
    "RangeAssignor",
    "SubscribedTopicDescriber",
    "SubscriptionType",
    "UniformAssignor",
]

ASSIGNORS: dict[str, ConsumerGroupPartitionAssignor] = {
    assignor.name: assignor for assignor in (UniformAssignor(), RangeAssignor())
}
"""The built-in assignors in ``group.consumer.assignors``' default order: ``uniform`` first."""
