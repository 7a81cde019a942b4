"""Transaction markers: the control batches that end a transaction in a partition (KIP-98).

A marker is a batch with the transactional and control attributes, the producer's id and
epoch, no sequence, and one record whose key is Kafka's ``ControlRecordType`` (version
int16, type int16: ABORT 0, COMMIT 1) and whose value is its ``EndTransactionMarker``
(version int16, coordinator epoch int32). Only the partition's leader writes one, when the
transaction coordinator asks (WriteTxnMarkers; Kafka's ``MemoryRecords.
withEndTransactionMarker``); consumers never see it as a record, they use it to close the
producer's transaction (``read_committed`` drops what an ABORT closes).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from minibroker.storage.records import (
    CONTROL_FLAG,
    TRANSACTIONAL_FLAG,
    BatchHeader,
    CorruptRecordError,
    build_batch,
    decode_records,
)

__all__ = ["ControlRecordType", "EndTransactionMarker", "build_end_txn_marker",
           "end_txn_marker_of"]

_KEY = struct.Struct(">hh")  # version, type
_VALUE = struct.Struct(">hi")  # version, coordinator epoch
_CURRENT_VERSION = 0


class ControlRecordType(IntEnum):
    """Kafka's ``ControlRecordType`` (the transaction ones)."""

    ABORT = 0
    COMMIT = 1


@dataclass(frozen=True, slots=True)
class EndTransactionMarker:
    control_type: ControlRecordType
    coordinator_epoch: int

    @property
    def is_abort(self) -> bool:
        return self.control_type is ControlRecordType.ABORT


def build_end_txn_marker(producer_id: int, producer_epoch: int, coordinator_epoch: int,
                         control_type: ControlRecordType, timestamp_ms: int) -> bytes:
    """The control batch a leader appends for WriteTxnMarkers (offsets assigned on append)."""
    return build_batch(
        [_VALUE.pack(_CURRENT_VERSION, coordinator_epoch)],
        keys=[_KEY.pack(_CURRENT_VERSION, control_type)],
        timestamp_ms=timestamp_ms, producer_id=producer_id, producer_epoch=producer_epoch,
        attributes=TRANSACTIONAL_FLAG | CONTROL_FLAG)


def end_txn_marker_of(header: BatchHeader, batch: bytes | memoryview) -> EndTransactionMarker:
    """The marker a control batch carries (``batch``: its bytes, header included)."""
    records = decode_records(batch)
    where = f"control batch at offset {header.base_offset}"
    if len(records) != 1:
        raise CorruptRecordError(f"{where}: {len(records)} records, a marker has one")
    key, value = records[0].key, records[0].value
    if key is None or len(key) < _KEY.size or value is None or len(value) < _VALUE.size:
        raise CorruptRecordError(f"{where}: key or value too short for a transaction marker")
    _, type_id = _KEY.unpack_from(key)
    if type_id not in (ControlRecordType.ABORT, ControlRecordType.COMMIT):
        raise CorruptRecordError(f"{where}: control type {type_id} is not a transaction marker")
    _, coordinator_epoch = _VALUE.unpack_from(value)
    return EndTransactionMarker(ControlRecordType(type_id), coordinator_epoch)
