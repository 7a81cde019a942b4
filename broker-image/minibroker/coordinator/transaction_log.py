"""The records of ``__transaction_state``, byte for byte as Kafka writes them, and the
states they record.

A transactional id's state is one record keyed by the id; the latest record of a key wins
when a new coordinator replays the partition. Kafka 4.2's formats
(transaction-coordinator/src/main/resources/common/message/): ``TransactionLogKey`` version
0 (the transactional id) and ``TransactionLogValue`` version 0 or 1, as
``TransactionLog.valueToBytes`` chooses by the cluster's ``transaction.version``
(``TransactionVersion.transactionLogValueVersion``: 0 under transaction version 0, the
flexible 1 from transaction version 1, whose tagged fields carry KIP-890's previous and next
producer ids and the transaction version of the client that made the transition). Each
starts with its int16 version. Version 0: strings int16-length UTF-8, arrays int32-counted
(-1: null). Version 1: compact strings and arrays (unsigned varint length + 1, 0: null) and
tagged fields, written only where they differ from their defaults, as Kafka's generated
code writes them. A null value is a tombstone (an expired transactional id).

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
from minibroker.coordinator.kafka_encoding import compact_string, string16, uvarint

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
VALUE_VERSIONS = (0, 1)
NO_PRODUCER_ID = -1  # the tagged fields' defaults (TransactionLogValue.json)
NO_PRODUCER_EPOCH = -1

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
    """``TransactionLogValue``: what a transactional id's record holds. The last four are
    version 1's tagged fields (version 0 reads them as their defaults)."""

    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    state: TransactionState
    partitions: frozenset[TopicPartition]
    last_update_timestamp_ms: int
    start_timestamp_ms: int
    previous_producer_id: int = NO_PRODUCER_ID
    next_producer_id: int = NO_PRODUCER_ID
    next_producer_epoch: int = NO_PRODUCER_EPOCH
    client_transaction_version: int = 0


def encode_key(transactional_id: str) -> bytes:
    return _I16.pack(KEY_VERSION) + string16(transactional_id)


