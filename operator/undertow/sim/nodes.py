"""The simulated processes: the controller and the brokers, running minibroker's own code.

A ``SimController`` is ``minibroker.controller.server`` without asyncio: the same
``QuorumController`` (persisted in its data directory), ticked every 100 ms, answering
register, heartbeat, metadata long-polls, AlterPartition, CreateTopic and AllocateProducerIds
over the virtual network. A ``SimBroker`` is ``minibroker.broker`` without asyncio: the same
``ReplicaManager`` and ``GroupCoordinator``, registering, heartbeating and long-polling the
controller, its followers fetching as ``minibroker.cluster.fetcher`` does, with the disk
failpoints (stall, full, power loss). Requests carry plain objects, not Kafka's bytes: the
simulation checks the replication rules, the wire protocol has its own tests.

Metadata crosses the network as JSON (``to_json``/``from_json``), as the real RPC does, so
no broker shares an object with the controller.

Long (about 770 lines), and going: three copies of the broker's own classes, which
``sim/cluster.py``'s real servers replace (docs/simulation.md, step 12).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from minibroker.cluster.alter_partition_manager import AlterPartitionManager, Answer
from minibroker.cluster.fetcher import MAX_TRUNCATION_ROUNDS, RETRY_BACKOFF_S
from minibroker.cluster.log_dir_failure import LogDirFailureChannel
from minibroker.cluster.partition import AlterPartitionRequest
from minibroker.cluster.replica_manager import ReplicaManager
from minibroker.cluster.types import (
    ErrorCode,
    FetchRequestData,
    FetchResult,
    MetadataImage,
    PartitionRegistration,
    ProduceResult,
    TopicPartition,
)
from minibroker.config import resolve
from minibroker.controller.quorum_controller import AlterPartitionItem, QuorumController
from minibroker.controller.server import TICK_MS
from minibroker.coordinator.group_coordinator import GroupCoordinator
from minibroker.coordinator.group_metadata_manager import OFFSETS_TOPIC, partition_for
from minibroker.coordinator.records import OffsetAndMetadata
from minibroker.events import ReplicationEventLog
from minibroker.storage.clean_shutdown import take_clean_shutdown, write_clean_shutdown
from minibroker.storage.durability import DurabilityTracker
from undertow.platform.base import CONTROLLER, broker_node
from undertow.sim.loop import SimLoop, SimTimer
from undertow.sim.network import NetworkError, Reply, VirtualNetwork
from undertow.sim.process import Process

log = logging.getLogger("undertow.sim")

CONTROLLER_ADDRESS = (CONTROLLER, 9093)
BROKER_PORT = 9092
METADATA_WAIT_MS = 1000
REGISTER_RETRY_MS = 200
BACKOFF_MS = RETRY_BACKOFF_S * 1000
LOG_DIR_FAILURE_HALT_DELAY_MS = 100
"""As ``minibroker.broker``: a failed log directory halts the broker this long after."""

EventSink = Callable[[str, dict[str, Any]], None]
"""Takes each replication event as it is logged, with the node that logged it."""


class SimNode:
    """What every simulated process has: a node name, a data directory, the current
    incarnation's ``Process`` (None while down)."""

    def __init__(self, node: str, loop: SimLoop, network: VirtualNetwork, data_dir: Path,
                 config: dict[str, str], on_event: EventSink, clock_s: Callable[[], float]
                 ) -> None:
        self.node = node
        self.loop = loop
        self.network = network
        self.data_dir = data_dir
        self.config = config
        self._on_event = on_event
        self._clock_s = clock_s
        self.process: Process | None = None
        self.incarnations = 0

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.alive

    def _new_process(self) -> Process:
        self.incarnations += 1
        self.process = Process(self.loop, self.node, self.incarnations)
        return self.process

    def _event_log(self) -> ReplicationEventLog:
        return ReplicationEventLog(self.data_dir, clock=self._clock_s,
                                   on_event=lambda event: self._on_event(self.node, event))

    def call(self, address: tuple[str, int], message: Any, timeout_ms: float,
             on_answer: Callable[[Any, NetworkError | None], None]) -> None:
        """A request from this node's current process."""
        assert self.process is not None
        self.network.request(self.process, self.node, address, message, on_answer, timeout_ms)


