"""The classic group protocol's requests: JoinGroup, SyncGroup, Heartbeat and LeaveGroup,
as Kafka 3.9's ``GroupCoordinator`` handles them (``handleJoinGroup``, ``doSyncGroup``,
``handleHeartbeat``, ``handleLeaveGroup``); the rebalances they start are ``rebalance.py``'s.

KIP-394: a JoinGroup v4+ without a member id is answered MEMBER_ID_REQUIRED with a new id,
and the member joins with it (until then it is a pending member with a session of its own).
KIP-345: a static member (``group.instance.id``) that rejoins with a new member id replaces
its old one, which is fenced (FENCED_INSTANCE_ID); in a Stable group whose protocol does not
change, without a rebalance. The leader's SyncGroup carries the assignment: it is written
to ``__consumer_offsets`` and, once acknowledged, every parked SyncGroup is answered and the
group is ``Stable``.

Everything here runs on one thread (the event loop, or a test's manual clock): no locks,
and a request's answer is a callback that may run now or later. This class is the classic
protocol's seam: KIP-848's ``consumer`` protocol would be a handler beside it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from minibroker.cluster.scheduler import Scheduler
from minibroker.cluster.types import ErrorCode
from minibroker.coordinator.delayed import join_key, member_key
from minibroker.coordinator.group_metadata import (
    GroupMetadata,
    GroupState,
    JoinGroupResult,
    MemberMetadata,
    Protocols,
    SyncGroupResult,
)
from minibroker.coordinator.rebalance import UNKNOWN_MEMBER_ID, Rebalancer, join_result
from minibroker.events import EventType, MemberRemovedReason, RebalanceReason

if TYPE_CHECKING:
    from minibroker.coordinator.group_coordinator import GroupConfig, GroupEvents
    from minibroker.coordinator.group_metadata_manager import GroupMetadataManager

log = logging.getLogger("minibroker.coordinator")

JoinCallback = Callable[[JoinGroupResult], None]
SyncCallback = Callable[[SyncGroupResult], None]
NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60 * 1000  # GroupCoordinator.NewMemberJoinTimeoutMs


class ClassicGroupHandler:
    def __init__(self, manager: GroupMetadataManager, scheduler: Scheduler,
                 config: GroupConfig, events: GroupEvents) -> None:
        self._manager = manager
        self._config = config
        self._events = events
        self.rebalancer = Rebalancer(manager, scheduler, config, events)

    # ---- JoinGroup ----------------------------------------------------------------------

    def join_group(self, group_id: str, member_id: str, instance_id: str | None, *,
                   require_known_member_id: bool, support_skipping_assignment: bool,
                   client_id: str, client_host: str, rebalance_timeout_ms: int,
                   session_timeout_ms: int, protocol_type: str, protocols: Protocols,
                   callback: JoinCallback) -> None:
        """Kafka's ``handleJoinGroup`` once the group's status is valid."""
        config = self._config
        if not config.min_session_timeout_ms <= session_timeout_ms <= \
                config.max_session_timeout_ms:
            callback(JoinGroupResult(member_id, ErrorCode.invalid_session_timeout))
            return
        is_unknown = member_id == UNKNOWN_MEMBER_ID
        group = self._manager.get_or_maybe_create_group(group_id, is_unknown)
        if group is None:
            callback(JoinGroupResult(member_id, ErrorCode.unknown_member_id))
            return
        if not self._accept_joining_member(group, member_id):
            group.remove(member_id)
            callback(JoinGroupResult(UNKNOWN_MEMBER_ID, ErrorCode.group_max_size_reached))
        elif group.is_(GroupState.DEAD):
            # Unloaded meanwhile: the member finds the coordinator again.
            callback(JoinGroupResult(member_id, ErrorCode.coordinator_not_available))
        elif not group.supports_protocols(protocol_type, {name for name, _ in protocols}):
            callback(JoinGroupResult(member_id, ErrorCode.inconsistent_group_protocol))
        elif is_unknown:
            new_id = group.generate_member_id(client_id, instance_id)
            member = MemberMetadata(new_id, instance_id, client_id, client_host,
                                    rebalance_timeout_ms, session_timeout_ms, protocol_type,
                                    protocols)
            if instance_id is not None:
                self._static_new_member_join(group, member, support_skipping_assignment,
                                             callback)
            elif require_known_member_id:
                # KIP-394: the member gets its id first and must join again with it.
                group.add_pending_member(new_id)
                self.rebalancer.schedule_heartbeat_expiration(group, new_id,
                                                              session_timeout_ms,
                                                              is_pending=True)
                callback(JoinGroupResult(new_id, ErrorCode.member_id_required))
            else:
                self._add_member_and_rebalance(group, member, callback)
        else:
            self._current_member_join(group, MemberMetadata(
                member_id, instance_id, client_id, client_host, rebalance_timeout_ms,
                session_timeout_ms, protocol_type, protocols), callback)
        if group.is_(GroupState.PREPARING_REBALANCE):
            self.rebalancer.rebalance_purgatory.check_and_complete(join_key(group.group_id))

    def _accept_joining_member(self, group: GroupMetadata, member_id: str) -> bool:
        if group.state in (GroupState.EMPTY, GroupState.DEAD):
            return True
        if group.is_(GroupState.PREPARING_REBALANCE):
            return ((group.has(member_id) and group.get(member_id).is_awaiting_join)
                    or group.num_awaiting < self._config.max_size)
        return group.has(member_id) or len(group.members) < self._config.max_size

    def _static_new_member_join(self, group: GroupMetadata, member: MemberMetadata,
                                support_skipping_assignment: bool,
                                callback: JoinCallback) -> None:
        assert member.group_instance_id is not None
        old_member_id = group.current_static_member_id(member.group_instance_id)
        if old_member_id is None:
            self._add_member_and_rebalance(group, member, callback)
            return
        log.info("Static member %s of group %s rejoins with a new member id %s, replacing "
                 "%s", member.group_instance_id, group.group_id, member.member_id,
                 old_member_id)
        leader_before = group.leader_id
        known = group.replace_static_member(member.group_instance_id, old_member_id,
                                            member.member_id)
        self.rebalancer.complete_and_schedule_next_heartbeat(group, known)
        old = (known.supported_protocols, known.rebalance_timeout_ms,
               known.session_timeout_ms)
        group.update_member(known, member.supported_protocols, member.rebalance_timeout_ms,
                            member.session_timeout_ms, callback)
        if group.is_(GroupState.STABLE):
            if group.protocol_name == group.select_protocol():
                # The assignment stands: persist the new member id, no rebalance.
                self._store_replaced_static_member(group, known, old, old_member_id,
                                                   leader_before, support_skipping_assignment,
                                                   callback)
            else:
                self.rebalancer.maybe_prepare_rebalance(
                    group, RebalanceReason.METADATA_CHANGED, known.member_id,
                    "static member changed its protocols")
        elif group.is_(GroupState.COMPLETING_REBALANCE):
            # The leader may be assigning to the old member id: start over.
            self.rebalancer.prepare_rebalance(
                group, RebalanceReason.METADATA_CHANGED, known.member_id,
                "static member rejoined while completing the rebalance")

    def _store_replaced_static_member(self, group: GroupMetadata, member: MemberMetadata,
                                      old: tuple[Protocols, int, int], old_member_id: str,
                                      leader_before: str | None, skip: bool,
                                      callback: JoinCallback) -> None:
        """The static member's new id, persisted; its JoinGroup answers once written. From
        JoinGroup v9 a leader is told so and skips the assignment; before, the old leader
        id is returned so that nobody assigns (the stable group would not take it)."""
        new_member_id = member.member_id
        assignment = {m.member_id: m.assignment for m in group.members.values()}

        def stored(error: ErrorCode) -> None:
            if error != ErrorCode.none:
                log.warning("Failed to persist the new member id of static member %s of "
                            "group %s: %s", member.group_instance_id, group.group_id,
                            error.name)
                group.update_member(member, *old, None)
                assert member.group_instance_id is not None
                restored = group.replace_static_member(member.group_instance_id,
                                                       new_member_id, old_member_id)
                self.rebalancer.complete_and_schedule_next_heartbeat(group, restored)
                callback(JoinGroupResult(UNKNOWN_MEMBER_ID, error,
                                         generation_id=group.generation_id,
                                         protocol_type=group.protocol_type,
                                         protocol_name=group.protocol_name,
                                         leader_id=leader_before or ""))
                return
            is_leader = skip and group.is_leader(new_member_id)
            group.maybe_invoke_join_callback(member, join_result(
                group, new_member_id, with_members=is_leader, skip_assignment=is_leader,
                leader=group.leader_id if skip else leader_before))

        self._manager.store_group(group, assignment, stored)

    def _current_member_join(self, group: GroupMetadata, request: MemberMetadata,
                             callback: JoinCallback) -> None:
        """A JoinGroup with a member id (``request`` holds what it asks for)."""
        member_id, protocols = request.member_id, request.supported_protocols
        rebalance_timeout_ms = request.rebalance_timeout_ms
        session_timeout_ms = request.session_timeout_ms
        if member_id in group.pending_members:
            # KIP-394's second step; a pending member is never static.
            log.info("Pending member %s joins group %s", member_id, group.group_id)
            self._add_member_and_rebalance(group, request, callback)
            return
        error = self.validate_current_member(group, member_id, request.group_instance_id)
        if error is not None:
            callback(JoinGroupResult(member_id, error))
            return
        member = group.get(member_id)
        state = group.state
        if state is GroupState.PREPARING_REBALANCE:
            self._update_member_and_rebalance(group, member, protocols, rebalance_timeout_ms,
                                              session_timeout_ms, callback,
                                              RebalanceReason.MEMBER_JOINED)
        elif state is GroupState.COMPLETING_REBALANCE:
            if member.matches(protocols):
                # It missed its JoinGroup answer: the current generation again.
                callback(join_result(group, member_id,
                                     with_members=group.is_leader(member_id)))
            else:
                self._update_member_and_rebalance(group, member, protocols,
                                                  rebalance_timeout_ms, session_timeout_ms,
                                                  callback, RebalanceReason.METADATA_CHANGED)
        elif state is GroupState.STABLE:
            if group.is_leader(member_id):
                # The leader's JoinGroup forces a rebalance (e.g. its topics changed).
                self._update_member_and_rebalance(group, member, protocols,
                                                  rebalance_timeout_ms, session_timeout_ms,
                                                  callback, RebalanceReason.LEADER_REJOINED)
            elif not member.matches(protocols):
                self._update_member_and_rebalance(group, member, protocols,
                                                  rebalance_timeout_ms, session_timeout_ms,
                                                  callback, RebalanceReason.METADATA_CHANGED)
            else:
                callback(join_result(group, member_id, with_members=False))
        else:
            log.warning("Member %s rejoins group %s in state %s", member_id, group.group_id,
                        state)
            callback(JoinGroupResult(member_id, ErrorCode.unknown_member_id))

    @staticmethod
    def validate_current_member(group: GroupMetadata, member_id: str,
                                 instance_id: str | None) -> ErrorCode | None:
        """An instance id must map to this member id (else FENCED_INSTANCE_ID), and the
        member must be known."""
        if instance_id is not None:
            current = group.current_static_member_id(instance_id)
            if current is None:
                return ErrorCode.unknown_member_id
            if current != member_id:
                log.info("Member %s of static instance %s is fenced by %s", member_id,
                         instance_id, current)
                return ErrorCode.fenced_instance_id
            return None
        return None if group.has(member_id) else ErrorCode.unknown_member_id

    def _add_member_and_rebalance(self, group: GroupMetadata, member: MemberMetadata,
                                  callback: JoinCallback) -> None:
        member.is_new = True
        if group.is_(GroupState.PREPARING_REBALANCE) and group.generation_id == 0:
            group.new_member_added = True
        group.add(member, callback)
        # A new member cannot heartbeat yet: its JoinGroup times out instead.
        self.rebalancer.schedule_heartbeat_expiration(group, member.member_id,
                                                      NEW_MEMBER_JOIN_TIMEOUT_MS, member=member)
        self.rebalancer.maybe_prepare_rebalance(group, RebalanceReason.MEMBER_JOINED,
                                                member.member_id,
                                                f"new member {member.member_id} joined")

    def _update_member_and_rebalance(self, group: GroupMetadata, member: MemberMetadata,
                                     protocols: Protocols, rebalance_timeout_ms: int,
                                     session_timeout_ms: int, callback: JoinCallback,
                                     reason: RebalanceReason) -> None:
        group.update_member(member, protocols, rebalance_timeout_ms, session_timeout_ms,
                            callback)
        self.rebalancer.maybe_prepare_rebalance(
            group, reason, member.member_id,
            f"member {member.member_id} rejoined in {group.state}")

    # ---- SyncGroup ----------------------------------------------------------------------

    def sync_group(self, group: GroupMetadata, generation_id: int, member_id: str,
                   protocol_type: str | None, protocol_name: str | None,
                   instance_id: str | None, assignment: dict[str, bytes],
                   callback: SyncCallback) -> None:
        """Kafka's ``doSyncGroup``."""
        if group.is_(GroupState.DEAD):
            callback(SyncGroupResult(ErrorCode.coordinator_not_available))
            return
        error = self.validate_current_member(group, member_id, instance_id)
        if error is None and generation_id != group.generation_id:
            error = ErrorCode.illegal_generation
        if error is None and (
                (protocol_type is not None and protocol_type != group.protocol_type)
                or (protocol_name is not None and protocol_name != group.protocol_name)):
            error = ErrorCode.inconsistent_group_protocol
        if error is not None:
            callback(SyncGroupResult(error))
        elif group.is_(GroupState.EMPTY):
            callback(SyncGroupResult(ErrorCode.unknown_member_id))
        elif group.is_(GroupState.PREPARING_REBALANCE):
            callback(SyncGroupResult(ErrorCode.rebalance_in_progress))
        elif group.is_(GroupState.COMPLETING_REBALANCE):
            group.get(member_id).awaiting_sync_callback = callback
            self.rebalancer.remove_pending_sync_member(group, member_id)
            if group.is_leader(member_id):
                self._store_assignment(group, member_id, generation_id, assignment)
        else:  # Stable: the current assignment again
            self.rebalancer.remove_pending_sync_member(group, member_id)
            member = group.get(member_id)
            callback(SyncGroupResult(ErrorCode.none, group.protocol_type,
                                     group.protocol_name, member.assignment))
            self.rebalancer.complete_and_schedule_next_heartbeat(group, member)

    def _store_assignment(self, group: GroupMetadata, leader_id: str, generation_id: int,
                          assignment: dict[str, bytes]) -> None:
        full = {m: assignment.get(m, b"") for m in group.members}
        missing = sorted(set(group.members) - set(assignment))
        if missing:
            log.warning("Setting empty assignments for members %s of %s for generation %d",
                        missing, group.group_id, generation_id)

        def stored(error: ErrorCode) -> None:
            # Another member may have joined meanwhile: only the same generation completes.
            if not (group.is_(GroupState.COMPLETING_REBALANCE)
                    and generation_id == group.generation_id):
                return
            if error != ErrorCode.none:
                self.rebalancer.reset_and_propagate_assignment_error(group, error)
                self.rebalancer.maybe_prepare_rebalance(
                    group, RebalanceReason.SYNC_FAILED, leader_id,
                    f"storing the assignment failed: {error.name}")
                return
            for member in group.members.values():
                member.assignment = full[member.member_id]
            group.transition_to(GroupState.STABLE)
            log.info("Group %s generation %d is stable", group.group_id, generation_id)
            self._events.emit(EventType.GROUP_STABLE, group=group.group_id,
                              generation=generation_id, members=list(group.members),
                              detail=group.assignment_summary())
            self.rebalancer.propagate_assignment(group, ErrorCode.none)

        self._manager.store_group(group, full, stored)

    # ---- Heartbeat and LeaveGroup -------------------------------------------------------

    def heartbeat(self, group: GroupMetadata, member_id: str, instance_id: str | None,
                  generation_id: int) -> ErrorCode:
        if group.is_(GroupState.DEAD):
            return ErrorCode.coordinator_not_available
        error = self.validate_current_member(group, member_id, instance_id)
        if error is None and generation_id != group.generation_id:
            error = ErrorCode.illegal_generation
        if error is not None:
            return error
        if group.is_(GroupState.EMPTY):
            return ErrorCode.unknown_member_id
        self.rebalancer.complete_and_schedule_next_heartbeat(group, group.get(member_id))
        if group.is_(GroupState.PREPARING_REBALANCE):
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def leave_group(self, group: GroupMetadata, member_id: str,
                    instance_id: str | None) -> ErrorCode:
        """One member of a LeaveGroup; by instance id alone (v3+, an administrator's
        removal) when the member id is unknown."""
        if member_id == UNKNOWN_MEMBER_ID:
            current = group.current_static_member_id(instance_id) if instance_id else None
            if current is None:
                return ErrorCode.unknown_member_id
            member_id = current
        elif member_id in group.pending_members:
            group.remove(member_id)
            if group.is_(GroupState.PREPARING_REBALANCE):
                self.rebalancer.rebalance_purgatory.check_and_complete(join_key(group.group_id))
            self.rebalancer.heartbeat_purgatory.check_and_complete(
                member_key(group.group_id, member_id))
            return ErrorCode.none
        else:
            error = self.validate_current_member(group, member_id, instance_id)
            if error is not None:
                return error
        log.info("Member %s leaves group %s", member_id, group.group_id)
        self.rebalancer.remove_member_and_update_group(group, group.get(member_id),
                                                       MemberRemovedReason.LEFT)
        self.rebalancer.heartbeat_purgatory.check_and_complete(
            member_key(group.group_id, member_id))
        return ErrorCode.none
