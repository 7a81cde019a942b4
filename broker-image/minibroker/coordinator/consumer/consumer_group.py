"""A consumer group (Kafka 4.2's ``ConsumerGroup`` over ``ModernGroup``): its epochs, members,
target assignment and the indexes the reconciliation reads.

Two epochs drive it: the *group epoch* moves whenever what the assignment depends on
changes (a member joins, leaves or changes its subscription, a subscribed topic's partitions
change); the *assignment epoch* is the group epoch the current target assignment was
computed for. Each member reconciles to the target at its own pace, and
``current_partition_epoch`` says which partitions some member still holds (at which epoch),
so that a partition is never given to two members at once.

The state is derived, never set (``maybeUpdateGroupState``): Empty without members,
Assigning while the target lags the group epoch, Reconciling while some member has not
reached it, else Stable.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from enum import StrEnum

from kio.schema.errors import ErrorCode

from minibroker.coordinator.consumer.member import Assignment, ConsumerGroupMember

__all__ = ["ConsumerGroup", "ConsumerGroupState", "GroupError"]


class ConsumerGroupState(StrEnum):
    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


class GroupError(Exception):
    """A Kafka ``ApiException`` of the group coordinator: its error code and message."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class ConsumerGroup:
    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.group_epoch = 0
        self.assignment_epoch = 0
        self.members: dict[str, ConsumerGroupMember] = {}
        self.static_members: dict[str, str] = {}
        """Instance id -> member id (KIP-345's static membership)."""
        self.target_assignment: dict[str, Assignment] = {}
        self._partition_epochs: dict[str, dict[int, int]] = {}
        self.subscribed_topic_names: Counter[str] = Counter()
        self.subscription_metadata: dict[str, tuple[str, int]] = {}
        """Subscribed topic name -> (topic id, partitions) the target was computed from."""
        self.metadata_hash = 0
        """KIP-1101's ``metadataHash`` of ``subscription_metadata``: a change (a topic
        created, deleted, or given partitions) bumps the group epoch; kept in the group's
        epoch record, so a new coordinator knows too."""

    # ---- derived state ------------------------------------------------------------------

    def topic_ids(self, names: Iterable[str]) -> list[str]:
        """The ids of the topics ``names`` that the target is computed from (those of the
        subscription metadata: a topic that does not exist has none)."""
        return [self.subscription_metadata[n][0] for n in names
                if n in self.subscription_metadata]

    @property
    def state(self) -> ConsumerGroupState:
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.group_epoch > self.assignment_epoch:
            return ConsumerGroupState.ASSIGNING
        if any(not m.is_reconciled_to(self.assignment_epoch) for m in self.members.values()):
            return ConsumerGroupState.RECONCILING
        return ConsumerGroupState.STABLE

    def is_homogeneous(self) -> bool:
        """``ModernGroup.subscriptionType``: every member subscribes to every subscribed
        topic (the uniform assignor's fast path)."""
        return all(n == len(self.members) for n in self.subscribed_topic_names.values())

    def current_partition_epoch(self, topic_id: str, partition: int) -> int:
        """The epoch of the member holding the partition (assigned or pending revocation);
        -1 when none does."""
        return self._partition_epochs.get(topic_id, {}).get(partition, -1)

    # ---- members ------------------------------------------------------------------------

    def member(self, member_id: str) -> ConsumerGroupMember:
        """``getOrMaybeCreateMember(memberId, false)``."""
        member = self.members.get(member_id)
        if member is None:
            raise GroupError(ErrorCode.unknown_member_id,
                             f"Member {member_id} is not a member of group {self.group_id}.")
        return member

    def update_member(self, new: ConsumerGroupMember) -> None:
        """``updateMember``: the member and every index over it. A partition some other
        member holds at an epoch not below the new member's is refused (Kafka's
        ``addPartitionEpochs`` guard), before anything changes."""
        old = self.members.get(new.member_id)
        self._check_partition_epochs(old, new)
        self.members[new.member_id] = new
        if old is not None:
            self.subscribed_topic_names.subtract(old.subscribed_topic_names)
            self._remove_partition_epochs(old)
        self.subscribed_topic_names.update(new.subscribed_topic_names)
        self.subscribed_topic_names = +self.subscribed_topic_names  # drop zero counts
        self._add_partition_epochs(new.assigned_partitions, new.member_epoch)
        self._add_partition_epochs(new.partitions_pending_revocation, new.member_epoch)
        if new.instance_id is not None:
            self.static_members[new.instance_id] = new.member_id

    def remove_member(self, member_id: str) -> None:
        old = self.members.pop(member_id, None)
        if old is None:
            return
        self.subscribed_topic_names.subtract(old.subscribed_topic_names)
        self.subscribed_topic_names = +self.subscribed_topic_names
        self._remove_partition_epochs(old)
        if old.instance_id is not None and self.static_members.get(old.instance_id) \
                == member_id:
            del self.static_members[old.instance_id]

    def _check_partition_epochs(self, old: ConsumerGroupMember | None,
                                new: ConsumerGroupMember) -> None:
        for assignment in (new.assigned_partitions, new.partitions_pending_revocation):
            for topic_id, partitions in assignment.items():
                epochs = self._partition_epochs.get(topic_id, {})
                for p in partitions:
                    previous = epochs.get(p)
                    if previous is None or previous < new.member_epoch or (
                            old is not None and previous == old.member_epoch
                            and p in old.assigned_partitions.get(topic_id, frozenset())
                            | old.partitions_pending_revocation.get(topic_id, frozenset())):
                        continue
                    raise RuntimeError(f"Cannot set the epoch of {topic_id}-{p} to "
                                       f"{new.member_epoch} because the partition is still "
                                       f"owned at epoch {previous}")

    def _add_partition_epochs(self, assignment: Assignment, epoch: int) -> None:
        for topic_id, partitions in assignment.items():
            epochs = self._partition_epochs.setdefault(topic_id, {})
            for p in partitions:
                epochs[p] = epoch

    def _remove_partition_epochs(self, member: ConsumerGroupMember) -> None:
        for assignment in (member.assigned_partitions, member.partitions_pending_revocation):
            for topic_id, partitions in assignment.items():
                epochs = self._partition_epochs.get(topic_id, {})
                for p in partitions:
                    if epochs.get(p) == member.member_epoch:
                        del epochs[p]
                if not epochs:
                    self._partition_epochs.pop(topic_id, None)

    # ---- offsets ------------------------------------------------------------------------

    def validate_offset_commit(self, member_id: str, member_epoch: int, *,
                               transactional: bool, instance_id: str | None = None,
                               api_version: int = 9) -> None:
        """``validateOffsetCommit``: a member commits at its current epoch
        (STALE_MEMBER_EPOCH otherwise); epoch -1 commits only to an empty group (the admin
        client, a consumer without group management); TxnOffsetCommit without member
        fields is not checked."""
        if member_epoch < 0 and not self.members:
            return
        if transactional and member_epoch == -1 and not member_id and instance_id is None:
            return
        member = self.member(member_id)
        if not transactional and api_version < 9:
            raise GroupError(ErrorCode.unsupported_version,
                             "OffsetCommit version 9 or above must be used by members using "
                             "the modern group protocol")
        self._validate_member_epoch(member_epoch, member)

    def validate_offset_fetch(self, member_id: str | None, member_epoch: int) -> None:
        """``validateOffsetFetch``: OffsetFetch v9+ may name a member, checked at its
        epoch; without one (the admin client) anything may read."""
        if member_id is None and member_epoch < 0:
            return
        member = self.members.get(member_id or "")
        if member is None:
            raise GroupError(ErrorCode.unknown_member_id,
                             f"Member {member_id} is not a member of group {self.group_id}.")
        self._validate_member_epoch(member_epoch, member)

    @staticmethod
    def _validate_member_epoch(received: int, member: ConsumerGroupMember) -> None:
        if received != member.member_epoch:
            raise GroupError(ErrorCode.stale_member_epoch,
                             f"The received member epoch {received} does not match the "
                             f"expected member epoch {member.member_epoch}.")
