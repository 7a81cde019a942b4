"""Rebalances and sessions of classic groups: what Kafka 3.9's ``GroupCoordinator`` does
between the requests (``prepareRebalance``, ``onCompleteJoin``, the pending-sync and heartbeat
expirations, ``removeMemberAndUpdateGroup``, ``onGroupLoaded``/``onGroupUnloaded``).

A rebalance moves the group to ``PreparingRebalance`` and parks the JoinGroups in
``DelayedJoin`` (``InitialDelayedJoin`` for an empty group) until every known member has
rejoined or the rebalance timeout passed; then the members that did not rejoin are removed
and the next generation starts (``CompletingRebalance``), each member answered, the leader
with every subscription. Every member must then send its SyncGroup within the rebalance
timeout (``DelayedSync``). A member's session is a ``DelayedHeartbeat`` that anything showing
it alive completes and reschedules; when one expires the member is removed and the group
rebalances. Each of these changes is also a replication event (``group_rebalance``,
``group_stable``, ``group_empty``, ``group_member_removed``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from minibroker.cluster.delayed import Purgatory
from minibroker.cluster.scheduler import Scheduler
from minibroker.cluster.types import ErrorCode
from minibroker.coordinator.delayed import (
    DelayedHeartbeat,
    DelayedJoin,
    DelayedSync,
    InitialDelayedJoin,
    join_key,
    member_key,
    sync_key,
)
from minibroker.coordinator.group_metadata import (
    GroupMetadata,
    GroupState,
    JoinGroupResult,
    MemberMetadata,
    SyncGroupResult,
)
from minibroker.events import EventType, MemberRemovedReason, RebalanceReason

if TYPE_CHECKING:
    from minibroker.coordinator.group_coordinator import GroupConfig, GroupEvents
    from minibroker.coordinator.group_metadata_manager import GroupMetadataManager

log = logging.getLogger("minibroker.coordinator")

UNKNOWN_MEMBER_ID = ""


def join_result(group: GroupMetadata, member_id: str, *, with_members: bool,
                 skip_assignment: bool = False,
                 leader: str | None = None) -> JoinGroupResult:
    return JoinGroupResult(
        member_id, ErrorCode.none, generation_id=group.generation_id,
        protocol_type=group.protocol_type, protocol_name=group.protocol_name,
        leader_id=(leader if leader is not None else group.leader_id) or "",
        skip_assignment=skip_assignment,
        members=group.current_member_metadata() if with_members else ())


class Rebalancer:
    """The rebalance and session machinery the classic handler drives; the delayed
    operations call back into it."""

    def __init__(self, manager: GroupMetadataManager, scheduler: Scheduler,
                 config: GroupConfig, events: GroupEvents) -> None:
        self._manager = manager
        self._config = config
        self._events = events
        self.heartbeat_purgatory = Purgatory(scheduler)
        self.rebalance_purgatory = Purgatory(scheduler)

    def maybe_prepare_rebalance(self, group: GroupMetadata, reason: RebalanceReason,
                                member_id: str | None, detail: str) -> None:
        if group.can_rebalance:
            self.prepare_rebalance(group, reason, member_id, detail)

    def prepare_rebalance(self, group: GroupMetadata, reason: RebalanceReason,
                          member_id: str | None, detail: str) -> None:
        if group.is_(GroupState.COMPLETING_REBALANCE):
            self.reset_and_propagate_assignment_error(group, ErrorCode.rebalance_in_progress)
        self.remove_sync_expiration(group)
        config = self._config
        if group.is_(GroupState.EMPTY):
            delay = config.initial_rebalance_delay_ms
            op: DelayedJoin = InitialDelayedJoin(
                self, self.rebalance_purgatory, group, delay, delay,
                max(group.rebalance_timeout_ms - delay, 0))
            timeout = delay
        else:
            op, timeout = DelayedJoin(self, group), group.rebalance_timeout_ms
        generation = group.generation_id
        group.transition_to(GroupState.PREPARING_REBALANCE)
        log.info("Preparing to rebalance group %s with old generation %d (%s): %s",
                 group.group_id, generation, reason, detail)
        self._events.emit(EventType.GROUP_REBALANCE, group=group.group_id,
                          generation=generation, member=member_id, reason=reason,
                          detail=detail)
        self.rebalance_purgatory.try_complete_else_watch(op, timeout)

    def on_complete_join(self, group: GroupMetadata) -> None:
        """``DelayedJoin`` completed: drop the dynamic members that did not rejoin, then
        start the next generation (or wait again if nobody rejoined). A group unloaded
        meanwhile is left as it is (Kafka removes its members all the same, unseen)."""
        if group.is_(GroupState.DEAD):
            return
        for member in group.not_yet_rejoined_members:
            if not member.is_static_member:
                self._events.emit(EventType.GROUP_MEMBER_REMOVED, group=group.group_id,
                                  generation=group.generation_id, member=member.member_id,
                                  reason=MemberRemovedReason.REBALANCE_TIMEOUT,
                                  detail="it did not rejoin within the rebalance timeout")
                group.remove(member.member_id)
                self.heartbeat_purgatory.check_and_complete(member_key(group.group_id,
                                                                       member.member_id))
        if not group.maybe_elect_new_joined_leader() and group.members:
            log.error("Group %s could not complete its rebalance: no member rejoined",
                      group.group_id)
            self.rebalance_purgatory.try_complete_else_watch(DelayedJoin(self, group),
                                                             group.rebalance_timeout_ms)
            return
        group.init_next_generation()
        if group.is_(GroupState.EMPTY):
            log.info("Group %s with generation %d is now empty", group.group_id,
                     group.generation_id)
            self._events.emit(EventType.GROUP_EMPTY, group=group.group_id,
                              generation=group.generation_id,
                              detail="the rebalance ended with no member")

            def stored(error: ErrorCode) -> None:
                if error != ErrorCode.none:
                    log.warning("Failed to write the empty metadata of group %s: %s",
                                group.group_id, error.name)

            self._manager.store_group(group, {}, stored)
            return
        log.info("Stabilizing group %s generation %d with %d members", group.group_id,
                 group.generation_id, len(group.members))
        for member in list(group.members.values()):
            group.maybe_invoke_join_callback(member, join_result(
                group, member.member_id, with_members=group.is_leader(member.member_id)))
            self.complete_and_schedule_next_heartbeat(group, member)
            member.is_new = False
            group.pending_sync_members.add(member.member_id)
        self.rebalance_purgatory.try_complete_else_watch(DelayedSync(self, group),
                                                         group.rebalance_timeout_ms)

    def should_complete_pending_sync(self, group: GroupMetadata, generation_id: int) -> bool:
        return (generation_id != group.generation_id
                or group.state in (GroupState.DEAD, GroupState.EMPTY,
                                   GroupState.PREPARING_REBALANCE)
                or not group.pending_sync_members)

    def on_expire_pending_sync(self, group: GroupMetadata, generation_id: int) -> None:
        if (generation_id != group.generation_id or group.state not in (
                GroupState.COMPLETING_REBALANCE, GroupState.STABLE)
                or not group.pending_sync_members):
            return
        missing = sorted(group.pending_sync_members)
        for member_id in missing:
            self._events.emit(EventType.GROUP_MEMBER_REMOVED, group=group.group_id,
                              generation=group.generation_id, member=member_id,
                              reason=MemberRemovedReason.REBALANCE_TIMEOUT,
                              detail="it did not send its SyncGroup within the rebalance "
                                     "timeout")
            group.remove(member_id)
            self.heartbeat_purgatory.check_and_complete(member_key(group.group_id, member_id))
        self.prepare_rebalance(group, RebalanceReason.SYNC_FAILED, None,
                                f"members {missing} sent no SyncGroup in time")

    def remove_sync_expiration(self, group: GroupMetadata) -> None:
        group.pending_sync_members.clear()
        self.rebalance_purgatory.check_and_complete(sync_key(group.group_id))

    def remove_pending_sync_member(self, group: GroupMetadata, member_id: str) -> None:
        group.pending_sync_members.discard(member_id)
        self.rebalance_purgatory.check_and_complete(sync_key(group.group_id))

    def reset_and_propagate_assignment_error(self, group: GroupMetadata,
                                             error: ErrorCode) -> None:
        for member in group.members.values():
            member.assignment = b""
        self.propagate_assignment(group, error)

    def propagate_assignment(self, group: GroupMetadata, error: ErrorCode) -> None:
        ok = error == ErrorCode.none
        for member in list(group.members.values()):
            result = SyncGroupResult(error, group.protocol_type if ok else None,
                                     group.protocol_name if ok else None, member.assignment)
            if group.maybe_invoke_sync_callback(member, result):
                # Its session may have expired unnoticed while it waited: start afresh.
                self.complete_and_schedule_next_heartbeat(group, member)

    def remove_member_and_update_group(self, group: GroupMetadata, member: MemberMetadata,
                                       reason: MemberRemovedReason) -> None:
        self._events.emit(EventType.GROUP_MEMBER_REMOVED, group=group.group_id,
                          generation=group.generation_id, member=member.member_id,
                          reason=reason, detail=(
                              "it left the group (LeaveGroup)" if reason is
                              MemberRemovedReason.LEFT else
                              f"no heartbeat within its session timeout "
                              f"({member.session_timeout_ms} ms)"))
        # A new member's parked JoinGroup is answered before it goes.
        group.maybe_invoke_join_callback(member, JoinGroupResult(
            UNKNOWN_MEMBER_ID, ErrorCode.unknown_member_id))
        group.remove(member.member_id)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self.maybe_prepare_rebalance(
                group, RebalanceReason.MEMBER_LEFT if reason is MemberRemovedReason.LEFT
                else RebalanceReason.SESSION_EXPIRED, member.member_id,
                f"member {member.member_id} was removed ({reason})")
        elif group.is_(GroupState.PREPARING_REBALANCE):
            self.rebalance_purgatory.check_and_complete(join_key(group.group_id))

    # ---- sessions -----------------------------------------------------------------------

    def complete_and_schedule_next_heartbeat(self, group: GroupMetadata,
                                             member: MemberMetadata) -> None:
        self.schedule_heartbeat_expiration(group, member.member_id,
                                            member.session_timeout_ms, member=member)

    def schedule_heartbeat_expiration(self, group: GroupMetadata, member_id: str,
                                      timeout_ms: int, *, member: MemberMetadata | None = None,
                                      is_pending: bool = False) -> None:
        key = member_key(group.group_id, member_id)
        if member is not None:
            member.heartbeat_satisfied = True
            self.heartbeat_purgatory.check_and_complete(key)
            member.heartbeat_satisfied = False
        op = DelayedHeartbeat(self, group, member_id, is_pending)
        self.heartbeat_purgatory.try_complete_else_watch(op, timeout_ms)

    def should_complete_heartbeat(self, group: GroupMetadata, member_id: str,
                                  is_pending: bool) -> bool:
        if group.is_(GroupState.DEAD):
            return True
        if is_pending:
            return group.has(member_id)
        return not group.has(member_id) or group.get(member_id).has_satisfied_heartbeat

    def on_expire_heartbeat(self, group: GroupMetadata, member_id: str,
                            is_pending: bool) -> None:
        if group.is_(GroupState.DEAD):
            return
        if is_pending:
            if member_id in group.pending_members:
                log.info("Pending member %s of group %s expired", member_id, group.group_id)
                group.remove(member_id)
                if group.is_(GroupState.PREPARING_REBALANCE):
                    self.rebalance_purgatory.check_and_complete(join_key(group.group_id))
        elif group.has(member_id) and not group.get(member_id).has_satisfied_heartbeat:
            log.info("Member %s of group %s has failed, removing it", member_id,
                     group.group_id)
            self.remove_member_and_update_group(group, group.get(member_id),
                                                MemberRemovedReason.SESSION_EXPIRED)

    # ---- the coordinator moving -------------------------------------------------------

    def on_group_loaded(self, group: GroupMetadata) -> None:
        if len(group.members) > self._config.max_size:
            self.prepare_rebalance(group, RebalanceReason.METADATA_CHANGED, None,
                                    f"freshly loaded group is over group.max.size "
                                    f"({self._config.max_size})")
        for member in list(group.members.values()):
            self.complete_and_schedule_next_heartbeat(group, member)

    def on_group_unloaded(self, group: GroupMetadata) -> None:
        previous = group.state
        group.transition_to(GroupState.DEAD)
        if previous is GroupState.PREPARING_REBALANCE:
            for member in list(group.members.values()):
                group.maybe_invoke_join_callback(member, JoinGroupResult(
                    member.member_id, ErrorCode.not_coordinator))
            self.rebalance_purgatory.check_and_complete(join_key(group.group_id))
        elif previous in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            for member in list(group.members.values()):
                group.maybe_invoke_sync_callback(member,
                                                 SyncGroupResult(ErrorCode.not_coordinator))
                self.heartbeat_purgatory.check_and_complete(member_key(group.group_id,
                                                                       member.member_id))
        self.remove_sync_expiration(group)
