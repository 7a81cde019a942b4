"""A step-by-step minibroker cluster in one process, for the tests that replay the seeds'
walkthroughs and the replication rules to the offset.

The same ``QuorumController``, ``ReplicaManager``, ``Partition`` and ``GroupCoordinator``
code as the real broker runs here on one manual clock (``manual_scheduler.py``), with "the
network" replaced by direct calls: a follower's fetch round, a controller tick, a crash or a
power loss happen exactly when the caller says, as Kafka's own ``ReplicaManagerTest`` and
``PartitionTest`` drive the replica manager without a fetcher thread. A fetch round drives
the follower-side steps the real ``ReplicaFetcher`` takes (``truncation_request``,
``on_epoch_answer``, ``build_follower_fetch``, ``on_follower_fetch``,
``on_follower_out_of_range``) in one call each, with no I/O between them: the rules are the
core's, the order the fetcher's. What runs the servers themselves, fetcher, handlers and
network included, is the simulator (``undertow.sim.cluster.SimulatedCluster``), where time
moves on its own. That makes the walkthroughs reproducible to the offset, and lets property
tests explore random fault sequences deterministically.

Every node (``controller``, ``broker-N``) writes its replication events to its data directory
under ``root`` as a real one does, stamped with the manual clock, and ``events()`` lists them
all in the order they happened, so tests assert them exactly.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from manual_scheduler import ManualScheduler

from minibroker.cluster.partition import AlterPartitionRequest, Partition
from minibroker.cluster.replica_manager import ReplicaManager
from minibroker.cluster.types import (
    ErrorCode,
    FetchRequestData,
    FetchResult,
    PartitionRegistration,
    ProduceResult,
    TopicPartition,
)
from minibroker.config import resolve
from minibroker.controller.quorum_controller import DuplicateBrokerRegistration, QuorumController
from minibroker.coordinator.group_coordinator import GroupCoordinator
from minibroker.events import ReplicationEventLog
from minibroker.storage.clean_shutdown import (
    NO_PREVIOUS_EPOCH,
    take_clean_shutdown,
    write_clean_shutdown,
)
from minibroker.storage.durability import DurabilityTracker
from minibroker.storage.records import build_batch, decode_values


@dataclass
class SendResult:
    """The outcome of one produce; ``result`` stays None while acks=all waits."""

    values: list[bytes]
    result: ProduceResult | None = None

    @property
    def done(self) -> bool:
        return self.result is not None

    @property
    def acknowledged(self) -> bool:
        return self.result is not None and self.result.error == ErrorCode.none


class _DirectAlterPartition:
    def __init__(self, sim: SimCluster, broker_id: int) -> None:
        self._sim = sim
        self._broker_id = broker_id

    def send(self, request: AlterPartitionRequest,
             on_response: Callable[[ErrorCode, PartitionRegistration | None], None]) -> None:
        self._sim.pending_alter_partitions.append((self._broker_id, request, on_response))
        if self._sim.auto_alter_partition:
            self._sim.deliver_alter_partitions()


@dataclass
class _FollowMap:
    following: dict[TopicPartition, int] = field(default_factory=dict)

    def follow(self, tp: TopicPartition, leader_id: int) -> None:
        self.following[tp] = leader_id

    def unfollow(self, tp: TopicPartition) -> None:
        self.following.pop(tp, None)


class SimCluster:
    def __init__(self, root: Path, brokers: int = 3, config: Mapping[str, str] | None = None,
                 *, auto_alter_partition: bool = True) -> None:
        self.root = root
        self.config = dict(config or {})
        self.scheduler = ManualScheduler()
        self._events: list[dict[str, Any]] = []
        self.controller = QuorumController(clock_ms=self.scheduler.now_ms,
                                           events=self._event_log("controller"),
                                           config=self.config)
        self.controller.add_listener(lambda _offset: self.propagate_metadata())
        self.auto_alter_partition = auto_alter_partition
        self.pending_alter_partitions: list[tuple[int, AlterPartitionRequest, Callable]] = []
        self.brokers: dict[int, ReplicaManager] = {}
        self.coordinators: dict[int, GroupCoordinator] = {}
        self._fetchers: dict[int, _FollowMap] = {}
        self._durability: dict[int, DurabilityTracker] = {}
        self._incarnations: dict[int, str] = {}
        self._broker_epochs: dict[int, int] = {}
        self._registering: dict[int, int] = {}
        """Brokers whose registration the controller refused, with the previous broker epoch
        their next attempt carries."""
        self.heartbeat_interval_ms: int = resolve("broker.heartbeat.interval.ms", self.config)
        for broker_id in range(1, brokers + 1):
            self.start(broker_id)

    # ---- events -----------------------------------------------------------------------

    def _event_log(self, node: str) -> ReplicationEventLog:
        def collect(event: dict[str, Any]) -> None:
            self._events.append({**event, "node": node})

        return ReplicationEventLog(self.root / node,
                                   clock=lambda: self.scheduler.now_ms() / 1000.0,
                                   on_event=collect)

    def events(self) -> list[dict[str, Any]]:
        """Every node's replication events so far, in the order they were logged, each with
        the ``node`` that logged it, as the harness adds it."""
        return list(self._events)

    # ---- processes ------------------------------------------------------------------

    def start(self, broker_id: int) -> ReplicaManager:
        """Start (or restart) a broker on its data directory; it registers at once."""
        durability = self._durability.setdefault(broker_id, DurabilityTracker())
        follow_map = _FollowMap()
        events = self._event_log(f"broker-{broker_id}")
        rm = ReplicaManager(
            broker_id, self.root / f"broker-{broker_id}", self.scheduler, config=self.config,
            alter_partition_sender=_DirectAlterPartition(self, broker_id),
            fetcher_manager=follow_map, events=events, durability=durability,
        )
        rm.start_timers()
        coordinator = GroupCoordinator(
            broker_id, self.scheduler, config=self.config, events=events,
            append=rm.append_records, local_partition=rm.partitions.get,
            metadata_image=rm.metadata_image, wall_clock_ms=self.scheduler.now_ms)
        rm.leadership_listeners.append(coordinator.on_leadership_change)
        self.coordinators[broker_id] = coordinator
        self.brokers[broker_id] = rm
        self._fetchers[broker_id] = follow_map
        self._incarnations[broker_id] = uuid.uuid4().hex
        self._registering.pop(broker_id, None)
        if self._register(broker_id, take_clean_shutdown(self.root / f"broker-{broker_id}")):
            self.heartbeat(broker_id)  # it has the metadata at once: unfenced
        return rm

    def _register(self, broker_id: int, previous_broker_epoch: int = NO_PREVIOUS_EPOCH) -> bool:
        """Register the broker's incarnation; False if the controller refused it because the
        previous incarnation's session lives (Kafka's DUPLICATE_BROKER_REGISTRATION): as the
        real broker does, it retries at each heartbeat (``advance``) until that expires."""
        try:
            epoch = self.controller.register_broker(
                broker_id, self._incarnations[broker_id], "sim", 9000 + broker_id,
                previous_broker_epoch=previous_broker_epoch)
        except DuplicateBrokerRegistration:
            self._registering[broker_id] = previous_broker_epoch
            return False
        self._registering.pop(broker_id, None)
        self._broker_epochs[broker_id] = epoch
        self.brokers[broker_id].apply_metadata(self.controller.image())
        return True

    def heartbeat(self, broker_id: int) -> None:
        """One BrokerHeartbeat with the broker's metadata offset; as the real broker's loop,
        it registers again when the controller no longer knows its broker epoch. A broker
        whose registration was refused tries it again first, and heartbeats at once if it is
        accepted (Kafka's BrokerLifecycleManager: "Immediately send a heartbeat")."""
        if broker_id in self._registering and not self._register(
                broker_id, self._registering[broker_id]):
            return
        rm = self.brokers[broker_id]
        error, _ = self.controller.heartbeat(broker_id, self._broker_epochs[broker_id],
                                             rm.image.metadata_offset)
        if error != ErrorCode.none:
            self._register(broker_id)

    def stop(self, broker_id: int) -> None:
        """A clean shutdown (SIGTERM): every log flushed, its recovery point checkpointed, and
        its broker epoch recorded for its next registration (KAFKA-15582). Without a
        controlled shutdown (``controlled.shutdown.enable=false``): the controller fences it
        once its session expires."""
        self._fetchers.pop(broker_id)
        self.coordinators.pop(broker_id).shutdown()
        self.brokers.pop(broker_id).shutdown()
        if self._registering.pop(broker_id, None) is None:  # its incarnation had an epoch
            write_clean_shutdown(self.root / f"broker-{broker_id}",
                                 self._broker_epochs[broker_id])

    def crash(self, broker_id: int, *, power_loss: bool = False) -> None:
        """kill -9 (page cache survives) or power loss (unflushed writes are gone; the broker
        records its log end offsets first, as the failpoint does)."""
        rm = self.brokers.pop(broker_id)
        self._registering.pop(broker_id, None)
        self._fetchers.pop(broker_id)
        self.coordinators.pop(broker_id).shutdown()
        if power_loss:
            rm.record_power_loss()
        rm.close()
        if power_loss:
            self._durability[broker_id].simulate_power_loss()
            self._durability[broker_id] = DurabilityTracker()

    def broker_epoch(self, broker_id: int) -> int:
        """The broker epoch of the broker's current (or last) incarnation."""
        return self._broker_epochs[broker_id]

    def is_running(self, broker_id: int) -> bool:
        return broker_id in self.brokers

    def has_replica(self, broker_id: int, tp: TopicPartition) -> bool:
        """Running with its replica of ``tp`` loaded: a restarted broker loads its logs once
        registered, after its previous incarnation's session has expired."""
        return broker_id in self.brokers and tp in self.brokers[broker_id].partitions

    # ---- controller traffic -----------------------------------------------------------

    def propagate_metadata(self) -> None:
        image = self.controller.image()
        for rm in list(self.brokers.values()):
            rm.apply_metadata(image)

    def deliver_alter_partitions(self) -> None:
        while self.pending_alter_partitions:
            broker_id, request, on_response = self.pending_alter_partitions.pop(0)
            if broker_id not in self.brokers:
                continue
            error, reg = self.controller.alter_partition(
                broker_id, request.tp, request.leader_epoch, request.partition_epoch,
                request.new_isr, request.broker_epochs)
            on_response(error, reg)

    def advance(self, ms: float, *, silent: Collection[int] = ()) -> None:
        """Let time pass: live brokers heartbeat (but those in ``silent``, cut off from the
        controller while they keep running; a fenced one is unfenced by its next heartbeat),
        timers fire, expired sessions are fenced."""
        remaining = ms
        while remaining > 0:
            step = min(self.heartbeat_interval_ms, remaining)
            for broker_id in list(self.brokers):
                if broker_id not in silent:
                    self.heartbeat(broker_id)
            self.scheduler.advance(step)
            self.controller.tick()
            remaining -= step

    # ---- topics and clients -------------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 3,
                     config: Mapping[str, str] | None = None) -> None:
        error, message = self.controller.create_topic(name, partitions, replication_factor,
                                                      config or {})
        if error != ErrorCode.none:
            raise ValueError(message)

    def registration(self, tp: TopicPartition) -> PartitionRegistration:
        return self.controller.topics[tp.topic].partitions[tp.partition]

    def leader_of(self, tp: TopicPartition) -> int:
        return self.registration(tp).leader

    def replica(self, broker_id: int, tp: TopicPartition) -> Partition:
        return self.brokers[broker_id].partitions[tp]

    def produce(self, tp: TopicPartition, values: Iterable[bytes | str], *, acks: int = -1,
                timeout_ms: int = 30_000, broker_id: int | None = None,
                producer: tuple[int, int, int] | None = None) -> SendResult:
        """Send one batch to the leader (or to ``broker_id``) as a producer would; an
        idempotent one passes ``producer`` = (producer id, epoch, base sequence)."""
        encoded = [v.encode() if isinstance(v, str) else v for v in values]
        pid, epoch, sequence = producer or (-1, -1, -1)
        send = SendResult(encoded)
        target = self.leader_of(tp) if broker_id is None else broker_id
        if target not in self.brokers:
            send.result = ProduceResult(error=ErrorCode.not_leader_or_follower)
            return send

        def done(results: dict[TopicPartition, ProduceResult]) -> None:
            send.result = results[tp]

        batch = build_batch(encoded, producer_id=pid, producer_epoch=epoch,
                            base_sequence=sequence)
        self.brokers[target].append_records(acks=acks, timeout_ms=timeout_ms,
                                            entries={tp: batch}, on_complete=done)
        return send

    def fetch_round(self, follower_id: int) -> None:
        """One fetch from ``follower_id`` to each of its leaders: truncate first if needed."""
        rm = self.brokers[follower_id]
        by_leader: dict[int, list[TopicPartition]] = {}
        for tp, leader_id in self._fetchers[follower_id].following.items():
            by_leader.setdefault(leader_id, []).append(tp)
        for leader_id, tps in by_leader.items():
            leader = self.brokers.get(leader_id)
            if leader is None:
                continue
            ready = [tp for tp in tps if self._truncate(rm, leader, tp)]
            if not ready:
                continue
            request = FetchRequestData(
                replica_id=follower_id, max_wait_ms=0, min_bytes=1, max_bytes=1 << 30,
                partitions=rm.build_follower_fetch(ready, 1 << 30),
                replica_epoch=self._broker_epochs[follower_id])
            responses: dict[TopicPartition, FetchResult] = {}
            leader.fetch_messages(request, responses.update)
            for tp, result in responses.items():
                if result.error == ErrorCode.none:
                    rm.on_follower_fetch(tp, result)
                elif result.error == ErrorCode.offset_out_of_range:
                    _, start, _ = leader.list_offset(tp, -2, -1, 0, follower_id)
                    _, end, _ = leader.list_offset(tp, -1, -1, 0, follower_id)
                    rm.on_follower_out_of_range(tp, start, end)

    def truncate_followers(self, follower_id: int) -> None:
        """Only the truncation step of a fetch round (a follower that has not fetched yet)."""
        rm = self.brokers[follower_id]
        for tp, leader_id in self._fetchers[follower_id].following.items():
            if leader_id in self.brokers:
                self._truncate(rm, self.brokers[leader_id], tp)

    def _truncate(self, rm: ReplicaManager, leader: ReplicaManager, tp: TopicPartition) -> bool:
        """Drive `tp`'s truncation to its end; True when the follower may fetch."""
        if tp not in rm.follower_states:
            return False
        for _ in range(100):
            request = rm.truncation_request(tp)
            if request is None:
                return True
            error, epoch, end = leader.last_offset_for_leader_epoch(tp, *request)
            if error != ErrorCode.none:
                return False
            rm.on_epoch_answer(tp, epoch, end)
        raise RuntimeError(f"truncation of {tp} did not converge")

    def replicate(self, rounds: int = 3) -> None:
        """A few fetch rounds for every live follower (enough to settle HWs)."""
        for _ in range(rounds):
            for broker_id in sorted(self.brokers):
                self.fetch_round(broker_id)

    def read_committed(self, tp: TopicPartition) -> list[tuple[int, bytes]]:
        """What a consumer reads from the current leader: every record below the HW."""
        leader = self.brokers[self.leader_of(tp)]
        partition = leader.partitions[tp]
        records = partition.log.read(partition.log_start_offset, 1 << 30,
                                     partition.high_watermark)
        return [(o, v) for o, v in decode_values(records) if o < partition.high_watermark]

    def log_values(self, broker_id: int, tp: TopicPartition) -> list[tuple[int, bytes]]:
        partition = self.replica(broker_id, tp)
        return list(decode_values(partition.log.read(partition.log_start_offset, 1 << 30)))