def encode_value(value: TransactionLogValue, version: int = 0) -> bytes:
    """``version`` 0 or 1. The partitions by topic, each topic's ids in order (Kafka groups
    them by topic); an Empty state writes null, a Complete* state none
    (``TransactionLog.valueToBytes``, which refuses an Empty state with partitions)."""
    if version not in VALUE_VERSIONS:
        raise ValueError(f"TransactionLogValue has versions {VALUE_VERSIONS}, not {version}")
    if value.state is TransactionState.EMPTY and value.partitions:
        raise ValueError(f"an Empty transaction has no partitions: {value}")
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(value.partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    flexible = version >= 1
    parts = [_I16.pack(version), _I64.pack(value.producer_id),
             _I16.pack(value.producer_epoch), _I32.pack(value.transaction_timeout_ms),
             _I8.pack(value.state.id)]
    if value.state is TransactionState.EMPTY:
        parts.append(b"\x00" if flexible else _I32.pack(-1))
    else:
        parts.append(uvarint(len(by_topic) + 1) if flexible else _I32.pack(len(by_topic)))
    for topic, ids in by_topic.items():
        if flexible:
            parts += [compact_string(topic), uvarint(len(ids) + 1),
                      *(_I32.pack(i) for i in ids), b"\x00"]
        else:
            parts += [string16(topic), _I32.pack(len(ids)), *(_I32.pack(i) for i in ids)]
    parts += [_I64.pack(value.last_update_timestamp_ms), _I64.pack(value.start_timestamp_ms)]
    if flexible:
        parts.append(_tagged_fields(value))
    return b"".join(parts)


def _tagged_fields(value: TransactionLogValue) -> bytes:
    """Version 1's tagged fields in tag order, each only if not its default."""
    fields = [(tag, packed) for tag, packed, is_default in (
        (0, _I64.pack(value.previous_producer_id), value.previous_producer_id == NO_PRODUCER_ID),
        (1, _I64.pack(value.next_producer_id), value.next_producer_id == NO_PRODUCER_ID),
        (2, _I16.pack(value.client_transaction_version), value.client_transaction_version == 0),
        (3, _I16.pack(value.next_producer_epoch),
         value.next_producer_epoch == NO_PRODUCER_EPOCH)) if not is_default]
    return uvarint(len(fields)) + b"".join(
        uvarint(tag) + uvarint(len(packed)) + packed for tag, packed in fields)


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
        return self._text(self.take(_I16))

    def _text(self, length: int) -> str:
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

    def uvarint(self) -> int:
        value, shift = 0, 0
        while True:
            byte = self.take(_I8) & 0xFF
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise CorruptTransactionRecordError(f"{self._what}: varint over 5 bytes")

    def compact_count(self) -> Iterable[int]:
        count = self.uvarint() - 1
        if count > len(self._data):
            raise CorruptTransactionRecordError(f"{self._what}: bad array length {count}")
        return range(max(count, 0))

    def compact_string(self) -> str:
        return self._text(self.uvarint() - 1)

    def bytes_(self, length: int) -> bytes:
        if length < 0 or self._at + length > len(self._data):
            raise CorruptTransactionRecordError(f"{self._what}: bad field length {length}")
        start, self._at = self._at, self._at + length
        return self._data[start:self._at]

    def version(self, readable: tuple[int, ...]) -> int:
        version = self.take(_I16)
        if version not in readable:
            raise CorruptTransactionRecordError(
                f"{self._what} version {version}: minibroker reads versions {readable}, the "
                f"ones Kafka 4.2 writes")
        return version

    def end(self) -> None:
        if self._at != len(self._data):
            raise CorruptTransactionRecordError(
                f"{self._what}: {len(self._data) - self._at} bytes after its last field")


def decode_key(data: bytes) -> str:
    """The transactional id of a key."""
    reader = _Reader(data, "TransactionLogKey")
    reader.version((KEY_VERSION,))
    transactional_id = reader.string()
    reader.end()
    return transactional_id


def decode_value(data: bytes | None) -> TransactionLogValue | None:
    """None for a tombstone; version 0 or 1 (``TransactionLog.readTxnRecordValue``), a
    tagged field this version does not know skipped, as Kafka's generated reader does."""
    if data is None:
        return None
    reader = _Reader(data, "TransactionLogValue")
    flexible = reader.version(VALUE_VERSIONS) >= 1
    producer_id, producer_epoch = reader.take(_I64), reader.take(_I16)
    timeout_ms, state = reader.take(_I32), TransactionState.from_id(reader.take(_I8))
    partitions = set()
    for _ in reader.compact_count() if flexible else reader.count():
        topic = reader.compact_string() if flexible else reader.string()
        partitions.update(TopicPartition(topic, reader.take(_I32))
                          for _ in (reader.compact_count() if flexible else reader.count()))
        if flexible:
            _skip_tagged_fields(reader)
    last_update, start = reader.take(_I64), reader.take(_I64)
    tagged: dict[int, bytes] = _skip_tagged_fields(reader) if flexible else {}

    def tag(number: int, unpacker: struct.Struct, default: int) -> int:
        if number not in tagged:
            return default
        raw = tagged[number]
        if len(raw) != unpacker.size:
            raise CorruptTransactionRecordError(
                f"TransactionLogValue: tagged field {number} has {len(raw)} bytes")
        return int(unpacker.unpack(raw)[0])

    value = TransactionLogValue(
        producer_id, producer_epoch, timeout_ms, state, frozenset(partitions), last_update,
        start, previous_producer_id=tag(0, _I64, NO_PRODUCER_ID),
        next_producer_id=tag(1, _I64, NO_PRODUCER_ID),
        next_producer_epoch=tag(3, _I16, NO_PRODUCER_EPOCH),
        client_transaction_version=tag(2, _I16, 0))
    reader.end()
    return value


def _skip_tagged_fields(reader: _Reader) -> dict[int, bytes]:
    """A flexible structure's tagged fields, by tag."""
    return {reader.uvarint(): reader.bytes_(reader.uvarint()) for _ in range(reader.uvarint())}
