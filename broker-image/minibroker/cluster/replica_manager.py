"""``ReplicaManager``: every partition replica on this broker, and the requests that touch them.

It applies the controller's metadata (become leader / become follower), serves Produce,
Fetch, ListOffsets and OffsetForLeaderEpoch through callbacks (so the same code runs under
asyncio in a broker and step by step in the tests' ``tests/minibroker/stepper.py``),
keeps the purgatories, runs the
ISR shrink, HW checkpoint and log timers, and gives the follower fetcher its per-partition
state. Its ``LogManager`` (``minibroker.storage.log_manager``) loads, flushes and
checkpoints the logs. It records the replication event of a power loss
(``minibroker.events``); its log manager records those of loading a log, its partitions
the rest.

Long (about 630 lines) as Kafka's ``ReplicaManager`` is: the one owner of the replicas'
state, so every request and timer that changes it goes through here, each a short method;
the rules themselves are in ``Partition`` and ``truncation``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from minibroker import environment
from minibroker.cluster.delayed import DelayedFetch, DelayedProduce, Purgatory
from minibroker.cluster.errors import KafkaApiError
from minibroker.cluster.log_dir_failure import LogDirFailureChannel
from minibroker.cluster.partition import READ_COMMITTED, AlterPartitionRequest, Partition
from minibroker.cluster.scheduler import Scheduler
from minibroker.cluster.truncation import truncation_for_epoch_answer
from minibroker.cluster.types import (
    UNDEFINED_EPOCH,
    ErrorCode,
    FetchPartition,
    FetchRequestData,
    FetchResult,
    MetadataImage,
    PartitionRegistration,
    ProduceResult,
    TopicPartition,
    TxnMarker,
)
from minibroker.config import LogConfig, resolve
from minibroker.events import EventType, ReplicationEventLog, TruncationReason
from minibroker.storage.checkpoints import REPLICATION_OFFSET_CHECKPOINT_FILE, OffsetCheckpointFile
from minibroker.storage.durability import DurabilityTracker
from minibroker.storage.log import LogAppendInfo
from minibroker.storage.log_manager import LogManager
from minibroker.storage.producer_state import AppendOrigin, VerificationGuard

log = logging.getLogger("minibroker.replica_manager")


class AlterPartitionSender(Protocol):
    """Sends an ISR change to the controller; the answer comes back through ``on_response``."""

    def send(self, request: AlterPartitionRequest,
             on_response: Callable[[ErrorCode, PartitionRegistration | None], None]) -> None: ...


class FetcherManager(Protocol):
    """Runs one fetcher per leader broker for this broker's follower partitions."""

    def follow(self, tp: TopicPartition, leader_id: int) -> None: ...

    def unfollow(self, tp: TopicPartition) -> None: ...


@dataclass
class FollowerState:
    leader_id: int
    leader_epoch: int
    needs_truncation: bool = True