class SimController(SimNode):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(CONTROLLER, *args, **kwargs)
        self.controller: QuorumController | None = None
        self._waiters: list[tuple[int, Reply, SimTimer]] = []

    def start(self) -> None:
        process = self._new_process()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        controller = self.controller = QuorumController(
            clock_ms=self.loop.now_ms, events=self._event_log(), config=self.config,
            data_dir=self.data_dir)
        controller.add_listener(lambda _offset: self._notify())
        self._waiters = []
        self.network.listen(CONTROLLER_ADDRESS, self.node, process, self._handle)

        def tick() -> None:
            controller.tick()
            process.call_later(TICK_MS, tick)

        process.call_later(TICK_MS, tick)

    def kill(self) -> None:
        if self.process is not None:
            self.process.exit()

    def state(self) -> dict[str, Any]:
        assert self.controller is not None
        return self.controller.state()

    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for _since, reply, timer in waiters:
            timer.cancel()
            reply(self._image())

    def _image(self) -> dict[str, Any]:
        assert self.controller is not None
        return self.controller.image().to_json()

    def _handle(self, message: tuple[str, dict[str, Any]], reply: Reply) -> None:
        name, p = message
        c = self.controller
        assert c is not None and self.process is not None
        if name == "register_broker":
            reply(c.register_broker(p["broker_id"], p["incarnation_id"], p["host"], p["port"],
                                    previous_broker_epoch=p["previous_broker_epoch"]))
        elif name == "heartbeat":
            reply(c.heartbeat(p["broker_id"], p["broker_epoch"], p["metadata_offset"]))
        elif name == "fetch_metadata":
            if c.metadata_offset > p["since"]:
                reply(self._image())
                return
            entry: list[Any] = []

            def expire() -> None:
                if entry and entry[0] in self._waiters:
                    self._waiters.remove(entry[0])
                    reply(self._image())

            entry.append((p["since"], reply, self.process.call_later(METADATA_WAIT_MS, expire)))
            self._waiters.append(entry[0])
        elif name == "alter_partitions":
            reply([(error, reg.to_json() if reg else None)
                   for error, reg in c.alter_partitions(p["broker_id"], p["items"])])
        elif name == "create_topic":
            reply(c.create_topic(p["name"], p["partitions"], p["replication_factor"],
                                 p["config"]))
        elif name == "allocate_producer_ids":
            reply(c.allocate_producer_ids(p["broker_id"], p["broker_epoch"]))
        else:
            raise AssertionError(f"unknown controller request {name!r}")


