"""Transaction version 2 (KIP-890 part 2) at the coordinator, against the log append
``test_txn_coordinator``'s harness answers: every EndTxn of a version 2 client bumps the
producer epoch and answers the new one (Kafka 4.2's ``TransactionCoordinator.endTransaction``,
``TransactionMetadata.prepareAbortOrCommit``), so a request left over from one transaction
is fenced in the next, where version 1 lets it decide the next transaction
(``endTransactionWithTV1``): the flaw Jepsen reported in 2024."""

from __future__ import annotations

from pathlib import Path

from test_txn_coordinator import GONE, TXN, Coordinator, run, states, until, wall_clock

from minibroker.cluster.types import ErrorCode, TopicPartition
from minibroker.coordinator.transaction_coordinator import EndTxnResult
from minibroker.coordinator.transaction_log import TransactionState
from minibroker.coordinator.transaction_metadata import MAX_EPOCH, TransactionMetadata
from minibroker.events import ReplicationEventLog

S = TransactionState
ALSO_GONE = TopicPartition("deleted-topic", 1)


async def add(c: Coordinator, pid: int, epoch: int, version: int,
              partitions: frozenset[TopicPartition] = frozenset({GONE})) -> ErrorCode:
    return await c.coordinator.handle_add_partitions_to_transaction(TXN, pid, epoch,
                                                                    partitions, version)


async def end(c: Coordinator, pid: int, epoch: int, version: int, *,
              commit: bool) -> EndTxnResult:
    return await c.coordinator.handle_end_transaction(TXN, pid, epoch, commit,
                                                      client_transaction_version=version)


async def completed(c: Coordinator, state: TransactionState) -> None:
    await until(lambda: states(c)[-1][0] is state, state.state_name)


def test_each_end_bumps_the_epoch_and_a_retry_gets_the_new_one(tmp_path: Path) -> None:
    async def scenario(c: Coordinator) -> None:
        _, pid, epoch = await c.init()
        assert epoch == 0
        assert await add(c, pid, 0, 2) == ErrorCode.none
        assert await end(c, pid, 0, 2, commit=True) == EndTxnResult(ErrorCode.none, pid, 1)
        await completed(c, S.COMPLETE_COMMIT)
        assert states(c)[1:] == [(S.ONGOING, 0, frozenset({GONE})),
                                 (S.PREPARE_COMMIT, 1, frozenset({GONE})),
                                 (S.COMPLETE_COMMIT, 1, frozenset())]
        # Each record says which version decided it (the flexible value's tagged field).
        assert [v.client_transaction_version for _, v in c.written[1:]] == [2, 2, 2]
        # A retry names the epoch before the bump: NONE, with the epoch to go on with.
        assert await end(c, pid, 0, 2, commit=True) == EndTxnResult(ErrorCode.none, pid, 1)
        assert (await end(c, pid, 0, 2, commit=False)).error == ErrorCode.invalid_txn_state
        # The next transaction runs under epoch 1; the old epoch is fenced from it.
        assert await add(c, pid, 0, 2) == ErrorCode.producer_fenced
        assert await add(c, pid, 1, 2) == ErrorCode.none
        assert await end(c, pid, 1, 2, commit=False) == EndTxnResult(ErrorCode.none, pid, 2)
        await completed(c, S.COMPLETE_ABORT)

    run(scenario, tmp_path)


def test_a_delayed_end_of_the_last_transaction_decides_the_next_only_below_version_2(
        tmp_path: Path) -> None:
    """The mechanism of Jepsen's aborted reads and lost writes: EndTxn(commit) of T1 is
    retried and completes; T2 begins; the first EndTxn(commit) of T1, delayed on the
    network, arrives. Under version 1 it carries T2's epoch and commits T2 half-written;
    under version 2 it names T1's epoch, fenced in T2."""
    async def scenario(c: Coordinator, version: int) -> None:
        _, pid, epoch = await c.init()
        assert await add(c, pid, epoch, version) == ErrorCode.none
        first_end = (pid, epoch)  # the request the network holds back
        t1 = await end(c, pid, epoch, version, commit=True)  # the retry, answered
        await completed(c, S.COMPLETE_COMMIT)
        t2_epoch = t1.producer_epoch if version == 2 else epoch
        assert await add(c, pid, t2_epoch, version, frozenset({ALSO_GONE})) == ErrorCode.none
        late = await end(c, *first_end, version, commit=True)
        if version == 2:
            assert late.error == ErrorCode.producer_fenced
            assert states(c)[-1] == (S.ONGOING, t2_epoch, frozenset({ALSO_GONE}))
        else:
            assert late.error == ErrorCode.none  # T2 committed by T1's request
            await completed(c, S.COMPLETE_COMMIT)
            assert states(c)[-2] == (S.PREPARE_COMMIT, epoch, frozenset({ALSO_GONE}))

    for version in (1, 2):
        run(lambda c, v=version: scenario(c, v), tmp_path / f"tv{version}")
        # The coordinator's `end_txn` events say what each EndTxn met and did, which the
        # analysis pairs with the client's transactions (`late_requests`).
        ends = [(e["reason"], e["decision"], e["producer_epoch"], e["txn_epoch"],
                 e["txn_state"], e["txn_partitions"], e["transaction_version"])
                for e in ReplicationEventLog(tmp_path / f"tv{version}").events()
                if e["type"] == "end_txn"]
        t2 = "deleted-topic-1"
        assert ends == ([("decided", "commit", 0, 0, "Ongoing", ["deleted-topic-0"], 1),
                         ("decided", "commit", 0, 0, "Ongoing", [t2], 1)] if version == 1 else
                        [("decided", "commit", 0, 0, "Ongoing", ["deleted-topic-0"], 2),
                         ("fenced", "commit", 0, 1, "Ongoing", None, 2)])


