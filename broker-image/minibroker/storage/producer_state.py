"""Idempotent producers (KIP-98): Kafka's ``ProducerStateManager`` for one partition's log.

For every producer id that wrote to the log it keeps a ``ProducerStateEntry``: the producer's
epoch and the ``BatchMetadata`` (sequence range and offsets) of its last five batches, which
is what a leader needs to tell a retry from a new batch. A retry of one of those five is a
duplicate, answered with the original offsets and not appended again; any other batch of the
current epoch must continue the sequence; an older epoch is fenced. The rules are Kafka 3.x's
(``ProducerAppendInfo`` since KIP-360): a new epoch of a known producer must start at sequence
0, while a producer id the log does not know is accepted at any sequence (its batches may have
been truncated away), so UNKNOWN_PRODUCER_ID is never returned.

There are no snapshot files: the state is a function of the batch headers in the log (they
carry producer id, epoch and base sequence), so the ``Log`` rebuilds it from them when it is
opened (after recovery cut a bad tail) and after a truncation removed batches it knew of.
Followers apply replicated batches without checks, so a new leader deduplicates retries of
batches its predecessor appended.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from minibroker.storage.records import BatchHeader

__all__ = [
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "NO_SEQUENCE",
    "NUM_BATCHES_TO_RETAIN",
    "BatchMetadata",
    "InvalidProducerBatchError",
    "InvalidProducerEpochError",
    "OutOfOrderSequenceError",
    "ProducerStateEntry",
    "ProducerStateError",
    "ProducerStateManager",
]

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NUM_BATCHES_TO_RETAIN = 5  # Kafka's: matches max.in.flight.requests.per.connection <= 5
_MAX_SEQUENCE = 2**31 - 1
_TRANSACTIONAL_FLAG = 0x10
_CONTROL_FLAG = 0x20


class ProducerStateError(Exception):
    """A producer's batch that the leader must refuse; subclasses name the Kafka error."""


class OutOfOrderSequenceError(ProducerStateError):
    """OUT_OF_ORDER_SEQUENCE_NUMBER: the batch does not continue the producer's sequence."""


class InvalidProducerEpochError(ProducerStateError):
    """INVALID_PRODUCER_EPOCH: a newer epoch of this producer id already wrote here."""


class InvalidProducerBatchError(ProducerStateError):
    """INVALID_RECORD: producer fields a producer cannot send (Kafka's LogValidator)."""


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
    """What the log says about one producer id: its epoch and its last five batches."""

    producer_id: int
    producer_epoch: int = NO_PRODUCER_EPOCH
    batches: deque[BatchMetadata] = field(
        default_factory=lambda: deque(maxlen=NUM_BATCHES_TO_RETAIN))

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def copy(self) -> ProducerStateEntry:
        return ProducerStateEntry(self.producer_id, self.producer_epoch,
                                  deque(self.batches, maxlen=NUM_BATCHES_TO_RETAIN))

    def find_duplicate_batch(self, batch: BatchHeader) -> BatchMetadata | None:
        """The retained batch with the same epoch and sequence range, if any."""
        if batch.producer_epoch != self.producer_epoch:
            return None
        first, last = batch.base_sequence, _last_sequence(batch)
        return next((m for m in self.batches if m.first_seq == first and m.last_seq == last),
                    None)

    def add_batch(self, batch: BatchHeader) -> None:
        """Record an appended batch; a new epoch forgets the old epoch's batches."""
        if batch.producer_epoch != self.producer_epoch:
            self.producer_epoch = batch.producer_epoch
            self.batches.clear()
        self.batches.append(BatchMetadata.of(batch))

    def check_append(self, batch: BatchHeader, where: str) -> None:
        """Kafka's checkProducerEpoch and checkSequence for a producer's (not a replica's)
        batch that is not a duplicate."""
        epoch, first_seq = batch.producer_epoch, batch.base_sequence
        if epoch < self.producer_epoch:
            raise InvalidProducerEpochError(
                f"{where}: epoch {epoch} of producer {self.producer_id} is older than the "
                f"last seen epoch {self.producer_epoch}")
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
    if batch.attributes & (_TRANSACTIONAL_FLAG | _CONTROL_FLAG):
        raise InvalidProducerBatchError(
            f"{where}: transactional and control batches are not supported (minibroker has "
            "no transaction coordinator)")
    if batch.producer_epoch < 0 or batch.base_sequence < 0:
        raise InvalidProducerBatchError(
            f"{where}: batch of producer {batch.producer_id} has epoch {batch.producer_epoch} "
            f"and base sequence {batch.base_sequence}; both must be >= 0")


class ProducerStateManager:
    """Producer id -> ``ProducerStateEntry`` for one partition, as of the log's end."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._producers: dict[int, ProducerStateEntry] = {}

    @property
    def producers(self) -> Mapping[int, ProducerStateEntry]:
        return self._producers

    def last_entry(self, producer_id: int) -> ProducerStateEntry | None:
        return self._producers.get(producer_id)

    def check_leader_append(self, batches: Sequence[BatchHeader]) -> BatchMetadata | None:
        """Validate a producer's batches (offsets already assigned) before they are written.

        Returns the original of a retried batch, in which case nothing may be appended;
        raises ``ProducerStateError`` for a batch the leader must refuse. Changes nothing:
        ``append`` records the batches once they are in the log.
        """
        staged: dict[int, ProducerStateEntry] = {}
        for batch in batches:
            pid = batch.producer_id
            if pid == NO_PRODUCER_ID:
                continue
            where = f"{self._name} offset {batch.base_offset}"
            _check_producer_fields(batch, where)
            entry = staged.get(pid)
            if entry is None:
                current = self._producers.get(pid)
                entry = current.copy() if current else ProducerStateEntry(pid)
                staged[pid] = entry
            duplicate = entry.find_duplicate_batch(batch)
            if duplicate is not None:
                return duplicate
            entry.check_append(batch, where)
            entry.add_batch(batch)
        return None

    def append(self, batches: Iterable[BatchHeader]) -> None:
        """Record batches now in the log (a leader's checked ones or a follower's copies)."""
        for batch in batches:
            if batch.producer_id != NO_PRODUCER_ID:
                entry = self._producers.get(batch.producer_id)
                if entry is None:
                    entry = self._producers[batch.producer_id] = ProducerStateEntry(
                        batch.producer_id)
                entry.add_batch(batch)

    def knows_offsets_from(self, offset: int) -> bool:
        """Whether a truncation to ``offset`` removes a batch this state remembers; if not,
        it removes only batches without a producer id and the state stays as it is."""
        return any(entry.last_offset >= offset for entry in self._producers.values())

    def rebuild(self, batches: Iterable[BatchHeader]) -> None:
        """Start over from the log's batches, oldest first."""
        self._producers.clear()
        self.append(batches)
