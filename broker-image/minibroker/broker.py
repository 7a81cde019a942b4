"""The broker process: ``ReplicaManager`` wired to the controller, the Kafka listener, the
follower fetchers, the group coordinator, and the control endpoint.

A broker registers with the controller (a new incarnation each start, which gets a new
broker epoch and stays fenced until its heartbeats show it has caught up with the metadata)
and heartbeats, both on a thread of their own (``lifecycle``), and long-polls for metadata;
every metadata change is applied by ``ReplicaManager`` (become leader / become follower).
ISR changes go back to the controller as AlterPartition requests, and blocks of producer ids
for idempotent producers come from it (AllocateProducerIds).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minibroker import environment
from minibroker.admin import AdminServer
from minibroker.cluster.add_partitions_to_txn_manager import AddPartitionsToTxnManager
from minibroker.cluster.alter_partition_manager import AlterPartitionManager, Answer
from minibroker.cluster.fetcher import ReplicaFetcher, ReplicaFetcherManager
from minibroker.cluster.log_dir_failure import LOG_DIR_FAILURE_EXIT_CODE, LogDirFailureChannel
from minibroker.cluster.partition import AlterPartitionRequest
from minibroker.cluster.replica_manager import ReplicaManager
from minibroker.cluster.scheduler import AsyncioScheduler
from minibroker.cluster.types import (
    ErrorCode,
    FetchRequestData,
    FetchResult,
    MetadataDelta,
    MetadataImage,
    NewPartitions,
    PartitionRegistration,
    ProduceResult,
    TopicDeletion,
    TopicPartition,
    TxnMarker,
)
from minibroker.config import resolve
from minibroker.coordinator.group_coordinator import GroupCoordinator
from minibroker.coordinator.transaction_coordinator import TransactionCoordinator
from minibroker.coordinator.transaction_state_manager import TRANSACTION_STATE_TOPIC
from minibroker.events import ReplicationEventLog
from minibroker.failpoints import DiskFull, DiskStall, power_loss
from minibroker.lifecycle import BrokerLifecycleManager, Registration
from minibroker.metrics import broker_registry
from minibroker.network.apis import KafkaApis
from minibroker.network.connection_quotas import ConnectionQuotas
from minibroker.network.kafka_server import KafkaServer
from minibroker.network.memory_pool import MemoryPool
from minibroker.network.socket_config import SocketServerConfig
from minibroker.network.txn_verification import TransactionSupportedOperation
from minibroker.producer_id_manager import ProducerIdAllocationError, ProducerIdManager
from minibroker.rpc import RpcClient, RpcError
from minibroker.shutdown import end_tasks
from minibroker.storage.clean_shutdown import take_clean_shutdown, write_clean_shutdown
from minibroker.storage.durability import DurabilityTracker
from minibroker.storage.producer_state import AppendOrigin, VerificationGuard

log = logging.getLogger("minibroker.broker")


PREPARE_SLICE = 20
"""New partitions whose logs are created between two turns of the event loop (a few ms
of file creations and fsyncs each)."""

LOG_DIR_FAILURE_HALT_DELAY_S = 0.1
"""Between a log directory's failure and the halt: the answers being written go out."""


