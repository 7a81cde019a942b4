"""Idempotent and transactional producers (KIP-98): Kafka's ``ProducerStateManager`` for one
partition's log.

For every producer id that wrote to the log it keeps a ``ProducerStateEntry``: the producer's
epoch and the ``BatchMetadata`` (sequence range and offsets) of its last five batches, which
is what a leader needs to tell a retry from a new batch. A retry of one of those five is a
duplicate, answered with the original offsets and not appended again; any other batch of the
current epoch must continue the sequence; an older epoch is fenced. The rules are Kafka 3.x's
(``ProducerAppendInfo`` since KIP-360): a new epoch of a known producer must start at sequence
0, while a producer id the log does not know is accepted at any sequence (its batches may have
been truncated away), so UNKNOWN_PRODUCER_ID is never returned.

Transactions (Kafka 4.2's ``ProducerAppendInfo``, ``ProducerStateManager``): a producer's
first transactional batch opens its transaction here (``current_txn_first_offset``, and an
entry in the ongoing transactions by first offset); a non-transactional batch while one is
open is INVALID_TXN_STATE. A marker (``control_records``) closes it, and is refused when its
producer epoch is older than the entry's (INVALID_PRODUCER_EPOCH; transaction versions 0
and 1, where a marker carries the epoch of the transaction's records), under transaction
version 2 when it is not newer (its decision bumped the epoch, so the marker fences every
batch of the transaction it ends: a late one is INVALID_PRODUCER_EPOCH), or when its
coordinator epoch is older than the last marker's (TRANSACTION_COORDINATOR_FENCED: a zombie
coordinator).
A closed transaction stays *unreplicated* until the high watermark passes its marker. The
first unstable offset, the first offset of a transaction open or not yet replicated, bounds
the last stable offset (LSO) that ``read_committed`` consumers read to.

KIP-890 part 1 (Kafka 3.6+, ``transaction.partition.verification.enable``): before a
client's first transactional batch of a transaction is appended, the leader asks the
coordinator whether the partition is in that transaction; the ``VerificationGuard`` it
hands out for the question must still be the producer's when the batch is appended. Any
transactional batch or marker of the producer clears it, so a batch verified before an
abort and appended after its marker is refused (INVALID_TXN_STATE) instead of opening a
transaction nobody will ever end (a hanging transaction).

There are no snapshot files: the state is a function of the batches in the log (their
headers carry producer id, epoch, base sequence and the transactional flag; a marker's one
record its type), so the ``Log`` rebuilds it from them when it is opened (after recovery cut
a bad tail) and after a truncation removed batches it knew of. Followers apply replicated
batches without checks, so a new leader deduplicates retries of batches its predecessor
appended, and knows which transactions its predecessor left open.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from minibroker.storage.control_records import EndTransactionMarker
from minibroker.storage.records import BatchHeader

__all__ = [
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "NO_SEQUENCE",
    "NUM_BATCHES_TO_RETAIN",
    "AppendOrigin",
    "AppendedBatch",
    "BatchMetadata",
    "CompletedTxn",
    "InvalidProducerBatchError",
    "InvalidProducerEpochError",
    "InvalidTxnStateError",
    "OutOfOrderSequenceError",
    "ProducerStateEntry",
    "ProducerStateError",
    "ProducerStateManager",
    "TransactionCoordinatorFencedError",
    "VerificationGuard",
]

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
_MAX_PRODUCER_EPOCH = 2**15 - 1  # Short.MAX_VALUE
NUM_BATCHES_TO_RETAIN = 5  # Kafka's: matches max.in.flight.requests.per.connection <= 5
_MAX_SEQUENCE = 2**31 - 1
NO_COORDINATOR_EPOCH = -1
_NO_OFFSET = 2**63 - 1



class AppendOrigin(Enum):
    """Kafka's ``AppendOrigin``: who appends decides what is checked. A client's batches
    get every check; a coordinator's (transactional offset commits) only the producer's
    epoch and transaction, having no sequence of their own; a follower's none."""

    CLIENT = "client"
    COORDINATOR = "coordinator"


