"""A group and its members: Kafka 3.9's ``GroupMetadata`` and ``MemberMetadata``.

The state machine of the classic protocol lives here, with Kafka's state names and allowed
transitions, so that every transition is checked in one place:

- ``Empty``: no member (a group that only commits offsets stays here). A new member's
  JoinGroup starts a rebalance.
- ``PreparingRebalance``: JoinGroups are parked until every known member has rejoined or
  the rebalance timeout passed (``DelayedJoin``).
- ``CompletingRebalance``: the generation is chosen; SyncGroups are parked until the leader
  sends the assignment and it is written to ``__consumer_offsets``.
- ``Stable``: members heartbeat and commit in the current generation.
- ``Dead``: unloaded (the coordinator moved) or removed; every request is told to find the
  coordinator again.

Members carry their parked JoinGroup/SyncGroup callbacks: answering one is invoking it
(``maybe_invoke_join_callback``), exactly once. Offsets committed through the group are
cached here with the offset of the record that holds them, next to those whose write is
still waiting for its acks (pending commits).

``GroupMetadata.group_type`` is Kafka's ``Group.GroupType``: a ``classic`` group's membership
is here, run by ``classic_group.ClassicGroupHandler``; a ``consumer`` group's (KIP-848) is
its ``consumer`` (``consumer.consumer_group.ConsumerGroup``), run by
``consumer.group_manager.ConsumerGroupManager``. Both keep their offsets here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from minibroker import environment
from minibroker.cluster.types import ErrorCode, TopicPartition
from minibroker.coordinator.consumer.consumer_group import ConsumerGroup
from minibroker.coordinator.records import OffsetAndMetadata, decode_assignment

__all__ = [
    "GroupMetadata",
    "GroupState",
    "GroupType",
    "JoinGroupResult",
    "MemberMetadata",
    "SyncGroupResult",
]

CONSUMER_PROTOCOL_TYPE = "consumer"  # ConsumerProtocol.PROTOCOL_TYPE


class GroupState(StrEnum):
    """Kafka's ``GroupState`` names, as DescribeGroups and ListGroups report them."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


class GroupType(StrEnum):
    """Kafka's ``Group.GroupType``."""

    CLASSIC = "classic"
    CONSUMER = "consumer"  # KIP-848


_VALID_PREVIOUS_STATES: dict[GroupState, frozenset[GroupState]] = {
    GroupState.PREPARING_REBALANCE: frozenset({GroupState.STABLE,
                                               GroupState.COMPLETING_REBALANCE,
                                               GroupState.EMPTY}),
    GroupState.COMPLETING_REBALANCE: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.STABLE: frozenset({GroupState.COMPLETING_REBALANCE}),
    GroupState.DEAD: frozenset(GroupState),
    GroupState.EMPTY: frozenset({GroupState.PREPARING_REBALANCE}),
}

Protocols = list[tuple[str, bytes]]


@dataclass(frozen=True)
class JoinGroupResult:
    """What a parked JoinGroup is answered with (Kafka's ``JoinGroupResult``)."""

    member_id: str
    error: ErrorCode
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    skip_assignment: bool = False
    members: tuple[tuple[str, str | None, bytes], ...] = ()  # (member id, instance id, meta)