def test_an_abort_with_nothing_added_is_a_transaction_of_its_own(tmp_path: Path) -> None:
    """Kafka's version 2 table: Empty, CompleteAbort and CompleteCommit take an abort with
    the current epoch (bumped, no partition); a commit there is INVALID_TXN_STATE."""
    async def scenario(c: Coordinator) -> None:
        _, pid, epoch = await c.init()
        assert (await end(c, pid, epoch, 2, commit=True)).error == ErrorCode.invalid_txn_state
        assert await end(c, pid, epoch, 2, commit=False) == EndTxnResult(ErrorCode.none, pid,
                                                                          epoch + 1)
        await completed(c, S.COMPLETE_ABORT)
        assert states(c)[-2] == (S.PREPARE_ABORT, epoch + 1, frozenset())
        # Version 1 refuses the same abort in Empty.
        _, pid, epoch = await c.init()
        assert (await end(c, pid, epoch, 1, commit=False)).error == ErrorCode.invalid_txn_state

    run(scenario, tmp_path)


def test_an_exhausted_epoch_moves_to_the_next_producer_id_at_the_end(tmp_path: Path) -> None:
    """``generateTxnTransitMetadataForTxnCompletion`` and ``prepareComplete``: the end at
    epoch 32766 takes a new producer id, whose epoch 0 the answer gives; a retry naming the
    old id and epoch is recognised (``retryOnOverflow``)."""
    async def scenario(c: Coordinator) -> None:
        _, pid, _ = await c.init()
        state = c.coordinator.state_manager.get_transaction_state(TXN)
        assert not isinstance(state, ErrorCode) and state is not None
        state.metadata.producer_epoch = MAX_EPOCH - 1  # 32,766 transactions later
        assert await add(c, pid, MAX_EPOCH - 1, 2) == ErrorCode.none
        answer = await end(c, pid, MAX_EPOCH - 1, 2, commit=True)
        assert answer.error == ErrorCode.none and answer.producer_id != pid
        assert answer.producer_epoch == 0
        await completed(c, S.COMPLETE_COMMIT)
        assert states(c)[-2][:2] == (S.PREPARE_COMMIT, MAX_EPOCH)
        assert c.written[-1][1] is not None and c.written[-1][1].producer_id == \
            answer.producer_id
        assert await end(c, pid, MAX_EPOCH - 1, 2, commit=True) == answer
        assert await add(c, answer.producer_id, 0, 2) == ErrorCode.none

    run(scenario, tmp_path)


def test_the_log_keeps_the_next_producer_id_of_a_decision_over_an_exhausted_epoch(
        tmp_path: Path) -> None:
    """Kafka 4.3's ``TransactionLog.valueToBytes`` writes the previous and next producer ids
    (KAFKA-20310): a coordinator that loads the PrepareCommit of a transaction ended at epoch
    32766 (its predecessor gone before the markers) still completes it to the next producer
    id, and knows the previous id, whose late retry it recognises (``retryOnOverflow``). In
    Kafka 4.2 both read back as -1: the id stayed at the exhausted epoch."""
    async def scenario(c: Coordinator) -> None:
        _, pid, _ = await c.init()
        state = c.coordinator.state_manager.get_transaction_state(TXN)
        assert not isinstance(state, ErrorCode) and state is not None
        state.metadata.producer_epoch = MAX_EPOCH - 1
        assert await add(c, pid, MAX_EPOCH - 1, 2) == ErrorCode.none
        answer = await end(c, pid, MAX_EPOCH - 1, 2, commit=True)
        await completed(c, S.COMPLETE_COMMIT)
        prepare = c.written[-2][1]
        assert prepare is not None and prepare.state is S.PREPARE_COMMIT
        assert (prepare.previous_producer_id, prepare.next_producer_id) == (
            pid, answer.producer_id)
        loaded = TransactionMetadata.loaded(TXN, prepare)
        complete = loaded.prepare_complete(now_ms=0)
        assert (complete.producer_id, complete.producer_epoch) == (answer.producer_id, 0)
        loaded.complete_transition_to(complete)
        assert loaded.last_producer_id == pid  # a retry naming it is known

    run(scenario, tmp_path)


