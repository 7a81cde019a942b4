"""A partition's side of transactions (KIP-98, Kafka 4.2's ProducerStateManager,
ProducerAppendInfo, TransactionIndex): a transactional batch opens its producer's
transaction, a marker closes it, the first unstable offset holds the LSO back until the
high watermark passes the marker, and an abort lands in the aborted-transaction index of
its marker's segment with the LSO it left. The state is rebuilt from the log when it is
reopened, copied by a follower, and rolled back by a truncation. Offsets were derived by
hand: each batch below takes the next offsets in the order written."""

from __future__ import annotations

from pathlib import Path

import pytest

from minibroker.storage.control_records import (
    ControlRecordType,
    EndTransactionMarker,
    build_end_txn_marker,
    end_txn_marker_of,
)
from minibroker.storage.durability import DurabilityTracker
from minibroker.storage.log import Log
from minibroker.storage.producer_state import (
    InvalidProducerBatchError,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    TransactionCoordinatorFencedError,
)
from minibroker.storage.records import TRANSACTIONAL_FLAG, build_batch, iter_batches
from minibroker.storage.transaction_index import AbortedTxn

ABORT, COMMIT = ControlRecordType.ABORT, ControlRecordType.COMMIT


def txn_batch(pid: int, seq: int, count: int = 1, epoch: int = 0) -> bytes:
    return build_batch([f"t-{pid}-{seq + i}".encode() for i in range(count)],
                       producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                       attributes=TRANSACTIONAL_FLAG)


def plain_batch(pid: int = -1, seq: int = -1) -> bytes:
    return build_batch([b"plain"], producer_id=pid, producer_epoch=0 if pid >= 0 else -1,
                       base_sequence=seq)


def open_log(directory: Path, **kwargs: int) -> Log:
    return Log(directory, durability=DurabilityTracker(), **kwargs)


def marker(log: Log, pid: int, control: ControlRecordType, coordinator_epoch: int = 5,
           epoch: int = 0, transaction_version: int = 0) -> int:
    return log.append_end_txn_marker(pid, epoch, coordinator_epoch, control, 0,
                                     1_700_000_000_000, transaction_version).first_offset


def test_an_aborted_transaction_is_unstable_until_its_marker_is_below_the_hw(
        tmp_path: Path) -> None:
    log = open_log(tmp_path)
    assert log.append_as_leader(txn_batch(7, 0, 2), 0).first_offset == 0  # offsets 0-1
    assert log.first_unstable_offset() == 0
    assert log.append_as_leader(plain_batch(), 0).first_offset == 2
    assert marker(log, 7, ABORT) == 3
    assert log.collect_aborted_txns(0, 4) == [AbortedTxn(7, 0, 3, 4)]
    assert log.collect_aborted_txns(2, 4) == [AbortedTxn(7, 0, 3, 4)]
    assert log.collect_aborted_txns(4, 9) == []  # the marker lies before the fetch
    log.on_high_watermark_updated(3)
    assert log.first_unstable_offset() == 0  # the marker itself is not replicated yet
    log.on_high_watermark_updated(4)
    assert log.first_unstable_offset() is None
    # The transaction is closed: the producer may write outside one again.
    assert log.append_as_leader(plain_batch(7, 2), 0).first_offset == 4
    assert log.producer_state.last_entry(7).coordinator_epoch == 5