class DiskStall:
    """The disk-stall failpoint: appends wait until it clears (itself, at its time limit)."""

    def __init__(self) -> None:
        self._timer: SimTimer | None = None
        self._waiting: list[Callable[[], None]] = []

    @property
    def stalled(self) -> bool:
        return self._timer is not None

    def stall(self, process: Process, duration_ms: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = process.call_later(duration_ms, self.clear)

    def clear(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiting, self._waiting = self._waiting, []
        for callback in waiting:
            callback()

    def after(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` now, or once the stall clears."""
        if self.stalled:
            self._waiting.append(callback)
        else:
            callback()


class SimBroker(SimNode):
    def __init__(self, broker_id: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(broker_node(broker_id), *args, **kwargs)
        self.broker_id = broker_id
        self.address = (self.node, BROKER_PORT)
        self.durability = DurabilityTracker()
        self.rm: ReplicaManager | None = None
        self.coordinator: GroupCoordinator | None = None
        self.broker_epoch = -1
        self.fenced = True
        self.disk_stall = DiskStall()
        self.disk_full_timer: SimTimer | None = None
        self.appends_held_by_stall = 0
        self.fetchers: SimFetcherManager | None = None
        self._producer_ids: list[int] = []
        self._awaiting_ids: list[Reply] = []

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        process = self._new_process()
        self._producer_ids, self._awaiting_ids = [], []
        self.disk_stall = DiskStall()
        self.appends_held_by_stall = 0
        self.data_dir.mkdir(parents=True, exist_ok=True)
        channel = LogDirFailureChannel()
        channel.on_offline(lambda _dir: self._halt_on_log_dir_failure())
        events = self._event_log()
        self.fetchers = SimFetcherManager(self)
        rm = self.rm = ReplicaManager(
            self.broker_id, self.data_dir, process, config=self.config,
            alter_partition_sender=AlterPartitionManager(self._transmit_alter_partitions),
            fetcher_manager=self.fetchers,
            events=events, durability=self.durability, log_dir_failure_channel=channel)
        rm.start_timers()
        coordinator = self.coordinator = GroupCoordinator(
            self.broker_id, process, config=self.config, events=events,
            append=self.append_records, local_partition=rm.partitions.get,
            metadata_image=lambda: rm.image, wall_clock_ms=self.loop.now_ms)
        rm.leadership_listeners.append(coordinator.on_leadership_change)
        self.broker_epoch, self.fenced = -1, True
        self.network.listen(self.address, self.node, process, self._handle)
        self._register(take_clean_shutdown(self.data_dir), then=self._after_registration)

    def crash(self, *, power_loss: bool = False) -> None:
        """SIGKILL (the page cache survives) or a power loss (unflushed writes are gone)."""
        process, rm = self.process, self.rm
        if process is None or not process.alive or rm is None:
            return
        if power_loss:
            rm.record_power_loss()
        process.exit()
        self._close()
        rm.close()
        if power_loss:
            self.durability.simulate_power_loss()
            self.durability = DurabilityTracker()

    def stop_cleanly(self) -> None:
        """SIGTERM: every log flushed, the broker epoch recorded (KAFKA-15582)."""
        process, rm = self.process, self.rm
        if process is None or not process.alive or rm is None:
            return
        process.exit()
        self._close()
        rm.shutdown()
        if self.broker_epoch >= 0:
            write_clean_shutdown(self.data_dir, self.broker_epoch)

    def wipe(self) -> None:
        """An ephemeral volume died with its pod: the next start finds an empty disk."""
        shutil.rmtree(self.data_dir, ignore_errors=True)
        self.durability = DurabilityTracker()

    def _close(self) -> None:
        if self.coordinator is not None:
            self.coordinator.shutdown()
        if self.disk_full_timer is not None:
            self.disk_full_timer.cancel()
            self.disk_full_timer = None
        self.durability.out_of_space = False

    def _halt_on_log_dir_failure(self) -> None:
        """``minibroker.broker``'s halt: stop following, exit shortly after (no flush)."""
        process = self.process
        assert process is not None and self.fetchers is not None
        self.fetchers.stop()

        process.call_later(LOG_DIR_FAILURE_HALT_DELAY_MS, self.crash)

    # ---- failpoints ----------------------------------------------------------------------

    def set_failpoint(self, name: str, duration_ms: float | None) -> None:
        assert self.process is not None and self.rm is not None
        if name == "disk-stall":
            assert duration_ms is not None
            self.disk_stall.stall(self.process, duration_ms)
        elif name == "disk-full":
            assert duration_ms is not None
            self.durability.out_of_space = True
            self.disk_full_timer = self.process.call_later(duration_ms, self._free_disk)
        elif name == "power-loss":
            self.crash(power_loss=True)
        else:
            raise ValueError(f"unknown failpoint {name!r}")

    def clear_failpoint(self, name: str) -> None:
        if name == "disk-stall":
            self.disk_stall.clear()
        elif name == "disk-full":
            self._free_disk()

    def _free_disk(self) -> None:
        if self.disk_full_timer is not None:
            self.disk_full_timer.cancel()
            self.disk_full_timer = None
        self.durability.out_of_space = False

    # ---- the controller channel ------------------------------------------------------------

    def _transmit_alter_partitions(self, batch: list[AlterPartitionRequest],
                                   answered: Callable[[list[Answer] | None], None]) -> None:
        """AlterPartition over the virtual network, as the broker's over its RPC."""
        def on_answer(answer: Any, error: NetworkError | None) -> None:
            answered(None if error is not None else [
                (code, PartitionRegistration.from_json(reg) if reg else None)
                for code, reg in answer])

        self._controller_call("alter_partitions", {
            "broker_id": self.broker_id,
            "items": [AlterPartitionItem(r.tp, r.leader_epoch, r.partition_epoch,
                                         tuple(r.new_isr), tuple(r.broker_epochs))
                      for r in batch]}, 5000, on_answer)

    def _controller_call(self, name: str, params: dict[str, Any], timeout_ms: float,
                         on_answer: Callable[[Any, NetworkError | None], None]) -> None:
        self.call(CONTROLLER_ADDRESS, (name, params), timeout_ms, on_answer)

    def _register(self, previous_broker_epoch: int,
                  then: Callable[[], None] = lambda: None) -> None:
        process = self.process
        assert process is not None

        def answered(epoch: Any, error: NetworkError | None) -> None:
            if error is not None:
                process.call_later(REGISTER_RETRY_MS, lambda: self._register(
                    previous_broker_epoch, then))
                return
            self.broker_epoch, self.fenced = epoch, True
            then()

        self._controller_call("register_broker", {
            "broker_id": self.broker_id, "incarnation_id": f"{self.node}-{process.incarnation}",
            "host": self.address[0], "port": self.address[1],
            "previous_broker_epoch": previous_broker_epoch}, 5000, answered)

    def _after_registration(self) -> None:
        process = self.process
        assert process is not None
        interval = resolve("broker.heartbeat.interval.ms", self.config)

        def heartbeat() -> None:
            rm = self.rm
            assert rm is not None

            def answered(answer: Any, error: NetworkError | None) -> None:
                if error is not None:
                    process.call_later(interval, heartbeat)
                    return
                code, fenced = answer
                if code != ErrorCode.none:
                    self._register(-1, then=lambda: process.call_later(interval, heartbeat))
                    return
                self.fenced = fenced
                process.call_later(interval, heartbeat)

            self._controller_call("heartbeat", {
                "broker_id": self.broker_id, "broker_epoch": self.broker_epoch,
                "metadata_offset": rm.image.metadata_offset}, interval * 4, answered)

        process.call_later(interval, heartbeat)
        self._poll_metadata(-1)

    def _poll_metadata(self, since: int) -> None:
        process = self.process
        assert process is not None

        def answered(answer: Any, error: NetworkError | None) -> None:
            if error is not None:
                process.call_later(BACKOFF_MS, lambda: self._poll_metadata(since))
                return
            image = MetadataImage.from_json(answer)
            newest = since
            if image.metadata_offset > since and self.rm is not None:
                newest = image.metadata_offset
                self.rm.apply_metadata(image)
            self._poll_metadata(newest)

        self._controller_call("fetch_metadata", {"since": since}, 5000, answered)

    # ---- what clients and followers ask ------------------------------------------------------

    def append_records(self, *, acks: int, timeout_ms: int, entries: dict[TopicPartition, bytes],
                       on_complete: Callable[[dict[TopicPartition, ProduceResult]], None]
                       ) -> None:
        """As ``BrokerServer.append_records``: held while the disk is stalled."""
        rm = self.rm
        assert rm is not None
        if not self.disk_stall.stalled:
            rm.append_records(acks=acks, timeout_ms=timeout_ms, entries=entries,
                              on_complete=on_complete)
            return
        self.appends_held_by_stall += 1

        def resume() -> None:
            self.appends_held_by_stall -= 1
            rm.append_records(acks=acks, timeout_ms=timeout_ms, entries=entries,
                              on_complete=on_complete)

        self.disk_stall.after(resume)

    def _handle(self, message: tuple[str, Any], reply: Reply) -> None:
        name, body = message
        rm = self.rm
        assert rm is not None
        if name == "produce":
            acks, timeout_ms, tp, batch = body
            if not _exists(rm.image, tp):
                reply(ProduceResult(ErrorCode.unknown_topic_or_partition))
                return
            self.append_records(acks=acks, timeout_ms=timeout_ms, entries={tp: batch},
                                on_complete=lambda results: reply(results[tp]))
        elif name == "fetch":
            request: FetchRequestData = body
            known = [p for p in request.partitions if _exists(rm.image, p.tp)]
            unknown = {p.tp: FetchResult(ErrorCode.unknown_topic_or_partition)
                       for p in request.partitions if not _exists(rm.image, p.tp)}
            if not known:
                reply(unknown)
                return
            rm.fetch_messages(FetchRequestData(
                request.replica_id, request.max_wait_ms, request.min_bytes, request.max_bytes,
                known, request.isolation_level, request.replica_epoch),
                lambda results: reply({**unknown, **results}))
        elif name == "list_offset":
            reply(rm.list_offset(*body))
        elif name == "epoch":
            reply(rm.last_offset_for_leader_epoch(*body))
        elif name == "metadata":
            reply(rm.image)
        elif name == "init_producer_id":
            self._init_producer_id(reply)
        else:
            self._handle_group(name, body, reply)

    def _init_producer_id(self, reply: Reply) -> None:
        """InitProducerId: the next id of this broker's block, a new block from the
        controller when it is used up (Kafka's RPCProducerIdManager); while none can be had,
        COORDINATOR_LOAD_IN_PROGRESS, which the producer retries."""
        if self._producer_ids:
            reply((ErrorCode.none, self._producer_ids.pop(0)))
            return
        self._awaiting_ids.append(reply)
        if len(self._awaiting_ids) > 1:
            return  # a block is on its way

        def answered(answer: Any, error: NetworkError | None) -> None:
            waiting, self._awaiting_ids = self._awaiting_ids, []
            if error is None and answer[0] == ErrorCode.none:
                _, start, length = answer
                self._producer_ids = list(range(start, start + length))
            for waiter in waiting:
                if self._producer_ids:
                    waiter((ErrorCode.none, self._producer_ids.pop(0)))
                else:
                    waiter((ErrorCode.coordinator_load_in_progress, -1))

        self._controller_call("allocate_producer_ids", {
            "broker_id": self.broker_id, "broker_epoch": self.broker_epoch}, 5000, answered)

    # ---- the group coordinator's APIs (``minibroker.network.group_apis``) ----------------------

    def _handle_group(self, name: str, body: Any, reply: Reply) -> None:
        coordinator = self.coordinator
        assert coordinator is not None
        if name == "find_coordinator":
            reply(self._coordinator_of(body))
        elif name == "join_group":
            coordinator.handle_join_group(
                body["group_id"], body["member_id"], body["instance_id"],
                require_known_member_id=True, support_skipping_assignment=True,
                client_id=body["client_id"], client_host="/sim",
                rebalance_timeout_ms=body["rebalance_timeout_ms"],
                session_timeout_ms=body["session_timeout_ms"], protocol_type="consumer",
                protocols=body["protocols"], callback=reply)
        elif name == "sync_group":
            coordinator.handle_sync_group(
                body["group_id"], body["generation_id"], body["member_id"], "consumer",
                body["protocol_name"], body["instance_id"], body["assignments"], reply)
        elif name == "heartbeat":
            reply(coordinator.handle_heartbeat(body["group_id"], body["member_id"],
                                               body["instance_id"], body["generation_id"]))
        elif name == "leave_group":
            reply(coordinator.handle_leave_group(body["group_id"], body["members"]))
        elif name == "offset_commit":
            self._commit_offsets(body, reply)
        elif name == "offset_fetch":
            reply(coordinator.handle_fetch_offsets(body["group_id"], body["require_stable"],
                                                   body["partitions"]))
        else:
            raise AssertionError(f"unknown broker request {name!r}")

    def _coordinator_of(self, group_id: str) -> tuple[ErrorCode, int, tuple[str, int] | None]:
        """FindCoordinator: the leader of the group's ``__consumer_offsets`` partition,
        creating the topic on first use as Kafka does."""
        assert self.rm is not None
        image = self.rm.image
        topic = image.topics.get(OFFSETS_TOPIC)
        if topic is None or not topic.partitions:
            self._create_offsets_topic()
            return ErrorCode.coordinator_not_available, -1, None
        reg = topic.partitions[partition_for(group_id, len(topic.partitions))]
        leader = image.brokers.get(reg.leader)
        if leader is None:
            return ErrorCode.coordinator_not_available, -1, None
        return ErrorCode.none, leader.broker_id, (leader.host, leader.port)

    def _create_offsets_topic(self) -> None:
        self._controller_call("create_topic", {
            "name": OFFSETS_TOPIC,
            "partitions": resolve("offsets.topic.num.partitions", self.config),
            "replication_factor": resolve("offsets.topic.replication.factor", self.config),
            "config": {"cleanup.policy": "compact"}}, 5000, lambda _answer, _error: None)

    def _commit_offsets(self, body: dict[str, Any], reply: Reply) -> None:
        """OffsetCommit: ``body["offsets"]`` maps each partition to its committed offset."""
        assert self.rm is not None and self.coordinator is not None
        now = int(self.loop.now_ms())
        errors: dict[TopicPartition, ErrorCode] = {}
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        for tp, offset in body["offsets"].items():
            if _exists(self.rm.image, tp):
                offsets[tp] = OffsetAndMetadata(offset, -1, "", now)
            else:
                errors[tp] = ErrorCode.unknown_topic_or_partition
        if not offsets:
            reply(errors)
            return
        self.coordinator.handle_commit_offsets(
            body["group_id"], body["member_id"], body["instance_id"], body["generation_id"],
            offsets, lambda done: reply({**errors, **done}))

    def state(self) -> dict[str, Any]:
        """The broker's ``/v1/state`` document, as ``BrokerServer.state``."""
        assert self.rm is not None and self.process is not None and self.coordinator is not None
        state = self.rm.state()
        state["disk_stalled"] = self.disk_stall.stalled
        state["appends_held_by_stall"] = self.appends_held_by_stall
        state["disk_full"] = self.durability.out_of_space
        state["log_dir_offline"] = self.rm.log_dir_offline
        state["incarnation_id"] = f"{self.node}-{self.process.incarnation}"
        state["broker_epoch"] = self.broker_epoch
        state["fenced"] = self.fenced
        state["group_coordinator"] = self.coordinator.state()
        return state


def _exists(image: MetadataImage, tp: TopicPartition) -> bool:
    topic = image.topics.get(tp.topic)
    return topic is not None and tp.partition in topic.partitions


class SimFetcher:
    """``minibroker.cluster.fetcher.ReplicaFetcher`` over the virtual network: truncate
    newly followed partitions (OffsetForLeaderEpoch), then long-poll the leader."""

    def __init__(self, broker: SimBroker, leader_id: int) -> None:
        self.broker = broker
        self.leader_id = leader_id
        self.partitions: set[TopicPartition] = set()
        self._busy = False
        self._stopped = False
        self._rounds: dict[TopicPartition, int] = {}
        config = broker.config
        self._max_wait_ms: int = resolve("replica.fetch.wait.max.ms", config)
        self._min_bytes: int = resolve("replica.fetch.min.bytes", config)
        self._max_bytes: int = resolve("replica.fetch.max.bytes", config)

    def add(self, tp: TopicPartition) -> None:
        self.partitions.add(tp)
        self._rounds.pop(tp, None)
        if not self._busy:
            self._cycle()

    def remove(self, tp: TopicPartition) -> None:
        self.partitions.discard(tp)

    def stop(self) -> None:
        self._stopped = True

    @property
    def _rm(self) -> ReplicaManager:
        assert self.broker.rm is not None
        return self.broker.rm

    def _followed(self) -> list[TopicPartition]:
        states = self._rm.follower_states
        return sorted(tp for tp in self.partitions
                      if (s := states.get(tp)) is not None and s.leader_id == self.leader_id)

    def _later(self, delay_ms: float) -> None:
        assert self.broker.process is not None
        self._busy = True
        self.broker.process.call_later(delay_ms, self._cycle)

    def _leader_address(self) -> tuple[str, int] | None:
        endpoint = self._rm.image.brokers.get(self.leader_id)
        return (endpoint.host, endpoint.port) if endpoint else None

    def _cycle(self) -> None:
        self._busy = False
        if self._stopped:
            return
        followed = self._followed()
        if not followed:
            return  # idle until `add`
        address = self._leader_address()
        if address is None:
            self._later(BACKOFF_MS)
            return
        self._busy = True
        for tp in followed:
            request = self._rm.truncation_request(tp)
            if request is None:
                continue
            if self._rounds.get(tp, 0) >= MAX_TRUNCATION_ROUNDS:
                # As ReplicaFetcher._truncate: this pass gives up on the partition (the fetch
                # skips it and backs off), and the next pass asks again from round 1.
                self._rounds[tp] = 0
                continue
            self._rounds[tp] = self._rounds.get(tp, 0) + 1
            self._truncate(address, tp, request)
            return
        self._fetch(address, [tp for tp in followed
                              if not self._rm.follower_states[tp].needs_truncation])

    def _truncate(self, address: tuple[str, int], tp: TopicPartition,
                  request: tuple[int, int]) -> None:
        state = self._rm.follower_states[tp]

        def answered(answer: Any, error: NetworkError | None) -> None:
            if error is not None or answer[0] != ErrorCode.none:
                # The pass ends (the leader may not know it leads yet: UNKNOWN_LEADER_EPOCH);
                # the next asks again from round 1, as ReplicaFetcher's next _truncate does.
                self._rounds.pop(tp, None)
                self._later(BACKOFF_MS)
                return
            _, epoch, end = answer
            if self._rm.follower_states.get(tp) is state:
                self._rm.on_epoch_answer(tp, epoch, end)
            self._cycle()

        self.broker.call(address, ("epoch", (tp, *request)), 30_000, answered)

    def _fetch(self, address: tuple[str, int], ready: list[TopicPartition]) -> None:
        if not ready:
            self._later(BACKOFF_MS)
            return
        rm = self._rm
        states = {tp: rm.follower_states[tp] for tp in ready}
        request = FetchRequestData(
            replica_id=self.broker.broker_id, max_wait_ms=self._max_wait_ms,
            min_bytes=self._min_bytes, max_bytes=self._max_bytes * len(ready),
            partitions=rm.build_follower_fetch(ready, self._max_bytes),
            replica_epoch=self.broker.broker_epoch)

        def answered(answer: Any, error: NetworkError | None) -> None:
            if error is not None:
                self._later(BACKOFF_MS)
                return
            self.broker.disk_stall.after(lambda: self._apply(address, states, answer))

        self.broker.call(address, ("fetch", request), self._max_wait_ms + 5000, answered)

    def _apply(self, address: tuple[str, int], states: dict[TopicPartition, Any],
               results: dict[TopicPartition, FetchResult]) -> None:
        if self._stopped or self.broker.rm is None:
            return
        rm = self._rm
        backoff = False
        out_of_range = []
        for tp, result in sorted(results.items()):
            if rm.follower_states.get(tp) is not states.get(tp):
                continue  # leadership moved while the fetch was in flight
            if result.error == ErrorCode.none:
                try:
                    rm.on_follower_fetch(tp, result)
                except Exception:  # KAFKA_STORAGE_ERROR: the broker halts
                    backoff = True
            elif result.error == ErrorCode.offset_out_of_range:
                out_of_range.append(tp)
            else:
                backoff = True
        if out_of_range:
            self._out_of_range(address, out_of_range[0], states[out_of_range[0]])
            return
        if backoff:
            self._later(BACKOFF_MS)
        else:
            self._cycle()

    def _out_of_range(self, address: tuple[str, int], tp: TopicPartition, state: Any) -> None:
        rm = self._rm
        epoch = rm.partitions[tp].leader_epoch
        offsets: list[int] = []

        def ask(timestamp: int) -> None:
            self.broker.call(address, ("list_offset", (tp, timestamp, epoch, 0,
                                                       self.broker.broker_id)),
                             30_000, answered)

        def answered(answer: Any, error: NetworkError | None) -> None:
            if error is not None or answer[0] != ErrorCode.none:
                self._later(BACKOFF_MS)
                return
            offsets.append(answer[1])
            if len(offsets) == 1:
                ask(-1)
                return
            if rm.follower_states.get(tp) is state:
                rm.on_follower_out_of_range(tp, offsets[0], offsets[1])
            self._cycle()

        ask(-2)


class SimFetcherManager:
    """One fetcher per leader broker (Kafka's ReplicaFetcherManager)."""

    def __init__(self, broker: SimBroker) -> None:
        self._broker = broker
        self.fetchers: dict[int, SimFetcher] = {}
        self._leader_of: dict[TopicPartition, int] = {}

    def follow(self, tp: TopicPartition, leader_id: int) -> None:
        self.unfollow(tp)
        fetcher = self.fetchers.get(leader_id)
        if fetcher is None:
            fetcher = self.fetchers[leader_id] = SimFetcher(self._broker, leader_id)
        self._leader_of[tp] = leader_id
        fetcher.add(tp)

    def unfollow(self, tp: TopicPartition) -> None:
        leader_id = self._leader_of.pop(tp, None)
        if leader_id is not None and leader_id in self.fetchers:
            self.fetchers[leader_id].remove(tp)

    def stop(self) -> None:
        for fetcher in self.fetchers.values():
            fetcher.stop()
