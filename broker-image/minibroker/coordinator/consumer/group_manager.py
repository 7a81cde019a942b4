"""The consumer group protocol's coordinator side (KIP-848): Kafka 4.2's
``GroupMetadataManager.consumerGroupHeartbeat``, ``consumerGroupLeave``, the fencing of
members and their session and rebalance timeouts, over `ConsumerGroup`.

A heartbeat does three things, in order:

1. it updates the member (subscription, rebalance timeout, assignor, rack); a new member, a
   changed subscription or a change of a subscribed topic's partitions bumps the group
   epoch;
2. when the group epoch is ahead of the target assignment's, the assignor computes a new
   target for every member (``TargetAssignmentBuilder``), at the group epoch;
3. the member reconciles one step towards its target (`build_current_assignment`), and the
   answer carries its epoch and, when it changed or the request was a full one, its
   assignment.

A member that stops heartbeating for ``group.consumer.session.timeout.ms`` is fenced:
removed, the group epoch bumped, its partitions free once the others reconcile. One that
does not revoke within its rebalance timeout is fenced too.

Every change is also a record (``consumer.records``), written to the group's
``__consumer_offsets`` partition in one batch before the member gets its answer, as Kafka's
coordinator runtime does, so a new coordinator replays the group. The state changes at
once; Kafka would revert it if the write failed (its timeline snapshots), minibroker keeps
it, which only matters while the write's failure leaves this broker the coordinator.

It is long because it is Kafka's GroupMetadataManager for the consumer protocol in one place: the
heartbeat's validation, reconciliation, fencing, timers and records change one group's state
together, as in Kafka's own class.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from kio.schema.errors import ErrorCode

from minibroker.cluster.scheduler import Scheduler, Timer
from minibroker.cluster.types import MetadataImage
from minibroker.config import resolve
from minibroker.coordinator.consumer.assignors import (
    ASSIGNORS,
    GroupSpec,
    MemberSubscription,
    PartitionAssignorError,
    SubscriptionType,
)
from minibroker.coordinator.consumer.consumer_group import (
    ConsumerGroup,
    ConsumerGroupState,
    GroupError,
)
from minibroker.coordinator.consumer.current_assignment_builder import (
    FencedMemberEpochError,
    build_current_assignment,
)
from minibroker.coordinator.consumer.member import (
    Assignment,
    ConsumerGroupMember,
    MemberState,
    assignment_of,
)
from minibroker.coordinator.consumer.records import (
    CURRENT_MEMBER_ASSIGNMENT,
    MEMBER_METADATA,
    TARGET_ASSIGNMENT_MEMBER,
    Record,
    current_assignment_record,
    group_epoch_record,
    member_metadata_record,
    metadata_hash,
    target_assignment_epoch_record,
    target_assignment_member_record,
    tombstone,
)

__all__ = ["ConsumerGroupConfig", "ConsumerGroupManager", "ConsumerGroups", "HeartbeatRequest",
           "HeartbeatResponse"]

log = logging.getLogger(__name__)

JOIN_GROUP_MEMBER_EPOCH = 0
LEAVE_GROUP_MEMBER_EPOCH = -1
LEAVE_GROUP_STATIC_MEMBER_EPOCH = -2
CONSUMER_GENERATED_MEMBER_ID_REQUIRED_VERSION = 1  # KIP-1082


@dataclass(frozen=True)
class ConsumerGroupConfig:
    """Kafka 4.2's ``GroupCoordinatorConfig`` keys of the consumer protocol."""

    session_timeout_ms: int
    heartbeat_interval_ms: int
    max_size: int
    assignors: tuple[str, ...]
    """The server assignors offered, the first the default."""

    @classmethod
    def from_config(cls, config: Mapping[str, str]) -> ConsumerGroupConfig:
        return cls(resolve("group.consumer.session.timeout.ms", config),
                   resolve("group.consumer.heartbeat.interval.ms", config),
                   resolve("group.consumer.max.size", config),
                   resolve("group.consumer.assignors", config))


