"""``Partition``: one replica of a partition on this broker, as leader or follower.

Every replication state change lives here, in one place each: ``make_leader``,
``make_follower``, ``maybe_expand_isr``, ``maybe_shrink_isr``, ``maybe_increment_high_watermark``
and the follower's ``truncate_to``. The rules are Kafka's (seeds 000 and 001):

- HW = min LEO over the ISR (the *maximal* ISR while an expansion is in flight, plus any
  caught-up replica about to join); it never decreases while this broker leads.
- A follower's HW = min(leader's HW, own LEO).
- A follower leaves the ISR after ``replica.lag.time.max.ms`` without catching up; it joins
  when its LEO >= HW and >= the start offset of the leader's current epoch; the leader never
  leaves its own ISR. ISR changes go through the controller (AlterPartition) with the
  current partition epoch.

Each change is also recorded as a replication event (``minibroker.events``): becoming leader
or follower, a truncation that dropped offsets, and an ISR change this leader made.

The last stable offset (``last_stable_offset``) is the HW held back by the log's first
transaction not yet stable; ``read_committed`` reads stop there. Every HW change passes
through the ``high_watermark`` setter, so the log learns which transactions became stable.

Long (about 570 lines) as Kafka's ``Partition`` is: it is the one place of every change
above, leader and follower sides together, so that each reads next to the rules it must
agree with.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from minibroker import environment
from minibroker.cluster.errors import KafkaApiError
from minibroker.cluster.replica import Replica
from minibroker.cluster.types import (
    NO_LEADER,
    UNDEFINED_EPOCH,
    ErrorCode,
    FetchResult,
    LeaderRecoveryState,
    PartitionRegistration,
    TopicPartition,
)
from minibroker.config import LogConfig
from minibroker.events import EventType, IsrChangeReason, ReplicationEventLog, TruncationReason
from minibroker.storage.control_records import ControlRecordType
from minibroker.storage.leader_epoch_cache import LeaderEpochCache
from minibroker.storage.log import Log, LogAppendInfo, OffsetOutOfRangeError
from minibroker.storage.producer_state import (
    AppendOrigin,
    InvalidProducerBatchError,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    ProducerStateError,
    TransactionCoordinatorFencedError,
    VerificationGuard,
)
from minibroker.storage.records import CorruptRecordError

log = logging.getLogger("minibroker.partition")

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
READ_COMMITTED = 1  # Fetch's and ListOffsets' isolation level (0: READ_UNCOMMITTED)

_PRODUCER_STATE_ERRORS: dict[type[ProducerStateError], ErrorCode] = {
    OutOfOrderSequenceError: ErrorCode.out_of_order_sequence_number,
    InvalidProducerEpochError: ErrorCode.invalid_producer_epoch,
    InvalidProducerBatchError: ErrorCode.invalid_record,
    InvalidTxnStateError: ErrorCode.invalid_txn_state,
    TransactionCoordinatorFencedError: ErrorCode.transaction_coordinator_fenced,
}


@dataclass(frozen=True)
class AlterPartitionRequest:
    tp: TopicPartition
    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[int, ...]
    reason: IsrChangeReason
    detail: str
    # KIP-903 (AlterPartition v3's BrokerState): the broker epoch each new ISR member's
    # fetches came with, -1 where unknown; the controller refuses a member whose
    # registration has moved on since.
    broker_epochs: tuple[int, ...] = ()
    # KIP-704: the leader's recovery state; a leader is always RECOVERED (``makeLeader``).
    leader_recovery_state: LeaderRecoveryState = LeaderRecoveryState.RECOVERED


class Partition:
    def __init__(
        self,
        tp: TopicPartition,
        broker_id: int,
        log: Log,
        leader_epoch_cache: LeaderEpochCache,
        config: LogConfig,
        *,
        replica_lag_time_max_ms: int,
        clock_ms: Callable[[], float],
        alter_partition: Callable[[AlterPartitionRequest], None],
        alive_broker_epoch: Callable[[int], int | None],
        broker_shutting_down: Callable[[int], bool],
        events: ReplicationEventLog,
        high_watermark: int = 0,
    ) -> None:
        self.tp = tp
        self.broker_id = broker_id
        self.log = log
        self.leader_epoch_cache = leader_epoch_cache
        self.config = config
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        self._clock_ms = clock_ms
        self._alter_partition = alter_partition
        self._alive_broker_epoch = alive_broker_epoch
        self._broker_shutting_down = broker_shutting_down
        self._events = events
        self._high_watermark = -1
        self.high_watermark = min(high_watermark, log.log_end_offset)
        self.leader_id = NO_LEADER
        self.leader_epoch = UNDEFINED_EPOCH
        self.partition_epoch = -1
        self.assignment: tuple[int, ...] = ()
        self.isr: tuple[int, ...] = ()
        self.leader_recovery_state = LeaderRecoveryState.RECOVERED
        self.pending_alter: AlterPartitionRequest | None = None
        self.leader_epoch_start_offset = 0
        self.remote_replicas: dict[int, Replica] = {}
        self.isr_shrinks = 0
        self.isr_expands = 0

    # ---- views ---------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.broker_id

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @high_watermark.setter
    def high_watermark(self, offset: int) -> None:
        """Every HW change passes here (Kafka's ``UnifiedLog.updateHighWatermarkMetadata``):
        transactions whose markers it passed become stable."""
        self._high_watermark = offset
        self.log.on_high_watermark_updated(offset)

    @property
    def last_stable_offset(self) -> int:
        """The LSO: the HW, held back by the first transaction not yet stable (Kafka's
        ``UnifiedLog.lastStableOffset``). What ``read_committed`` consumers read to."""
        unstable = self.log.first_unstable_offset()
        return self._high_watermark if unstable is None else min(unstable,
                                                                   self._high_watermark)

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    @property
    def maximal_isr(self) -> frozenset[int]:
        """The committed ISR plus a replica whose addition is in flight (Kafka's rule: a
        joining replica counts for the HW at once; a leaving one only once committed)."""
        if self.pending_alter is None:
            return frozenset(self.isr)
        return frozenset(self.isr) | frozenset(self.pending_alter.new_isr)

    @property
    def effective_min_isr(self) -> int:
        """Kafka 3.7's effectiveMinIsr: min.insync.replicas capped at the replica count (the
        legacy rule, Kafka up to 3.6, does not cap it)."""
        if self.config.high_watermark_min_isr_rule == "legacy":
            return self.config.min_insync_replicas
        return min(self.config.min_insync_replicas, max(len(self.assignment), 1))

    def update_config(self, config: LogConfig) -> None:
        """A dynamic topic config change, as Kafka's LogManager.updateTopicConfig: min ISR and
        the high watermark's rule at once, the log's flush and segment settings from its next
        append."""
        self.config = config
        self.log.update_config(config.segment_bytes, config.flush_interval_messages,
                               config.flush_interval_ms)

    @property
    def is_under_min_isr(self) -> bool:
        return self.is_leader and len(self.isr) < self.effective_min_isr

    def __repr__(self) -> str:
        return f"[Partition {self.tp} epoch={self.leader_epoch}]"

    # ---- leadership changes ----------------------------------------------------------

    def make_leader(self, reg: PartitionRegistration) -> None:
        """Become leader at ``reg.leader_epoch``: the new epoch starts at our LEO."""
        now = self._clock_ms()
        if reg.leader_recovery_state is LeaderRecoveryState.RECOVERING:
            # Partition.makeLeader (Kafka 4.2): a KRaft leader has nothing to recover; it
            # marks itself RECOVERED and says so in its next AlterPartition.
            log.info("%r was marked as RECOVERING; marking it RECOVERED", self)
        self._apply_registration(reg)
        self.leader_epoch_start_offset = self.log_end_offset
        self.leader_epoch_cache.assign(reg.leader_epoch, self.log_end_offset)
        self.remote_replicas = {r: Replica(r) for r in reg.replicas if r != self.broker_id}
        for replica in self.remote_replicas.values():
            replica.reset(now, replica.broker_id in self.isr, self.log_end_offset)
        log.info("%r became leader with ISR %s, LEO %d, HW %d", self, list(self.isr),
                 self.log_end_offset, self.high_watermark)
        self._emit(EventType.BECOME_LEADER, log_end_offset=self.log_end_offset,
                   high_watermark=self.high_watermark, isr=list(self.isr))
        self.maybe_increment_high_watermark()

    def make_follower(self, reg: PartitionRegistration) -> None:
        """Follow ``reg.leader``; the fetcher truncates before it fetches."""
        self._apply_registration(reg)
        self.remote_replicas = {}
        log.info("%r became follower of %d with LEO %d, HW %d", self, reg.leader,
                 self.log_end_offset, self.high_watermark)
        self._emit(EventType.BECOME_FOLLOWER, leader=reg.leader,
                   log_end_offset=self.log_end_offset, high_watermark=self.high_watermark)

    def apply_registration(self, reg: PartitionRegistration) -> None:
        """Same leader and epoch, newer partition epoch: an ISR change was committed (ours,
        when the metadata outruns the AlterPartition answer, or the controller's own)."""
        if reg.partition_epoch <= self.partition_epoch:
            return
        pending = self.pending_alter
        ours = pending is not None and reg.isr == pending.new_isr
        self._update_isr(reg, pending if ours else None)

    def _update_isr(self, reg: PartitionRegistration, ours: AlterPartitionRequest | None
                    ) -> None:
        """The one place a committed ISR change is applied, counted and logged. Only this
        leader's own change (``ours``) is an event here: the controller records those it
        makes itself (a fenced broker leaving every ISR)."""
        old = self.isr
        self._apply_registration(reg)
        if self.is_leader and len(reg.isr) < len(old):
            self.isr_shrinks += 1
        elif self.is_leader and len(reg.isr) > len(old):
            self.isr_expands += 1
        if reg.isr != old:
            detail = ours.detail if ours is not None else "the controller changed it"
            log.info("%r ISR updated from %s to %s because %s", self, list(old), list(reg.isr),
                     detail)
            if ours is not None:
                self._emit(EventType.ISR_CHANGE, old_isr=list(old), isr=list(reg.isr),
                           reason=ours.reason, detail=ours.detail)
        self.maybe_increment_high_watermark()

    def _emit(self, event_type: EventType, **fields: object) -> None:
        """An event about this replica: its partition, its leader epoch, this broker."""
        self._events.emit(event_type, topic=self.tp.topic, partition=self.tp.partition,
                          leader_epoch=self.leader_epoch, broker=self.broker_id, **fields)

    def _apply_registration(self, reg: PartitionRegistration) -> None:
        self.leader_id = reg.leader
        self.leader_epoch = reg.leader_epoch
        self.partition_epoch = reg.partition_epoch
        self.assignment = reg.replicas
        self.isr = reg.isr
        self.leader_recovery_state = (LeaderRecoveryState.RECOVERED
                                      if reg.leader == self.broker_id
                                      else reg.leader_recovery_state)
        self.pending_alter = None

    # ---- leader: produce ----------------------------------------------------------------

    def append_records_to_leader(self, records: bytes, required_acks: int,
                                 origin: AppendOrigin = AppendOrigin.CLIENT, *,
                                 verify: bool = False,
                                 verification_guard: VerificationGuard | None = None
                                 ) -> LogAppendInfo:
        self._check_leader_for_write(required_acks)
        try:
            info = self.log.append_as_leader(records, self.leader_epoch, origin, verify=verify,
                                             verification_guard=verification_guard)
        except CorruptRecordError as exc:
            raise KafkaApiError(ErrorCode.corrupt_message, f"{self.tp}: {exc}") from None
        except ProducerStateError as exc:
            raise KafkaApiError(_PRODUCER_STATE_ERRORS[type(exc)], str(exc)) from None
        if info.duplicate:
            log.info("%r duplicate batch: answering with the original offsets %d-%d", self,
                     info.first_offset, info.last_offset)
        self.maybe_increment_high_watermark()
        return info

    def append_end_txn_marker(self, producer_id: int, producer_epoch: int,
                              coordinator_epoch: int, control_type: ControlRecordType,
                              transaction_version: int = 0) -> LogAppendInfo:
        """A transaction marker for the coordinator (Kafka's ``appendRecordsToLeader`` with
        origin COORDINATOR and acks=-1, as WriteTxnMarkers appends): refused below
        min.insync.replicas like any acks=-1 write."""
        self._check_leader_for_write(-1)
        try:
            info = self.log.append_end_txn_marker(
                producer_id, producer_epoch, coordinator_epoch, control_type,
                self.leader_epoch, int(environment.current().wall_clock() * 1000),
                transaction_version)
        except ProducerStateError as exc:
            raise KafkaApiError(_PRODUCER_STATE_ERRORS[type(exc)], str(exc)) from None
        self.maybe_increment_high_watermark()
        return info

    def maybe_start_transaction_verification(self, producer_id: int, producer_epoch: int
                                             ) -> VerificationGuard | None:
        """KIP-890 part 1 on the leader: the guard a transactional produce must verify
        with the coordinator first, or None when its transaction is already open here."""
        self._check_leader_for_write(0)
        try:
            return self.log.producer_state.maybe_start_transaction_verification(
                producer_id, producer_epoch)
        except ProducerStateError as exc:
            raise KafkaApiError(_PRODUCER_STATE_ERRORS[type(exc)], str(exc)) from None

    def _check_leader_for_write(self, required_acks: int) -> None:
        if not self.is_leader:
            raise KafkaApiError(ErrorCode.not_leader_or_follower,
                                f"broker {self.broker_id} is not the leader of {self.tp}")
        min_isr = self.effective_min_isr
        if required_acks == -1 and len(self.isr) < min_isr:
            raise KafkaApiError(
                ErrorCode.not_enough_replicas,
                f"{self.tp}: ISR {list(self.isr)} is smaller than min.insync.replicas={min_isr}",
            )

    def check_enough_replicas_reach_offset(self, required_offset: int) -> tuple[bool, ErrorCode]:
        """Kafka's DelayedProduce check: done once the HW passes the batch."""
        if not self.is_leader:
            return True, ErrorCode.not_leader_or_follower
        if self.high_watermark >= required_offset:
            # The records were appended before the ISR shrank (Kafka counts the maximal ISR).
            if len(self.maximal_isr) >= self.effective_min_isr:
                return True, ErrorCode.none
            return True, ErrorCode.not_enough_replicas_after_append
        return False, ErrorCode.none

    # ---- leader: fetch ------------------------------------------------------------------

    def check_current_leader_epoch(self, current_leader_epoch: int, require_leader: bool) -> None:
        """KIP-320 fencing: older epochs are fenced, newer ones are not known here yet."""
        if current_leader_epoch != UNDEFINED_EPOCH:
            if current_leader_epoch < self.leader_epoch:
                raise KafkaApiError(ErrorCode.fenced_leader_epoch,
                                    f"{self.tp}: epoch {current_leader_epoch} < "
                                    f"{self.leader_epoch}")
            if current_leader_epoch > self.leader_epoch:
                raise KafkaApiError(ErrorCode.unknown_leader_epoch,
                                    f"{self.tp}: epoch {current_leader_epoch} > "
                                    f"{self.leader_epoch}")
        if require_leader and not self.is_leader:
            raise KafkaApiError(ErrorCode.not_leader_or_follower,
                                f"broker {self.broker_id} is not the leader of {self.tp}")

    def read_records(self, fetch_offset: int, current_leader_epoch: int, max_bytes: int,
                     from_follower: bool, isolation_level: int = 0) -> FetchResult:
        """Followers read to the LEO; consumers below the HW (READ_UNCOMMITTED) or the LSO
        (READ_COMMITTED, with the aborted transactions among what they read, as Kafka's
        ``UnifiedLog.read`` with ``FetchIsolation.TXN_COMMITTED``)."""
        self.check_current_leader_epoch(current_leader_epoch, require_leader=True)
        lso = self.last_stable_offset
        committed = not from_follower and isolation_level == READ_COMMITTED
        max_offset = None if from_follower else lso if committed else self.high_watermark
        try:
            records = self.log.read(fetch_offset, max_bytes, max_offset)
        except OffsetOutOfRangeError as exc:
            raise KafkaApiError(ErrorCode.offset_out_of_range, str(exc)) from None
        return FetchResult(
            error=ErrorCode.none,
            high_watermark=self.high_watermark,
            last_stable_offset=lso,
            log_start_offset=self.log_start_offset,
            records=records,
            aborted_transactions=(self.log.collect_aborted_txns(fetch_offset, lso)
                                  if committed and records else None),
        )

    def update_follower_fetch_state(self, replica_id: int, fetch_offset: int,
                                    leader_end_offset: int, broker_epoch: int = -1) -> bool:
        """A follower's fetch tells us its LEO; returns True when the HW advanced. A fetch
        from an earlier incarnation of the follower (its broker epoch is below the one the
        live broker registered with; Kafka 3.5+, KIP-903's Replica.updateFetchStateOrThrow)
        changes nothing: its fetch offset is the log end of a log that may no longer exist."""
        replica = self.remote_replicas.get(replica_id)
        if replica is None:
            return False
        alive_epoch = self._alive_broker_epoch(replica_id)
        if broker_epoch != -1 and alive_epoch is not None and alive_epoch > broker_epoch:
            raise KafkaApiError(
                ErrorCode.not_leader_or_follower,
                f"{self.tp}: stale fetch state update from broker {replica_id}: broker epoch "
                f"{broker_epoch}, the live broker's is {alive_epoch}")
        replica.update_fetch_state(fetch_offset, leader_end_offset, self._clock_ms(),
                                   broker_epoch)
        self.maybe_expand_isr(replica)
        return self.maybe_increment_high_watermark()

    def maybe_increment_high_watermark(self) -> bool:
        """Kafka's maybeIncrementLeaderHW. Under the strict rule (Kafka 3.7+, KAFKA-15583)
        the HW stands still while the ISR is under the effective min ISR: records a lone
        leader acknowledged with acks=1 are not committed, so no consumer reads them."""
        if not self.is_leader:
            return False
        if self.config.high_watermark_min_isr_rule == "strict" and self.is_under_min_isr:
            return False
        leader_end_offset = self.log_end_offset
        now = self._clock_ms()
        new_hw = leader_end_offset
        maximal_isr = self.maximal_isr
        for replica in self.remote_replicas.values():
            joining = (replica.is_caught_up(leader_end_offset, now, self.replica_lag_time_max_ms)
                       and self._is_replica_isr_eligible(replica))
            if replica.log_end_offset < new_hw and (replica.broker_id in maximal_isr or joining):
                new_hw = replica.log_end_offset
        if new_hw > self.high_watermark:
            self.high_watermark = new_hw
            return True
        return False

    def reset_replicas_of_new_incarnations(self) -> None:
        """A follower that registered again (a new broker epoch) restarted: what the leader
        knew of its log end offset and lag came from the previous incarnation's log."""
        if not self.is_leader:
            return
        now = self._clock_ms()
        for replica in self.remote_replicas.values():
            alive_epoch = self._alive_broker_epoch(replica.broker_id)
            if (replica.broker_epoch not in (None, -1) and alive_epoch is not None
                    and alive_epoch != replica.broker_epoch):
                log.info("%r broker %d is a new incarnation (broker epoch %d, was %d): its "
                         "replica state is reset", self, replica.broker_id, alive_epoch,
                         replica.broker_epoch)
                replica.reset(now, False, self.log_end_offset)

    def _is_replica_isr_eligible(self, replica: Replica) -> bool:
        """Kafka 3.7's isReplicaIsrEligible: the broker is alive (registered, unfenced), not
        in controlled shutdown (KIP-841), and the fetches that made it caught up came from
        that registration (or sent no epoch)."""
        alive_epoch = self._alive_broker_epoch(replica.broker_id)
        return (alive_epoch is not None and replica.broker_epoch is not None
                and replica.broker_epoch in (-1, alive_epoch)
                and not self._broker_shutting_down(replica.broker_id))

    # ---- leader: ISR changes ------------------------------------------------------------

    def maybe_expand_isr(self, replica: Replica) -> None:
        if self.pending_alter is not None or replica.broker_id in self.isr:
            return
        end = replica.log_end_offset
        if (end >= self.high_watermark and end >= self.leader_epoch_start_offset
                and self._is_replica_isr_eligible(replica)):
            self._submit_isr((*self.isr, replica.broker_id), IsrChangeReason.CAUGHT_UP,
                             f"replica {replica.broker_id} caught up and rejoined ISR")

    def maybe_shrink_isr(self) -> None:
        """Drop followers that have not caught up within replica.lag.time.max.ms."""
        if not self.is_leader or self.pending_alter is not None:
            return
        now = self._clock_ms()
        leader_end_offset = self.log_end_offset
        out_of_sync = [
            r for r in self.isr
            if r != self.broker_id and r in self.remote_replicas
            and not self.remote_replicas[r].is_caught_up(leader_end_offset, now,
                                                         self.replica_lag_time_max_ms)
        ]
        if out_of_sync:
            new_isr = tuple(r for r in self.isr if r not in out_of_sync)
            lag = ", ".join(
                f"replica {r} is no longer in-sync (last caught up "
                f"{now - self.remote_replicas[r].last_caught_up_time_ms:.0f} ms ago)"
                for r in out_of_sync
            )
            self._submit_isr(new_isr, IsrChangeReason.LAG, lag)

    def _submit_isr(self, new_isr: tuple[int, ...], reason: IsrChangeReason,
                    detail: str) -> None:
        ordered = tuple(r for r in self.assignment if r in new_isr)
        epochs = tuple(
            self._alive_broker_epoch(r) if r == self.broker_id
            else self.remote_replicas[r].broker_epoch
            for r in ordered)
        epochs = tuple(-1 if e is None else e for e in epochs)
        self.pending_alter = AlterPartitionRequest(self.tp, self.leader_epoch,
                                                   self.partition_epoch, ordered, reason,
                                                   detail, epochs, self.leader_recovery_state)
        self._alter_partition(self.pending_alter)

    def on_alter_partition_response(self, request: AlterPartitionRequest, error: ErrorCode,
                                    reg: PartitionRegistration | None) -> bool:
        """Apply the controller's answer; returns True when the ISR changed."""
        if self.pending_alter is not request:
            return False  # superseded: a newer registration already arrived
        if error != ErrorCode.none or reg is None:
            self.pending_alter = None
            log.info("%r AlterPartition to %s rejected: %s", self, list(request.new_isr),
                     error.name.upper())
            return False
        if reg.partition_epoch <= self.partition_epoch:
            self.pending_alter = None
            return False
        self._update_isr(reg, request)
        return True

    # ---- leader: offsets ----------------------------------------------------------------

    def last_offset_for_leader_epoch(self, current_leader_epoch: int,
                                     leader_epoch: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch on the leader: (largest epoch <= requested, its end offset)."""
        self.check_current_leader_epoch(current_leader_epoch, require_leader=True)
        return self.leader_epoch_cache.end_offset_for(leader_epoch, self.log_end_offset)

    def fetch_offset_for_timestamp(self, timestamp: int, current_leader_epoch: int,
                                   isolation_level: int, replica_id: int) -> tuple[int, int]:
        """ListOffsets: earliest is the log start; latest is the HW for consumers (the LSO
        for READ_COMMITTED ones) and the LEO for followers (Kafka's isolation rules). A new
        leader whose HW has not yet reached the start of its epoch answers a consumer's
        latest with OFFSET_NOT_AVAILABLE (KIP-207, Kafka 2.2 onwards): its HW may still be
        below what the previous leader exposed, and a consumer resetting to it would read
        some records twice."""
        self.check_current_leader_epoch(current_leader_epoch, require_leader=True)
        if timestamp == EARLIEST_TIMESTAMP:
            return self.log_start_offset, self.leader_epoch
        if timestamp == LATEST_TIMESTAMP:
            if replica_id >= 0:
                return self.log_end_offset, self.leader_epoch
            if self.leader_epoch_start_offset > self.high_watermark:
                raise KafkaApiError(
                    ErrorCode.offset_not_available,
                    f"{self.tp}: the high watermark ({self.high_watermark}) of leader epoch "
                    f"{self.leader_epoch} is behind the epoch's start offset "
                    f"({self.leader_epoch_start_offset})")
            if isolation_level == READ_COMMITTED:
                return self.last_stable_offset, self.leader_epoch
            return self.high_watermark, self.leader_epoch
        raise KafkaApiError(ErrorCode.invalid_request,
                            f"ListOffsets by timestamp ({timestamp}) is not supported")

    # ---- follower ---------------------------------------------------------------------

    def append_records_to_follower(self, records: bytes, leader_high_watermark: int) -> int:
        """Append what the leader sent; HW = min(leader HW, own LEO). Returns the LEO."""
        if records:
            info = self.log.append_as_follower(records)
            for batch in info.batches:
                latest = self.leader_epoch_cache.latest_epoch
                if latest is None or batch.partition_leader_epoch > latest:
                    self.leader_epoch_cache.assign(batch.partition_leader_epoch,
                                                   batch.base_offset)
        self.high_watermark = min(leader_high_watermark, self.log_end_offset)
        return self.log_end_offset

    def truncate_to(self, offset: int, reason: TruncationReason, detail: str) -> None:
        """Drop the offsets from ``offset`` on (from the batch holding it); ``reason`` and
        ``detail`` say why, in the log and in the truncation event."""
        if offset >= self.log_end_offset:
            # As Kafka 3.x's UnifiedLog.truncateTo (KIP-279 era): truncate the epoch
            # cache even when the log keeps everything. A broker that became leader of an
            # epoch and appended nothing before losing leadership has an entry starting at
            # its log end offset; left there, its OffsetForLeaderEpoch requests keep naming
            # that epoch, the leader keeps answering with an epoch this broker never saw,
            # and it never fetches (a livelock).
            self.leader_epoch_cache.truncate_from_end(self.log_end_offset)
            return
        old_end = self.log_end_offset
        self.log.truncate_to(offset)
        self.leader_epoch_cache.truncate_from_end(self.log_end_offset)
        self.high_watermark = min(self.high_watermark, self.log_end_offset)
        log.info("%r truncated log from %d to %d (%s: %s)", self, old_end, self.log_end_offset,
                 reason, detail)
        if self.log_end_offset < old_end:
            self._emit(EventType.TRUNCATION, from_offset=old_end, to_offset=self.log_end_offset,
                       reason=reason, detail=detail)

    def truncate_fully_and_start_at(self, offset: int, reason: TruncationReason,
                                    detail: str) -> None:
        """Drop the whole log and restart it, empty, at ``offset``. As an event, the offsets
        dropped run from the old log end down to the old log start."""
        old_start, old_end = self.log_start_offset, self.log_end_offset
        self.log.truncate_fully_and_start_at(offset)
        self.leader_epoch_cache.clear_and_flush()
        self.high_watermark = offset
        detail = f"{detail}; the log restarts empty at offset {offset}"
        log.info("%r truncated fully, restarting at %d (%s: %s)", self, offset, reason, detail)
        if old_end > old_start:
            self._emit(EventType.TRUNCATION, from_offset=old_end, to_offset=old_start,
                       reason=reason, detail=detail)
