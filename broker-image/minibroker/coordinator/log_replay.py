"""Replaying a coordinator's partition: how a new coordinator learns the state it owns.

Both coordinators keep their state as records in a partition they lead (``__consumer_offsets``,
``__transaction_state``) and rebuild it, when they become its leader, by reading the
partition from its log start to its log end (Kafka's ``doLoadGroupsAndOffsets`` and
``TransactionStateManager.loadTransactionMetadata`` read to the log end offset, not the high
watermark), the latest record of each key winning. A batch that does not parse is skipped
with a warning, as Kafka skips what its deserializer rejects. A transaction marker is not a
record: it goes to ``on_marker`` (the group coordinator's transactional offsets wait for
theirs), or is passed over.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from minibroker.cluster.partition import Partition
from minibroker.cluster.types import TopicPartition
from minibroker.storage.control_records import EndTransactionMarker, end_txn_marker_of
from minibroker.storage.records import (
    BatchHeader,
    CorruptRecordError,
    decode_records,
    iter_batches,
)

__all__ = ["LOAD_BUFFER_SIZE", "replay"]

log = logging.getLogger("minibroker.coordinator")

# offsets.load.buffer.size and transaction.state.log.load.buffer.size (Kafka's defaults)
LOAD_BUFFER_SIZE = 5 * 1024 * 1024

Apply = Callable[[bytes | None, bytes | None, BatchHeader], None]
"""One record: its key, its value (None: a tombstone) and its batch's header."""
OnMarker = Callable[[BatchHeader, EndTransactionMarker], None]


def replay(tp: TopicPartition, replica: Partition, apply: Apply,
           corrupt: tuple[type[Exception], ...], on_marker: OnMarker | None = None) -> None:
    """``apply`` every record of ``replica``'s log in order, ``on_marker`` every
    transaction marker; a batch raising one of ``corrupt`` (or a corrupt record) is
    skipped."""
    position, end = replica.log_start_offset, replica.log_end_offset
    while position < end:
        data = replica.log.read(position, LOAD_BUFFER_SIZE)
        if not data:
            break
        for header, batch in iter_batches(data, validate_crc=False):
            position = header.next_offset
            try:
                if header.is_control:
                    if on_marker is not None:
                        on_marker(header, end_txn_marker_of(header, batch))
                    continue
                for record in decode_records(batch):
                    apply(record.key, record.value, header)
            except (CorruptRecordError, *corrupt) as exc:
                log.warning("%s: skipped the batch at offset %d: %s", tp, header.base_offset,
                            exc)