@dataclass(frozen=True)
class HeartbeatRequest:
    """ConsumerGroupHeartbeat's fields, topics named by id; None where the client did not
    say (it did not change since its last heartbeat)."""

    group_id: str
    member_id: str
    member_epoch: int
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: Assignment | None = None
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    api_version: int = 1


@dataclass(frozen=True)
class HeartbeatResponse:
    error: ErrorCode = ErrorCode.none
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: Assignment | None = None
    """Set when the member joined, sent a full request, or its assignment changed."""


class ConsumerGroups(Protocol):
    """Where the consumer groups live: the coordinator's groups, beside the classic ones
    (Kafka's ``GroupMetadataManager.groups``)."""

    def consumer_group(self, group_id: str) -> ConsumerGroup | None:
        """The group, None when there is none; GroupError (GROUP_ID_NOT_FOUND) when the id
        is a classic group's."""

    def create_consumer_group(self, group_id: str) -> tuple[ConsumerGroup, list[Record]]:
        """``getOrMaybeCreateConsumerGroup(groupId, true)``: a new group (an empty classic
        group of the id becomes one, with the records that say so); GroupError when a
        classic group with members has the id."""

    def write(self, group_id: str, records: list[Record],
              done: Callable[[ErrorCode], None]) -> None:
        """Append ``records`` to the group's partition, one batch; ``done`` gets the error a
        member should see."""


class _Describer:
    """``SubscribedTopicDescriber`` over a metadata image."""

    def __init__(self, image: MetadataImage) -> None:
        self._by_id = {t.topic_id: t for t in image.topics.values()}

    def num_partitions(self, topic_id: str) -> int:
        topic = self._by_id.get(topic_id)
        return -1 if topic is None else len(topic.partitions)

    def racks_for_partition(self, topic_id: str, partition: int) -> frozenset[str]:
        return frozenset()  # minibroker's brokers have no rack in the image


