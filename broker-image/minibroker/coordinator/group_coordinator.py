"""``GroupCoordinator``: the broker's group coordinator, as Kafka 3.9's classic one
(``kafka.coordinator.group.GroupCoordinator``).

Every request first passes ``validate_group_status``: a valid group id, a running
coordinator, the group's ``__consumer_offsets`` partition loaded (else
COORDINATOR_LOAD_IN_PROGRESS) and led by this broker (else NOT_COORDINATOR). Membership
requests then go to the classic protocol's handler (``classic_group``) or, for KIP-848's
ConsumerGroupHeartbeat, to the consumer protocol's (``consumer.group_manager``); offsets,
listing and describing are answered here from the ``GroupMetadataManager``'s cache, and
commits are written through it. A group id is one protocol's at a time: an empty group may
change protocol, one with members keeps its own (minibroker has no online migration:
``group.consumer.migration.policy`` is Kafka's ``disabled``). The coordinator follows the
``ReplicaManager``: becoming leader of an offsets partition loads its groups
(``on_election``), losing it unloads them (``on_resignation``).

It is callback-based and takes its clock and timers from the broker's ``Scheduler``, like
``ReplicaManager``, so the same code runs in a broker and on the manual clock of the
tests' step-by-step cluster (``tests/minibroker/stepper.py``).

It is long because it is the one entry point for every group API of both protocols (Kafka's
GroupCoordinatorService): each handler is short, and they share the partition-to-coordinator
mapping, the loading and the timers kept here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from minibroker import environment
from minibroker.cluster.partition import Partition
from minibroker.cluster.scheduler import Scheduler
from minibroker.cluster.types import ErrorCode, MetadataImage, TopicPartition
from minibroker.config import resolve
from minibroker.coordinator.classic_group import (
    ClassicGroupHandler,
    JoinCallback,
    SyncCallback,
)
from minibroker.coordinator.consumer.consumer_group import ConsumerGroup, GroupError
from minibroker.coordinator.consumer.group_manager import (
    ConsumerGroupConfig,
    ConsumerGroupManager,
    HeartbeatRequest,
    HeartbeatResponse,
)
from minibroker.coordinator.consumer.records import Record, consumer_group_tombstones
from minibroker.coordinator.group_metadata import (
    CONSUMER_PROTOCOL_TYPE,
    GroupMetadata,
    GroupState,
    GroupType,
    JoinGroupResult,
    Protocols,
    SyncGroupResult,
)
from minibroker.coordinator.group_metadata_manager import (
    OFFSETS_TOPIC,
    AppendRecords,
    CommittedOffset,
    GroupMetadataManager,
    Guards,
)
from minibroker.coordinator.rebalance import UNKNOWN_MEMBER_ID
from minibroker.coordinator.records import OffsetAndMetadata, encode_group_key
from minibroker.events import EventType, ReplicationEventLog

__all__ = ["GroupConfig", "GroupCoordinator", "GroupEvents", "GroupSummary", "MemberSummary"]


@dataclass(frozen=True)
class GroupConfig:
    """Kafka's ``GroupConfig``, from the broker's ``group.*`` keys."""

    min_session_timeout_ms: int
    max_session_timeout_ms: int
    max_size: int
    initial_rebalance_delay_ms: int

    @classmethod
    def from_config(cls, config: Mapping[str, str]) -> GroupConfig:
        return cls(resolve("group.min.session.timeout.ms", config),
                   resolve("group.max.session.timeout.ms", config),
                   resolve("group.max.size", config),
                   resolve("group.initial.rebalance.delay.ms", config))


class GroupEvents:
    """The coordinator's replication events, each naming this broker."""

    def __init__(self, events: ReplicationEventLog, broker_id: int) -> None:
        self._events = events
        self._broker_id = broker_id

    def emit(self, event_type: EventType, /, **fields: object) -> None:
        self._events.emit(event_type, broker=self._broker_id, **fields)


class MemberSummary(NamedTuple):
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


class GroupSummary(NamedTuple):
    state: str
    protocol_type: str
    protocol: str
    members: tuple[MemberSummary, ...]