AppendedBatch = tuple[BatchHeader, EndTransactionMarker | None]
"""A batch as the log holds it, with the marker a control batch carries."""


class ProducerStateError(Exception):
    """A producer's batch that the leader must refuse; subclasses name the Kafka error."""


class OutOfOrderSequenceError(ProducerStateError):
    """OUT_OF_ORDER_SEQUENCE_NUMBER: the batch does not continue the producer's sequence."""


class InvalidProducerEpochError(ProducerStateError):
    """INVALID_PRODUCER_EPOCH: a newer epoch of this producer id already wrote here."""


class InvalidProducerBatchError(ProducerStateError):
    """INVALID_RECORD: producer fields a producer cannot send (Kafka's LogValidator)."""


class InvalidTxnStateError(ProducerStateError):
    """INVALID_TXN_STATE: a non-transactional batch of a producer whose transaction is open."""


class TransactionCoordinatorFencedError(ProducerStateError):
    """TRANSACTION_COORDINATOR_FENCED: a marker from a coordinator older than the last one."""


class VerificationGuard:
    """Kafka's ``VerificationGuard``: the token of one verification, compared by identity."""

    __slots__ = ("producer_id",)

    def __init__(self, producer_id: int) -> None:
        self.producer_id = producer_id


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction a marker closed in this partition: Kafka's ``CompletedTxn``."""

    producer_id: int
    first_offset: int
    last_offset: int  # the marker's offset
    is_aborted: bool


def _last_sequence(batch: BatchHeader) -> int:
    """The batch's last sequence; sequences wrap from 2^31-1 to 0."""
    last = batch.base_sequence + batch.last_offset_delta
    return last - _MAX_SEQUENCE - 1 if last > _MAX_SEQUENCE else last


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == _MAX_SEQUENCE)


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """One appended batch of a producer: its sequence range and where it landed."""

    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int

    @classmethod
    def of(cls, batch: BatchHeader) -> BatchMetadata:
        return cls(batch.base_sequence, _last_sequence(batch), batch.base_offset,
                   batch.last_offset)


