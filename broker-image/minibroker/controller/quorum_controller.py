"""The controller's state machine (KRaft's role, one voter).

It is the source of truth for broker liveness (registration, heartbeats, fencing), for
every partition's leader, leader epoch, ISR and partition epoch, and for the producer ids
that brokers hand out to idempotent producers. It is plain Python with an injected clock so
that tests can drive it step by step; ``controller.server`` puts it on the network. Every
change is persisted (fsync) before the caller is answered, so a controller restart loses
nothing. Fencing, unfencing, the ISR changes fencing makes and every election are also
recorded as replication events (``minibroker.events``).

Long (about 800 lines) as Kafka's ``QuorumController`` is: one state machine whose every
change (registration, heartbeat, fencing, AlterPartition, topic creation and deletion, new
partitions, producer ids) is applied and persisted in one place; the rules it applies live
beside it (``partition_change``, ``replica_placement``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from minibroker import environment
from minibroker.cluster.types import (
    NO_LEADER,
    BrokerEndpoint,
    ErrorCode,
    LeaderRecoveryState,
    MetadataDelta,
    MetadataImage,
    NewPartitions,
    PartitionRegistration,
    TopicDeletion,
    TopicImage,
    TopicPartition,
)
from minibroker.config import ConfigError, resolve, validate_topic_config
from minibroker.controller.metadata_deltas import MetadataDeltaLog, TopicState
from minibroker.controller.partition_change import PartitionChange, build_change
from minibroker.controller.replica_placement import (
    InvalidAssignment,
    place,
    validate_manual_assignment,
)
from minibroker.events import (
    ElectionKind,
    ElectionReason,
    ElrChangeReason,
    EventType,
    FenceReason,
    IsrChangeReason,
    ReplicationEventLog,
)
from minibroker.fsutil import atomic_write

log = logging.getLogger("minibroker.controller")

STATE_FILE = "controller-state.json"
PRODUCER_ID_BLOCK_SIZE = 1000  # Kafka's ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE
MAX_PARTITIONS_PER_BATCH = 10_000
"""Kafka's ``ReplicationControlManager.MAX_PARTITIONS_PER_BATCH`` (CreateTopics, KAFKA-14996)
and ``QuorumController.MAX_RECORDS_PER_USER_OP`` (CreatePartitions): the most partitions one
request may create. Without it, a request for 10,001 partitions fenced every broker of a
3-broker cluster over and over."""
EXCESSIVE_BATCH = "Unable to perform excessively large batch operation."
"""The message of the POLICY_VIOLATION Kafka's ``EventHandlerExceptionInfo`` gives an
operation over ``MAX_RECORDS_PER_USER_OP`` records."""


class DuplicateBrokerRegistration(Exception):
    """Kafka's DuplicateBrokerRegistrationException: a new incarnation of a broker whose
    registered one still has a valid session."""


@dataclass
class BrokerRegistration:
    """KRaft's BrokerRegistration. ``broker_epoch`` is the metadata offset of the registration
    record: each (re)start of a broker gets a larger one, so requests of an earlier
    incarnation can be told apart."""

    broker_id: int
    incarnation_id: str
    host: str
    port: int
    fenced: bool
    broker_epoch: int
    last_heartbeat_ms: float | None = None
    """When this registration (its broker epoch) last heartbeat: its session, as Kafka's
    ``BrokerHeartbeatTracker`` keeps a contact time per broker id and epoch. None until the
    first heartbeat, and once fenced by ``fence_broker`` (an expired session has none)."""
    listeners: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Its other listeners' advertised addresses, by name (KIP-103)."""
    registration_offset: int = -1
    """The metadata offset of its latest registration record (Kafka's
    ``registerBrokerRecordOffsets``): the broker epoch, or later when the same incarnation
    registered again. A fenced broker is unfenced once it has caught up with it."""
    max_heartbeat_gap_ms: float = 0.0
    """The longest time between two heartbeats of this registration: how close its session
    came to expiring (``broker.session.timeout.ms``), not persisted."""
    in_controlled_shutdown: bool = False
    """Kafka's ``BrokerRegistration.inControlledShutdown``: it asked to shut down while it
    led partitions; neither electable nor admitted to an ISR since (``isActive``)."""
    metadata_offset: int = -1
    """The metadata offset its last heartbeat reported (BrokerHeartbeatState), not
    persisted."""
    controlled_shutdown_offset: int = -1
    """BrokerHeartbeatState.controlledShutdownOffset: the metadata offset at which its
    controlled shutdown began, -1 when not shutting down; not persisted (Kafka keeps it in
    the active controller's BrokerHeartbeatManager only)."""


@dataclass(frozen=True)
class AlterPartitionItem:
    """One partition of an AlterPartition request (its ``PartitionData``)."""

    tp: TopicPartition
    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[int, ...]
    broker_epochs: tuple[int, ...] = ()
    """KIP-903 (AlterPartition v3): the broker epoch the leader saw each ``new_isr`` member
    fetch with, -1 where it does not know."""
    leader_recovery_state: LeaderRecoveryState = LeaderRecoveryState.RECOVERED
    """KIP-704: the leader's own recovery state (AlterPartition v1+)."""


@dataclass
class TopicRecord:
    name: str
    topic_id: str
    config: dict[str, str]
    partitions: dict[int, PartitionRegistration]


class _Refused(Exception):
    def __init__(self, error: ErrorCode, message: str | None = None) -> None:
        super().__init__(message)
        self.error, self.message = error, message