@dataclass
class BrokerOptions:
    broker_id: int
    listen: tuple[str, int]
    controller: tuple[str, int]
    data_dir: Path
    config: dict[str, str] = field(default_factory=dict)
    advertised: tuple[str, int] | None = None
    listeners: dict[str, tuple[str, int]] = field(default_factory=dict)
    """More client listeners, by name (Kafka's ``listeners``, KIP-103)."""
    advertised_listeners: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Their advertised addresses (default: where each listens)."""
    broker_addresses: dict[int, tuple[str, int]] = field(default_factory=dict)
    metrics_port: int | None = None
    failpoint_token: str | None = None
    controller_secret: bytes = b""
    """The cluster's controller secret: the controller serves only brokers that prove they
    hold it (``rpc_auth``; Kafka's controller listener with SASL, KIP-631)."""


class BrokerServer:
    """Also the object ``KafkaApis`` calls: the ReplicaManager API plus the failpoints."""

    def __init__(self, options: BrokerOptions) -> None:
        self.options = options
        self.broker_id = options.broker_id
        self.loop = asyncio.get_running_loop()
        self.incarnation_id = environment.new_uuid().hex
        self.durability = DurabilityTracker()
        self.disk_stall = DiskStall(self.loop)
        self.appends_held_by_stall = 0
        """Appends waiting for the disk stall to clear (in /v1/state: proof that a produce
        request reached a stalled broker and is being held, not answered)."""
        self.disk_full = DiskFull(self.loop, self.durability)
        self.log_dir_failure_channel = LogDirFailureChannel()
        self.log_dir_failure_channel.on_offline(self._handle_log_dir_failure)
        config = options.config
        connect_timeout_s = resolve("socket.connection.setup.timeout.ms", config) / 1000
        self.controller = RpcClient(*options.controller, secret=options.controller_secret,
                                    connect_timeout=connect_timeout_s)
        self.lifecycle = BrokerLifecycleManager(
            options.controller, secret=options.controller_secret,
            heartbeat_ms=resolve("broker.heartbeat.interval.ms", config),
            session_timeout_ms=resolve("broker.session.timeout.ms", config),
            connect_timeout_s=connect_timeout_s,
            metadata_offset=lambda: self.replica_manager.image.metadata_offset)
        self.fetchers = ReplicaFetcherManager(self._make_fetcher)
        self.events = ReplicationEventLog(options.data_dir)
        self.replica_manager = ReplicaManager(
            options.broker_id, options.data_dir, AsyncioScheduler(self.loop), config=config,
            alter_partition_sender=AlterPartitionManager(self._transmit_alter_partitions),
            fetcher_manager=self.fetchers, events=self.events, durability=self.durability,
            log_dir_failure_channel=self.log_dir_failure_channel)
        self.group_coordinator = GroupCoordinator(
            options.broker_id, self.replica_manager.scheduler, config=config,
            events=self.events, append=self.append_records,
            local_partition=self.replica_manager.partitions.get,
            metadata_image=self.metadata_image)
        self.replica_manager.leadership_listeners.append(
            self.group_coordinator.on_leadership_change)
        self.producer_ids = ProducerIdManager(self._allocate_producer_ids)
        self.txn_coordinator = TransactionCoordinator(
            options.broker_id, self.replica_manager.scheduler, config=config,
            events=self.events, append=self.append_records,
            local_partition=self.replica_manager.partitions.get,
            metadata_image=self.metadata_image,
            generate_producer_id=self.producer_ids.generate_producer_id,
            address_of=self._address_of, spawn=self._spawn)
        self.replica_manager.leadership_listeners.append(
            self.txn_coordinator.on_leadership_change)
        self.add_partitions_to_txn = AddPartitionsToTxnManager(
            options.broker_id, coordinator_for=self._transaction_coordinator_of,
            address_of=self._address_of)
        self.apis = apis = KafkaApis(self)
        # Every listener draws on the broker's one set of connection and memory bounds.
        socket_config = SocketServerConfig.from_config(config)
        quotas, memory_pool = (ConnectionQuotas(socket_config),
                               MemoryPool(socket_config.queued_max_request_bytes))
        self.kafka_server = KafkaServer(apis, config=socket_config, quotas=quotas,
                                        memory_pool=memory_pool)
        self.listener_servers = {
            name: KafkaServer(apis, config=socket_config, listener=name, quotas=quotas,
                              memory_pool=memory_pool)
            for name in options.listeners}
        self.admin: AdminServer | None = None
        self.tasks: set[asyncio.Task] = set()
        """Every task the broker has started and that has not ended (``_spawn``); empty
        once ``stop`` returns."""

    # ---- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        host, port = self.options.listen
        await self.kafka_server.start(host, port)
        for name, server in self.listener_servers.items():
            await server.start(*self.options.listeners[name])
        if self.options.metrics_port is not None:
            self.admin = AdminServer(
                self.loop, host, self.options.metrics_port,
                registry=broker_registry(lambda: self.admin.on_loop(self.state)),
                state=self.state, events=self.events, token=self.options.failpoint_token,
                actions={
                    ("POST", "/v1/failpoints/disk-stall"): self._stall,
                    ("DELETE", "/v1/failpoints/disk-stall"): lambda _b: self.disk_stall.clear(),
                    ("POST", "/v1/failpoints/power-loss"): lambda _b: self.power_loss(),
                    ("POST", "/v1/failpoints/disk-full"): self._fill_disk,
                    ("DELETE", "/v1/failpoints/disk-full"): lambda _b: self.disk_full.clear(),
                })
            self.admin.start()
        self.replica_manager.start_timers()
        self.txn_coordinator.startup()
        await self.lifecycle.start(Registration(
            self.broker_id, self.incarnation_id, *self.advertised,
            listeners=self.advertised_listeners(),
            previous_broker_epoch=take_clean_shutdown(self.options.data_dir)))
        self._spawn(self._metadata_loop(), "metadata")
        log.info("Broker %d listening on %s:%d, advertised as %s:%d", self.broker_id, host,
                 self.kafka_server.port, *self.advertised)

    async def stop(self) -> None:
        """Shut the components down in turn, as Kafka's BrokerServer.shutdown does: first,
        with ``controlled.shutdown.enable``, the controlled shutdown (the controller moves
        this broker's leaderships and takes it out of every ISR while it still serves, at
        most ``controlled.shutdown.timeout.ms``); then the controller session and channel,
        the broker's own tasks, the listeners and the logs. Each step is bounded, so a
        controller that never answers, or a task that ignores its cancellation, cannot hold
        the stop; a task still running when the bound is up is logged by name, and the
        shutdown is then not recorded as clean (that task may still change the logs)."""
        config = self.options.config
        if resolve("controlled.shutdown.enable", config):
            self.replica_manager.begin_controlled_shutdown()
            await self.lifecycle.controlled_shutdown(
                resolve("controlled.shutdown.timeout.ms", config) / 1000)
        await self.lifecycle.stop()
        # Closed for good before the tasks are cancelled: an answer's callback that starts
        # another call (AlterPartitionManager's next batch) fails at once, without reconnecting.
        await self.controller.aclose()
        clean = await end_tasks(self.tasks, f"broker {self.broker_id}")
        await self.fetchers.stop()
        await self.kafka_server.stop()
        for server in self.listener_servers.values():
            await server.stop()
        if self.admin is not None:
            self.admin.stop()
        self.group_coordinator.shutdown()
        self.txn_coordinator.shutdown()
        self.add_partitions_to_txn.shutdown()
        self.replica_manager.shutdown()
        if clean and self.broker_epoch >= 0:  # every log is flushed: the shutdown was clean
            write_clean_shutdown(self.options.data_dir, self.broker_epoch)

    def _spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> None:
        """Start a task that ``stop`` will end: kept in ``tasks`` until it does (the loop
        holds only a weak reference to a task)."""
        task = self.loop.create_task(coroutine, name=f"broker-{self.broker_id}-{name}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    @property
    def broker_epoch(self) -> int:
        return self.lifecycle.broker_epoch

    @property
    def fenced(self) -> bool:
        return self.lifecycle.fenced

    @property
    def advertised(self) -> tuple[str, int]:
        return self.options.advertised or (self.options.listen[0], self.kafka_server.port)

    def advertised_listeners(self) -> dict[str, tuple[str, int]]:
        """Each named listener's advertised address, as registered with the controller."""
        return {name: self.options.advertised_listeners.get(
                    name, (self.options.listeners[name][0], server.port))
                for name, server in self.listener_servers.items()}

    def _stall(self, body: dict[str, Any]) -> dict[str, Any]:
        self.disk_stall.stall(int(body["duration_ms"]))
        return {"stalled_until_ms": body["duration_ms"]}

    def power_loss(self) -> None:
        """The power-loss failpoint; never returns. The replicas' log end offsets are
        recorded first: the events file survives."""
        self.replica_manager.record_power_loss()
        power_loss(self.durability)

    def _fill_disk(self, body: dict[str, Any]) -> dict[str, Any]:
        self.disk_full.fill(int(body["duration_ms"]))
        return {"full_for_ms": body["duration_ms"]}

    def _handle_log_dir_failure(self, log_dir: Path) -> None:
        """Kafka's ReplicaManager.handleLogDirFailure, then LogManager.handleLogDirFailure
        with no live log directory left: stop serving, then halt (see
        ``cluster/log_dir_failure.py``). The halt waits a moment, as Kafka's handler
        thread runs beside the request threads: answers already written go out."""
        log.error("Stopping serving replicas in dir %s because the log directory has failed",
                  log_dir)
        for tp in list(self.replica_manager.follower_states):
            self.fetchers.unfollow(tp)
        log.critical("Shutdown broker because all log dirs in %s have failed", log_dir)
        self.loop.call_later(LOG_DIR_FAILURE_HALT_DELAY_S, environment.halt,
                             LOG_DIR_FAILURE_EXIT_CODE)

    # ---- controller channel -------------------------------------------------------------

    def _transmit_alter_partitions(self, batch: list[AlterPartitionRequest],
                                   answered: Callable[[list[Answer] | None], None]) -> None:
        """AlterPartition over the controller RPC; its answers are applied on the loop."""
        self._spawn(self._alter_partitions(batch, answered), "alter-partitions")

    async def _alter_partitions(self, batch: list[AlterPartitionRequest],
                                answered: Callable[[list[Answer] | None], None]) -> None:
        answers: list[Answer] | None = None
        try:
            answer = await self.controller.call("alter_partitions", {
                "broker_id": self.broker_id,
                "items": [{"topic": r.tp.topic, "partition": r.tp.partition,
                           "leader_epoch": r.leader_epoch,
                           "partition_epoch": r.partition_epoch, "new_isr": list(r.new_isr),
                           "broker_epochs": list(r.broker_epochs),
                           "leader_recovery_state": r.leader_recovery_state.name}
                          for r in batch]})
            answers = [(ErrorCode[result["error"]],
                        PartitionRegistration.from_json(result["registration"])
                        if result["registration"] else None)
                       for result in answer["results"]]
        except RpcError as exc:
            log.warning("AlterPartition for %d partitions (%s) failed: %s", len(batch),
                        ", ".join(str(r.tp) for r in batch[:3]), exc)
        finally:  # whatever happened, the batch is answered and the next may go
            answered(answers)

    async def _allocate_producer_ids(self) -> tuple[int, int]:
        try:
            answer = await self.controller.call("allocate_producer_ids", {
                "broker_id": self.broker_id, "broker_epoch": self.broker_epoch})
        except RpcError as exc:
            raise ProducerIdAllocationError(str(exc)) from exc
        if answer["error"] != "none":
            raise ProducerIdAllocationError(f"the controller refused: {answer['error']}")
        return answer["producer_id_start"], answer["producer_id_len"]

    async def _metadata_loop(self) -> None:
        """Long-poll the controller for what changed after this broker's image (a
        ``MetadataDelta``; the whole image the first time, or when the controller no longer
        has the changes) and apply it."""
        while True:
            current = self.replica_manager.image
            try:
                data = await self.controller.call("fetch_metadata", {
                    "since": current.metadata_offset, "cluster_id": current.cluster_id,
                    "wait_ms": 1000}, timeout=5)
            except RpcError as exc:
                log.debug("Metadata fetch failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            image = (MetadataDelta.from_json(data).apply(current)
                     if "delta" in data else MetadataImage.from_json(data))
            if image.metadata_offset > current.metadata_offset:
                await self._prepare_partitions(image)
                self.replica_manager.apply_metadata(image)

    async def _prepare_partitions(self, image: MetadataImage) -> None:
        """Create the logs of the image's new partitions a slice at a time, letting the
        event loop serve requests and fetches between slices: a CreateTopics of thousands
        of partitions does not hold this broker's followers (and so every ISR) still."""
        new = self.replica_manager.new_partitions(image)
        for start in range(0, len(new), PREPARE_SLICE):
            for tp, reg in new[start:start + PREPARE_SLICE]:
                self.replica_manager.prepare_partition(tp, reg, image)
            await asyncio.sleep(0)

    # ---- replication ----------------------------------------------------------------------

    def _address_of(self, broker_id: int) -> tuple[str, int] | None:
        if broker_id in self.options.broker_addresses:
            return self.options.broker_addresses[broker_id]
        endpoint = self.replica_manager.image.brokers.get(broker_id)
        return (endpoint.host, endpoint.port) if endpoint else None

    def _make_fetcher(self, leader_id: int) -> ReplicaFetcher:
        config = self.options.config
        return ReplicaFetcher(
            leader_id, self.replica_manager, self._address_of, self.disk_stall.wait,
            max_wait_ms=resolve("replica.fetch.wait.max.ms", config),
            min_bytes=resolve("replica.fetch.min.bytes", config),
            max_bytes=resolve("replica.fetch.max.bytes", config),
            broker_epoch=lambda: self.broker_epoch)

    # ---- what KafkaApis calls -----------------------------------------------------------

    def metadata_image(self) -> MetadataImage:
        return self.replica_manager.image

    def broker_config(self) -> dict[str, str]:
        return self.options.config

    def append_records(self, *, acks: int, timeout_ms: int, entries: dict[TopicPartition, bytes],
                       on_complete: Callable[[dict[TopicPartition, ProduceResult]], None],
                       origin: AppendOrigin = AppendOrigin.CLIENT,
                       verification_guards: dict[TopicPartition, VerificationGuard | None]
                       | None = None) -> None:
        self._when_disk_writable(functools.partial(
            self.replica_manager.append_records, acks=acks, timeout_ms=timeout_ms,
            entries=entries, on_complete=on_complete, origin=origin,
            verification_guards=verification_guards))

    def append_end_txn_markers(
            self, *, marker: TxnMarker, timeout_ms: int,
            on_complete: Callable[[dict[TopicPartition, ProduceResult]], None]) -> None:
        self._when_disk_writable(functools.partial(
            self.replica_manager.append_end_txn_markers, marker=marker, timeout_ms=timeout_ms,
            on_complete=on_complete))

    def maybe_start_transaction_verification(
            self, tp: TopicPartition, producer_id: int, producer_epoch: int
    ) -> VerificationGuard | None:
        return self.replica_manager.maybe_start_transaction_verification(tp, producer_id,
                                                                         producer_epoch)

    async def verify_transaction(self, transactional_id: str, producer_id: int,
                                 producer_epoch: int, partitions: list[TopicPartition],
                                 operation: TransactionSupportedOperation
                                 ) -> dict[TopicPartition, ErrorCode]:
        return await self.add_partitions_to_txn.verify_transaction(
            transactional_id, producer_id, producer_epoch, partitions, operation)

    def _transaction_coordinator_of(self, transactional_id: str) -> int | None:
        """The leader of the id's ``__transaction_state`` partition, as this broker's
        metadata has it (Kafka's ``AddPartitionsToTxnManager.getTransactionCoordinator``)."""
        topic = self.replica_manager.image.topics.get(TRANSACTION_STATE_TOPIC)
        if topic is None:
            return None
        partition = self.txn_coordinator.state_manager.partition_for(transactional_id)
        reg = topic.partitions.get(partition)
        return reg.leader if reg is not None and reg.leader >= 0 else None

    def complete_txn_offsets(self, producer_id: int, partitions: set[int],
                             commit: bool) -> None:
        self.group_coordinator.on_transaction_completed(producer_id, partitions, commit)

    def _when_disk_writable(self, append: Callable[[], None]) -> None:
        """An append now, or once a stalled disk (the disk-stall fault) writes again."""
        if not self.disk_stall.stalled:
            append()
            return

        async def after_stall() -> None:
            try:
                await self.disk_stall.wait()
            finally:
                self.appends_held_by_stall -= 1
            append()

        self.appends_held_by_stall += 1
        self._spawn(after_stall(), "append-after-disk-stall")

    def fetch_messages(self, request: FetchRequestData,
                       on_complete: Callable[[dict[TopicPartition, FetchResult]], None]) -> None:
        self.replica_manager.fetch_messages(request, on_complete)

    def list_offset(self, tp: TopicPartition, timestamp: int, current_leader_epoch: int,
                    isolation_level: int, replica_id: int = -1) -> tuple[ErrorCode, int, int]:
        return self.replica_manager.list_offset(tp, timestamp, current_leader_epoch,
                                                isolation_level, replica_id)

    def last_offset_for_leader_epoch(self, tp: TopicPartition, current_leader_epoch: int,
                                     leader_epoch: int) -> tuple[ErrorCode, int, int]:
        return self.replica_manager.last_offset_for_leader_epoch(tp, current_leader_epoch,
                                                                 leader_epoch)

    async def create_topic(self, name: str, num_partitions: int, replication_factor: int,
                           config: dict[str, str]) -> tuple[ErrorCode, str | None]:
        try:
            answer = await self.controller.call("create_topic", {
                "name": name, "partitions": num_partitions,
                "replication_factor": replication_factor, "config": config})
        except RpcError as exc:
            return ErrorCode.request_timed_out, str(exc)
        return ErrorCode[answer["error"]], answer["message"]

    async def alter_topic_config(self, name: str, changes: dict[str, str | None],
                                 validate_only: bool) -> tuple[ErrorCode, str | None]:
        try:
            answer = await self.controller.call("alter_topic_config", {
                "name": name, "changes": changes, "validate_only": validate_only})
        except RpcError as exc:
            return ErrorCode.request_timed_out, str(exc)
        return ErrorCode[answer["error"]], answer["message"]

    async def delete_topics(self, names: list[str], topic_ids: list[str]
                            ) -> list[TopicDeletion]:
        """Forwarded to the controller (Kafka's ``forwardToController``); if it cannot be
        reached, every topic gets REQUEST_TIMED_OUT."""
        try:
            answer = await self.controller.call("delete_topics", {"names": names,
                                                                  "topic_ids": topic_ids})
        except RpcError as exc:
            return [TopicDeletion(name, topic_id, ErrorCode.request_timed_out, str(exc))
                    for name, topic_id in [*((n, None) for n in names),
                                           *((None, i) for i in topic_ids)]]
        return [TopicDeletion(r["name"], r["topic_id"], ErrorCode[r["error"]], r["message"])
                for r in answer["results"]]

    async def create_partitions(self, topics: list[NewPartitions], validate_only: bool
                                ) -> list[tuple[ErrorCode, str | None]]:
        """Forwarded to the controller, all topics in one call: its bound on the partitions
        one request adds counts them together."""
        try:
            answer = await self.controller.call("create_partitions", {
                "topics": [{"name": t.name, "count": t.count,
                            "assignments": None if t.assignments is None
                            else [list(a) for a in t.assignments]} for t in topics],
                "validate_only": validate_only})
        except RpcError as exc:
            return [(ErrorCode.request_timed_out, str(exc))] * len(topics)
        return [(ErrorCode[r["error"]], r["message"]) for r in answer["results"]]

    async def init_producer_id(self) -> tuple[ErrorCode, int]:
        try:
            return ErrorCode.none, await self.producer_ids.generate_producer_id()
        except ProducerIdAllocationError as exc:
            # Kafka's answer while no block is available: retriable, the producer retries.
            log.warning("InitProducerId: no producer id block (%s)", exc)
            return ErrorCode.coordinator_load_in_progress, -1

    def state(self) -> dict[str, Any]:
        state = self.replica_manager.state()
        state["disk_stalled"] = self.disk_stall.stalled
        state["appends_held_by_stall"] = self.appends_held_by_stall
        state["disk_full"] = self.durability.out_of_space
        state["log_dir_offline"] = self.replica_manager.log_dir_offline
        state["incarnation_id"] = self.incarnation_id
        state["broker_epoch"] = self.broker_epoch
        state["fenced"] = self.fenced
        state["connections"] = self.kafka_server.quotas.total  # all listeners together
        state["group_coordinator"] = self.group_coordinator.state()
        state["transaction_coordinator"] = {
            **self.txn_coordinator.state_manager.state(),
            "markers_pending": self.txn_coordinator.markers.state()}
        return state


async def run_broker(options: BrokerOptions, stop: asyncio.Event) -> None:
    broker = BrokerServer(options)
    await broker.start()
    with contextlib.suppress(asyncio.CancelledError):
        await stop.wait()
    await broker.stop()