class ReplicaManager:
    def __init__(
        self,
        broker_id: int,
        data_dir: Path,
        scheduler: Scheduler,
        *,
        config: Mapping[str, str],
        alter_partition_sender: AlterPartitionSender,
        fetcher_manager: FetcherManager,
        events: ReplicationEventLog,
        durability: DurabilityTracker | None = None,
        log_dir_failure_channel: LogDirFailureChannel | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.data_dir = data_dir
        self.scheduler = scheduler
        self.config = dict(config)
        self.durability = durability or DurabilityTracker()
        self.log_dir_failure_channel = log_dir_failure_channel or LogDirFailureChannel()
        self._alter_partition_sender = alter_partition_sender
        self._fetcher_manager = fetcher_manager
        self.events = events
        self.partitions: dict[TopicPartition, Partition] = {}
        self._prepared: dict[TopicPartition, Partition] = {}
        """Created by ``prepare_partition`` for an image not applied yet."""
        # Told (partition, is leader now, leader epoch) on every leadership change here:
        # the group coordinator follows __consumer_offsets this way.
        self.leadership_listeners: list[Callable[[TopicPartition, bool, int], None]] = []
        self.follower_states: dict[TopicPartition, FollowerState] = {}
        self.in_controlled_shutdown = False
        """Set by ``begin_controlled_shutdown`` (Kafka's ``isInControlledShutdown``)."""
        self.image = MetadataImage()
        self.produce_purgatory = Purgatory(scheduler)
        self.fetch_purgatory = Purgatory(scheduler)
        self.replica_lag_time_max_ms: int = resolve("replica.lag.time.max.ms", self.config)
        self._hw_checkpoint = OffsetCheckpointFile(data_dir / REPLICATION_OFFSET_CHECKPOINT_FILE)
        self._checkpointed_hws = dict(self._hw_checkpoint.read())
        self.log_manager = LogManager(
            broker_id, data_dir, durability=self.durability, events=events,
            clock=lambda: self.scheduler.now_ms() / 1000.0)
        self._closed = False
        data_dir.mkdir(parents=True, exist_ok=True)

    # ---- timers -----------------------------------------------------------------------

    def start_timers(self) -> None:
        """ISR shrink every lag/2 (as Kafka), HW checkpoints, time-based flushes."""
        self._every(self.replica_lag_time_max_ms / 2, self.maybe_shrink_isrs)
        self._every(resolve("replica.high.watermark.checkpoint.interval.ms", self.config),
                    self.checkpoint_high_watermarks)
        self._every(resolve("log.flush.offset.checkpoint.interval.ms", self.config),
                    self.checkpoint_recovery_points)
        self._every(100, self.log_manager.flush_logs_on_time)
        self._every(resolve("producer.id.expiration.check.interval.ms", self.config),
                    self.remove_expired_producers)

    def _every(self, period_ms: float, action: Callable[[], None]) -> None:
        def run() -> None:
            if self._closed:
                return
            try:
                if not self.log_dir_offline:
                    action()
            except OSError as exc:  # Kafka's checkpoint and flush threads do the same
                self.log_dir_failure_channel.maybe_add_offline_log_dir(
                    self.data_dir, f"Error in periodic {action.__name__} in dir "
                                   f"{self.data_dir}", exc)
            finally:
                self.scheduler.call_later(period_ms, run)

        self.scheduler.call_later(period_ms, run)

    def remove_expired_producers(self) -> None:
        """Kafka's ``LogManager`` producer expiration task, over every replica (leaders
        and followers alike, as each keeps its own producer state)."""
        now_ms = int(environment.current().wall_clock() * 1000)
        expiration_ms = resolve("producer.id.expiration.ms", self.config)
        for tp, partition in self.partitions.items():
            expired = partition.log.producer_state.remove_expired_producers(now_ms,
                                                                            expiration_ms)
            if expired:
                log.info("%s: removed %d expired producer ids", tp, len(expired))

    def maybe_shrink_isrs(self) -> None:
        for partition in self.partitions.values():
            partition.maybe_shrink_isr()

    @property
    def log_dir_offline(self) -> bool:
        return self.log_dir_failure_channel.is_offline(self.data_dir)

    def checkpoint_high_watermarks(self) -> None:
        hws = {(tp.topic, tp.partition): p.high_watermark for tp, p in self.partitions.items()}
        if hws != self._checkpointed_hws:
            self.durability.check_space(self._hw_checkpoint.path)
            self._hw_checkpoint.write(hws)
            self._checkpointed_hws = hws

    def checkpoint_recovery_points(self) -> None:
        """Every log's recovery point, checkpointed by the log manager."""
        self.log_manager.checkpoint_recovery_points()

    def begin_controlled_shutdown(self) -> None:
        """Kafka's ReplicaManager.beginControlledShutdown: from now on a follower replica this
        broker is out of the ISR of, or that has no leader, stops fetching
        (``_apply_partition``): the controller is taking the broker out of every ISR."""
        self.in_controlled_shutdown = True

    def shutdown(self) -> None:
        """A clean shutdown, as Kafka's LogManager.shutdown: flush every log, checkpoint the
        recovery points and high watermarks, then close."""
        self.log_manager.flush_all()
        self.checkpoint_high_watermarks()
        self.close()

    def close(self) -> None:
        """Release the logs without flushing them: a crash (``shutdown`` is the clean way).
        The purgatories go first (Kafka's ReplicaManager.shutdown): a fetch expiring later
        would read a closed log."""
        self._closed = True
        self.produce_purgatory.shutdown()
        self.fetch_purgatory.shutdown()
        self.log_manager.close()

    # ---- metadata: become leader / become follower -----------------------------------

    def _log_config(self, topic: str, image: MetadataImage | None = None) -> LogConfig:
        topic_image = (image or self.image).topics.get(topic)
        return LogConfig.from_layers(topic_image.config if topic_image else {}, self.config)

    def _get_or_create_partition(self, tp: TopicPartition, reg: PartitionRegistration
                                 ) -> Partition:
        partition = self.partitions.get(tp) or self._prepared.pop(tp, None)
        if partition is None:
            partition = self._create_partition(tp, reg, self.image)
        self.partitions[tp] = partition
        return partition

    def _create_partition(self, tp: TopicPartition, reg: PartitionRegistration,
                          image: MetadataImage) -> Partition:
        config = self._log_config(tp.topic, image)
        topic = image.topics.get(tp.topic)
        log_, cache = self.log_manager.load_log(tp.topic, tp.partition, config,
                                                leader_epoch=reg.leader_epoch,
                                                partition_epoch=reg.partition_epoch,
                                                topic_id=topic.topic_id if topic else None)
        return Partition(
            tp, self.broker_id, log_, cache, config,
            replica_lag_time_max_ms=self.replica_lag_time_max_ms,
            clock_ms=self.scheduler.now_ms,
            alter_partition=self._send_alter_partition,
            alive_broker_epoch=self._alive_broker_epoch,
            broker_shutting_down=self._broker_shutting_down,
            events=self.events,
            high_watermark=self._checkpointed_hws.get((tp.topic, tp.partition), 0),
        )

    def new_partitions(self, image: MetadataImage) -> list[tuple[TopicPartition,
                                                                 PartitionRegistration]]:
        """The partitions of ``image`` with a replica here that this broker has no log for
        yet (neither made nor prepared)."""
        return [(TopicPartition(name, index), reg)
                for name, topic in image.topics.items()
                if self.image.topics.get(name) is not topic
                for index, reg in topic.partitions.items()
                if self.broker_id in reg.replicas
                and (tp := TopicPartition(name, index)) not in self.partitions
                and tp not in self._prepared]

    def prepare_partition(self, tp: TopicPartition, reg: PartitionRegistration,
                          image: MetadataImage) -> None:
        """Create (or load) a partition's log ahead of ``apply_metadata(image)``, which then
        makes it leader or follower. Creating a log costs file creations and fsyncs: a broker
        given thousands of new partitions at once prepares them a slice at a time, serving
        requests and fetches in between (Kafka creates logs on the metadata publisher's
        thread, apart from the request handlers). A prepared partition is not served
        until the image that names it is applied."""
        self._prepared[tp] = self._create_partition(tp, reg, image)

    def apply_metadata(self, image: MetadataImage) -> None:
        """Apply the controller's view: each partition whose registration changed (or that
        this broker does not have yet) becomes leader or follower here. Only what changed
        is touched (Kafka's ``ReplicaManager.applyDelta`` takes the delta's changed
        partitions): with thousands of partitions an ISR change costs one partition's work,
        not every partition's."""
        if image.metadata_offset <= self.image.metadata_offset:
            return
        before, self.image = self.image, image
        for name, old in before.topics.items():
            current = image.topics.get(name)
            if current is None or current.topic_id != old.topic_id:
                for index in old.partitions:
                    self._delete_partition(TopicPartition(name, index))
        for name, topic in image.topics.items():
            old = before.topics.get(name)
            if old is topic:
                continue  # shared by a delta that did not touch it
            old_partitions = old.partitions if old is not None else {}
            config_changed = old is not None and old.config != topic.config
            for index, reg in topic.partitions.items():
                if self.broker_id not in reg.replicas:
                    continue
                tp = TopicPartition(name, index)
                partition = self.partitions.get(tp)
                if partition is None or old_partitions.get(index) != reg:
                    self._apply_partition(tp, reg)
                if config_changed and partition is not None:  # IncrementalAlterConfigs
                    partition.update_config(self._log_config(name))
        if image.brokers != before.brokers:
            for partition in self.partitions.values():
                partition.reset_replicas_of_new_incarnations()

    def _delete_partition(self, tp: TopicPartition) -> None:
        """Kafka's ``ReplicaManager.applyDelta`` for a deleted topic (``stopPartitions`` with
        delete): the replica stops fetching and serving, a coordinator of it resigns, its
        waiting requests are answered, and its log and checkpointed offsets go. A topic
        created again under the same name (another id) starts from empty logs."""
        partition = self.partitions.pop(tp, None) or self._prepared.pop(tp, None)
        if partition is None:
            return
        self.follower_states.pop(tp, None)
        self._fetcher_manager.unfollow(tp)
        for listener in self.leadership_listeners:
            listener(tp, False, partition.leader_epoch)
        self.produce_purgatory.check_and_complete(tp)
        self.fetch_purgatory.check_and_complete(tp)
        self._checkpointed_hws.pop((tp.topic, tp.partition), None)
        self.log_manager.delete_log(tp.topic, tp.partition)

    def _broker_shutting_down(self, broker_id: int) -> bool:
        """Kafka's MetadataCache.isBrokerShuttingDown: in controlled shutdown."""
        endpoint = self.image.brokers.get(broker_id)
        return endpoint is not None and endpoint.in_controlled_shutdown

    def _alive_broker_epoch(self, broker_id: int) -> int | None:
        """Kafka's MetadataCache.getAliveBrokerEpoch: None for a fenced or unknown broker."""
        endpoint = self.image.brokers.get(broker_id)
        return endpoint.broker_epoch if endpoint is not None else None

    def _apply_partition(self, tp: TopicPartition, reg: PartitionRegistration) -> None:
        partition = self._get_or_create_partition(tp, reg)
        newer_epoch = reg.leader_epoch > partition.leader_epoch
        changed = False
        if reg.leader == self.broker_id:
            if newer_epoch or not partition.is_leader:
                self.follower_states.pop(tp, None)
                self._fetcher_manager.unfollow(tp)
                partition.make_leader(reg)
                changed = True
            else:
                partition.apply_registration(reg)
        elif newer_epoch or partition.leader_id != reg.leader:
            partition.make_follower(reg)
            self._fetcher_manager.unfollow(tp)
            self.follower_states.pop(tp, None)
            if reg.leader >= 0:
                self.follower_states[tp] = FollowerState(reg.leader, reg.leader_epoch)
                if self._log_config(tp.topic).truncation_mode == "high-watermark":
                    # Kafka 0.10.2's ReplicaManager.makeFollowers truncates to the HW here,
                    # before the fetcher starts: it needs nothing from the leader, which
                    # may be dead (hw-truncation-double-crash.yaml).
                    self._truncate_to_high_watermark(tp)
                self._fetcher_manager.follow(tp, reg.leader)
            changed = True
        else:
            partition.apply_registration(reg)
        if (self.in_controlled_shutdown and reg.leader != self.broker_id
                and (reg.leader < 0 or self.broker_id not in reg.isr)):
            # ReplicaManager.applyLocalFollowersDelta: "During controlled shutdown, replica
            # with no leaders and replica where this broker is not in the ISR are stopped."
            self._fetcher_manager.unfollow(tp)
            self.follower_states.pop(tp, None)
        self.produce_purgatory.check_and_complete(tp)
        self.fetch_purgatory.check_and_complete(tp)
        if changed:
            for listener in self.leadership_listeners:
                listener(tp, partition.is_leader, reg.leader_epoch)

    def _send_alter_partition(self, request: AlterPartitionRequest) -> None:
        def on_response(error: ErrorCode, reg: PartitionRegistration | None) -> None:
            partition = self.partitions.get(request.tp)
            if partition is not None and partition.on_alter_partition_response(request, error,
                                                                               reg):
                self.produce_purgatory.check_and_complete(request.tp)
                self.fetch_purgatory.check_and_complete(request.tp)

        self._alter_partition_sender.send(request, on_response)

    # ---- produce ----------------------------------------------------------------------

    def _leader_partition(self, tp: TopicPartition) -> Partition:
        partition = self.partitions.get(tp)
        if partition is None:
            if tp.topic in self.image.topics and tp.partition in self.image.topics[
                    tp.topic].partitions:
                raise KafkaApiError(ErrorCode.not_leader_or_follower,
                                    f"broker {self.broker_id} has no replica of {tp}")
            raise KafkaApiError(ErrorCode.unknown_topic_or_partition, f"unknown {tp}")
        return partition

    def append_records(
        self,
        *,
        acks: int,
        timeout_ms: int,
        entries: dict[TopicPartition, bytes],
        on_complete: Callable[[dict[TopicPartition, ProduceResult]], None],
        origin: AppendOrigin = AppendOrigin.CLIENT,
        verification_guards: Mapping[TopicPartition, VerificationGuard | None] | None = None,
    ) -> None:
        """A client's Produce (or a coordinator's records): each partition's batch on its
        leader. ``verification_guards``: the guards of a transactional Produce verified
        with its coordinator (KIP-890 part 1); None when nothing is verified."""
        verify = verification_guards is not None
        guards = verification_guards or {}
        self._append_to_leaders(
            acks, timeout_ms,
            {tp: functools.partial(Partition.append_records_to_leader, records=records,
                                   required_acks=acks, origin=origin, verify=verify,
                                   verification_guard=guards.get(tp))
             for tp, records in entries.items()},
            on_complete)

    def maybe_start_transaction_verification(
            self, tp: TopicPartition, producer_id: int, producer_epoch: int
    ) -> VerificationGuard | None:
        """Raises ``KafkaApiError`` (not the leader, an older producer epoch)."""
        return self._leader_partition(tp).maybe_start_transaction_verification(
            producer_id, producer_epoch)

    def append_end_txn_markers(
        self,
        *,
        marker: TxnMarker,
        timeout_ms: int,
        on_complete: Callable[[dict[TopicPartition, ProduceResult]], None],
    ) -> None:
        """One producer's WriteTxnMarkers entry: a marker in each of its partitions, with
        acks=-1 (Kafka's ``appendRecords`` with origin COORDINATOR)."""
        self._append_to_leaders(
            -1, timeout_ms,
            {tp: functools.partial(Partition.append_end_txn_marker,
                                   producer_id=marker.producer_id,
                                   producer_epoch=marker.producer_epoch,
                                   coordinator_epoch=marker.coordinator_epoch,
                                   control_type=marker.control_type,
                                   transaction_version=marker.transaction_version)
             for tp in marker.partitions},
            on_complete)

    def _append_to_leaders(
        self,
        acks: int,
        timeout_ms: int,
        appends: dict[TopicPartition, Callable[[Partition], LogAppendInfo]],
        on_complete: Callable[[dict[TopicPartition, ProduceResult]], None],
    ) -> None:
        results: dict[TopicPartition, ProduceResult] = {}
        required: dict[TopicPartition, int] = {}
        for tp, append in appends.items():
            try:
                if self.log_dir_offline:
                    raise self.log_dir_failure_channel.storage_error(self.data_dir,
                                                                     f"appending to {tp}")
                partition = self._leader_partition(tp)
                try:
                    info = append(partition)
                except OSError as exc:
                    raise self.log_dir_failure_channel.storage_error(
                        self.data_dir, f"appending to {tp}", exc) from exc
            except KafkaApiError as exc:
                results[tp] = ProduceResult(error=exc.code, error_message=exc.message)
                continue
            results[tp] = ProduceResult(error=ErrorCode.none, base_offset=info.first_offset,
                                        log_start_offset=partition.log_start_offset)
            required[tp] = info.last_offset + 1
            self.fetch_purgatory.check_and_complete(tp)
        if acks != -1 or not required:
            on_complete(results)
            return

        def check(tp: TopicPartition, offset: int) -> tuple[bool, ErrorCode]:
            partition = self.partitions.get(tp)
            if partition is None:
                return True, ErrorCode.not_leader_or_follower
            return partition.check_enough_replicas_reach_offset(offset)

        op = DelayedProduce(results, required, check, on_complete)
        self.produce_purgatory.try_complete_else_watch(op, timeout_ms)

    # ---- fetch ------------------------------------------------------------------------

    def fetch_messages(self, request: FetchRequestData,
                       on_complete: Callable[[dict[TopicPartition, FetchResult]], None]) -> None:
        results, size, has_error = self._read(request, update_follower_state=True)
        if request.max_wait_ms <= 0 or size >= request.min_bytes or has_error or not results:
            on_complete(results)
            return
        op = DelayedFetch(
            {p.tp for p in request.partitions},
            lambda: self._read(request, update_follower_state=False),
            request.min_bytes,
            on_complete,
            lambda: self._fetch_may_complete(request),
        )
        self.fetch_purgatory.try_complete_else_watch(op, request.max_wait_ms)

    def _fetch_may_complete(self, request: FetchRequestData) -> bool:
        """Whether a waiting fetch may have something to answer now, from offsets alone
        (Kafka's ``DelayedFetch.tryComplete``): a partition gone, no longer led or in
        another leader epoch (KIP-320), or a fetch offset below the offset it reads to (the
        LEO for a follower, the HW for a consumer) or out of the log's range. With
        ``min_bytes`` above 1 the bytes must be counted, so the read decides."""
        if request.min_bytes > 1:
            return True
        for fp in request.partitions:
            partition = self.partitions.get(fp.tp)
            if partition is None or not partition.is_leader:
                return True
            if fp.current_leader_epoch not in (UNDEFINED_EPOCH, partition.leader_epoch):
                return True
            offset, log_end = fp.fetch_offset, partition.log_end_offset
            end = (log_end if request.is_from_follower
                   else partition.last_stable_offset if request.isolation_level == READ_COMMITTED
                   else partition.high_watermark)
            if offset < end or not partition.log_start_offset <= offset <= log_end:
                return True
        return False

    def _read(self, request: FetchRequestData, update_follower_state: bool
              ) -> tuple[dict[TopicPartition, FetchResult], int, bool]:
        results: dict[TopicPartition, FetchResult] = {}
        total = 0
        has_error = False
        budget = request.max_bytes
        for fp in request.partitions:
            try:
                partition = self._leader_partition(fp.tp)
                leader_end_offset = partition.log_end_offset
                result = partition.read_records(fp.fetch_offset, fp.current_leader_epoch,
                                                min(fp.max_bytes, max(budget, 1)),
                                                request.is_from_follower,
                                                request.isolation_level)
                if request.is_from_follower and update_follower_state:
                    if partition.update_follower_fetch_state(request.replica_id, fp.fetch_offset,
                                                             leader_end_offset,
                                                             request.replica_epoch):
                        self.produce_purgatory.check_and_complete(fp.tp)
                        self.fetch_purgatory.check_and_complete(fp.tp)
                    result = FetchResult(ErrorCode.none, partition.high_watermark,
                                         partition.high_watermark, partition.log_start_offset,
                                         result.records)
            except KafkaApiError as exc:
                result = FetchResult(error=exc.code)
                has_error = True
            results[fp.tp] = result
            total += len(result.records)
            budget -= len(result.records)
        return results, total, has_error

    # ---- offsets ------------------------------------------------------------------------

    def list_offset(self, tp: TopicPartition, timestamp: int, current_leader_epoch: int,
                    isolation_level: int, replica_id: int = -1) -> tuple[ErrorCode, int, int]:
        try:
            partition = self._leader_partition(tp)
            offset, epoch = partition.fetch_offset_for_timestamp(
                timestamp, current_leader_epoch, isolation_level, replica_id)
        except KafkaApiError as exc:
            return exc.code, -1, -1
        return ErrorCode.none, offset, epoch

    def last_offset_for_leader_epoch(self, tp: TopicPartition, current_leader_epoch: int,
                                     leader_epoch: int) -> tuple[ErrorCode, int, int]:
        try:
            partition = self._leader_partition(tp)
            epoch, end_offset = partition.last_offset_for_leader_epoch(current_leader_epoch,
                                                                       leader_epoch)
        except KafkaApiError as exc:
            return exc.code, -1, -1
        return ErrorCode.none, epoch, end_offset

    def metadata_image(self) -> MetadataImage:
        return self.image

    # ---- the follower's side, driven by a fetcher -------------------------------------

    def truncation_request(self, tp: TopicPartition) -> tuple[int, int] | None:
        """The next step of a follower's truncation, before it may fetch.

        None when the partition needs no (more) truncation. With
        ``replication.truncation.mode=high-watermark`` (before KIP-101) the follower truncated
        to its HW when it became one (``_apply_partition``), and None follows. Otherwise
        (current leader epoch, our latest epoch) for the OffsetForLeaderEpoch request whose
        answer goes to `on_epoch_answer`.
        """
        state = self.follower_states.get(tp)
        if state is None or not state.needs_truncation:
            return None
        partition = self.partitions[tp]
        if self._log_config(tp.topic).truncation_mode == "high-watermark":
            self._truncate_to_high_watermark(tp)  # switched to the old rule meanwhile
            return None
        latest = partition.leader_epoch_cache.latest_epoch
        return partition.leader_epoch, -1 if latest is None else latest

    def _truncate_to_high_watermark(self, tp: TopicPartition) -> None:
        """The pre-KIP-101 rule: a new follower cuts its log to its own HW."""
        partition = self.partitions[tp]
        partition.truncate_to(partition.high_watermark, TruncationReason.HIGH_WATERMARK,
                              "pre-KIP-101 rule: truncate to the high watermark")
        self.follower_states[tp].needs_truncation = False

    def on_epoch_answer(self, tp: TopicPartition, leader_epoch: int, end_offset: int) -> None:
        """Truncate per the leader's answer (KIP-101/279); the next `truncation_request` says
        whether another round is needed."""
        partition = self.partitions[tp]
        state = truncation_for_epoch_answer(
            partition.leader_epoch_cache, partition.log_end_offset, partition.high_watermark,
            leader_epoch, end_offset)
        partition.truncate_to(state.offset, TruncationReason.OFFSET_FOR_LEADER_EPOCH,
                              f"leader epoch {leader_epoch} ends at {end_offset} on the leader")
        if state.completed:
            self.follower_states[tp].needs_truncation = False

    def build_follower_fetch(self, tps: list[TopicPartition], max_bytes: int
                             ) -> list[FetchPartition]:
        return [
            FetchPartition(tp, self.partitions[tp].log_end_offset,
                           self.partitions[tp].leader_epoch, self.partitions[tp].log_start_offset,
                           max_bytes)
            for tp in tps
        ]

    def on_follower_fetch(self, tp: TopicPartition, result: FetchResult) -> None:
        """Raises ``KAFKA_STORAGE_ERROR`` once the log directory failed (the fetcher backs
        off; the broker halts)."""
        if self.log_dir_offline:
            raise self.log_dir_failure_channel.storage_error(self.data_dir, f"appending to {tp}")
        partition = self.partitions[tp]
        try:
            partition.append_records_to_follower(result.records, result.high_watermark)
        except OSError as exc:
            raise self.log_dir_failure_channel.storage_error(
                self.data_dir, f"appending fetched records to {tp}", exc) from exc

    def on_follower_out_of_range(self, tp: TopicPartition, leader_start_offset: int,
                                 leader_end_offset: int) -> None:
        """Our fetch offset is outside the leader's log (Kafka's handleOutOfRangeError)."""
        partition = self.partitions[tp]
        if leader_end_offset < partition.log_end_offset:
            partition.truncate_to(leader_end_offset, TruncationReason.OUT_OF_RANGE,
                                  f"fetch offset beyond the leader's log end {leader_end_offset}")
        elif leader_start_offset > partition.log_end_offset:
            partition.truncate_fully_and_start_at(
                leader_start_offset, TruncationReason.OUT_OF_RANGE,
                f"the leader's log starts at {leader_start_offset}, past our log end "
                f"{partition.log_end_offset}")

    # ---- power loss ---------------------------------------------------------------------

    def record_power_loss(self) -> None:
        """The power-loss failpoint, before the unflushed bytes are cut: the log end offset
        of every replica as held in memory, for the restart to say what the loss took."""
        for tp, partition in sorted(self.partitions.items()):
            self.events.emit(EventType.POWER_LOSS, topic=tp.topic, partition=tp.partition,
                             broker=self.broker_id, log_end_offset=partition.log_end_offset,
                             leader_epoch=partition.leader_epoch)

    # ---- state for describe, metrics and the harness ------------------------------------

    def state(self) -> dict:
        return {
            "broker_id": self.broker_id,
            "metadata_offset": self.image.metadata_offset,
            "isr_shrinks": sum(p.isr_shrinks for p in self.partitions.values()),
            "isr_expands": sum(p.isr_expands for p in self.partitions.values()),
            "partitions": [
                {
                    "topic": tp.topic,
                    "partition": tp.partition,
                    "role": "leader" if p.is_leader else "follower",
                    "leader": p.leader_id,
                    "leader_epoch": p.leader_epoch,
                    "partition_epoch": p.partition_epoch,
                    "isr": list(p.isr),
                    "replicas": list(p.assignment),
                    "high_watermark": p.high_watermark,
                    "last_stable_offset": p.last_stable_offset,
                    "log_end_offset": p.log_end_offset,
                    "log_start_offset": p.log_start_offset,
                    "producers": len(p.log.producer_state.producers),
                    "ongoing_transactions": len(p.log.producer_state.ongoing_txns),
                }
                for tp, p in sorted(self.partitions.items())
            ],
        }
