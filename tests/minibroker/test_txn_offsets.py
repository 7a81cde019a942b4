"""Offsets committed in a transaction (TxnOffsetCommit; Kafka 3.9's GroupMetadata
``prepareTxnOffsetCommit``, ``completePendingTxnOffsetCommit`` and the load's handling of
transactional records): written as the producer's transactional batch with origin
COORDINATOR, pending (OffsetFetch's require_stable says UNSTABLE_OFFSET_COMMIT) until the
transaction's marker, then the group's offset on COMMIT and gone on ABORT; a new
coordinator replaying the partition reaches the same state, with a transaction still open
left pending."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from group_harness import GROUP, Harness

from minibroker.cluster.types import ErrorCode, TopicPartition
from minibroker.coordinator.records import OffsetAndMetadata
from minibroker.storage.control_records import ControlRecordType
from minibroker.storage.durability import DurabilityTracker
from minibroker.storage.log import Log
from minibroker.storage.producer_state import AppendOrigin
from minibroker.storage.records import iter_batches

INPUT = TopicPartition("input", 0)


def txn_commit(h: Harness, producer_id: int, offset: int, epoch: int = 0) -> ErrorCode:
    answer: list[dict[TopicPartition, ErrorCode]] = []
    h.coordinator.handle_txn_commit_offsets(
        GROUP, producer_id, epoch, "", None, -1,
        {INPUT: OffsetAndMetadata(offset, commit_timestamp=0)}, answer.append)
    (errors,) = answer
    return errors[INPUT]


def committed(h: Harness, require_stable: bool = False) -> tuple[ErrorCode, int]:
    error, offsets = h.coordinator.handle_fetch_offsets(GROUP, require_stable, [INPUT])
    assert error == ErrorCode.none
    return offsets[INPUT].error, offsets[INPUT].offset


def test_a_transactions_offsets_count_only_once_its_commit_marker_is_written(
        tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.lead()
    assert txn_commit(h, 7, 5) == ErrorCode.none
    (tp, batch), origin = h.written[-1], h.origins[-1]
    ((header, _),) = list(iter_batches(batch))
    assert (origin, header.is_transactional, header.producer_id) == (
        AppendOrigin.COORDINATOR, True, 7)
    assert committed(h) == (ErrorCode.none, -1)
    assert committed(h, require_stable=True) == (ErrorCode.unstable_offset_commit, -1)
    h.coordinator.on_transaction_completed(7, {tp.partition}, is_commit=True)
    assert committed(h, require_stable=True) == (ErrorCode.none, 5)
    assert txn_commit(h, 9, 8) == ErrorCode.none
    h.coordinator.on_transaction_completed(9, {tp.partition}, is_commit=False)
    assert committed(h, require_stable=True) == (ErrorCode.none, 5)


def test_a_new_coordinator_replays_committed_aborted_and_open_transactions(
        tmp_path: Path) -> None:
    """The first coordinator's records and the leaders' markers in a real log: producer 7
    commits offset 5, producer 9 writes 8 and aborts, producer 11 writes 9 and is still
    open. The next coordinator loads 5, with 11's offset pending until its marker."""
    first = Harness(tmp_path / "first")
    first.lead()
    log = Log(tmp_path / "log", durability=DurabilityTracker())
    for producer_id, offset, marker in ((7, 5, ControlRecordType.COMMIT),
                                        (9, 8, ControlRecordType.ABORT), (11, 9, None)):
        assert txn_commit(first, producer_id, offset) == ErrorCode.none
        log.append_as_leader(first.written[-1][1], 0, AppendOrigin.COORDINATOR)
        if marker is not None:
            log.append_end_txn_marker(producer_id, 0, 0, marker, 0, 0)
    replica = SimpleNamespace(log=log, log_start_offset=log.log_start_offset,
                              log_end_offset=log.log_end_offset)
    second = Harness(tmp_path / "second", replica=replica)
    second.lead()
    assert committed(second) == (ErrorCode.none, 5)
    assert committed(second, require_stable=True) == (ErrorCode.unstable_offset_commit, -1)
    second.coordinator.on_transaction_completed(11, {0}, is_commit=True)
    assert committed(second, require_stable=True) == (ErrorCode.none, 9)