class ConsumerGroupManager:
    def __init__(self, scheduler: Scheduler, config: ConsumerGroupConfig,
                 metadata_image: Callable[[], MetadataImage], groups: ConsumerGroups,
                 new_member_id: Callable[[], str]) -> None:
        self._scheduler = scheduler
        self.config = config
        self._metadata_image = metadata_image
        self._groups = groups
        self._new_member_id = new_member_id
        self._session_timers: dict[tuple[str, str], Timer] = {}
        self._rebalance_timers: dict[tuple[str, str], Timer] = {}

    # ---- the request ---------------------------------------------------------------------

    def heartbeat(self, request: HeartbeatRequest,
                  callback: Callable[[HeartbeatResponse], None]) -> None:
        """``GroupCoordinatorService.consumerGroupHeartbeat`` after its status checks:
        ``callback`` gets the answer once the heartbeat's records are written."""
        records: list[Record] = []
        try:
            self._validate(request)
            if request.member_epoch in (LEAVE_GROUP_MEMBER_EPOCH,
                                        LEAVE_GROUP_STATIC_MEMBER_EPOCH):
                answer = self._leave(request, records)
            else:
                answer = self._heartbeat(request, records)
        except GroupError as exc:
            answer = HeartbeatResponse(exc.code, str(exc))
        except FencedMemberEpochError as exc:
            answer = HeartbeatResponse(ErrorCode.fenced_member_epoch, str(exc))
        if not records:
            callback(answer)
            return

        def written(error: ErrorCode) -> None:
            callback(answer if error is ErrorCode.none else HeartbeatResponse(error))

        self._groups.write(request.group_id, records, written)

    def _validate(self, r: HeartbeatRequest) -> None:
        """``throwIfConsumerGroupHeartbeatRequestIsInvalid``."""
        def invalid(message: str) -> GroupError:
            return GroupError(ErrorCode.invalid_request, message)

        if (r.api_version >= CONSUMER_GENERATED_MEMBER_ID_REQUIRED_VERSION
                or r.member_epoch > 0 or r.member_epoch == LEAVE_GROUP_MEMBER_EPOCH) \
                and not r.member_id:
            raise invalid("MemberId can't be empty.")
        if not r.group_id:
            raise invalid("GroupId can't be empty.")
        if r.instance_id == "":
            raise invalid("InstanceId can't be empty.")
        if r.rack_id == "":
            raise invalid("RackId can't be empty.")
        if r.member_epoch == JOIN_GROUP_MEMBER_EPOCH:
            if r.rebalance_timeout_ms == -1:
                raise invalid("RebalanceTimeoutMs must be provided in first request.")
            if r.owned is None or any(r.owned.values()):
                raise invalid("TopicPartitions must be empty when (re-)joining.")
            if r.subscribed_topic_names is None and r.subscribed_topic_regex is None:
                raise invalid("Either SubscribedTopicNames or SubscribedTopicRegex must be "
                              "non-null when (re-)joining.")
        elif r.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH and r.instance_id is None:
            raise invalid("InstanceId can't be null.")
        elif r.member_epoch < LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            raise invalid("MemberEpoch is invalid.")
        if r.server_assignor is not None and r.server_assignor not in self.config.assignors:
            raise GroupError(ErrorCode.unsupported_assignor,
                             f"ServerAssignor {r.server_assignor} is not supported. Supported "
                             f"assignors: {', '.join(self.config.assignors)}.")
        # Not in this coordinator yet: documented in docs/design.md's rules table.
        if r.instance_id is not None:
            raise invalid("Static membership (InstanceId) is not supported by minibroker's "
                          "consumer group protocol yet.")
        if r.subscribed_topic_regex:  # librdkafka sends "" for no regex, as Kafka allows
            raise GroupError(ErrorCode.invalid_regular_expression,
                             "SubscribedTopicRegex is not supported by minibroker yet.")

    def _heartbeat(self, r: HeartbeatRequest, records: list[Record]) -> HeartbeatResponse:
        joining = r.member_epoch == JOIN_GROUP_MEMBER_EPOCH
        group = self._groups.consumer_group(r.group_id)
        if group is None:
            if not joining:
                raise GroupError(ErrorCode.group_id_not_found,
                                 f"Consumer group {r.group_id} not found.")
            group, created = self._groups.create_consumer_group(r.group_id)
            records += created
        member_id = r.member_id or self._new_member_id()
        member = group.members.get(member_id)
        if member is None:
            if not joining:
                raise GroupError(ErrorCode.unknown_member_id,
                                 f"Member {member_id} is not a member of group "
                                 f"{r.group_id}.")
            if len(group.members) >= self.config.max_size:
                raise GroupError(ErrorCode.group_max_size_reached,
                                 f"The consumer group has reached its maximum capacity of "
                                 f"{self.config.max_size} members.")
            member = ConsumerGroupMember(member_id)
            log.info("[GroupId %s] Member %s joins the consumer group using the consumer "
                     "protocol.", r.group_id, member_id)
        else:
            _check_member_epoch(member, r.member_epoch, r.owned)

        # 1. The member, and the group epoch when what the assignment depends on changed.
        updated = replace(
            member, client_id=r.client_id, client_host=r.client_host,
            rack_id=r.rack_id if r.rack_id is not None else member.rack_id,
            rebalance_timeout_ms=(r.rebalance_timeout_ms if r.rebalance_timeout_ms != -1
                                  else member.rebalance_timeout_ms),
            server_assignor=(r.server_assignor if r.server_assignor is not None
                             else member.server_assignor),
            subscribed_topic_names=(tuple(sorted(set(r.subscribed_topic_names)))
                                    if r.subscribed_topic_names is not None
                                    else member.subscribed_topic_names))
        subscription_changed = updated.subscribed_topic_names != member.subscribed_topic_names
        if r.member_id not in group.members or _metadata_of(updated) != _metadata_of(member):
            records.append(member_metadata_record(group.group_id, updated))
        image = self._metadata_image()
        metadata = self._subscription_metadata(group, image, updated)
        hash_ = metadata_hash(metadata)
        bump = subscription_changed or group.group_epoch == 0 or hash_ != group.metadata_hash
        # The topic ids the target and the reconciliation use: from this image (a replayed
        # group has only the hash of what they were).
        group.subscription_metadata = metadata
        if bump:
            group.metadata_hash = hash_
            group.group_epoch += 1
            records.append(group_epoch_record(group.group_id, group.group_epoch,
                                              group.metadata_hash))
            log.info("[GroupId %s] Bumped group epoch to %d.", r.group_id, group.group_epoch)
        # The member is in the group from here on (Kafka writes its metadata record).
        group.update_member(updated)

        # 2. A new target assignment for the group epoch.
        if group.group_epoch > group.assignment_epoch:
            self._update_target_assignment(group, image, records)

        # 3. Reconcile the member one step.
        reconciled = self._maybe_reconcile(group, updated, subscription_changed, r.owned,
                                           image, records)
        self._schedule_session_timeout(group.group_id, member_id)
        full = (r.rebalance_timeout_ms != -1 and r.subscribed_topic_names is not None
                and r.owned is not None)
        changed = reconciled.assigned_partitions != member.assigned_partitions
        return HeartbeatResponse(
            member_id=member_id, member_epoch=reconciled.member_epoch,
            heartbeat_interval_ms=self.config.heartbeat_interval_ms,
            assignment=(reconciled.assigned_partitions if joining or full or changed
                        else None))

    @staticmethod
    def _subscription_metadata(group: ConsumerGroup, image: MetadataImage,
                               member: ConsumerGroupMember | None = None
                               ) -> dict[str, tuple[str, int]]:
        """The subscribed topics' ids and partition counts of the group's members, with
        ``member``'s subscription in place of its old one (``updateSubscriptionMetadata``)."""
        names = {n for m in group.members.values()
                 if member is None or m.member_id != member.member_id
                 for n in m.subscribed_topic_names}
        if member is not None:
            names |= set(member.subscribed_topic_names)
        return {name: (image.topics[name].topic_id, len(image.topics[name].partitions))
                for name in sorted(names) if name in image.topics}

    def _update_target_assignment(self, group: ConsumerGroup, image: MetadataImage,
                                  records: list[Record]) -> None:
        """``TargetAssignmentBuilder.build``: every member's target at the group epoch."""
        spec = GroupSpec(
            members={m.member_id: MemberSubscription(
                rack_id=m.rack_id,
                subscribed_topic_ids=frozenset(group.topic_ids(m.subscribed_topic_names)),
                assignment=group.target_assignment.get(m.member_id, {}))
                for m in sorted(group.members.values(), key=lambda m: m.member_id)},
            subscription_type=(SubscriptionType.HOMOGENEOUS if group.is_homogeneous()
                               else SubscriptionType.HETEROGENEOUS))
        name = self._assignor_for(group)
        try:
            target = ASSIGNORS[name].assign(spec, _Describer(image))
        except PartitionAssignorError as exc:
            raise GroupError(ErrorCode.unknown_server_error,
                             f"Failed to compute a new target assignment for epoch "
                             f"{group.group_epoch}: {exc}") from exc
        new_target = {m: assignment_of(a) for m, a in sorted(target.items())}
        for member_id, assignment in new_target.items():
            if group.target_assignment.get(member_id) != assignment:
                records.append(target_assignment_member_record(group.group_id, member_id,
                                                               assignment))
        group.target_assignment = new_target
        group.assignment_epoch = group.group_epoch
        records.append(target_assignment_epoch_record(group.group_id, group.assignment_epoch))
        log.info("[GroupId %s] Computed a new target assignment for epoch %d with '%s' "
                 "assignor.", group.group_id, group.group_epoch, name)

    def assignor_name(self, group: ConsumerGroup) -> str:
        """The assignor the group's target comes from (ConsumerGroupDescribe)."""
        return self._assignor_for(group)

    def _assignor_for(self, group: ConsumerGroup) -> str:
        """``computePreferredServerAssignor``: the members' most common choice (the first
        offered on a tie, for determinism), else the default."""
        votes: dict[str, int] = {}
        for m in group.members.values():
            if m.server_assignor is not None:
                votes[m.server_assignor] = votes.get(m.server_assignor, 0) + 1
        if not votes:
            return self.config.assignors[0]
        return max(self.config.assignors, key=lambda a: votes.get(a, 0))

    def _maybe_reconcile(self, group: ConsumerGroup, member: ConsumerGroupMember,
                         subscription_changed: bool, owned: Assignment | None,
                         image: MetadataImage, records: list[Record]) -> ConsumerGroupMember:
        if not subscription_changed and member.is_reconciled_to(group.assignment_epoch):
            return member
        updated = build_current_assignment(
            member, target_epoch=group.assignment_epoch,
            target=group.target_assignment.get(member.member_id, {}),
            subscribed_topic_ids=group.topic_ids(member.subscribed_topic_names),
            has_subscription_changed=subscription_changed,
            current_partition_epoch=group.current_partition_epoch, owned=owned)
        if updated != member:
            group.update_member(updated)
            records.append(current_assignment_record(group.group_id, updated))
            log.info("[GroupId %s] Member %s new assignment state: epoch=%d, previousEpoch=%d, "
                     "state=%s, assignedPartitions=%s and revokedPartitions=%s.",
                     group.group_id, member.member_id, updated.member_epoch,
                     updated.previous_member_epoch, updated.state,
                     _text(updated.assigned_partitions, image),
                     _text(updated.partitions_pending_revocation, image))
            key = (group.group_id, member.member_id)
            if updated.state is MemberState.UNREVOKED_PARTITIONS:
                self._schedule(self._rebalance_timers, key, updated.rebalance_timeout_ms,
                               lambda: self._on_rebalance_timeout(key, updated.member_epoch))
            else:
                self._cancel(self._rebalance_timers, key)
        return updated

    # ---- leaving and fencing ----------------------------------------------------------------

    def _leave(self, r: HeartbeatRequest, records: list[Record]) -> HeartbeatResponse:
        group = self._groups.consumer_group(r.group_id)
        if group is None:
            raise GroupError(ErrorCode.group_id_not_found,
                             f"Consumer group {r.group_id} not found.")
        group.member(r.member_id)
        log.info("[GroupId %s] Member %s left the consumer group.", r.group_id, r.member_id)
        records += self._fence_member(group, r.member_id)
        return HeartbeatResponse(member_id=r.member_id, member_epoch=r.member_epoch)

    def _fence_member(self, group: ConsumerGroup, member_id: str) -> list[Record]:
        """``consumerGroupFenceMember``: the member is gone, its target too, and the group
        epoch moves so the others get its partitions; the records that say so."""
        member = group.members[member_id]
        group.remove_member(member_id)
        group.target_assignment.pop(member_id, None)
        group.subscription_metadata = self._subscription_metadata(group, self._metadata_image())
        group.metadata_hash = metadata_hash(group.subscription_metadata)
        group.group_epoch += 1
        key = (group.group_id, member_id)
        self._cancel(self._session_timers, key)
        self._cancel(self._rebalance_timers, key)
        if group.state is ConsumerGroupState.EMPTY:
            log.info("[GroupId %s] The group is now empty, at epoch %d.", group.group_id,
                     group.group_epoch)
        return [tombstone(CURRENT_MEMBER_ASSIGNMENT, group.group_id, member.member_id),
                tombstone(TARGET_ASSIGNMENT_MEMBER, group.group_id, member.member_id),
                tombstone(MEMBER_METADATA, group.group_id, member.member_id),
                group_epoch_record(group.group_id, group.group_epoch, group.metadata_hash)]

    def _fence_and_write(self, group: ConsumerGroup, member_id: str) -> None:
        """A timer's fencing: nobody waits for its records."""
        records = self._fence_member(group, member_id)

        def written(error: ErrorCode) -> None:
            if error is not ErrorCode.none:
                log.info("[GroupId %s] Writing the fencing of %s failed: %s",
                         group.group_id, member_id, error.name)

        self._groups.write(group.group_id, records, written)

    def on_loaded(self, group: ConsumerGroup) -> None:
        """A new coordinator replayed the group (Kafka's ``onLoaded``): every member's
        session starts now, and one still revoking gets its rebalance timeout again."""
        for member in group.members.values():
            self._schedule_session_timeout(group.group_id, member.member_id)
            if member.state is MemberState.UNREVOKED_PARTITIONS:
                key = (group.group_id, member.member_id)
                epoch = member.member_epoch
                self._schedule(self._rebalance_timers, key, member.rebalance_timeout_ms,
                               lambda key=key, epoch=epoch: self._on_rebalance_timeout(key,
                                                                                       epoch))

    def unload(self, group: ConsumerGroup) -> None:
        """The coordinator gave up the group's partition: its timers go with it."""
        for member_id in group.members:
            self._cancel(self._session_timers, (group.group_id, member_id))
            self._cancel(self._rebalance_timers, (group.group_id, member_id))

    def _on_session_timeout(self, key: tuple[str, str]) -> None:
        self._session_timers.pop(key, None)
        group = self._groups.consumer_group(key[0])
        if group is not None and key[1] in group.members:
            log.info("[GroupId %s] Member %s fenced from the group because its session "
                     "expired.", *key)
            self._fence_and_write(group, key[1])

    def _on_rebalance_timeout(self, key: tuple[str, str], member_epoch: int) -> None:
        self._rebalance_timers.pop(key, None)
        group = self._groups.consumer_group(key[0])
        member = group.members.get(key[1]) if group is not None else None
        if group is not None and member is not None and member.member_epoch == member_epoch:
            log.info("[GroupId %s] Member %s fenced from the group because it failed to "
                     "transition from epoch %d within %dms.", key[0], key[1], member_epoch,
                     member.rebalance_timeout_ms)
            self._fence_and_write(group, key[1])

    def _schedule_session_timeout(self, group_id: str, member_id: str) -> None:
        key = (group_id, member_id)
        self._schedule(self._session_timers, key, self.config.session_timeout_ms,
                       lambda: self._on_session_timeout(key))

    def _schedule(self, timers: dict[tuple[str, str], Timer], key: tuple[str, str],
                  delay_ms: int, callback: Callable[[], None]) -> None:
        self._cancel(timers, key)
        timers[key] = self._scheduler.call_later(delay_ms, callback)

    @staticmethod
    def _cancel(timers: dict[tuple[str, str], Timer], key: tuple[str, str]) -> None:
        timer = timers.pop(key, None)
        if timer is not None:
            timer.cancel()