@dataclass(frozen=True)
class SyncGroupResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass
class MemberMetadata:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    supported_protocols: Protocols
    assignment: bytes = b""
    awaiting_join_callback: Callable[[JoinGroupResult], None] | None = None
    awaiting_sync_callback: Callable[[SyncGroupResult], None] | None = None
    is_new: bool = False
    # Set by a heartbeat (or anything that shows the member alive), cleared when the next
    # expiration is scheduled: Kafka's DelayedHeartbeat completes on it.
    heartbeat_satisfied: bool = False

    @property
    def is_static_member(self) -> bool:
        return self.group_instance_id is not None

    @property
    def is_awaiting_join(self) -> bool:
        return self.awaiting_join_callback is not None

    @property
    def is_awaiting_sync(self) -> bool:
        return self.awaiting_sync_callback is not None

    def metadata(self, protocol: str) -> bytes:
        for name, metadata in self.supported_protocols:
            if name == protocol:
                return metadata
        raise ValueError(f"member {self.member_id} does not support protocol {protocol}")

    @property
    def has_satisfied_heartbeat(self) -> bool:
        """A new member may expire while awaiting its join; any other member awaiting a
        join or sync is alive by definition."""
        if self.is_new:
            return self.heartbeat_satisfied
        return self.is_awaiting_join or self.is_awaiting_sync or self.heartbeat_satisfied

    @property
    def protocols(self) -> frozenset[str]:
        """The names of the member's protocols, each once however often the JoinGroup named
        it (Kafka's ``MemberMetadata.protocols``, a set): a group's votes count members."""
        return frozenset(name for name, _ in self.supported_protocols)

    def matches(self, protocols: Protocols) -> bool:
        return protocols == self.supported_protocols

    def vote(self, candidates: set[str]) -> str:
        """The member's most preferred protocol among those every member supports."""
        return next(name for name, _ in self.supported_protocols if name in candidates)


@dataclass
class CachedOffset:
    """Kafka's ``CommitRecordMetadataAndOffset``: the offset of the record holding it."""

    record_offset: int
    offset: OffsetAndMetadata