class QuorumController:
    """Broker registry plus partition state, with KRaft's election and AlterPartition rules."""

    def __init__(
        self,
        *,
        clock_ms: Callable[[], float],
        events: ReplicationEventLog,
        config: Mapping[str, str] | None = None,
        data_dir: Path | None = None,
    ) -> None:
        self._clock_ms = clock_ms
        self._events = events
        self.config = dict(config or {})
        self.data_dir = data_dir
        self.cluster_id = environment.new_uuid().hex[:22]
        self.brokers: dict[int, BrokerRegistration] = {}
        self.topics: dict[str, TopicRecord] = {}
        self.metadata_offset = 0
        self.next_producer_id = 0
        self.unclean_elections = 0
        self._last_rebalance_ms = clock_ms()
        self._listeners: list[Callable[[int], None]] = []
        if data_dir is not None:
            self._load()
        self._deltas = MetadataDeltaLog(self.metadata_offset, self._topic_states())

    # ---- listeners and persistence -------------------------------------------------

    def add_listener(self, listener: Callable[[int], None]) -> None:
        """Called with the new metadata offset after every committed change."""
        self._listeners.append(listener)

    def _commit(self) -> None:
        self.metadata_offset += 1
        self._deltas.record(self._topic_states())
        self._persist()
        for listener in self._listeners:
            listener(self.metadata_offset)

    def _persist(self) -> None:
        if self.data_dir is None:
            return
        state = {
            "cluster_id": self.cluster_id,
            "metadata_offset": self.metadata_offset,
            "next_producer_id": self.next_producer_id,
            "brokers": [
                {"id": b.broker_id, "incarnation_id": b.incarnation_id, "host": b.host,
                 "port": b.port, "fenced": b.fenced, "broker_epoch": b.broker_epoch,
                 "registration_offset": b.registration_offset,
                 "in_controlled_shutdown": b.in_controlled_shutdown,
                 "listeners": {name: list(address) for name, address in b.listeners.items()}}
                for b in self.brokers.values()
            ],
            "topics": [
                {"name": t.name, "topic_id": t.topic_id, "config": t.config,
                 "partitions": {str(p): reg.to_json() for p, reg in t.partitions.items()}}
                for t in self.topics.values()
            ],
        }
        atomic_write(self.data_dir / STATE_FILE, json.dumps(state, separators=(",", ":")).encode())

    def _load(self) -> None:
        assert self.data_dir is not None
        path = self.data_dir / STATE_FILE
        if not path.exists():
            return
        state = json.loads(path.read_text())
        self.cluster_id = state["cluster_id"]
        self.metadata_offset = state["metadata_offset"]
        self.next_producer_id = state.get("next_producer_id", 0)  # absent before idempotence
        now = self._clock_ms()
        # Every unfenced broker gets a full session from the controller's restart to heartbeat
        # again; a fenced one has none (ClusterControlManager.activate).
        self.brokers = {
            b["id"]: BrokerRegistration(
                b["id"], b["incarnation_id"], b["host"], b["port"], b["fenced"],
                b.get("broker_epoch", -1), None if b["fenced"] else now,
                {name: (host, port) for name, (host, port) in b.get("listeners", {}).items()},
                b.get("registration_offset", b.get("broker_epoch", -1)),
                in_controlled_shutdown=b.get("in_controlled_shutdown", False))
            for b in state["brokers"]
        }
        self.topics = {
            t["name"]: TopicRecord(
                t["name"], t["topic_id"], t["config"],
                {int(p): PartitionRegistration.from_json(r) for p, r in t["partitions"].items()},
            )
            for t in state["topics"]
        }
        log.info("Loaded controller state at metadata offset %d", self.metadata_offset)

    # ---- brokers ---------------------------------------------------------------------

    def _session_timeout_ms(self) -> int:
        return resolve("broker.session.timeout.ms", self.config)

    def is_live(self, broker_id: int) -> bool:
        """ClusterControlManager.isActive: registered, unfenced and not in controlled
        shutdown: one that may lead, join an ISR or be given a new replica."""
        broker = self.brokers.get(broker_id)
        return broker is not None and not broker.fenced and not broker.in_controlled_shutdown

    def has_valid_session(self, broker_id: int) -> bool:
        """BrokerHeartbeatManager.hasValidSession for the broker's registered epoch: it has
        heartbeat within ``broker.session.timeout.ms`` (whether or not it is fenced: a broker
        fenced by its controlled shutdown keeps its session until it times out)."""
        broker = self.brokers.get(broker_id)
        return (broker is not None and broker.last_heartbeat_ms is not None
                and self._clock_ms() - broker.last_heartbeat_ms <= self._session_timeout_ms())

    def register_broker(self, broker_id: int, incarnation_id: str, host: str, port: int,
                        listeners: Mapping[str, tuple[str, int]] | None = None,
                        previous_broker_epoch: int = -1) -> int:
        """Kafka 4.2's ``ClusterControlManager.registerBroker``. A new incarnation (a new
        process start) is refused with DUPLICATE_BROKER_REGISTRATION while the registered one
        still has a valid session: the restarted broker retries until that session expires.
        Then it gets a new broker epoch and starts fenced; the old incarnation leaves every
        ISR and its leaderships move (``handleBrokerShutdown``). ``previous_broker_epoch`` is
        the epoch its clean shutdown recorded (-1: none): with ELR, a new incarnation whose
        previous epoch is not the one registered shut down uncleanly and leaves every ISR and
        ELR (KAFKA-15586; the partition changes of KAFKA-18106). The same incarnation
        registering again (its answer was lost) amends its registration and keeps its broker
        epoch and fenced state. Returns the broker epoch."""
        existing = self.brokers.get(broker_id)
        if existing is not None and existing.incarnation_id == incarnation_id:
            return self._amend_registration(existing, host, port, listeners)
        if existing is not None and self.has_valid_session(broker_id):
            raise DuplicateBrokerRegistration(
                f"Another broker is registered with broker id {broker_id} (incarnation "
                f"{existing.incarnation_id}, broker epoch {existing.broker_epoch}) and its "
                f"session has not expired; if the broker was restarted this resolves itself "
                f"once the session times out")
        if existing is not None and not existing.fenced:
            # Its session expired since the last tick, which has not fenced it yet.
            self._fence(broker_id, FenceReason.RESTARTED, "it restarted with a new incarnation")
        clean = existing is not None and existing.broker_epoch == previous_broker_epoch
        if existing is not None and not clean and self.elr_enabled:
            self._handle_unclean_shutdown(broker_id, previous_broker_epoch)
        broker_epoch = self.metadata_offset + 1  # the offset of this registration's record
        self.brokers[broker_id] = BrokerRegistration(
            broker_id, incarnation_id, host, port, fenced=True, broker_epoch=broker_epoch,
            listeners=dict(listeners or {}), registration_offset=broker_epoch,
        )
        log.info("Broker %d registered (incarnation %s, broker epoch %d%s) at %s:%d; fenced "
                 "until it catches up with the metadata", broker_id, incarnation_id,
                 broker_epoch, ", after a clean shutdown" if clean else "", host, port)
        self._commit()
        return broker_epoch

    def _amend_registration(self, broker: BrokerRegistration, host: str, port: int,
                            listeners: Mapping[str, tuple[str, int]] | None) -> int:
        """registerBroker's same-incarnation case: a new registration record with the same
        broker epoch, fenced state and session; its addresses are the request's."""
        broker.host, broker.port, broker.listeners = host, port, dict(listeners or {})
        broker.registration_offset = self.metadata_offset + 1
        log.info("Amending the registration of broker %d, incarnation %s; its broker epoch "
                 "remains %d", broker.broker_id, broker.incarnation_id, broker.broker_epoch)
        self._commit()
        return broker.broker_epoch

    def heartbeat(self, broker_id: int, broker_epoch: int, metadata_offset: int, *,
                  want_shut_down: bool = False) -> tuple[ErrorCode, bool]:
        """KRaft's BrokerHeartbeat (ReplicationControlManager.processBrokerHeartbeat, with
        BrokerHeartbeatManager.calculateNextBrokerState): keeps the session alive; unfences
        a fenced broker once its metadata offset has reached its registration record, so
        that it is elected or admitted to an ISR only with the current view of every
        partition; with ``want_shut_down``, takes the broker through its controlled shutdown
        (``_controlled_shutdown``). Returns (error, fenced); an unknown broker or an older
        epoch must register again. With ``want_shut_down`` the reply's shouldShutDown is
        ``fenced``: Kafka's SHUTDOWN_NOW is the one state that both fences and lets the
        broker stop, CONTROLLED_SHUTDOWN neither."""
        broker = self.brokers.get(broker_id)
        if broker is None:
            return ErrorCode.broker_id_not_registered, True
        if broker.broker_epoch != broker_epoch:
            return ErrorCode.stale_broker_epoch, True
        now = self._clock_ms()
        if broker.last_heartbeat_ms is not None:
            broker.max_heartbeat_gap_ms = max(broker.max_heartbeat_gap_ms,
                                              now - broker.last_heartbeat_ms)
        broker.last_heartbeat_ms = now
        if broker.fenced:
            if not want_shut_down and metadata_offset >= broker.registration_offset:
                self._unfence(broker_id)
        elif want_shut_down:
            self._controlled_shutdown(broker)
        broker.metadata_offset = metadata_offset
        return ErrorCode.none, broker.fenced

    def _controlled_shutdown(self, broker: BrokerRegistration) -> None:
        """An unfenced broker wants to shut down (calculateNextBrokerState's UNFENCED and
        CONTROLLED_SHUTDOWN states). While it leads a partition it enters controlled
        shutdown: out of every ISR, its leaderships moved by the election rules
        (ReplicationControlManager.handleBrokerInControlledShutdown), at the metadata offset
        that change commits at. It may stop (SHUTDOWN_NOW: fenced, handleBrokerFenced) once
        it leads nothing and every active broker has reached that offset
        (lowestActiveOffset), so the new leaders know they lead before the old one goes."""
        leads = self._has_leaderships(broker.broker_id)
        if broker.controlled_shutdown_offset < 0:
            if leads:
                self._enter_controlled_shutdown(broker)
                return
        elif leads or broker.controlled_shutdown_offset > self._lowest_active_offset():
            return
        self._fence(broker.broker_id, FenceReason.CONTROLLED_SHUTDOWN,
                    "its controlled shutdown was granted")
        self._commit()

    def _enter_controlled_shutdown(self, broker: BrokerRegistration) -> None:
        broker_id = broker.broker_id
        log.info("Broker %d has requested and been granted a controlled shutdown: moving its "
                 "leaderships and removing it from every ISR", broker_id)
        broker.in_controlled_shutdown = True
        detail = f"broker {broker_id} is in controlled shutdown"
        self._remove_from_every_isr(broker_id, IsrChangeReason.CONTROLLED_SHUTDOWN,
                                    ElectionReason.CONTROLLED_SHUTDOWN, detail,
                                    f"leader {detail}")
        self._commit()
        broker.controlled_shutdown_offset = self.metadata_offset

    def _has_leaderships(self, broker_id: int) -> bool:
        """BrokersToIsrs.hasLeaderships."""
        return any(reg.leader == broker_id for topic in self.topics.values()
                   for reg in topic.partitions.values())

    def _lowest_active_offset(self) -> float:
        """BrokerHeartbeatManager.lowestActiveOffset: the lowest metadata offset an active
        broker (unfenced, not shutting down) has reported; infinite with none."""
        return min((b.metadata_offset for b in self.brokers.values()
                    if not b.fenced and b.controlled_shutdown_offset < 0), default=float("inf"))

    def tick(self) -> None:
        """Fence every broker whose session expired; now and then, restore preferred leaders."""
        now = self._clock_ms()
        if (resolve("auto.leader.rebalance.enable", self.config) and now - self._last_rebalance_ms
                >= resolve("leader.imbalance.check.interval.ms", self.config)):
            self._last_rebalance_ms = now
            self._elect_preferred_leaders()
        timeout = self._session_timeout_ms()
        expired = [
            b.broker_id for b in self.brokers.values()
            if not b.fenced and not self.has_valid_session(b.broker_id)
        ]
        for broker_id in expired:
            self._fence(broker_id, FenceReason.SESSION_EXPIRED,
                        f"its session expired ({timeout} ms without heartbeat)")
        if expired:
            self._commit()

    def fence_broker(self, broker_id: int, detail: str) -> None:
        """Fence now, as an expired session would: how step-by-step tests fence a broker at
        an exact moment."""
        self.brokers[broker_id].last_heartbeat_ms = None
        if not self.brokers[broker_id].fenced:
            self._fence(broker_id, FenceReason.SESSION_EXPIRED, detail)
            self._commit()

    def _unfence(self, broker_id: int) -> None:
        broker = self.brokers[broker_id]
        log.info("Unfencing broker %d (broker epoch %d): it has caught up with the metadata",
                 broker_id, broker.broker_epoch)
        broker.fenced = False
        self._events.emit(EventType.BROKER_UNFENCED, broker=broker_id,
                          broker_epoch=broker.broker_epoch)
        self._elect_offline_partitions(f"broker {broker_id} was unfenced")
        self._commit()

    def _fence(self, broker_id: int, reason: FenceReason, detail: str) -> None:
        """handleBrokerFenced: out of every ISR, its leaderships moved. A fenced broker leaves
        controlled shutdown (BrokerHeartbeatManager.touch)."""
        broker = self.brokers[broker_id]
        log.log(logging.INFO if reason == FenceReason.CONTROLLED_SHUTDOWN else logging.WARNING,
                "Fencing broker %d because %s", broker_id, detail)
        broker.fenced = True
        broker.controlled_shutdown_offset = -1
        self._events.emit(EventType.BROKER_FENCED, broker=broker_id,
                          broker_epoch=broker.broker_epoch, reason=reason, detail=detail)
        self._remove_from_every_isr(broker_id, IsrChangeReason.FENCED,
                                    ElectionReason.LEADER_FENCED,
                                    f"broker {broker_id} was fenced because {detail}",
                                    f"leader {broker_id} was fenced because {detail}")

    def _remove_from_every_isr(self, broker_id: int, isr_reason: IsrChangeReason,
                               election_reason: ElectionReason, cause: str,
                               election_cause: str) -> None:
        """generateLeaderAndIsrUpdates with ``brokerToRemove``: out of every ISR it is in,
        and never an acceptable leader, so each partition it led elects another."""
        for topic in self.topics.values():
            for index, reg in list(topic.partitions.items()):
                if broker_id in reg.isr:
                    self._change(topic, index, target_isr=set(reg.isr) - {broker_id},
                                 acceptable=lambda r: r != broker_id and self.is_live(r),
                                 isr_reason=isr_reason, election_reason=election_reason,
                                 cause=cause, election_cause=election_cause,
                                 broker=broker_id)

    def _handle_unclean_shutdown(self, broker_id: int, previous_broker_epoch: int) -> None:
        """ReplicationControlManager.handleBrokerUncleanShutdown: the broker restarted
        without a clean shutdown (its previous epoch is unknown or stale), so its log may
        lack what it acknowledged; it leaves every ISR and ELR and cannot lead on the way."""
        log.warning("Broker %d restarted without a clean shutdown (previous broker epoch %d, "
                    "registered %d): removing it from every ISR and ELR", broker_id,
                    previous_broker_epoch, self.brokers[broker_id].broker_epoch)
        for topic in self.topics.values():
            for index, reg in list(topic.partitions.items()):
                if broker_id in reg.isr or broker_id in reg.elr:
                    self._change(topic, index, target_isr=set(reg.isr) - {broker_id},
                                 acceptable=lambda r: r != broker_id and self.is_live(r),
                                 unclean_shutdown=(broker_id,),
                                 isr_reason=IsrChangeReason.UNCLEAN_SHUTDOWN,
                                 election_reason=ElectionReason.UNCLEAN_SHUTDOWN,
                                 cause=f"broker {broker_id} restarted without a clean shutdown",
                                 broker=broker_id)

    # ---- leader election ---------------------------------------------------------------

    @property
    def elr_enabled(self) -> bool:
        """``eligible.leader.replicas.version`` 1: Kafka 4.1+'s rules (KIP-966)."""
        return resolve("eligible.leader.replicas.version", self.config) == "1"

    def _unclean_enabled(self, topic: TopicRecord) -> bool:
        return resolve("unclean.leader.election.enable", topic.config, self.config)

    def _min_isr(self, topic: TopicRecord) -> int:
        return resolve("min.insync.replicas", topic.config, self.config)

    def _change(self, topic: TopicRecord, index: int, *, target_isr: set[int] | tuple[int, ...],
                acceptable: Callable[[int], bool], isr_reason: IsrChangeReason,
                election_reason: ElectionReason, cause: str, broker: int | None = None,
                unclean_shutdown: tuple[int, ...] = (), isr_logged_by_leader: bool = False,
                election_cause: str | None = None,
                target_recovery_state: LeaderRecoveryState | None = None) -> PartitionChange:
        """Apply ``build_change`` to one partition and log what changed: the ISR (unless
        the leader that asked for it logs it), the ELR, the leader. ``cause`` says why, for
        the log and the events."""
        reg = topic.partitions[index]
        change = build_change(reg, target_isr=target_isr, min_isr=self._min_isr(topic),
                              is_acceptable_leader=acceptable, elr_enabled=self.elr_enabled,
                              unclean_enabled=self._unclean_enabled(topic),
                              unclean_shutdown=unclean_shutdown,
                              target_recovery_state=target_recovery_state)
        after, kind = change.registration, change.election
        tp = TopicPartition(topic.name, index)
        rewritten_by_election = kind in (ElectionKind.ELR, ElectionKind.UNCLEAN,
                                         ElectionKind.LAST_KNOWN_LEADER)
        if after.isr != reg.isr and not rewritten_by_election and not isr_logged_by_leader:
            log.info("[Partition %s epoch=%d] ISR updated from %s to %s: %s", tp,
                     reg.leader_epoch, list(reg.isr), list(after.isr), cause)
            self._events.emit(
                EventType.ISR_CHANGE, topic=tp.topic, partition=tp.partition,
                leader_epoch=reg.leader_epoch, broker=broker, old_isr=list(reg.isr),
                isr=list(after.isr), reason=isr_reason, detail=cause)
        if change.elr_changed(reg):
            self._emit_elr_change(tp, reg, change, broker, unclean_shutdown,
                                  self._min_isr(topic), cause)
        if kind is not None:
            detail = f"{self._election_detail(reg, after, kind)}: {election_cause or cause}"
            log.log(logging.INFO if kind in (ElectionKind.CLEAN, ElectionKind.ELR)
                    else logging.WARNING, "[Partition %s] %s", tp, detail)
            if kind in (ElectionKind.UNCLEAN, ElectionKind.LAST_KNOWN_LEADER):
                self.unclean_elections += 1
            # The ISR the leader was chosen from: the target (without ELR an empty target
            # leaves the last member in place).
            chosen_from = tuple(r for r in reg.replicas if r in target_isr)
            if not chosen_from and not self.elr_enabled:
                chosen_from = reg.isr
            self._emit_election(tp, replace(reg, isr=chosen_from), after.leader, kind,
                                election_reason, detail)
        if after.leader_recovery_state != reg.leader_recovery_state:
            self._emit_leader_recovery(tp, after, broker if kind is None else after.leader)
        topic.partitions[index] = after
        return change

    @staticmethod
    def _election_detail(reg: PartitionRegistration, after: PartitionRegistration,
                         kind: ElectionKind) -> str:
        leader = after.leader
        if kind == ElectionKind.OFFLINE:
            elr = f" nor ELR member in {list(after.elr)}" if after.elr else ""
            return f"offline: no live ISR member in {list(reg.isr)}{elr}"
        if kind == ElectionKind.ELR:
            return (f"leader changed from {reg.leader} to {leader} at epoch "
                    f"{after.leader_epoch}, elected from the eligible leader replicas "
                    f"{list(reg.elr) or list(reg.isr)} with the ISR empty (KIP-966)")
        if kind == ElectionKind.LAST_KNOWN_LEADER:
            return (f"LAST KNOWN LEADER election: broker {leader} leads again at epoch "
                    f"{after.leader_epoch} as the leader the partition had when its ISR "
                    f"emptied, with the ISR and the ELR empty (KIP-966; Kafka counts it "
                    f"unclean); data may be lost")
        if kind == ElectionKind.UNCLEAN:
            return (f"UNCLEAN leader election: broker {leader} becomes leader without being "
                    f"in the ISR {list(reg.isr)}; data may be lost")
        return f"leader changed from {reg.leader} to {leader} at epoch {after.leader_epoch}"

    def _emit_elr_change(self, tp: TopicPartition, reg: PartitionRegistration,
                         change: PartitionChange, broker: int | None,
                         unclean_shutdown: tuple[int, ...], min_isr: int, cause: str) -> None:
        after, kind = change.registration, change.election
        if kind in (ElectionKind.ELR, ElectionKind.LAST_KNOWN_LEADER):
            reason = ElrChangeReason.ELECTED
        elif kind == ElectionKind.UNCLEAN:
            reason = ElrChangeReason.UNCLEAN_ELECTION
        elif unclean_shutdown:
            reason = ElrChangeReason.UNCLEAN_SHUTDOWN
        elif len(after.isr) >= min_isr:
            reason = ElrChangeReason.ISR_AT_MIN
        else:
            reason = ElrChangeReason.ISR_BELOW_MIN
        self._emit_elr(tp, reg, after, reason, broker, cause)

    def _emit_elr(self, tp: TopicPartition, reg: PartitionRegistration,
                  after: PartitionRegistration, reason: ElrChangeReason, broker: int | None,
                  cause: str) -> None:
        detail = (f"ELR {list(reg.elr)} -> {list(after.elr)}, last known leader "
                  f"{list(reg.last_known_elr)} -> {list(after.last_known_elr)}: {cause}")
        log.info("[Partition %s] %s", tp, detail)
        self._events.emit(EventType.ELR_CHANGE, topic=tp.topic, partition=tp.partition,
                          leader_epoch=after.leader_epoch, broker=broker,
                          old_elr=list(reg.elr), elr=list(after.elr),
                          last_known_elr=list(after.last_known_elr), reason=reason,
                          detail=detail)

    def _emit_election(self, tp: TopicPartition, reg: PartitionRegistration, leader: int,
                       kind: ElectionKind, reason: ElectionReason, detail: str) -> None:
        """``reg`` is the registration the leader was chosen from (its ISR, its leader)."""
        self._events.emit(EventType.LEADER_ELECTION, topic=tp.topic, partition=tp.partition,
                          leader_epoch=reg.leader_epoch + 1, leader=leader,
                          previous_leader=reg.leader, kind=kind, isr=list(reg.isr),
                          reason=reason, detail=detail)

    def _emit_leader_recovery(self, tp: TopicPartition, after: PartitionRegistration,
                              broker: int | None) -> None:
        """KIP-704: the partition became RECOVERING (an unclean election) or RECOVERED (its
        leader said so in an AlterPartition)."""
        state = after.leader_recovery_state
        detail = (f"leader {after.leader} was elected uncleanly: RECOVERING, the ISR stays "
                  "the leader alone until the leader says it has recovered"
                  if state is LeaderRecoveryState.RECOVERING else
                  f"leader {after.leader} has recovered from the unclean election")
        log.info("[Partition %s] %s", tp, detail)
        self._events.emit(
            EventType.LEADER_RECOVERY, topic=tp.topic, partition=tp.partition,
            leader_epoch=after.leader_epoch, broker=broker, leader=after.leader,
            leader_recovery_state=state.name, isr=list(after.isr), detail=detail)

    def _elect_preferred_leaders(self) -> None:
        """Kafka's auto leader rebalance: the first replica leads again once it is in sync."""
        changed = False
        for topic in self.topics.values():
            for index, reg in list(topic.partitions.items()):
                preferred = reg.replicas[0]
                if reg.leader != preferred and preferred in reg.isr and self.is_live(preferred):
                    detail = (f"preferred leader election: leader changed from {reg.leader} to "
                              f"{preferred} at epoch {reg.leader_epoch + 1}")
                    log.info("[Partition %s-%d] %s", topic.name, index, detail)
                    self._emit_election(TopicPartition(topic.name, index), reg, preferred,
                                        ElectionKind.PREFERRED, ElectionReason.PREFERRED, detail)
                    topic.partitions[index] = replace(
                        reg, leader=preferred, leader_epoch=reg.leader_epoch + 1,
                        partition_epoch=reg.partition_epoch + 1)
                    changed = True
        if changed:
            self._commit()

    def _elect_offline_partitions(self, cause: str) -> None:
        """handleBrokerUnfenced: every partition without a leader tries an election."""
        for topic in self.topics.values():
            for index, reg in list(topic.partitions.items()):
                if reg.leader == NO_LEADER:
                    self._change(topic, index, target_isr=reg.isr, acceptable=self.is_live,
                                 isr_reason=IsrChangeReason.CAUGHT_UP,
                                 election_reason=ElectionReason.BROKER_UNFENCED, cause=cause)

    # ---- topics -----------------------------------------------------------------------

    def create_topic(self, name: str, num_partitions: int, replication_factor: int,
                     config: Mapping[str, str]) -> tuple[ErrorCode, str | None]:
        if name in self.topics:
            return ErrorCode.topic_already_exists, f"Topic '{name}' already exists."
        # CreateTopics v4+ sends -1 for "the broker's default".
        if num_partitions == -1:
            num_partitions = resolve("num.partitions", self.config)
        if replication_factor == -1:
            replication_factor = resolve("default.replication.factor", self.config)
        if not name or len(name) > 249 or not all(c.isalnum() or c in "._-" for c in name):
            return ErrorCode.invalid_topic_exception, f"Invalid topic name {name!r}."
        if num_partitions < 1:
            return ErrorCode.invalid_partitions, "Number of partitions must be at least 1."
        live = sorted(b for b in self.brokers if self.is_live(b))
        if replication_factor < 1 or replication_factor > len(live):
            return (ErrorCode.invalid_replication_factor,
                    f"Replication factor {replication_factor} needs that many live brokers;"
                    f" {len(live)} available.")
        try:
            validate_topic_config(config)
        except ConfigError as exc:
            return ErrorCode.invalid_config, str(exc)
        partitions = {index: _new_registration(replicas, replicas) for index, replicas
                      in enumerate(place(live, 0, num_partitions, replication_factor))}
        self.topics[name] = TopicRecord(name, environment.new_uuid().hex, dict(config), partitions)
        log.info("Created topic %s with %d partitions, replication factor %d, config %s",
                 name, num_partitions, replication_factor, dict(config))
        self._commit()
        return ErrorCode.none, None

    def alter_topic_config(self, name: str, changes: Mapping[str, str | None],
                           validate_only: bool = False) -> tuple[ErrorCode, str | None]:
        """IncrementalAlterConfigs on a topic: each key set (a value) or deleted (None).
        With ELR, a change of the topic's min.insync.replicas clears its ELR and last known
        leaders: eligibility was earned against the old minimum. A change is what Kafka 4.2's
        ``ConfigurationControlManager.incrementalAlterConfigResource`` writes a ConfigRecord
        for: the topic's own value (its override, not the effective one) differs after the
        request, so a SET to the value it has, or a DELETE of an override it does not have,
        writes nothing and clears nothing (``createClearElrRecordsAsNeeded`` reads only the
        records written)."""
        topic = self.topics.get(name)
        if topic is None:
            return ErrorCode.unknown_topic_or_partition, f"Topic '{name}' does not exist."
        config = dict(topic.config)
        for key, value in changes.items():
            if value is None:
                config.pop(key, None)
            else:
                config[key] = value
        try:
            validate_topic_config(config)
        except ConfigError as exc:
            return ErrorCode.invalid_config, str(exc)
        if validate_only:
            return ErrorCode.none, None
        topic_min_isr = topic.config.get("min.insync.replicas")
        topic.config = config
        log.info("Topic %s config is now %s", name, config)
        if self.elr_enabled and config.get("min.insync.replicas") != topic_min_isr:
            for index, reg in list(topic.partitions.items()):
                if reg.elr or reg.last_known_elr:
                    after = replace(reg, elr=(), last_known_elr=(),
                                    partition_epoch=reg.partition_epoch + 1)
                    self._emit_elr(TopicPartition(name, index), reg, after,
                                   ElrChangeReason.MIN_ISR_CHANGED, None,
                                   f"min.insync.replicas of {name} was set")
                    topic.partitions[index] = after
        self._commit()
        return ErrorCode.none, None

    def delete_topics(self, names: Collection[str], topic_ids: Collection[str]
                      ) -> list[TopicDeletion]:
        """DeleteTopics, as Kafka 4.2's ``ControllerApis.deleteTopics`` resolves its names
        and ids (``findTopicIds``, ``findTopicNames``) and
        ``ReplicationControlManager.deleteTopics`` removes them: one RemoveTopicRecord per
        topic, all committed at once. An unknown name is UNKNOWN_TOPIC_OR_PARTITION, an
        unknown id UNKNOWN_TOPIC_ID, a name whose id was also given INVALID_REQUEST (and,
        as in Kafka, that id gets no answer of its own). Internal topics are deleted like
        any other, as Kafka does for a client allowed to. Each broker drops the topic's
        replicas and logs once its metadata no longer has it (``ReplicaManager``). With
        ``delete.topic.enable`` false every topic is TOPIC_DELETION_DISABLED."""
        if not resolve("delete.topic.enable", self.config):
            return [TopicDeletion(name, topic_id, ErrorCode.topic_deletion_disabled)
                    for name, topic_id in [*((n, None) for n in names),
                                           *((None, i) for i in topic_ids)]]
        by_id = {t.topic_id: t for t in self.topics.values()}
        results: list[TopicDeletion] = []
        doomed: dict[str, str] = {}  # topic id -> name
        for topic_id in topic_ids:
            topic = by_id.get(topic_id)
            if topic is None:
                results.append(TopicDeletion(None, topic_id, ErrorCode.unknown_topic_id,
                                             "This server does not host this topic ID."))
            else:
                doomed[topic_id] = topic.name
        for name in names:
            topic = self.topics.get(name)
            if topic is None:
                results.append(TopicDeletion(name, None, ErrorCode.unknown_topic_or_partition,
                                             "This server does not host this "
                                             "topic-partition."))
            elif topic.topic_id in doomed:
                del doomed[topic.topic_id]
                results.append(TopicDeletion(
                    name, topic.topic_id, ErrorCode.invalid_request,
                    "The provided topic name maps to an ID that was already supplied."))
            else:
                doomed[topic.topic_id] = name
        for topic_id, name in doomed.items():
            del self.topics[name]
            results.append(TopicDeletion(name, topic_id, ErrorCode.none))
        if doomed:
            log.info("DeleteTopics result(s): %s", ", ".join(
                f"{{id: {topic_id}, name: {name}, result: SUCCESS}}"
                for topic_id, name in doomed.items()))
            self._commit()
        return results

    def create_partitions(self, requests: Sequence[NewPartitions], validate_only: bool = False
                          ) -> list[tuple[ErrorCode, str | None]]:
        """CreatePartitions, as Kafka 4.2's ``ReplicationControlManager.createPartitions``:
        each topic grows to its new count, the new partitions placed over the live brokers
        with the topic's replication factor (or where ``assignments`` says, checked as
        ``validateManualPartitionAssignment``), each led by the first live replica, all
        committed at once. Errors are per topic; a request that would add more than
        ``MAX_PARTITIONS_PER_BATCH`` partitions in all is refused whole, before anything is
        placed (Kafka's ``BoundedList`` of ``MAX_RECORDS_PER_USER_OP`` records).
        ``validate_only`` answers without changing anything."""
        additions: list[int | _Refused] = []
        for request in requests:
            try:
                additions.append(self._additional_partitions(request))
            except _Refused as refused:
                additions.append(refused)
        if sum(a for a in additions if isinstance(a, int)) > MAX_PARTITIONS_PER_BATCH:
            return [(ErrorCode.policy_violation, EXCESSIVE_BATCH)] * len(requests)
        results: list[tuple[ErrorCode, str | None]] = []
        grown: list[tuple[TopicRecord, dict[int, PartitionRegistration]]] = []
        for request, additional in zip(requests, additions, strict=True):
            try:
                if isinstance(additional, _Refused):
                    raise additional
                topic = self.topics[request.name]
                grown.append((topic, self._place_new_partitions(topic, request, additional)))
                results.append((ErrorCode.none, None))
            except _Refused as refused:
                results.append((refused.error, refused.message))
        if validate_only or not grown:
            return results
        for topic, added in grown:
            topic.partitions.update(added)
            log.info("Topic %s now has %d partitions (added %s)", topic.name,
                     len(topic.partitions), {i: list(r.replicas) for i, r in added.items()})
        self._commit()
        return results

    def _additional_partitions(self, request: NewPartitions) -> int:
        topic = self.topics.get(request.name)
        if topic is None:  # an UnknownTopicOrPartitionException without a message
            raise _Refused(ErrorCode.unknown_topic_or_partition)
        current = len(topic.partitions)
        if request.count == current:
            raise _Refused(ErrorCode.invalid_partitions,
                           f"Topic already has {current} partition(s).")
        if request.count < current:
            raise _Refused(ErrorCode.invalid_partitions,
                           f"The topic {request.name} currently has {current} partition(s); "
                           f"{request.count} would not be an increase.")
        additional = request.count - current
        if request.assignments is not None and len(request.assignments) != additional:
            raise _Refused(ErrorCode.invalid_replica_assignment,
                           f"Attempted to add {additional} additional partition(s), but only "
                           f"{len(request.assignments)} assignment(s) were specified.")
        return additional

    def _place_new_partitions(self, topic: TopicRecord, request: NewPartitions,
                              additional: int) -> dict[int, PartitionRegistration]:
        start = len(topic.partitions)
        replication_factor = len(next(iter(topic.partitions.values())).replicas)
        if request.assignments is None:
            live = sorted(b for b in self.brokers if self.is_live(b))
            if replication_factor > len(live):
                raise _Refused(ErrorCode.invalid_replication_factor,
                               f"Unable to replicate the partition {replication_factor} "
                               f"time(s): only {len(live)} broker(s) are live.")
            return {start + i: _new_registration(replicas, replicas) for i, replicas
                    in enumerate(place(live, start, additional, replication_factor))}
        added = {}
        for i, replicas in enumerate(request.assignments):
            try:
                validate_manual_assignment(replicas, replication_factor,
                                           lambda b: b in self.brokers)
            except InvalidAssignment as exc:
                raise _Refused(ErrorCode.invalid_replica_assignment, str(exc)) from None
            isr = tuple(r for r in replicas if self.is_live(r))
            if not isr:
                raise _Refused(ErrorCode.invalid_replica_assignment,
                               f"All brokers specified in the manual partition assignment "
                               f"for partition {start + i} are fenced or in controlled "
                               f"shutdown.")
            added[start + i] = _new_registration(tuple(replicas), isr)
        return added

    # ---- producer ids -----------------------------------------------------------------

    def allocate_producer_ids(self, broker_id: int, broker_epoch: int
                              ) -> tuple[ErrorCode, int, int]:
        """Kafka's AllocateProducerIds: (error, first id, count) of a block that no broker,
        nor an earlier incarnation of this one, was given. The new high-water mark is
        persisted before the block leaves, so a controller restart cannot hand it out again."""
        broker = self.brokers.get(broker_id)
        if broker is None:
            return ErrorCode.broker_id_not_registered, -1, 0
        if broker.broker_epoch != broker_epoch:
            return ErrorCode.stale_broker_epoch, -1, 0
        start = self.next_producer_id
        self.next_producer_id += PRODUCER_ID_BLOCK_SIZE
        self._persist()
        log.info("Allocated producer ids %d-%d to broker %d", start,
                 self.next_producer_id - 1, broker_id)
        return ErrorCode.none, start, PRODUCER_ID_BLOCK_SIZE

    # ---- AlterPartition -------------------------------------------------------------

    def alter_partition(self, broker_id: int, tp: TopicPartition, leader_epoch: int,
                        partition_epoch: int, new_isr: tuple[int, ...],
                        broker_epochs: tuple[int, ...] = ()
                        ) -> tuple[ErrorCode, PartitionRegistration | None]:
        """A leader's ISR change, accepted only against the current partition epoch.
        ``broker_epochs`` (KIP-903, AlterPartition v3) pairs with ``new_isr``: the broker
        epoch the leader saw each member fetch with, -1 where it does not know."""
        ((error, reg),) = self.alter_partitions(broker_id, [
            AlterPartitionItem(tp, leader_epoch, partition_epoch, new_isr, broker_epochs)])
        return error, reg

    def alter_partitions(self, broker_id: int, items: list[AlterPartitionItem]
                         ) -> list[tuple[ErrorCode, PartitionRegistration | None]]:
        """One AlterPartition request of many partitions (Kafka's AlterPartitionManager
        batches a leader's pending ISR changes): each item is checked and applied on its
        own, and the accepted changes are committed (persisted) once, together."""
        answers = [self._alter_partition(broker_id, item) for item in items]
        if any(error is ErrorCode.none for error, _ in answers):
            self._commit()
        return answers

    def _alter_partition(self, broker_id: int, item: AlterPartitionItem
                         ) -> tuple[ErrorCode, PartitionRegistration | None]:
        tp, leader_epoch, partition_epoch = item.tp, item.leader_epoch, item.partition_epoch
        new_isr, broker_epochs = item.new_isr, item.broker_epochs
        topic = self.topics.get(tp.topic)
        reg = topic.partitions.get(tp.partition) if topic else None
        if topic is None or reg is None:
            return ErrorCode.unknown_topic_or_partition, None
        if reg.leader != broker_id:
            return ErrorCode.not_leader_or_follower, reg
        if leader_epoch < reg.leader_epoch:
            return ErrorCode.fenced_leader_epoch, reg
        if partition_epoch != reg.partition_epoch:
            return ErrorCode.invalid_update_version, reg
        if broker_id not in new_isr or not set(new_isr) <= set(reg.replicas):
            return ErrorCode.invalid_request, reg
        # KIP-704 (``validateAlterPartitionData``): a leader still recovering from an unclean
        # election keeps the ISR to itself, and a recovered partition never goes back.
        recovering = item.leader_recovery_state is LeaderRecoveryState.RECOVERING
        if recovering and len(new_isr) > 1:
            log.info("[Partition %s] AlterPartition from %d refused: the ISR %s has more than "
                     "the leader while it is still recovering from an unclean election", tp,
                     broker_id, list(new_isr))
            return ErrorCode.invalid_request, reg
        if recovering and reg.leader_recovery_state is LeaderRecoveryState.RECOVERED:
            log.info("[Partition %s] AlterPartition from %d refused: the leader recovery "
                     "state cannot change from RECOVERED to RECOVERING", tp, broker_id)
            return ErrorCode.invalid_request, reg
        # KRaft checks every member, kept or added: registered, unfenced, and (KIP-903) the
        # same registration the leader saw fetching.
        if any(not self.is_live(r) for r in new_isr):
            return ErrorCode.ineligible_replica, reg
        for r, epoch in zip(new_isr, broker_epochs, strict=False):
            if epoch != -1 and epoch != self.brokers[r].broker_epoch:
                log.info("[Partition %s] AlterPartition from %d refused: broker %d's epoch is "
                         "%d, not %d", tp, broker_id, r, self.brokers[r].broker_epoch, epoch)
                return ErrorCode.ineligible_replica, reg
        # Through the PartitionChangeBuilder, as Kafka's alterPartition: an ISR below min ISR
        # hands its leavers to the ELR, one at min ISR clears it.
        shrink = len(new_isr) < len(reg.isr)
        change = self._change(
            topic, tp.partition, target_isr=new_isr, acceptable=self.is_live,
            isr_reason=IsrChangeReason.LAG if shrink else IsrChangeReason.CAUGHT_UP,
            election_reason=ElectionReason.LEADER_FENCED, broker=broker_id,
            cause=f"leader {broker_id} changed the ISR to {sorted(new_isr)}",
            isr_logged_by_leader=True, target_recovery_state=item.leader_recovery_state)
        return ErrorCode.none, change.registration

    # ---- views ------------------------------------------------------------------------

    def _topic_states(self) -> list[TopicState]:
        return [(t.name, t.topic_id, t.config, t.partitions) for t in self.topics.values()]

    def metadata_since(self, since: int, cluster_id: str) -> MetadataImage | MetadataDelta:
        """What a broker whose image is at ``since`` needs: the changes after it (every
        live broker, and the topics and partitions that changed), or the whole image when
        the controller no longer knows them or the broker's image is of another cluster."""
        changed = (self._deltas.changes_since(since, self.metadata_offset)
                   if cluster_id == self.cluster_id else None)
        if changed is None:
            return self.image()
        deleted = frozenset(name for name in changed if name not in self.topics)
        return MetadataDelta(self.image(topics={name: partitions for name, partitions
                                                in changed.items() if name not in deleted}),
                             deleted_topics=deleted)

    def image(self, topics: Mapping[str, frozenset[int] | None] | None = None
              ) -> MetadataImage:
        """The current image; with ``topics``, only those topics, and of each only the
        given partitions (``None``: all)."""
        chosen = (self.topics.values() if topics is None
                  else [self.topics[name] for name in topics])
        return MetadataImage(
            metadata_offset=self.metadata_offset,
            cluster_id=self.cluster_id,
            brokers={
                b.broker_id: BrokerEndpoint(b.broker_id, b.host, b.port, b.broker_epoch,
                                            dict(b.listeners), b.in_controlled_shutdown)
                for b in self.brokers.values() if not b.fenced
            },
            topics={
                t.name: TopicImage(t.name, t.topic_id, dict(t.config), dict(
                    t.partitions if topics is None or topics[t.name] is None
                    else {i: t.partitions[i] for i in topics[t.name]}))
                for t in chosen
            },
        )

    def state(self) -> dict[str, Any]:
        """The controller's ``/v1/state`` document."""
        c = self
        return {
            "cluster_id": c.cluster_id,
            "metadata_offset": c.metadata_offset,
            "brokers": [
                {"id": b.broker_id, "host": b.host, "port": b.port, "fenced": b.fenced,
                 "broker_epoch": b.broker_epoch,
                 "max_heartbeat_gap_ms": round(b.max_heartbeat_gap_ms)}
                for b in sorted(c.brokers.values(), key=lambda b: b.broker_id)
            ],
            "topics": {
                t.name: {"config": t.config, "partitions": {
                    str(i): reg.to_json() for i, reg in sorted(t.partitions.items())}}
                for t in c.topics.values()
            },
            "eligible_leader_replicas_version": 1 if c.elr_enabled else 0,
            "offline_partitions": c.offline_partitions_count(),
            "unclean_elections": c.unclean_elections,
            "next_producer_id": c.next_producer_id,
        }

    def offline_partitions_count(self) -> int:
        return sum(
            1 for t in self.topics.values() for reg in t.partitions.values()
            if reg.leader == NO_LEADER
        )


def _new_registration(replicas: tuple[int, ...], isr: tuple[int, ...]) -> PartitionRegistration:
    """A new partition, as Kafka's ``buildPartitionRegistration``: led by its first ISR
    member, at leader and partition epoch 0."""
    return PartitionRegistration(replicas=replicas, isr=isr, leader=isr[0], leader_epoch=0,
                                 partition_epoch=0)