_DEAD_GROUP = GroupSummary(GroupState.DEAD, "", "", ())
_NO_GROUP = GroupSummary("", "", "", ())


class GroupCoordinator:
    def __init__(self, broker_id: int, scheduler: Scheduler, *, config: Mapping[str, str],
                 events: ReplicationEventLog, append: AppendRecords,
                 local_partition: Callable[[TopicPartition], Partition | None],
                 metadata_image: Callable[[], MetadataImage],
                 wall_clock_ms: Callable[[], float] | None = None) -> None:
        self.broker_id = broker_id
        self.config = GroupConfig.from_config(config)
        self._events = GroupEvents(events, broker_id)
        self.manager = GroupMetadataManager(
            broker_id, scheduler, config=config, append=append,
            local_partition=local_partition, metadata_image=metadata_image,
            events=self._events, wall_clock_ms=wall_clock_ms)
        self.classic = ClassicGroupHandler(self.manager, scheduler, self.config, self._events)
        self.protocols: tuple[str, ...] = resolve("group.coordinator.rebalance.protocols",
                                                  config)
        self.consumer = ConsumerGroupManager(
            scheduler, ConsumerGroupConfig.from_config(config), metadata_image, self,
            new_member_id=lambda: str(environment.new_uuid()))

    # ---- following the offsets topic's leadership ------------------------------------------

    def on_leadership_change(self, tp: TopicPartition, is_leader: bool,
                             leader_epoch: int) -> None:
        """The ``ReplicaManager``'s listener (Kafka: ``BrokerMetadataPublisher``)."""
        if tp.topic != OFFSETS_TOPIC:
            return
        if is_leader:
            self.manager.schedule_load(tp.partition, leader_epoch, self._on_group_loaded)
        else:
            self.manager.remove_groups_for_partition(tp.partition, leader_epoch,
                                                     self._on_group_unloaded)

    def _on_group_loaded(self, group: GroupMetadata) -> None:
        if group.consumer is not None:
            self.consumer.on_loaded(group.consumer)
        else:
            self.classic.rebalancer.on_group_loaded(group)

    def _on_group_unloaded(self, group: GroupMetadata) -> None:
        if group.consumer is not None:
            self.consumer.unload(group.consumer)
        else:
            self.classic.rebalancer.on_group_unloaded(group)

    # ---- the consumer groups (``ConsumerGroups``) -------------------------------------------

    def consumer_group(self, group_id: str) -> ConsumerGroup | None:
        group = self.manager.get_group(group_id)
        if group is None:
            return None
        if group.consumer is None:
            raise GroupError(ErrorCode.group_id_not_found,
                             f"Group {group_id} is not a consumer group.")
        return group.consumer

    def create_consumer_group(self, group_id: str) -> tuple[ConsumerGroup, list[Record]]:
        """An empty classic group of the id (offsets only, or left by its members) becomes
        a consumer group with its offsets, its classic metadata record deleted
        (``maybeDeleteEmptyClassicGroup``); one with members stays classic (Kafka's
        ``validateOnlineUpgrade`` with the migration disabled)."""
        existing = self.manager.get_group(group_id)
        if existing is not None and existing.consumer is not None:
            return existing.consumer, []
        if existing is not None and not existing.is_(GroupState.EMPTY):
            raise GroupError(ErrorCode.group_id_not_found,
                             f"Cannot upgrade classic group {group_id} to consumer group "
                             f"because the online upgrade is disabled.")
        group = self.manager.get_or_maybe_create_group(group_id, True)
        assert group is not None
        group.group_type = GroupType.CONSUMER
        group.protocol_type = CONSUMER_PROTOCOL_TYPE
        group.consumer = ConsumerGroup(group_id)
        return group.consumer, ([] if existing is None
                                else [(encode_group_key(group_id), None)])

    def write(self, group_id: str, records: list[Record],
              done: Callable[[ErrorCode], None]) -> None:
        self.manager.write_records(group_id, records, done)

    def handle_consumer_group_describe(self, group_id: str
                                       ) -> tuple[ErrorCode, str | None, ConsumerGroup | None]:
        """ConsumerGroupDescribe of one group: (error, message, the group when found)."""
        error = self.validate_group_status(group_id)
        if error is not None:
            return error, None, None
        try:
            group = self.consumer_group(group_id)
        except GroupError as exc:
            return exc.code, str(exc), None
        if group is None:
            return (ErrorCode.group_id_not_found, f"Consumer group {group_id} not found.",
                    None)
        return ErrorCode.none, None, group

    def handle_consumer_group_heartbeat(self, request: HeartbeatRequest,
                                        callback: Callable[[HeartbeatResponse], None]
                                        ) -> None:
        """ConsumerGroupHeartbeat (KIP-848); answered once its records are written."""
        if "consumer" not in self.protocols:
            callback(HeartbeatResponse(ErrorCode.unsupported_version,
                                       "The consumer group protocol is not enabled "
                                       "(group.coordinator.rebalance.protocols)."))
            return
        error = self.validate_group_status(request.group_id)
        if error is not None:
            callback(HeartbeatResponse(error))
            return
        self.consumer.heartbeat(request, callback)

    def shutdown(self) -> None:
        """Kafka's ``GroupCoordinator.shutdown``: nothing is coordinated here any more."""
        self.manager.shutdown()

    def validate_group_status(self, group_id: str | None, *,
                              allow_empty: bool = False) -> ErrorCode | None:
        """OffsetCommit, OffsetFetch and DescribeGroups accept the empty group id."""
        if group_id is None or (not group_id and not allow_empty):
            return ErrorCode.invalid_group_id
        if self.manager.is_group_loading(group_id):
            return ErrorCode.coordinator_load_in_progress
        if not self.manager.is_group_local(group_id):
            return ErrorCode.not_coordinator
        return None

    # ---- membership (the classic protocol) ---------------------------------------------

    def handle_join_group(self, group_id: str, member_id: str, instance_id: str | None, *,
                          require_known_member_id: bool, support_skipping_assignment: bool,
                          client_id: str, client_host: str, rebalance_timeout_ms: int,
                          session_timeout_ms: int, protocol_type: str, protocols: Protocols,
                          callback: JoinCallback) -> None:
        error = self.validate_group_status(group_id) or self._claim_for_classic(group_id)
        if error is not None:
            callback(JoinGroupResult(member_id, error))
            return
        self.classic.join_group(
            group_id, member_id, instance_id, require_known_member_id=require_known_member_id,
            support_skipping_assignment=support_skipping_assignment, client_id=client_id,
            client_host=client_host, rebalance_timeout_ms=rebalance_timeout_ms,
            session_timeout_ms=session_timeout_ms, protocol_type=protocol_type,
            protocols=protocols, callback=callback)

    def _claim_for_classic(self, group_id: str) -> ErrorCode | None:
        """A classic JoinGroup to a consumer group: an empty one becomes classic again
        (``classicGroupJoinToClassicGroup``); one with members refuses it (Kafka 4 would
        take the member into the consumer group, which minibroker does not)."""
        group = self.manager.get_group(group_id)
        if group is None or group.consumer is None:
            return None
        if group.consumer.members:
            return ErrorCode.inconsistent_group_protocol
        self.consumer.unload(group.consumer)
        # Its records go (``ConsumerGroup.createGroupTombstoneRecords``); the offsets stay.
        self.manager.write_records(group_id, consumer_group_tombstones(group_id),
                                   lambda _error: None)
        group.consumer = None
        group.group_type = GroupType.CLASSIC
        group.protocol_type = None
        return None

    def handle_sync_group(self, group_id: str, generation_id: int, member_id: str,
                          protocol_type: str | None, protocol_name: str | None,
                          instance_id: str | None, assignment: dict[str, bytes],
                          callback: SyncCallback) -> None:
        error = self.validate_group_status(group_id)
        if error == ErrorCode.coordinator_load_in_progress:
            # The rebalance's state is lost with the old coordinator: rejoin.
            error = ErrorCode.rebalance_in_progress
        group = self.manager.get_group(group_id) if error is None else None
        if error is None and group is None:
            error = ErrorCode.unknown_member_id
        if error is not None or group is None:
            callback(SyncGroupResult(error or ErrorCode.unknown_member_id))
            return
        self.classic.sync_group(group, generation_id, member_id, protocol_type, protocol_name,
                                instance_id, assignment, callback)

    def handle_heartbeat(self, group_id: str, member_id: str, instance_id: str | None,
                         generation_id: int) -> ErrorCode:
        error = self.validate_group_status(group_id)
        if error == ErrorCode.coordinator_load_in_progress:
            return ErrorCode.none  # the group is loading: answer blindly
        if error is not None:
            return error
        group = self.manager.get_group(group_id)
        if group is None:
            return ErrorCode.unknown_member_id
        return self.classic.heartbeat(group, member_id, instance_id, generation_id)

    def handle_leave_group(self, group_id: str, members: list[tuple[str, str | None]]
                           ) -> tuple[ErrorCode, list[ErrorCode]]:
        """(top-level error, one error per (member id, instance id) leaving)."""
        error = self.validate_group_status(group_id)
        if error is not None:
            return error, []
        group = self.manager.get_group(group_id)
        if group is None:
            return ErrorCode.none, [ErrorCode.unknown_member_id] * len(members)
        if group.is_(GroupState.DEAD):
            return ErrorCode.coordinator_not_available, []
        return ErrorCode.none, [self.classic.leave_group(group, member_id, instance_id)
                                for member_id, instance_id in members]

    # ---- offsets ------------------------------------------------------------------------

    def handle_commit_offsets(self, group_id: str, member_id: str, instance_id: str | None,
                              generation_id: int,
                              offsets: dict[TopicPartition, OffsetAndMetadata],
                              callback: Callable[[dict[TopicPartition, ErrorCode]], None],
                              api_version: int = 9) -> None:
        """``generation_id`` is a consumer group member's epoch (OffsetCommit v9)."""
        error = self.validate_group_status(group_id, allow_empty=True)
        group = self.manager.get_group(group_id) if error is None else None
        if group is not None and group.consumer is not None:
            error = _group_error(lambda: group.consumer.validate_offset_commit(
                member_id, generation_id, transactional=False, instance_id=instance_id,
                api_version=api_version))
            if error is not None:
                callback(dict.fromkeys(offsets, error))
            else:
                self.manager.store_offsets(group, offsets, callback)
            return
        if error is None and group is None:
            if generation_id < 0:
                # A group that uses Kafka only to store offsets (no membership).
                group = self.manager.get_or_maybe_create_group(group_id, True)
            else:
                error = ErrorCode.illegal_generation
        if error is None and group is not None:
            error = self._validate_offset_commit(group, generation_id, member_id, instance_id)
            if error is None and group.is_(GroupState.COMPLETING_REBALANCE):
                # Its generation is known but the assignment is not yet out.
                error = ErrorCode.rebalance_in_progress
        if error is not None or group is None:
            callback(dict.fromkeys(offsets, error or ErrorCode.unknown_member_id))
            return
        if group.state in (GroupState.STABLE, GroupState.PREPARING_REBALANCE):
            # Commits are allowed while preparing: the heartbeat tells of the rebalance.
            member = group.get(member_id)
            self.classic.rebalancer.complete_and_schedule_next_heartbeat(group, member)
        self.manager.store_offsets(group, offsets, callback)

    def handle_txn_commit_offsets(self, group_id: str, producer_id: int, producer_epoch: int,
                                  member_id: str, instance_id: str | None,
                                  generation_id: int,
                                  offsets: dict[TopicPartition, OffsetAndMetadata],
                                  callback: Callable[[dict[TopicPartition, ErrorCode]], None],
                                  verification_guards: Guards | None = None) -> None:
        """Kafka 3.9's ``handleTxnCommitOffsets``: offsets a transaction commits (KIP-98;
        ``send_offsets_to_transaction``). The group is created if unknown; the member id
        and the generation are checked only when given (KIP-447). The offsets are written
        as the producer's transactional records and count once its COMMIT marker is;
        ``verification_guards``: KIP-890 part 1's, when the write was verified."""
        error = self.validate_group_status(group_id, allow_empty=True)
        group = None
        if error is None:
            group = self.manager.get_or_maybe_create_group(group_id, True)
            if group is None or group.is_(GroupState.DEAD):
                error = ErrorCode.coordinator_not_available
            elif group.consumer is not None:
                consumer = group.consumer
                error = _group_error(lambda: consumer.validate_offset_commit(
                    member_id, generation_id, transactional=True, instance_id=instance_id))
            elif instance_id is not None:
                error = self.classic.validate_current_member(group, member_id, instance_id)
            elif member_id != UNKNOWN_MEMBER_ID and not group.has(member_id):
                error = ErrorCode.unknown_member_id
            if error is None and group is not None and group.consumer is None \
                    and 0 <= generation_id != group.generation_id:
                error = ErrorCode.illegal_generation
        if error is not None or group is None:
            callback(dict.fromkeys(offsets, error or ErrorCode.coordinator_not_available))
            return
        self.manager.store_offsets(group, offsets, callback, (producer_id, producer_epoch),
                                   verification_guards)

    def on_transaction_completed(self, producer_id: int, partitions: set[int],
                                 is_commit: bool) -> None:
        """A transaction's marker is written in these ``__consumer_offsets`` partitions
        (Kafka's ``onTransactionCompleted`` from the WriteTxnMarkers handler)."""
        self.manager.handle_txn_completion(producer_id, partitions, is_commit)

    def _validate_offset_commit(self, group: GroupMetadata, generation_id: int,
                                member_id: str, instance_id: str | None) -> ErrorCode | None:
        if group.is_(GroupState.DEAD):
            return ErrorCode.coordinator_not_available
        if generation_id < 0 and group.is_(GroupState.EMPTY):
            return None  # the admin client, or a consumer without group management
        if generation_id >= 0 or member_id != UNKNOWN_MEMBER_ID or instance_id is not None:
            error = self.classic.validate_current_member(group, member_id, instance_id)
            if error is None and generation_id != group.generation_id:
                error = ErrorCode.illegal_generation
            return error
        if not group.is_(GroupState.EMPTY):
            return ErrorCode.unknown_member_id  # only members commit to a live group
        return None

    def handle_fetch_offsets(self, group_id: str, require_stable: bool,
                             partitions: list[TopicPartition] | None,
                             member: tuple[str | None, int] = (None, -1)
                             ) -> tuple[ErrorCode, dict[TopicPartition, CommittedOffset]]:
        """Offsets whatever the group's state: a group may commit without membership.
        ``member``: OffsetFetch v9's member id and epoch, checked against a consumer
        group's member (``validateOffsetFetch``)."""
        error = self.validate_group_status(group_id, allow_empty=True)
        group = self.manager.get_group(group_id) if error is None else None
        if group is not None and group.consumer is not None:
            consumer = group.consumer
            error = _group_error(lambda: consumer.validate_offset_fetch(*member))
        if error is not None:
            return error, {}
        return ErrorCode.none, self.manager.get_offsets(group_id, require_stable, partitions)

    # ---- listing and describing -----------------------------------------------------------

    def handle_list_groups(self, states: set[str], types: set[str]
                           ) -> tuple[ErrorCode, list[tuple[str, str, str, str]]]:
        """(group id, protocol type, state, type) of every group coordinated here,
        filtered by state and type (case-insensitive)."""
        error = (ErrorCode.coordinator_load_in_progress if self.manager.is_loading
                 else ErrorCode.none)
        wanted_states = {s.lower() for s in states}
        wanted_types = {t.lower() for t in types}
        listed = [(g.group_id, g.protocol_type or "", _state(g), g.group_type)
                  for g in self.manager.groups.values()]
        return error, [group for group in listed
                       if (not wanted_states or group[2].lower() in wanted_states)
                       and (not wanted_types or group[3] in wanted_types)]

    def handle_describe_group(self, group_id: str) -> tuple[ErrorCode, GroupSummary]:
        error = self.validate_group_status(group_id, allow_empty=True)
        if error is not None:
            return error, _NO_GROUP
        group = self.manager.get_group(group_id)
        if group is None or group.consumer is not None:
            # Kafka's DescribeGroups (before v6) says Dead of a group that is not classic.
            return ErrorCode.none, _DEAD_GROUP
        stable = group.is_(GroupState.STABLE) and group.protocol_name is not None
        return ErrorCode.none, GroupSummary(
            group.state, group.protocol_type or "",
            group.protocol_name or "" if stable else "",
            tuple(MemberSummary(
                m.member_id, m.group_instance_id, m.client_id, m.client_host,
                m.metadata(group.protocol_name) if stable and group.protocol_name else b"",
                m.assignment if stable else b"") for m in group.members.values()))

    # ---- deleting ---------------------------------------------------------------------

    def handle_delete_groups(self, group_ids: list[str],
                             callback: Callable[[dict[str, ErrorCode]], None]) -> None:
        """Kafka 4.2's ``GroupCoordinatorService.deleteGroups``: each
        group must be coordinated here (else NOT_COORDINATOR or
        COORDINATOR_LOAD_IN_PROGRESS), known (GROUP_ID_NOT_FOUND) and Empty
        (``validateDeleteGroup``: NON_EMPTY_GROUP while it has members, classic or consumer
        protocol ones); an
        Empty group's offsets and metadata get tombstones in ``__consumer_offsets``
        (``GroupMetadataManager.delete_group``). ``callback`` gets every group's error once
        every write is acknowledged. The empty group id is allowed, as in Kafka."""
        results: dict[str, ErrorCode] = {}
        doomed: list[GroupMetadata] = []
        for group_id in group_ids:
            error = self.validate_group_status(group_id, allow_empty=True)
            group = self.manager.get_group(group_id) if error is None else None
            if error is None and (group is None or group.is_(GroupState.DEAD)):
                error = ErrorCode.group_id_not_found
            elif error is None and group is not None and (
                    not group.is_(GroupState.EMPTY)
                    or (group.consumer is not None and group.consumer.members)):
                # ``ConsumerGroup.validateDeleteGroup`` too: a consumer group with members.
                error = ErrorCode.non_empty_group
            if error is not None or group is None:
                results[group_id] = error or ErrorCode.group_id_not_found
            elif group_id not in results:
                results[group_id] = ErrorCode.none
                doomed.append(group)
        waiting = len(doomed)
        if not waiting:
            callback(results)
            return

        def deleted(group_id: str, error: ErrorCode) -> None:
            nonlocal waiting
            results[group_id] = error
            waiting -= 1
            if waiting == 0:
                callback(results)

        for group in doomed:
            self.manager.delete_group(
                group, lambda error, group_id=group.group_id: deleted(group_id, error))

    # ---- state for /v1/state ------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {
            "offsets_topic_partitions": self.manager.partition_count(),
            "owned_partitions": sorted(self.manager.owned_partitions),
            "loading_partitions": sorted(self.manager.loading_partitions),
            "groups": [
                {"group": g.group_id, "partition": self.manager.partition_for(g.group_id),
                 "state": _state(g), "type": g.group_type, "protocol_type": g.protocol_type,
                 "protocol": g.protocol_name, "generation": g.generation_id,
                 "leader": g.leader_id, "members": list(g.members),
                 "committed_offsets": len(g.offsets),
                 **(_consumer_state(g.consumer) if g.consumer is not None else {})}
                for g in sorted(self.manager.groups.values(), key=lambda g: g.group_id)],
        }


def _consumer_state(group: ConsumerGroup) -> dict[str, Any]:
    """A consumer group's epochs and members (KIP-848): the group epoch stands in the
    generation, each member's epoch and partitions are listed."""
    return {
        "generation": group.group_epoch, "assignment_epoch": group.assignment_epoch,
        "members": sorted(group.members),
        "member_epochs": {m.member_id: m.member_epoch for m in group.members.values()},
        "assignments": {m.member_id: {t: sorted(ps) for t, ps in m.assigned_partitions.items()}
                        for m in group.members.values()},
    }


def _state(group: GroupMetadata) -> str:
    """The state ListGroups and /v1/state report: a consumer group's own."""
    return group.consumer.state if group.consumer is not None else group.state


def _group_error(check: Callable[[], None]) -> ErrorCode | None:
    try:
        check()
    except GroupError as exc:
        return exc.code
    return None