@dataclass
class GroupMetadata:
    group_id: str
    clock_ms: Callable[[], float]
    state: GroupState = GroupState.EMPTY
    group_type: GroupType = GroupType.CLASSIC
    protocol_type: str | None = None
    protocol_name: str | None = None
    generation_id: int = 0
    leader_id: str | None = None
    current_state_timestamp: int = -1
    new_member_added: bool = False
    members: dict[str, MemberMetadata] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    pending_members: set[str] = field(default_factory=set)
    pending_sync_members: set[str] = field(default_factory=set)
    offsets: dict[TopicPartition, CachedOffset] = field(default_factory=dict)
    pending_offset_commits: dict[TopicPartition, OffsetAndMetadata] = field(
        default_factory=dict)
    # producer id -> its transaction's offsets, until its marker (record offset -1: the
    # record is not appended yet).
    pending_txn_offset_commits: dict[int, dict[TopicPartition, CachedOffset]] = field(
        default_factory=dict)
    consumer: ConsumerGroup | None = None
    """A consumer group's membership (KIP-848); None for a classic group."""
    _awaiting_join: int = 0
    _protocol_votes: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.current_state_timestamp = int(self.clock_ms())

    # ---- state ------------------------------------------------------------------------

    def is_(self, state: GroupState) -> bool:
        return self.state is state

    @property
    def can_rebalance(self) -> bool:
        return self.state in _VALID_PREVIOUS_STATES[GroupState.PREPARING_REBALANCE]

    def transition_to(self, state: GroupState) -> None:
        if self.state not in _VALID_PREVIOUS_STATES[state]:
            raise AssertionError(f"group {self.group_id} should be in one of "
                                 f"{sorted(_VALID_PREVIOUS_STATES[state])} before moving to "
                                 f"{state}; it is {self.state}")
        self.state = state
        self.current_state_timestamp = int(self.clock_ms())

    # ---- members ----------------------------------------------------------------------

    def has(self, member_id: str) -> bool:
        return member_id in self.members

    def get(self, member_id: str) -> MemberMetadata:
        return self.members[member_id]

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def add(self, member: MemberMetadata,
            callback: Callable[[JoinGroupResult], None] | None = None) -> None:
        if member.group_instance_id is not None:
            if member.group_instance_id in self.static_members:
                raise AssertionError(f"static member {member.group_instance_id} is already "
                                     f"in group {self.group_id}")
            self.static_members[member.group_instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        self._protocol_votes.update(member.protocols)
        member.awaiting_join_callback = callback
        if callback is not None:
            self._awaiting_join += 1
        self.pending_members.discard(member.member_id)

    def remove(self, member_id: str) -> None:
        member = self.members.pop(member_id, None)
        if member is not None:
            self._protocol_votes.subtract(member.protocols)
            if member.is_awaiting_join:
                self._awaiting_join -= 1
            if member.group_instance_id is not None:
                self.static_members.pop(member.group_instance_id, None)
        if self.is_leader(member_id):
            self.leader_id = next(iter(self.members), None)
        self.pending_members.discard(member_id)
        self.pending_sync_members.discard(member_id)

    def maybe_elect_new_joined_leader(self) -> bool:
        """If the leader did not rejoin, any member that did leads; False when none did."""
        if self.leader_id is None:
            return False
        if self.get(self.leader_id).is_awaiting_join:
            return True
        joined = next((m for m, member in self.members.items() if member.is_awaiting_join),
                      None)
        if joined is None:
            return False
        self.leader_id = joined
        return True

    def replace_static_member(self, instance_id: str, old_member_id: str,
                              new_member_id: str) -> MemberMetadata:
        """KIP-345: the instance rejoined with a new member id; the old one is fenced
        (its parked requests answered FENCED_INSTANCE_ID)."""
        member = self.members.pop(old_member_id)
        self.maybe_invoke_join_callback(member, JoinGroupResult(old_member_id,
                                                                ErrorCode.fenced_instance_id))
        self.maybe_invoke_sync_callback(member, SyncGroupResult(ErrorCode.fenced_instance_id))
        member.member_id = new_member_id
        self.members[new_member_id] = member
        if self.is_leader(old_member_id):
            self.leader_id = new_member_id
        self.static_members[instance_id] = new_member_id
        return member

    def add_pending_member(self, member_id: str) -> None:
        """KIP-394: a member id handed out by MEMBER_ID_REQUIRED, until it joins with it."""
        self.pending_members.add(member_id)

    def current_static_member_id(self, instance_id: str) -> str | None:
        return self.static_members.get(instance_id)

    @property
    def not_yet_rejoined_members(self) -> list[MemberMetadata]:
        return [m for m in self.members.values() if not m.is_awaiting_join]

    @property
    def has_all_members_joined(self) -> bool:
        return len(self.members) == self._awaiting_join and not self.pending_members

    @property
    def num_awaiting(self) -> int:
        return self._awaiting_join

    @property
    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    @staticmethod
    def generate_member_id(client_id: str, instance_id: str | None) -> str:
        return f"{instance_id if instance_id is not None else client_id}-{environment.new_uuid()}"

    def supports_protocols(self, protocol_type: str, protocols: set[str]) -> bool:
        if self.is_(GroupState.EMPTY):
            return bool(protocol_type) and bool(protocols)
        return (self.protocol_type == protocol_type
                and any(self._protocol_votes[p] == len(self.members) for p in protocols))

    def select_protocol(self) -> str:
        """Each member votes for its most preferred protocol every member supports; the
        most votes win (ties: the first protocol voted for, as Scala's groupBy-maxBy)."""
        candidates = {p for p, n in self._protocol_votes.items() if n == len(self.members)}
        votes = Counter(m.vote(candidates) for m in self.members.values())
        return votes.most_common(1)[0][0]

    def update_member(self, member: MemberMetadata, protocols: Protocols,
                      rebalance_timeout_ms: int, session_timeout_ms: int,
                      callback: Callable[[JoinGroupResult], None] | None) -> None:
        self._protocol_votes.subtract(member.protocols)
        member.supported_protocols = protocols
        self._protocol_votes.update(member.protocols)
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        if callback is not None and not member.is_awaiting_join:
            self._awaiting_join += 1
        elif callback is None and member.is_awaiting_join:
            self._awaiting_join -= 1
        member.awaiting_join_callback = callback

    def maybe_invoke_join_callback(self, member: MemberMetadata,
                                   result: JoinGroupResult) -> None:
        callback = member.awaiting_join_callback
        if callback is not None:
            member.awaiting_join_callback = None
            self._awaiting_join -= 1
            callback(result)

    def maybe_invoke_sync_callback(self, member: MemberMetadata,
                                   result: SyncGroupResult) -> bool:
        callback = member.awaiting_sync_callback
        if callback is None:
            return False
        member.awaiting_sync_callback = None
        callback(result)
        return True

    def init_next_generation(self) -> None:
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.transition_to(GroupState.COMPLETING_REBALANCE)
        else:
            self.protocol_name = None
            self.transition_to(GroupState.EMPTY)
        self.pending_sync_members.clear()

    def current_member_metadata(self) -> tuple[tuple[str, str | None, bytes], ...]:
        """What the leader is given to assign: every member's subscription."""
        assert self.protocol_name is not None
        return tuple((m.member_id, m.group_instance_id, m.metadata(self.protocol_name))
                     for m in self.members.values())

    def assignment_summary(self) -> str:
        """``member: topic-0,1; ...`` for a consumer group, byte counts otherwise."""
        parts = []
        for member in self.members.values():
            topics = (decode_assignment(member.assignment)
                      if self.protocol_type == CONSUMER_PROTOCOL_TYPE else {})
            what = " ".join(f"{t}-{','.join(map(str, sorted(ps)))}"
                            for t, ps in sorted(topics.items()) if ps)
            parts.append(f"{member.member_id}: {what or f'{len(member.assignment)} bytes'}")
        return "; ".join(parts)

    # ---- offsets ----------------------------------------------------------------------

    def initialize_offsets(self, offsets: dict[TopicPartition, CachedOffset]) -> None:
        self.offsets.update(offsets)

    def prepare_offset_commit(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        self.pending_offset_commits.update(offsets)

    def on_offset_commit_append(self, tp: TopicPartition, record_offset: int,
                                offset: OffsetAndMetadata) -> None:
        """The commit's record reached its acks: it becomes the partition's offset unless a
        later record already did."""
        if tp in self.pending_offset_commits:
            cached = self.offsets.get(tp)
            if cached is None or cached.record_offset < record_offset:
                self.offsets[tp] = CachedOffset(record_offset, offset)
        if self.pending_offset_commits.get(tp) == offset:
            del self.pending_offset_commits[tp]

    def fail_pending_offset_write(self, tp: TopicPartition, offset: OffsetAndMetadata) -> None:
        if self.pending_offset_commits.get(tp) == offset:
            del self.pending_offset_commits[tp]

    # ---- transactional offsets (KIP-98, TxnOffsetCommit) ----------------------------------

    def prepare_txn_offset_commit(self, producer_id: int,
                                  offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        pending = self.pending_txn_offset_commits.setdefault(producer_id, {})
        for tp, offset in offsets.items():
            pending[tp] = CachedOffset(-1, offset)

    def on_txn_offset_commit_append(self, producer_id: int, tp: TopicPartition,
                                    record_offset: int, offset: OffsetAndMetadata) -> None:
        """The record is written; the offset waits for the transaction's marker."""
        pending = self.pending_txn_offset_commits.get(producer_id, {})
        if tp in pending and pending[tp].offset == offset:
            pending[tp] = CachedOffset(record_offset, offset)

    def fail_pending_txn_offset_commit(self, producer_id: int, tp: TopicPartition) -> None:
        pending = self.pending_txn_offset_commits.get(producer_id)
        if pending is not None:
            pending.pop(tp, None)
            if not pending:
                del self.pending_txn_offset_commits[producer_id]

    def complete_pending_txn_offset_commit(self, producer_id: int, is_commit: bool) -> None:
        """Kafka's ``completePendingTxnOffsetCommit``: on COMMIT the producer's offsets
        become the group's, each unless a later record already is; on ABORT they go."""
        pending = self.pending_txn_offset_commits.pop(producer_id, {})
        if not is_commit:
            return
        for tp, cached in pending.items():
            current = self.offsets.get(tp)
            if cached.record_offset >= 0 and (current is None
                                              or current.record_offset < cached.record_offset):
                self.offsets[tp] = cached

    def has_pending_offset_commits(self, tp: TopicPartition) -> bool:
        """A commit of ``tp`` in flight, plain or in an open transaction (OffsetFetch's
        require_stable answers UNSTABLE_OFFSET_COMMIT meanwhile, KIP-447)."""
        return tp in self.pending_offset_commits or any(
            tp in pending for pending in self.pending_txn_offset_commits.values())

    def offset(self, tp: TopicPartition) -> OffsetAndMetadata | None:
        cached = self.offsets.get(tp)
        return cached.offset if cached is not None else None
