"""The group coordinator's APIs: JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit,
OffsetFetch, ListGroups, DescribeGroups and DeleteGroups, as Kafka 3.9's ``KafkaApis``
handles them for the classic protocol (DeleteGroups as Kafka 4.2's), and KIP-848's
ConsumerGroupHeartbeat and ConsumerGroupDescribe as Kafka 4.2's do; FindCoordinator, which
serves both coordinators, is in ``coordinator_apis``.

Every version's request is turned into a call on the ``GroupCoordinator`` (callback-based;
a parked JoinGroup or SyncGroup is awaited here) and its answer into that version's
response, built from a superset of fields (``responses.build``).
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta
from types import ModuleType
from typing import Any, Protocol

from kio.static.protocol import ResponsePayload

from minibroker.cluster.types import ErrorCode, MetadataImage, TopicPartition
from minibroker.config import resolve
from minibroker.coordinator.consumer.group_manager import HeartbeatRequest
from minibroker.coordinator.consumer.member import Assignment
from minibroker.coordinator.group_coordinator import GroupCoordinator
from minibroker.coordinator.group_metadata_manager import OFFSETS_TOPIC
from minibroker.coordinator.records import OffsetAndMetadata
from minibroker.network.codec import ApiKey, Request
from minibroker.network.kafka_server import CLIENT_HOST
from minibroker.network.responses import (
    NO_THROTTLE,
    build,
    completion,
    response_module,
)
from minibroker.network.txn_verification import (
    TransactionSupportedOperation,
    TransactionVerifier,
    verify_transactional_append,
)

__all__ = ["GroupApis", "GroupBroker"]

log = logging.getLogger("minibroker.network.group_apis")

_AUTHORIZED_OPERATIONS_OMITTED = -(2**31)


_COORDINATOR_ERRORS = {
    ErrorCode.network_exception: ErrorCode.coordinator_load_in_progress,
    ErrorCode.unknown_topic_or_partition: ErrorCode.coordinator_not_available,
    ErrorCode.not_enough_replicas: ErrorCode.coordinator_not_available,
    ErrorCode.request_timed_out: ErrorCode.coordinator_not_available,
    ErrorCode.not_leader_or_follower: ErrorCode.not_coordinator,
    ErrorCode.kafka_storage_error: ErrorCode.not_coordinator,
}
"""A coordinator's write errors as its clients see them (Kafka 4.2's
``CoordinatorOperationExceptionHelper``)."""


class GroupBroker(TransactionVerifier, Protocol):
    """What GroupApis needs of the broker: its coordinator and its metadata."""

    group_coordinator: GroupCoordinator

    def metadata_image(self) -> MetadataImage: ...

    def broker_config(self) -> dict[str, str]: ...


def _commit_answer(topic_type: Any, partition_type: Any, topics: Any,
                   errors: dict[TopicPartition, ErrorCode]) -> tuple[Any, ...]:
    """An offset commit's answer: every partition asked, in the request's order."""
    return tuple(topic_type(name=topic.name, partitions=tuple(
        partition_type(partition_index=part.partition_index,
                       error_code=errors[TopicPartition(topic.name, part.partition_index)])
        for part in topic.partitions)) for topic in topics)


def _ms(value: timedelta) -> int:
    return int(value / timedelta(milliseconds=1))


class GroupApis:
    """The handlers of the group coordinator's APIs, for ``KafkaApis``."""

    def __init__(self, broker: GroupBroker) -> None:
        self._verify_transactions: bool = resolve(
            "transaction.partition.verification.enable", broker.broker_config())
        self._broker = broker

    @property
    def _coordinator(self) -> GroupCoordinator:
        return self._broker.group_coordinator

    # -- JoinGroup, SyncGroup, Heartbeat, LeaveGroup -----------------------------------------

    async def handle_join_group(self, request: Request) -> ResponsePayload:
        body, version = request.body, request.api_version
        session_ms = _ms(body.session_timeout)
        # v0 has no rebalance timeout: the session timeout stands in (JoinGroupRequest).
        rebalance_ms = _ms(body.rebalance_timeout) if version >= 1 else session_ms
        result = await completion(lambda done: self._coordinator.handle_join_group(
            body.group_id, body.member_id, getattr(body, "group_instance_id", None),
            require_known_member_id=version >= 4,  # KIP-394
            support_skipping_assignment=version >= 9,
            client_id=request.client_id or "", client_host=CLIENT_HOST.get(),
            rebalance_timeout_ms=rebalance_ms, session_timeout_ms=session_ms,
            protocol_type=body.protocol_type,
            protocols=[(p.name, p.metadata) for p in body.protocols], callback=done))
        m = response_module(ApiKey.JOIN_GROUP, version)
        return build(
            m.JoinGroupResponse, throttle_time=NO_THROTTLE, error_code=result.error,
            generation_id=result.generation_id, protocol_type=result.protocol_type,
            # Before v7 the protocol name is not nullable.
            protocol_name=result.protocol_name if version >= 7 else result.protocol_name or "",
            leader=result.leader_id, skip_assignment=result.skip_assignment,
            member_id=result.member_id,
            members=tuple(build(m.JoinGroupResponseMember, member_id=member_id,
                                group_instance_id=instance_id, metadata=metadata)
                          for member_id, instance_id, metadata in result.members))

    async def handle_sync_group(self, request: Request) -> ResponsePayload:
        body, version = request.body, request.api_version
        m = response_module(ApiKey.SYNC_GROUP, version)
        protocol_type = getattr(body, "protocol_type", None)
        protocol_name = getattr(body, "protocol_name", None)
        if version >= 5 and (protocol_type is None or protocol_name is None):
            return build(m.SyncGroupResponse, throttle_time=NO_THROTTLE,
                         error_code=ErrorCode.inconsistent_group_protocol, protocol_type=None,
                         protocol_name=None, assignment=b"")
        result = await completion(lambda done: self._coordinator.handle_sync_group(
            body.group_id, body.generation_id, body.member_id, protocol_type, protocol_name,
            getattr(body, "group_instance_id", None),
            {a.member_id: a.assignment for a in body.assignments}, done))
        return build(m.SyncGroupResponse, throttle_time=NO_THROTTLE, error_code=result.error,
                     protocol_type=result.protocol_type, protocol_name=result.protocol_name,
                     assignment=result.assignment)

    async def handle_heartbeat(self, request: Request) -> ResponsePayload:
        body = request.body
        error = self._coordinator.handle_heartbeat(
            body.group_id, body.member_id, getattr(body, "group_instance_id", None),
            body.generation_id)
        m = response_module(ApiKey.HEARTBEAT, request.api_version)
        return build(m.HeartbeatResponse, throttle_time=NO_THROTTLE, error_code=error)

    async def handle_leave_group(self, request: Request) -> ResponsePayload:
        body, version = request.body, request.api_version
        m = response_module(ApiKey.LEAVE_GROUP, version)
        if version < 3:
            leaving = [(body.member_id, None)]
        else:  # KIP-345: a batch, members named by instance id too
            leaving = [(member.member_id, member.group_instance_id) for member in body.members]
        error, errors = self._coordinator.handle_leave_group(body.group_id, leaving)
        if version < 3:
            # One member: its own error is the answer (LeaveGroupResponse before v3).
            return build(m.LeaveGroupResponse, throttle_time=NO_THROTTLE,
                         error_code=errors[0] if error == ErrorCode.none and errors else error)
        return m.LeaveGroupResponse(
            throttle_time=NO_THROTTLE, error_code=error,
            members=tuple(m.MemberResponse(member_id=member_id, group_instance_id=instance_id,
                                           error_code=member_error)
                          for (member_id, instance_id), member_error in zip(leaving, errors,
                                                                            strict=False)))

    # -- OffsetCommit and OffsetFetch --------------------------------------------------------

    async def handle_offset_commit(self, request: Request) -> ResponsePayload:
        body, version = request.body, request.api_version
        m = response_module(ApiKey.OFFSET_COMMIT, version)
        errors, offsets = self._offsets_to_commit(body.topics)
        if offsets:
            errors.update(await completion(lambda done: self._coordinator.handle_commit_offsets(
                body.group_id, body.member_id, getattr(body, "group_instance_id", None),
                body.generation_id_or_member_epoch, offsets, done, version)))
        return build(m.OffsetCommitResponse, throttle_time=NO_THROTTLE,
                     topics=_commit_answer(m.OffsetCommitResponseTopic,
                                           m.OffsetCommitResponsePartition, body.topics, errors))

    async def handle_txn_offset_commit(self, request: Request) -> ResponsePayload:
        """TxnOffsetCommit (v0-5; v3 is KIP-447's member id and generation, v5 transaction
        version 2's, which adds the group's offsets partition to the transaction itself)."""
        body, version = request.body, request.api_version
        m = response_module(ApiKey.TXN_OFFSET_COMMIT, version)
        errors, offsets = self._offsets_to_commit(body.topics)
        guards = None
        operation = TransactionSupportedOperation.for_txn_offset_commit(version)
        if offsets and (self._verify_transactions or operation.supports_epoch_bump):
            # KIP-890: is the group's offsets partition in the transaction (part 1), or
            # add it (part 2)?
            tp = TopicPartition(OFFSETS_TOPIC,
                                self._coordinator.manager.partition_for(body.group_id))
            guards, failed = await verify_transactional_append(
                self._broker, body.transactional_id, body.producer_id, body.producer_epoch,
                [tp], operation)
            if tp in failed:
                error = _COORDINATOR_ERRORS.get(failed[tp], failed[tp])
                errors.update(dict.fromkeys(offsets, error))
                offsets = {}
        if offsets:
            errors.update(await completion(
                lambda done: self._coordinator.handle_txn_commit_offsets(
                    body.group_id, body.producer_id, body.producer_epoch,
                    getattr(body, "member_id", ""), getattr(body, "group_instance_id", None),
                    getattr(body, "generation_id", -1), offsets, done, guards)))
        return m.TxnOffsetCommitResponse(
            throttle_time=NO_THROTTLE,
            topics=_commit_answer(m.TxnOffsetCommitResponseTopic,
                                  m.TxnOffsetCommitResponsePartition, body.topics, errors))

    def _offsets_to_commit(self, topics: Any) -> tuple[dict[TopicPartition, ErrorCode],
                                                       dict[TopicPartition, OffsetAndMetadata]]:
        """The request's offsets of partitions the metadata knows, and the errors of the
        others (UNKNOWN_TOPIC_OR_PARTITION)."""
        image = self._broker.metadata_image()
        now = int(self._coordinator.manager.now_ms())
        errors: dict[TopicPartition, ErrorCode] = {}
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        for topic in topics:
            known = image.topics.get(topic.name)
            for part in topic.partitions:
                tp = TopicPartition(topic.name, part.partition_index)
                if known is None or tp.partition not in known.partitions:
                    errors[tp] = ErrorCode.unknown_topic_or_partition
                else:
                    offsets[tp] = OffsetAndMetadata(
                        part.committed_offset, getattr(part, "committed_leader_epoch", -1),
                        part.committed_metadata or "", now)
        return errors, offsets

    async def handle_offset_fetch(self, request: Request) -> ResponsePayload:
        body, version = request.body, request.api_version
        m = response_module(ApiKey.OFFSET_FETCH, version)
        require_stable = getattr(body, "require_stable", False)
        if version >= 8:  # KIP-709: many groups in one request; v9 names the member
            return m.OffsetFetchResponse(throttle_time=NO_THROTTLE, groups=tuple(
                self._fetched_group(m, group.group_id, group.topics, require_stable,
                                    (getattr(group, "member_id", None),
                                     getattr(group, "member_epoch", -1)))
                for group in body.groups))
        error, topics = self._fetch(m, body.group_id, body.topics, require_stable, version)
        return build(m.OffsetFetchResponse, throttle_time=NO_THROTTLE, error_code=error,
                     topics=topics)

    def _fetched_group(self, m: ModuleType, group_id: str, topics: Any,
                       require_stable: bool, member: tuple[str | None, int]) -> Any:
        error, fetched = self._fetch(m, group_id, topics, require_stable, 8, member)
        return m.OffsetFetchResponseGroup(group_id=group_id, topics=fetched, error_code=error)

    def _fetch(self, m: ModuleType, group_id: str, topics: Any, require_stable: bool,
               version: int, member: tuple[str | None, int] = (None, -1)
               ) -> tuple[ErrorCode, tuple[Any, ...]]:
        wanted = (None if topics is None else
                  [TopicPartition(t.name, p) for t in topics for p in t.partition_indexes])
        error, offsets = self._coordinator.handle_fetch_offsets(group_id, require_stable,
                                                                wanted, member)
        v8 = version >= 8
        topic_type = m.OffsetFetchResponseTopics if v8 else m.OffsetFetchResponseTopic
        partition_type = m.OffsetFetchResponsePartitions if v8 else m.OffsetFetchResponsePartition
        if error != ErrorCode.none and version < 2 and wanted:
            # v1 has no group-level error: each partition carries it.
            offsets = {tp: (-1, -1, "", error) for tp in wanted}
        by_topic: dict[str, list[Any]] = {}
        for tp, (offset, leader_epoch, metadata, partition_error) in offsets.items():
            by_topic.setdefault(tp.topic, []).append(build(
                partition_type, partition_index=tp.partition, committed_offset=offset,
                committed_leader_epoch=leader_epoch, metadata=metadata,
                error_code=partition_error))
        return error, tuple(topic_type(name=name, partitions=tuple(parts))
                            for name, parts in by_topic.items())

    # -- ListGroups and DescribeGroups -------------------------------------------------------

    async def handle_list_groups(self, request: Request) -> ResponsePayload:
        body = request.body
        m = response_module(ApiKey.LIST_GROUPS, request.api_version)
        error, groups = self._coordinator.handle_list_groups(
            set(getattr(body, "states_filter", ())), set(getattr(body, "types_filter", ())))
        return build(m.ListGroupsResponse, throttle_time=NO_THROTTLE, error_code=error,
                     groups=tuple(build(m.ListedGroup, group_id=group_id,
                                        protocol_type=protocol_type, group_state=state,
                                        group_type=group_type)
                                  for group_id, protocol_type, state, group_type in groups))

    async def handle_describe_groups(self, request: Request) -> ResponsePayload:
        m = response_module(ApiKey.DESCRIBE_GROUPS, request.api_version)
        described = []
        for group_id in request.body.groups:
            error, summary = self._coordinator.handle_describe_group(group_id)
            described.append(build(
                m.DescribedGroup, error_code=error, group_id=group_id,
                group_state=summary.state, protocol_type=summary.protocol_type,
                protocol_data=summary.protocol,
                members=tuple(build(m.DescribedGroupMember, member_id=member.member_id,
                                    group_instance_id=member.group_instance_id,
                                    client_id=member.client_id, client_host=member.client_host,
                                    member_metadata=member.metadata,
                                    member_assignment=member.assignment)
                              for member in summary.members),
                authorized_operations=_AUTHORIZED_OPERATIONS_OMITTED))
        return build(m.DescribeGroupsResponse, throttle_time=NO_THROTTLE,
                     groups=tuple(described))

    async def handle_delete_groups(self, request: Request) -> ResponsePayload:
        """Kafka 4.2's ``KafkaApis.handleDeleteGroupsRequest``: each group's error, a
        tombstone write's as ``CoordinatorOperationExceptionHelper`` maps it."""
        m = response_module(ApiKey.DELETE_GROUPS, request.api_version)
        group_ids = list(request.body.groups_names)
        errors = await completion(
            lambda done: self._coordinator.handle_delete_groups(group_ids, done))
        return build(m.DeleteGroupsResponse, throttle_time=NO_THROTTLE, results=tuple(
            m.DeletableGroupResult(group_id=group_id, error_code=_COORDINATOR_ERRORS.get(
                errors[group_id], errors[group_id]))
            for group_id in dict.fromkeys(group_ids)))

    # -- ConsumerGroupHeartbeat and ConsumerGroupDescribe (KIP-848) --------------------------

    async def handle_consumer_group_heartbeat(self, request: Request) -> ResponsePayload:
        body, version = request.body, request.api_version
        m = response_module(ApiKey.CONSUMER_GROUP_HEARTBEAT, version)
        owned = (None if body.topic_partitions is None else
                 owned_partitions((t.topic_id, t.partitions) for t in body.topic_partitions))
        rebalance_ms = _ms(body.rebalance_timeout)
        heartbeat = HeartbeatRequest(
            group_id=body.group_id, member_id=body.member_id, member_epoch=body.member_epoch,
            rebalance_timeout_ms=rebalance_ms,
            subscribed_topic_names=(None if body.subscribed_topic_names is None
                                    else tuple(body.subscribed_topic_names)),
            subscribed_topic_regex=getattr(body, "subscribed_topic_regex", None),
            server_assignor=body.server_assignor, owned=owned, instance_id=body.instance_id,
            rack_id=body.rack_id, client_id=request.client_id or "",
            client_host=CLIENT_HOST.get(), api_version=version)
        answer = await completion(lambda done: self._coordinator.handle_consumer_group_heartbeat(
            heartbeat, done))
        # A write's error as Kafka's CoordinatorOperationExceptionHelper gives it.
        error = _COORDINATOR_ERRORS.get(answer.error, answer.error)
        assignment = None if answer.assignment is None else m.Assignment(
            topic_partitions=tuple(
                m.TopicPartitions(topic_id=uuid.UUID(topic_id), partitions=tuple(sorted(ps)))
                for topic_id, ps in answer.assignment.items()))
        return m.ConsumerGroupHeartbeatResponse(
            throttle_time=NO_THROTTLE, error_code=error, error_message=answer.message,
            member_id=answer.member_id, member_epoch=answer.member_epoch,
            heartbeat_interval=timedelta(milliseconds=answer.heartbeat_interval_ms),
            assignment=assignment)

    async def handle_consumer_group_describe(self, request: Request) -> ResponsePayload:
        m = response_module(ApiKey.CONSUMER_GROUP_DESCRIBE, request.api_version)
        image = self._broker.metadata_image()
        names = {t.topic_id: t.name for t in image.topics.values()}

        def described_assignment(assignment: Assignment) -> Any:
            return m.Assignment(topic_partitions=tuple(
                m.TopicPartitions(topic_id=uuid.UUID(topic_id),
                                  topic_name=names.get(topic_id, ""),
                                  partitions=tuple(sorted(ps)))
                for topic_id, ps in assignment.items() if topic_id in names))

        described = []
        for group_id in request.body.group_ids:
            error, message, group = self._coordinator.handle_consumer_group_describe(group_id)
            if group is None:
                described.append(build(m.DescribedGroup, error_code=error,
                                       error_message=message, group_id=group_id,
                                       group_state="", group_epoch=-1, assignment_epoch=-1,
                                       assignor_name="", members=(),
                                       authorized_operations=_AUTHORIZED_OPERATIONS_OMITTED))
                continue
            described.append(build(
                m.DescribedGroup, error_code=ErrorCode.none, group_id=group_id,
                group_state=group.state, group_epoch=group.group_epoch,
                assignment_epoch=group.assignment_epoch,
                assignor_name=self._coordinator.consumer.assignor_name(group),
                members=tuple(build(
                    m.Member, member_id=member.member_id, instance_id=member.instance_id,
                    rack_id=member.rack_id, member_epoch=member.member_epoch,
                    client_id=member.client_id, client_host=member.client_host,
                    subscribed_topic_names=member.subscribed_topic_names,
                    subscribed_topic_regex=None,
                    assignment=described_assignment(member.assigned_partitions),
                    target_assignment=described_assignment(
                        group.target_assignment.get(member.member_id, {})),
                    member_type=1)  # KIP-1099: a consumer protocol member
                    for member in group.members.values()),
                authorized_operations=_AUTHORIZED_OPERATIONS_OMITTED))
        return m.ConsumerGroupDescribeResponse(throttle_time=NO_THROTTLE,
                                               groups=tuple(described))


def owned_partitions(topics: Any) -> Assignment:
    """A heartbeat's owned partitions, topics by minibroker's topic id (the image's form:
    ``uuid.hex``)."""
    owned: dict[str, frozenset[int]] = {}
    for topic_id, partitions in topics:
        if topic_id is not None and partitions:
            owned[topic_id.hex] = owned.get(topic_id.hex, frozenset()) | frozenset(partitions)
    return dict(sorted(owned.items()))