@dataclass
class ProducerStateEntry:
    """What the log says about one producer id: its epoch, its last five batches, the
    coordinator epoch of its last marker and the first offset of its open transaction."""

    producer_id: int
    producer_epoch: int = NO_PRODUCER_EPOCH
    batches: deque[BatchMetadata] = field(
        default_factory=lambda: deque(maxlen=NUM_BATCHES_TO_RETAIN))
    coordinator_epoch: int = NO_COORDINATOR_EPOCH
    current_txn_first_offset: int | None = None
    last_timestamp: int = -1  # the max timestamp of its last batch (producer.id.expiration.ms)

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def copy(self) -> ProducerStateEntry:
        return ProducerStateEntry(self.producer_id, self.producer_epoch,
                                  deque(self.batches, maxlen=NUM_BATCHES_TO_RETAIN),
                                  self.coordinator_epoch, self.current_txn_first_offset,
                                  self.last_timestamp)

    def find_duplicate_batch(self, batch: BatchHeader) -> BatchMetadata | None:
        """The retained batch with the same epoch and sequence range, if any."""
        if batch.producer_epoch != self.producer_epoch:
            return None
        first, last = batch.base_sequence, _last_sequence(batch)
        return next((m for m in self.batches if m.first_seq == first and m.last_seq == last),
                    None)

    def add_batch(self, batch: BatchHeader) -> bool:
        """Record an appended data batch; a new epoch forgets the old epoch's batches.
        Returns whether the batch opened a transaction."""
        self._update_epoch(batch.producer_epoch)
        self.batches.append(BatchMetadata.of(batch))
        self.last_timestamp = batch.max_timestamp
        if batch.is_transactional and self.current_txn_first_offset is None:
            self.current_txn_first_offset = batch.base_offset
            return True
        return False

    def end_txn(self, batch: BatchHeader, marker: EndTransactionMarker) -> CompletedTxn | None:
        """Record a marker (Kafka's ``appendEndTxnMarker``); the transaction it closed, if
        this partition held any of its records."""
        first = self.current_txn_first_offset
        self._update_epoch(batch.producer_epoch)
        self.coordinator_epoch = marker.coordinator_epoch
        self.last_timestamp = batch.max_timestamp
        self.current_txn_first_offset = None
        if first is None:
            return None
        return CompletedTxn(self.producer_id, first, batch.base_offset, marker.is_abort)

    def _update_epoch(self, producer_epoch: int) -> None:
        if producer_epoch != self.producer_epoch:
            self.producer_epoch = producer_epoch
            self.batches.clear()

    def check_txn_state(self, batch: BatchHeader, where: str) -> None:
        """Kafka's ``appendDataBatch``: an open transaction takes only transactional batches."""
        if self.current_txn_first_offset is not None and not batch.is_transactional:
            raise InvalidTxnStateError(
                f"{where}: expected a transactional write from producer {self.producer_id}, "
                f"whose transaction is open since offset {self.current_txn_first_offset}")

    def check_marker(self, producer_epoch: int, marker: EndTransactionMarker,
                     where: str, transaction_version: int = 0) -> None:
        """Kafka's ``checkProducerEpoch`` and ``checkCoordinatorEpoch`` for a coordinator's
        marker. Transaction versions 0 and 1 refuse a marker of an older epoch; version 2's
        marker carries the epoch its decision bumped, so it must be newer than the
        producer's batches here, except the retry of a marker already written (the same
        epoch with no transaction open: KAFKA-19999, Kafka 4.2) and, from Kafka 4.3, the
        marker of a transaction at the largest epoch, which the coordinator aborts without
        a bump (KAFKA-20090)."""
        tv2 = transaction_version >= 2
        stale = producer_epoch <= self.producer_epoch if tv2 \
            else producer_epoch < self.producer_epoch
        if stale and not (tv2 and producer_epoch == self.producer_epoch
                          and (self.current_txn_first_offset is None
                               or producer_epoch == _MAX_PRODUCER_EPOCH)):
            raise InvalidProducerEpochError(
                f"{where}: epoch {producer_epoch} of producer {self.producer_id}'s marker is "
                f"{'not newer than' if tv2 else 'older than'} the last seen epoch "
                f"{self.producer_epoch} (transaction version {transaction_version})")
        if marker.coordinator_epoch < self.coordinator_epoch:
            raise TransactionCoordinatorFencedError(
                f"{where}: coordinator epoch {marker.coordinator_epoch} of producer "
                f"{self.producer_id}'s marker is older than {self.coordinator_epoch} (a zombie "
                "coordinator)")

    def check_epoch(self, batch: BatchHeader, where: str) -> None:
        """Kafka's checkProducerEpoch for a data batch."""
        if batch.producer_epoch < self.producer_epoch:
            raise InvalidProducerEpochError(
                f"{where}: epoch {batch.producer_epoch} of producer {self.producer_id} is older "
                f"than the last seen epoch {self.producer_epoch}")

    def check_append(self, batch: BatchHeader, where: str) -> None:
        """Kafka's checkProducerEpoch and checkSequence for a producer's (not a replica's)
        batch that is not a duplicate."""
        self.check_epoch(batch, where)
        epoch, first_seq = batch.producer_epoch, batch.base_sequence
        if epoch != self.producer_epoch:
            if first_seq != 0 and self.producer_epoch != NO_PRODUCER_EPOCH:
                raise OutOfOrderSequenceError(
                    f"{where}: new epoch {epoch} of producer {self.producer_id} starts at "
                    f"sequence {first_seq}, not 0 (current epoch {self.producer_epoch})")
        elif not _in_sequence(self.last_seq, first_seq):
            raise OutOfOrderSequenceError(
                f"{where}: producer {self.producer_id} epoch {epoch} sent sequence {first_seq}"
                f" after {self.last_seq}")