def _check_member_epoch(member: ConsumerGroupMember, received: int,
                        owned: Assignment | None) -> None:
    """``throwIfConsumerGroupMemberEpochIsInvalid``: 0 rejoins; a greater epoch, or a smaller
    one other than the previous epoch with a subset of the assignment (its answer was lost),
    is fenced."""
    if received == JOIN_GROUP_MEMBER_EPOCH:
        return
    if received > member.member_epoch:
        raise FencedMemberEpochError(
            f"The consumer group member has a greater member epoch ({received}) than the one "
            f"known by the group coordinator ({member.member_epoch}). The member must "
            f"abandon all its partitions and rejoin.")
    if received < member.member_epoch and (
            received != member.previous_member_epoch
            or not _is_subset(owned, member.assigned_partitions)):
        raise FencedMemberEpochError(
            f"The consumer group member has a smaller member epoch ({received}) than the one "
            f"known by the group coordinator ({member.member_epoch}). The member must "
            f"abandon all its partitions and rejoin.")


def _is_subset(owned: Assignment | None, assigned: Assignment) -> bool:
    if owned is None:
        return False
    return all(p in assigned.get(t, ()) for t, ps in owned.items() for p in ps)


def _text(assignment: Assignment, image: MetadataImage) -> str:
    names = {t.topic_id: t.name for t in image.topics.values()}
    return ", ".join(f"{names.get(t, t)}-{sorted(ps)}" for t, ps in assignment.items()) or "-"


def _metadata_of(m: ConsumerGroupMember) -> tuple[object, ...]:
    """What ``ConsumerGroupMemberMetadataValue`` holds of a member."""
    return (m.instance_id, m.rack_id, m.client_id, m.client_host, m.subscribed_topic_names,
            m.rebalance_timeout_ms, m.server_assignor)
