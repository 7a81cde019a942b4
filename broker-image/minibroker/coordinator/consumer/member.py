"""A consumer group member (Kafka 4.2's ``ConsumerGroupMember`` and ``MemberState``).

A member is a value: every change builds a new one (Kafka's ``ConsumerGroupMember.Builder``),
so the group can compare the old and the new member to know what to write and what to
re-index (partition epochs, subscription counts).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from minibroker.coordinator.consumer.assignor_api import Assignment

__all__ = ["Assignment", "ConsumerGroupMember", "MemberState", "assignment_of"]


def assignment_of(items: Mapping[str, object]) -> dict[str, frozenset[int]]:
    """A normalised assignment: frozensets, no empty topic, topics in sorted order (so that
    iterating one is deterministic whatever the hash seed)."""
    out: dict[str, frozenset[int]] = {}
    for topic_id in sorted(items):
        partitions = frozenset(items[topic_id])  # type: ignore[call-overload]
        if partitions:
            out[topic_id] = partitions
    return out


class MemberState(StrEnum):
    """Where a member is in its reconciliation towards the group's target assignment."""

    STABLE = "stable"
    """At the target assignment's epoch with all of it."""
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    """Asked to revoke partitions, still owning some; its epoch has not moved."""
    UNRELEASED_PARTITIONS = "unreleased_partitions"
    """At the new epoch, waiting for partitions that other members have not yet released."""
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class ConsumerGroupMember:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple[str, ...] = ()
    """Sorted; Kafka's ``subscribedTopicNames``."""
    server_assignor: str | None = None
    member_epoch: int = 0
    previous_member_epoch: int = 0
    state: MemberState = MemberState.STABLE
    assigned_partitions: Assignment = field(default_factory=dict)
    partitions_pending_revocation: Assignment = field(default_factory=dict)

    def is_reconciled_to(self, target_assignment_epoch: int) -> bool:
        """Kafka's ``ModernGroupMember.isReconciledTo``."""
        return (self.state is MemberState.STABLE
                and self.member_epoch == target_assignment_epoch)

    def with_epoch(self, member_epoch: int, **changes: object) -> ConsumerGroupMember:
        """Kafka's ``Builder.updateMemberEpoch``: the current epoch becomes the previous."""
        return replace(self, member_epoch=member_epoch,
                       previous_member_epoch=self.member_epoch, **changes)  # type: ignore[arg-type]