def test_a_transaction_timed_out_at_an_exhausted_epoch_moves_to_the_next_producer_id(
        tmp_path: Path) -> None:
    """Kafka 4.3's ``generateTxnTransitMetadataForTxnCompletion`` takes the next producer id
    for an exhausted epoch on the coordinator's own abort too (KAFKA-20090: 4.2 skipped it
    on the epoch-fence path): a transaction open past its timeout at epoch 32766 is aborted
    at 32767 and completed at the next producer id, epoch 0; the client's own abort, coming
    late with the old id and epoch, is a retry over the overflow and gets the new id."""
    async def scenario(c: Coordinator) -> None:
        clock = wall_clock(c)
        _, pid, _ = await c.init()
        state = c.coordinator.state_manager.get_transaction_state(TXN)
        assert not isinstance(state, ErrorCode) and state is not None
        state.metadata.producer_epoch = MAX_EPOCH - 1
        assert await add(c, pid, MAX_EPOCH - 1, 2) == ErrorCode.none
        clock[0] += 60_001
        c.coordinator.abort_timed_out_transactions()
        await completed(c, S.COMPLETE_ABORT)
        assert states(c)[-2][:2] == (S.PREPARE_ABORT, MAX_EPOCH)
        complete = c.written[-1][1]
        assert complete is not None and complete.producer_id != pid
        assert complete.producer_epoch == 0
        assert await end(c, pid, MAX_EPOCH - 1, 2, commit=False) == EndTxnResult(
            ErrorCode.none, complete.producer_id, 0)

    run(scenario, tmp_path)


def test_a_transaction_left_at_the_largest_epoch_is_aborted_without_overflow(
        tmp_path: Path) -> None:
    """Kafka 4.3 (KAFKA-20090) lets the coordinator abort a transaction that a bug left open
    at epoch 32767: the fence and the decision keep that epoch instead of overflowing (4.2
    refused the fence, and the transaction stayed open), and under transaction version 2
    the id moves to the next producer id at the end. Version 1 keeps the id and epoch."""
    async def scenario(c: Coordinator, level: int) -> None:
        clock = wall_clock(c)
        _, pid, _ = await c.init()
        state = c.coordinator.state_manager.get_transaction_state(TXN)
        assert not isinstance(state, ErrorCode) and state is not None
        state.metadata.producer_epoch = MAX_EPOCH
        assert await add(c, pid, MAX_EPOCH, level) == ErrorCode.none
        clock[0] += 60_001
        c.coordinator.abort_timed_out_transactions()
        await completed(c, S.COMPLETE_ABORT)
        assert states(c)[-2][:2] == (S.PREPARE_ABORT, MAX_EPOCH)
        complete = c.written[-1][1]
        assert complete is not None
        assert (complete.producer_id != pid, complete.producer_epoch) == (
            (True, 0) if level == 2 else (False, MAX_EPOCH))

    for level in (1, 2):
        run(lambda c, v=level: scenario(c, v), tmp_path / f"level{level}",
            config={"transaction.version": str(level)})


def test_the_coordinators_own_abort_follows_the_clusters_version(tmp_path: Path) -> None:
    """A transaction open past its timeout is aborted with the epoch bumped once under
    either version (version 1 in memory first, version 2 by its decision); the decision
    records version 2 under a cluster on version 2, else 0 (``endTransactionWithTV1``
    records level 0), and transaction.version 0 writes the value's version 0."""
    async def scenario(c: Coordinator, level: int) -> None:
        clock = wall_clock(c)
        _, pid, epoch = await c.init()
        assert await add(c, pid, epoch, 0) == ErrorCode.none
        clock[0] += 60_001
        c.coordinator.abort_timed_out_transactions()
        await completed(c, S.COMPLETE_ABORT)
        assert states(c)[-2:] == [(S.PREPARE_ABORT, epoch + 1, frozenset({GONE})),
                                  (S.COMPLETE_ABORT, epoch + 1, frozenset())]
        value = c.written[-2][1]
        assert value is not None
        assert value.client_transaction_version == (2 if level == 2 else 0)
        assert set(c.value_versions) == {b"\x00\x00" if level == 0 else b"\x00\x01"}
        assert (await end(c, pid, epoch, 0, commit=False)).error == ErrorCode.producer_fenced

    for level in (0, 1, 2):
        run(lambda c, v=level: scenario(c, v), tmp_path / f"level{level}",
            config={"transaction.version": str(level)})