def test_interleaved_transactions_keep_the_lso_at_the_other_producers_first_offset(
        tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(txn_batch(7, 0), 0)  # 0
    log.append_as_leader(txn_batch(8, 0), 0)  # 1
    assert marker(log, 7, ABORT) == 2
    assert log.collect_aborted_txns(0, 3) == [AbortedTxn(7, 0, 2, 1)]  # 8's is still open
    assert log.first_unstable_offset() == 0  # 7's marker is above the HW
    log.on_high_watermark_updated(3)
    assert log.first_unstable_offset() == 1
    assert marker(log, 8, COMMIT) == 3
    assert log.collect_aborted_txns(0, 4) == [AbortedTxn(7, 0, 2, 1)]  # a commit: no entry
    log.on_high_watermark_updated(4)
    assert log.first_unstable_offset() is None


def test_an_open_transaction_takes_only_transactional_batches(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(txn_batch(7, 0), 0)
    with pytest.raises(InvalidTxnStateError, match="transaction is open since offset 0"):
        log.append_as_leader(plain_batch(7, 1), 0)
    with pytest.raises(InvalidProducerBatchError, match="without a producer id"):
        log.append_as_leader(build_batch([b"x"], attributes=TRANSACTIONAL_FLAG), 0)
    assert log.log_end_offset == 1
    assert log.append_as_leader(txn_batch(7, 1), 0).first_offset == 1  # the same transaction
    assert log.producer_state.ongoing_txns == {0: 7}


def test_markers_of_an_older_producer_epoch_or_coordinator_are_refused(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(txn_batch(7, 0, epoch=2), 0)
    with pytest.raises(InvalidProducerEpochError, match=r"epoch 1 .* older than .* 2"):
        marker(log, 7, COMMIT, epoch=1)
    assert marker(log, 7, COMMIT, coordinator_epoch=5, epoch=2) == 1
    log.append_as_leader(txn_batch(7, 1, epoch=2), 0)
    with pytest.raises(TransactionCoordinatorFencedError, match="coordinator epoch 4"):
        marker(log, 7, ABORT, coordinator_epoch=4, epoch=2)
    assert log.log_end_offset == 3
    assert log.producer_state.ongoing_txns == {2: 7}


def test_a_transaction_version_2_marker_must_carry_a_newer_epoch(tmp_path: Path) -> None:
    """Kafka 4.2's checkProducerEpoch with transaction version 2: the decision bumped the
    epoch, so the marker's must be above the transaction's batches (then a late batch of
    that transaction is INVALID_PRODUCER_EPOCH); the same epoch is taken only as the retry
    of a marker already written, with no transaction open (KAFKA-19999)."""
    log = open_log(tmp_path)
    log.append_as_leader(txn_batch(7, 0, epoch=3), 0)
    with pytest.raises(InvalidProducerEpochError, match="not newer than the last seen epoch 3"):
        marker(log, 7, COMMIT, epoch=3, transaction_version=2)
    assert marker(log, 7, COMMIT, epoch=4, transaction_version=2) == 1
    assert marker(log, 7, COMMIT, epoch=4, transaction_version=2) == 2  # a retry
    with pytest.raises(InvalidProducerEpochError):
        log.append_as_leader(txn_batch(7, 1, epoch=3), 0)  # late, of the ended transaction
    assert log.append_as_leader(txn_batch(7, 0, epoch=4), 0).first_offset == 3
    with pytest.raises(InvalidProducerEpochError):  # open again: not a retry
        marker(log, 7, ABORT, epoch=4, transaction_version=2)
    # Versions 0 and 1: the marker carries the transaction's own epoch.
    assert marker(log, 7, ABORT, epoch=4, transaction_version=1) == 4


def test_a_version_2_marker_at_the_largest_epoch_closes_the_transaction_open_at_it(
        tmp_path: Path) -> None:
    """Kafka 4.3's checkProducerEpoch (KAFKA-20090): the coordinator aborts a transaction
    left open at epoch 32767 without bumping it, so the partition takes a version 2 marker
    of the same epoch there, though the transaction is open; below that epoch the same
    marker is still refused (Kafka 4.2 refused both)."""
    largest = 2**15 - 1
    log = open_log(tmp_path)
    log.append_as_leader(txn_batch(7, 0, epoch=largest), 0)
    assert marker(log, 7, ABORT, epoch=largest, transaction_version=2) == 1
    assert log.producer_state.ongoing_txns == {}
    log.append_as_leader(txn_batch(8, 0, epoch=largest - 1), 0)
    with pytest.raises(InvalidProducerEpochError, match="not newer than"):
        marker(log, 8, ABORT, epoch=largest - 1, transaction_version=2)


def test_the_state_and_the_index_are_rebuilt_when_the_log_is_reopened(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=200)  # a segment per batch or two
    log.append_as_leader(txn_batch(7, 0), 0)  # 0
    log.append_as_leader(txn_batch(8, 0), 0)  # 1
    marker(log, 7, ABORT)  # 2: aborted with 8's open at 1
    log.append_as_leader(txn_batch(9, 0), 0)  # 3
    marker(log, 9, ABORT)  # 4
    assert len(log.segment_base_offsets) > 1
    before = log.collect_aborted_txns(0, 5)
    assert before == [AbortedTxn(7, 0, 2, 1), AbortedTxn(9, 3, 4, 1)]
    log.close()
    reopened = open_log(tmp_path, segment_bytes=200)
    assert reopened.collect_aborted_txns(0, 5) == before
    assert reopened.producer_state.ongoing_txns == {1: 8}
    reopened.on_high_watermark_updated(5)
    assert reopened.first_unstable_offset() == 1


def test_a_follower_copy_holds_the_same_transactions(tmp_path: Path) -> None:
    leader = open_log(tmp_path / "leader")
    leader.append_as_leader(txn_batch(7, 0, 3), 0)  # 0-2
    marker(leader, 7, ABORT)  # 3
    leader.append_as_leader(txn_batch(8, 0), 0)  # 4
    follower = open_log(tmp_path / "follower")
    follower.append_as_follower(leader.read(0, 1 << 20))
    assert follower.collect_aborted_txns(0, 5) == [AbortedTxn(7, 0, 3, 4)]
    assert follower.producer_state.ongoing_txns == {4: 8}


def test_a_truncation_below_a_marker_reopens_its_transaction(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(txn_batch(6, 0), 0)  # 0
    marker(log, 6, ABORT)  # 1: kept by the truncation
    log.append_as_leader(txn_batch(7, 0, 2), 0)  # 2-3
    marker(log, 7, ABORT)  # 4
    log.on_high_watermark_updated(5)
    assert log.first_unstable_offset() is None
    log.truncate_to(4)
    log.on_high_watermark_updated(4)  # as Partition.truncate_to does: HW = min(HW, LEO)
    assert log.collect_aborted_txns(0, 5) == [AbortedTxn(6, 0, 1, 2)]
    assert log.producer_state.ongoing_txns == {2: 7}
    assert log.first_unstable_offset() == 2


def test_a_marker_is_a_control_batch_with_its_type_and_coordinator_epoch() -> None:
    data = build_end_txn_marker(7, 3, 12, COMMIT, 1_700_000_000_000)
    ((header, batch),) = list(iter_batches(data))
    assert (header.is_control, header.is_transactional) == (True, True)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 3, -1)
    assert end_txn_marker_of(header, batch) == EndTransactionMarker(COMMIT, 12)


def test_kip_890_a_batch_verified_before_its_transaction_ended_is_refused(
        tmp_path: Path) -> None:
    """The verification guard (Kafka's VerificationGuard): a batch that opens a transaction
    needs the producer's current one; once its transaction is open nothing is verified;
    a marker spends the guard, so a batch verified before an abort and appended after its
    marker is refused instead of opening a transaction nobody will end."""
    log = open_log(tmp_path)
    state = log.producer_state
    guard = state.maybe_start_transaction_verification(7, 0)
    assert guard is not None
    with pytest.raises(InvalidTxnStateError, match="not part of an ongoing transaction"):
        log.append_as_leader(txn_batch(7, 0), 0, verify=True)
    assert log.append_as_leader(txn_batch(7, 0), 0, verify=True,
                                verification_guard=guard).first_offset == 0
    assert state.maybe_start_transaction_verification(7, 0) is None  # open here already
    marker(log, 7, ABORT)  # 1
    late = state.maybe_start_transaction_verification(7, 0)
    marker(log, 7, ABORT)  # 2: the coordinator ended it before the verified batch landed
    with pytest.raises(InvalidTxnStateError):
        log.append_as_leader(txn_batch(7, 1), 0, verify=True, verification_guard=late)
    assert log.log_end_offset == 3