def _check_producer_fields(batch: BatchHeader, where: str) -> None:
    if batch.is_control:
        raise InvalidProducerBatchError(
            f"{where}: clients are not allowed to write control records")
    if batch.producer_epoch < 0 or batch.base_sequence < 0:
        raise InvalidProducerBatchError(
            f"{where}: batch of producer {batch.producer_id} has epoch {batch.producer_epoch} "
            f"and base sequence {batch.base_sequence}; both must be >= 0")


class ProducerStateManager:
    """Producer id -> ``ProducerStateEntry`` for one partition, as of the log's end, with
    the transactions open in it and those closed but not yet below the high watermark."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._producers: dict[int, ProducerStateEntry] = {}
        # first offset -> producer id; closed ones by first offset too (markers may close
        # them in another order).
        self._ongoing_txns: dict[int, int] = {}
        self._unreplicated_txns: dict[int, CompletedTxn] = {}
        self._last_offset = -1  # the last offset of any batch with a producer id
        self._verification_guards: dict[int, VerificationGuard] = {}

    @property
    def producers(self) -> Mapping[int, ProducerStateEntry]:
        return self._producers

    def last_entry(self, producer_id: int) -> ProducerStateEntry | None:
        return self._producers.get(producer_id)

    @property
    def ongoing_txns(self) -> Mapping[int, int]:
        """First offset -> producer id of each transaction open in this partition."""
        return self._ongoing_txns

    def first_unstable_offset(self) -> int | None:
        """The first offset of a transaction open, or closed by a marker not yet below the
        high watermark (Kafka's ``firstUnstableOffset``); None when there is none."""
        if not self._ongoing_txns and not self._unreplicated_txns:
            return None
        return min(min(self._ongoing_txns, default=_NO_OFFSET),
                   min(self._unreplicated_txns, default=_NO_OFFSET))

    def on_high_watermark_updated(self, high_watermark: int) -> None:
        """Closed transactions whose marker the high watermark passed are stable."""
        if not self._unreplicated_txns:  # every HW change of every partition comes here
            return
        stable = [first for first, txn in self._unreplicated_txns.items()
                  if txn.last_offset < high_watermark]
        for first in stable:
            del self._unreplicated_txns[first]

    def maybe_start_transaction_verification(self, producer_id: int,
                                             producer_epoch: int) -> VerificationGuard | None:
        """Kafka's ``UnifiedLog.maybeStartTransactionVerification``: None when the
        producer's transaction is already open here in this epoch (nothing to verify), else
        the guard the append must present (the one already handed out, if any)."""
        entry = self._producers.get(producer_id)
        if entry is not None and producer_epoch < entry.producer_epoch:
            raise InvalidProducerEpochError(
                f"{self._name}: epoch {producer_epoch} of producer {producer_id} is older than "
                f"the last seen epoch {entry.producer_epoch}")
        if (entry is not None and entry.current_txn_first_offset is not None
                and entry.producer_epoch == producer_epoch):
            return None
        return self._verification_guards.setdefault(producer_id,
                                                    VerificationGuard(producer_id))

    def check_leader_append(self, batches: Sequence[BatchHeader],
                            origin: AppendOrigin = AppendOrigin.CLIENT, *,
                            verify: bool = False,
                            verification_guard: VerificationGuard | None = None
                            ) -> BatchMetadata | None:
        """Validate a producer's batches (offsets already assigned) before they are written.

        Returns the original of a retried batch, in which case nothing may be appended;
        raises ``ProducerStateError`` for a batch the leader must refuse. With ``verify``
        (KIP-890 part 1), a transactional batch that would open a transaction must come
        with the producer's current ``verification_guard``. Changes nothing: ``append``
        records the batches once they are in the log.
        """
        staged: dict[int, ProducerStateEntry] = {}
        for batch in batches:
            pid = batch.producer_id
            where = f"{self._name} offset {batch.base_offset}"
            if pid == NO_PRODUCER_ID:
                if batch.is_transactional or batch.is_control:
                    raise InvalidProducerBatchError(
                        f"{where}: a transactional or control batch without a producer id")
                continue
            _check_producer_fields(batch, where)
            entry = staged.get(pid)
            if entry is None:
                staged[pid] = entry = self._entry_copy(pid)
            if origin is AppendOrigin.CLIENT:
                duplicate = entry.find_duplicate_batch(batch)
                if duplicate is not None:
                    return duplicate
                entry.check_append(batch, where)
            else:
                entry.check_epoch(batch, where)
            entry.check_txn_state(batch, where)
            if (verify and batch.is_transactional and entry.current_txn_first_offset is None
                    and (verification_guard is None
                         or self._verification_guards.get(pid) is not verification_guard)):
                raise InvalidTxnStateError(
                    f"{where}: record of producer {pid} was not part of an ongoing "
                    "transaction (not verified with its coordinator, or ended since)")
            entry.add_batch(batch)
        return None

    def check_marker_append(self, producer_id: int, producer_epoch: int,
                            marker: EndTransactionMarker, offset: int,
                            transaction_version: int = 0) -> None:
        """Validate a coordinator's marker before it is written (``check_marker``)."""
        self._entry_copy(producer_id).check_marker(producer_epoch, marker,
                                                   f"{self._name} offset {offset}",
                                                   transaction_version)

    def _entry_copy(self, producer_id: int) -> ProducerStateEntry:
        current = self._producers.get(producer_id)
        return current.copy() if current else ProducerStateEntry(producer_id)

    def append(self, batches: Iterable[AppendedBatch]) -> list[CompletedTxn]:
        """Record batches now in the log (a leader's checked ones or a follower's copies);
        returns the transactions their markers closed, for the caller to index (aborted
        ones) before ``complete_txn``."""
        completed: list[CompletedTxn] = []
        for batch, marker in batches:
            pid = batch.producer_id
            if pid == NO_PRODUCER_ID:
                continue
            entry = self._producers.get(pid)
            if entry is None:
                entry = self._producers[pid] = ProducerStateEntry(pid)
            self._last_offset = batch.last_offset
            if batch.is_transactional:  # the transaction is open or over: guard spent
                self._verification_guards.pop(pid, None)
            if marker is None:
                if entry.add_batch(batch):
                    self._ongoing_txns[batch.base_offset] = pid
            else:
                txn = entry.end_txn(batch, marker)
                if txn is not None:
                    completed.append(txn)
        return completed

    def last_stable_offset(self, txn: CompletedTxn) -> int:
        """The LSO once ``txn`` is complete (Kafka's ``lastStableOffset(CompletedTxn)``):
        the first offset of another producer's open transaction, else past the marker. The
        aborted-transaction index keeps it with the entry."""
        return min((first for first, pid in self._ongoing_txns.items()
                    if pid != txn.producer_id), default=txn.last_offset + 1)

    def complete_txn(self, txn: CompletedTxn) -> None:
        """The transaction is closed; it stays unstable until the HW passes its marker."""
        del self._ongoing_txns[txn.first_offset]
        self._unreplicated_txns[txn.first_offset] = txn

    def remove_expired_producers(self, now_ms: int, expiration_ms: int) -> list[int]:
        """Kafka's ``removeExpiredProducers``: forget each producer with no transaction
        open whose last batch is ``expiration_ms`` old; returns their ids."""
        expired = [pid for pid, entry in self._producers.items()
                   if entry.current_txn_first_offset is None
                   and now_ms - entry.last_timestamp >= expiration_ms]
        for pid in expired:
            del self._producers[pid]
            self._verification_guards.pop(pid, None)
        return expired

    def knows_offsets_from(self, offset: int) -> bool:
        """Whether a truncation to ``offset`` removes a batch this state remembers; if not,
        it removes only batches without a producer id and the state stays as it is."""
        return self._last_offset >= offset

    def clear(self) -> None:
        """Forget everything (the log starts over; ``append`` its batches again)."""
        self._producers.clear()
        self._ongoing_txns.clear()
        self._unreplicated_txns.clear()
        self._last_offset = -1
        self._verification_guards.clear()
