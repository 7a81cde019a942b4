"""The records of ``__transaction_state``, byte for byte as Kafka writes them, and the
states they record.

A transactional id's state is one record keyed by the id; the latest record of a key wins
when a new coordinator replays the partition. Kafka 4.2's formats
(transaction-coordinator/src/main/resources/common/message/): ``TransactionLogKey`` version
0 (the transactional id) and ``TransactionLogValue`` version 0, which Kafka writes for
clients on transaction version 1 (``TransactionLog.valueToBytes``: the flexible version 1,
with the tagged previous/next producer ids of KIP-890, only for transaction version 2).
Each starts with its int16 version; strings are int16-length UTF-8, arrays int32-counted
(-1: null). A null value is a tombstone (an expired transactional id).

``TransactionState`` is Kafka's enum (``org.apache.kafka.coordinator.transaction.
TransactionState``): its ids are what ``TransactionStatus`` holds, and its valid previous
states are the only transitions ``TransactionMetadata`` makes.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from minibroker.cluster.types import TopicPartition

__all__ = [
    "CorruptTransactionRecordError",
    "TransactionLogValue",
    "TransactionState",
    "decode_key",
    "decode_value",
    "encode_key",
    "encode_value",
]

KEY_VERSION = 0
VALUE_VERSION = 0

_I8, _I16, _I32, _I64 = (struct.Struct(f">{c}") for c in "bhiq")


class CorruptTransactionRecordError(ValueError):
    """A key or value of ``__transaction_state`` that does not parse."""


class TransactionState(enum.Enum):
    """Kafka's ``TransactionState``: (id in the log, name as DescribeTransactions gives it,
    whether an idle transactional id in it may expire)."""

    EMPTY = (0, "Empty", True)
    ONGOING = (1, "Ongoing", False)
    PREPARE_COMMIT = (2, "PrepareCommit", False)
    PREPARE_ABORT = (3, "PrepareAbort", False)
    COMPLETE_COMMIT = (4, "CompleteCommit", True)
    COMPLETE_ABORT = (5, "CompleteAbort", True)
    DEAD = (6, "Dead", False)
    PREPARE_EPOCH_FENCE = (7, "PrepareEpochFence", False)

    @property
    def id(self) -> int:
        return self.value[0]

    @property
    def state_name(self) -> str:
        return self.value[1]

    @property
    def expiration_allowed(self) -> bool:
        return self.value[2]

    @property
    def valid_previous_states(self) -> frozenset[TransactionState]:
        return _VALID_PREVIOUS[self]

    @classmethod
    def from_id(cls, state_id: int) -> TransactionState:
        for state in cls:
            if state.id == state_id:
                return state
        raise CorruptTransactionRecordError(f"unknown transaction state id {state_id}")


S = TransactionState
_VALID_PREVIOUS: dict[TransactionState, frozenset[TransactionState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE, S.EMPTY, S.COMPLETE_COMMIT,
                                S.COMPLETE_ABORT}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_ABORT, S.COMPLETE_COMMIT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
}
del S


@dataclass(frozen=True)
class TransactionLogValue:
    """``TransactionLogValue`` version 0: what a transactional id's record holds."""

    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    state: TransactionState
    partitions: frozenset[TopicPartition]
    last_update_timestamp_ms: int
    start_timestamp_ms: int


def _string(value: str) -> bytes:
    data = value.encode()
    return _I16.pack(len(data)) + data


def encode_key(transactional_id: str) -> bytes:
    return _I16.pack(KEY_VERSION) + _string(transactional_id)


def encode_value(value: TransactionLogValue) -> bytes:
    """Version 0; the partitions by topic, each topic's ids in order (Kafka groups them by
    topic, ``TransactionLog.valueToBytes``); an Empty or Complete* state writes none."""
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(value.partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    parts = [_I16.pack(VALUE_VERSION), _I64.pack(value.producer_id),
             _I16.pack(value.producer_epoch), _I32.pack(value.transaction_timeout_ms),
             _I8.pack(value.state.id), _I32.pack(len(by_topic))]
    for topic, ids in by_topic.items():
        parts += [_string(topic), _I32.pack(len(ids)), *(_I32.pack(i) for i in ids)]
    parts += [_I64.pack(value.last_update_timestamp_ms), _I64.pack(value.start_timestamp_ms)]
    return b"".join(parts)


class _Reader:
    def __init__(self, data: bytes, what: str) -> None:
        self._data, self._at, self._what = data, 0, what

    def take(self, unpacker: struct.Struct) -> int:
        try:
            (value,) = unpacker.unpack_from(self._data, self._at)
        except struct.error:
            raise CorruptTransactionRecordError(
                f"{self._what} ends at byte {self._at} of {len(self._data)}") from None
        self._at += unpacker.size
        return int(value)

    def string(self) -> str:
        length = self.take(_I16)
        if length < 0 or self._at + length > len(self._data):
            raise CorruptTransactionRecordError(f"{self._what}: bad string length {length}")
        start, self._at = self._at, self._at + length
        try:
            return self._data[start:self._at].decode()
        except UnicodeDecodeError as exc:
            raise CorruptTransactionRecordError(f"{self._what}: {exc}") from None

    def count(self) -> Iterable[int]:
        count = self.take(_I32)
        if count < -1 or count > len(self._data):
            raise CorruptTransactionRecordError(f"{self._what}: bad array length {count}")
        return range(max(count, 0))

    def version(self, expected: int) -> None:
        version = self.take(_I16)
        if version != expected:
            raise CorruptTransactionRecordError(
                f"{self._what} version {version}: minibroker reads version {expected}, the "
                f"one it writes")

    def end(self) -> None:
        if self._at != len(self._data):
            raise CorruptTransactionRecordError(
                f"{self._what}: {len(self._data) - self._at} bytes after its last field")


def decode_key(data: bytes) -> str:
    """The transactional id of a key."""
    reader = _Reader(data, "TransactionLogKey")
    reader.version(KEY_VERSION)
    transactional_id = reader.string()
    reader.end()
    return transactional_id


def decode_value(data: bytes | None) -> TransactionLogValue | None:
    """None for a tombstone."""
    if data is None:
        return None
    reader = _Reader(data, "TransactionLogValue")
    reader.version(VALUE_VERSION)
    producer_id, producer_epoch = reader.take(_I64), reader.take(_I16)
    timeout_ms, state = reader.take(_I32), TransactionState.from_id(reader.take(_I8))
    partitions = set()
    for _ in reader.count():
        topic = reader.string()
        partitions.update(TopicPartition(topic, reader.take(_I32)) for _ in reader.count())
    value = TransactionLogValue(producer_id, producer_epoch, timeout_ms, state,
                                frozenset(partitions), reader.take(_I64), reader.take(_I64))
    reader.end()
    return value
