"""The transaction coordinator in process: ``__transaction_state``'s records byte for byte
(Kafka 4.2's TransactionLogKey and TransactionLogValue version 0, derived by hand from
their schemas), InitProducerId's state machine (``prepareInitProducerIdTransit``,
``prepareIncrementProducerEpoch``, ``prepareProducerIdRotation``) against a log append
this test answers itself, and what DescribeTransactions and ListTransactions show.
Loading after a failover is in tests/sim/test_txn_coordinator_failover.py, clients in
tests/minibroker/test_txn_interop.py."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.describe_transactions.v0 import request as describe_req
from kio.schema.list_transactions.v1 import request as list_req
from kio.static.primitive import i64

from minibroker.cluster.scheduler import AsyncioScheduler
from minibroker.cluster.types import (
    BrokerEndpoint,
    ErrorCode,
    MetadataImage,
    PartitionRegistration,
    ProduceResult,
    TopicImage,
    TopicPartition,
)
from minibroker.coordinator.transaction_coordinator import (
    InitProducerIdResult,
    TransactionCoordinator,
)
from minibroker.coordinator.transaction_log import (
    CorruptTransactionRecordError,
    TransactionLogValue,
    TransactionState,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from minibroker.coordinator.transaction_state_manager import TRANSACTION_STATE_TOPIC
from minibroker.events import ReplicationEventLog
from minibroker.network.codec import ApiKey, Request
from minibroker.network.txn_apis import TxnApis
from minibroker.storage.records import decode_records, iter_batches

PARTITIONS = 4
TXN = "orders-writer"
MINUTE_MS = 60_000


# -- the records ----------------------------------------------------------------------------


def test_a_key_is_its_version_and_the_transactional_id() -> None:
    assert encode_key(TXN) == b"\x00\x00" + b"\x00\x0d" + b"orders-writer"
    assert decode_key(encode_key(TXN)) == TXN


def test_a_value_is_written_as_kafka_writes_version_0() -> None:
    empty = TransactionLogValue(7, 2, 60000, TransactionState.EMPTY, frozenset(), 1000, -1)
    assert encode_value(empty) == bytes.fromhex(
        "0000"                  # version 0
        "0000000000000007"      # ProducerId
        "0002"                  # ProducerEpoch
        "0000ea60"              # TransactionTimeoutMs 60000
        "00"                    # TransactionStatus: Empty
        "ffffffff"              # TransactionPartitions: null (Empty)
        "00000000000003e8"      # TransactionLastUpdateTimestampMs 1000
        "ffffffffffffffff")     # TransactionStartTimestampMs -1
    ongoing = TransactionLogValue(
        7, 3, 60000, TransactionState.ONGOING,
        frozenset({TopicPartition("b", 2), TopicPartition("a", 1), TopicPartition("a", 0)}),
        2000, 1500)
    assert encode_value(ongoing)[16:-16] == bytes.fromhex(
        "01"                    # Ongoing
        "00000002"              # two topics, in name order
        "000161" "00000002" "00000000" "00000001"  # "a": partitions 0 and 1
        "000162" "00000001" "00000002")            # "b": partition 2
    assert decode_value(encode_value(ongoing)) == ongoing
    assert decode_value(None) is None  # a tombstone
    complete = TransactionLogValue(7, 3, 60000, TransactionState.COMPLETE_COMMIT, frozenset(),
                                   2000, 1500)
    assert encode_value(complete)[16:21] == bytes.fromhex("04" "00000000")  # none, not null
    with pytest.raises(ValueError, match="an Empty transaction has no partitions"):
        encode_value(TransactionLogValue(7, 2, 1, TransactionState.EMPTY,
                                         frozenset({TopicPartition("a", 0)}), 0, -1))


def test_a_value_is_written_as_kafka_writes_the_flexible_version_1() -> None:
    """Transaction version 1+: compact arrays and strings, and the client's transaction
    version as tagged field 2 (the other tagged fields at their defaults are left out)."""
    ongoing = TransactionLogValue(
        7, 3, 60000, TransactionState.PREPARE_COMMIT,
        frozenset({TopicPartition("b", 2), TopicPartition("a", 1), TopicPartition("a", 0)}),
        2000, 1500, client_transaction_version=2)
    assert encode_value(ongoing, 1) == bytes.fromhex(
        "0001"                  # version 1
        "0000000000000007"      # ProducerId
        "0003"                  # ProducerEpoch
        "0000ea60"              # TransactionTimeoutMs 60000
        "02"                    # PrepareCommit
        "03"                    # two topics (compact: count + 1)
        "0261" "03" "00000000" "00000001" "00"  # "a": partitions 0 and 1, no tagged fields
        "0262" "02" "00000002" "00"             # "b": partition 2
        "00000000000007d0"      # TransactionLastUpdateTimestampMs 2000
        "00000000000005dc"      # TransactionStartTimestampMs 1500
        "01" "02" "02" "0002")  # one tagged field: tag 2, 2 bytes, ClientTransactionVersion 2
    assert decode_value(encode_value(ongoing, 1)) == ongoing
    empty = TransactionLogValue(7, 2, 60000, TransactionState.EMPTY, frozenset(), 1000, -1,
                                previous_producer_id=5)
    assert encode_value(empty, 1)[16:18] == bytes.fromhex("00" "00")  # Empty, null partitions
    assert encode_value(empty, 1)[-11:] == bytes.fromhex(
        "01" "00" "08" "0000000000000005")  # tag 0: PreviousProducerId 5
    assert decode_value(encode_value(empty, 1)) == empty
    # A tagged field this version does not know is skipped, as Kafka's reader does.
    unknown_tag = encode_value(empty, 1)[:-11] + bytes.fromhex("01" "07" "01" "ff")
    assert decode_value(unknown_tag) == TransactionLogValue(
        7, 2, 60000, TransactionState.EMPTY, frozenset(), 1000, -1)


@pytest.mark.parametrize(("data", "error"), [
    (b"\x00\x00\x00", "ends at byte 2"),
    (b"\x00\x02" + b"\x00" * 40, r"version 2: minibroker reads versions \(0, 1\)"),
    (encode_value(TransactionLogValue(1, 0, 1, TransactionState.EMPTY, frozenset(), 0, -1))
     [:16] + b"\x09" + b"\x00" * 20, "unknown transaction state id 9"),
    (encode_value(TransactionLogValue(1, 0, 1, TransactionState.EMPTY, frozenset(), 0, -1))
     + b"\x00", "1 bytes after its last field"),
    (encode_value(TransactionLogValue(1, 0, 1, TransactionState.EMPTY, frozenset(), 0, -1,
                                      client_transaction_version=2), 1)[:-3]
     + b"\x01\x00", "tagged field 2 has 1 bytes"),
])
def test_a_record_that_does_not_parse_names_why(data: bytes, error: str) -> None:
    with pytest.raises(CorruptTransactionRecordError, match=error):
        decode_value(data)


def test_transitions_follow_kafkas_valid_previous_states() -> None:
    S = TransactionState
    assert S.PREPARE_COMMIT.valid_previous_states == {S.ONGOING}
    assert S.EMPTY.valid_previous_states == {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}
    assert [s.id for s in S] == list(range(8))


# -- InitProducerId -------------------------------------------------------------------------


class Coordinator:
    """A broker leading every partition of ``__transaction_state`` (when ``leads``), whose
    log append answers ``append_error`` and keeps what was written."""

    def __init__(self, tmp_path: Path, *, leads: bool = True,
                 config: dict[str, str] | None = None) -> None:
        reg = PartitionRegistration((1,), (1,), 1, 0, 0)
        self.image = MetadataImage(1, {1: BrokerEndpoint(1, "host-1", 9001)}, {
            TRANSACTION_STATE_TOPIC: TopicImage(TRANSACTION_STATE_TOPIC, "00" * 16, {},
                                                dict.fromkeys(range(PARTITIONS), reg))})
        self.written: list[tuple[str, TransactionLogValue | None]] = []
        self.value_versions: list[bytes] = []  # each value's int16 version, as written
        self.append_error = ErrorCode.none
        self.held: list[Callable[[], None]] = []  # appends answered only when released
        self.hold = False
        self.next_id = 1000
        self.coordinator = TransactionCoordinator(
            1, AsyncioScheduler(asyncio.get_running_loop()), config=config or {},
            events=ReplicationEventLog(tmp_path), append=self._append,
            local_partition=lambda _tp: None, metadata_image=lambda: self.image,
            generate_producer_id=self._generate, address_of=lambda _broker: None,
            spawn=self._spawn)
        self.tasks: set[asyncio.Task[None]] = set()
        if leads:
            for partition in range(PARTITIONS):
                self.coordinator.on_leadership_change(
                    TopicPartition(TRANSACTION_STATE_TOPIC, partition), True, 5)

    def _spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coroutine, name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _generate(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def _append(self, *, acks: int, timeout_ms: int, entries: dict[TopicPartition, bytes],
                on_complete: Callable[[dict[TopicPartition, ProduceResult]], None]) -> None:
        # acks=all; the transaction timeout for a transition, 30 s for tombstones.
        assert acks == -1 and timeout_ms in (MINUTE_MS, 30_000)
        for batch in entries.values():
            for _, records in iter_batches(batch):
                self.written += [(decode_key(r.key), decode_value(r.value))
                                 for r in decode_records(records)]
                self.value_versions += [r.value[:2] for r in decode_records(records) if r.value]

        def answer() -> None:
            on_complete({tp: ProduceResult(self.append_error, base_offset=0) for tp in entries})

        if self.hold:
            self.held.append(answer)
        else:
            answer()

    async def init(self, expected: tuple[int, int] | None = None, *, txn: str = TXN,
                   timeout_ms: int = MINUTE_MS) -> tuple[ErrorCode, int, int]:
        result: InitProducerIdResult = await self.coordinator.handle_init_producer_id(
            txn, timeout_ms, expected)
        return result.error, result.producer_id, result.producer_epoch


async def until(condition: Callable[[], object], what: str) -> None:
    """Poll the coordinator's own state, at most 5 s."""
    deadline = asyncio.get_running_loop().time() + 5
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"not within 5 s: {what}"
        await asyncio.sleep(0.001)


def loaded(c: Coordinator) -> Callable[[], bool]:
    return lambda: not c.coordinator.state_manager.state()["loading"]


def run(scenario: Callable[[Coordinator], Any], tmp_path: Path, **kwargs: Any) -> None:
    async def main() -> None:
        coordinator = Coordinator(tmp_path, **kwargs)
        await until(loaded(coordinator), "the loads the leadership changes scheduled")
        await scenario(coordinator)

    asyncio.run(main())


def test_each_new_instance_bumps_the_epoch_and_the_log_has_it_first(tmp_path: Path) -> None:
    async def scenario(c: Coordinator) -> None:
        assert await c.init() == (ErrorCode.none, 1000, 0)
        assert await c.init() == (ErrorCode.none, 1000, 1)
        assert [(txn, v.producer_id, v.producer_epoch, v.state, v.transaction_timeout_ms)
                for txn, v in c.written if v is not None] == [
            (TXN, 1000, 0, TransactionState.EMPTY, MINUTE_MS),
            (TXN, 1000, 1, TransactionState.EMPTY, MINUTE_MS)]

    run(scenario, tmp_path)


def test_a_recovering_producer_bumps_its_own_epoch_and_a_stale_one_is_fenced(
        tmp_path: Path) -> None:
    """KIP-360: the producer names its id and epoch; the current epoch bumps, a retry of
    that bump (the last epoch) gets the same epoch back, any older one is fenced."""
    async def scenario(c: Coordinator) -> None:
        await c.init()
        await c.init()  # epoch 1
        assert await c.init((1000, 1)) == (ErrorCode.none, 1000, 2)
        assert await c.init((1000, 1)) == (ErrorCode.none, 1000, 2)  # the retry
        assert await c.init((1000, 0)) == (ErrorCode.producer_fenced, -1, -1)
        assert await c.init((999, 2)) == (ErrorCode.producer_fenced, -1, -1)

    run(scenario, tmp_path)


def test_an_exhausted_epoch_moves_the_id_to_a_new_producer_id(tmp_path: Path) -> None:
    async def scenario(c: Coordinator) -> None:
        await c.init()
        metadata = c.coordinator.state_manager.get_transaction_state(TXN).metadata
        metadata.producer_epoch = 2**15 - 2  # as if bumped that many times
        assert await c.init() == (ErrorCode.none, 1001, 0)

    run(scenario, tmp_path)


def test_what_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    async def scenario(c: Coordinator) -> None:
        assert (await c.init(txn=""))[0] == ErrorCode.invalid_request
        assert (await c.init(timeout_ms=900_001))[0] == ErrorCode.invalid_transaction_timeout
        assert (await c.init(timeout_ms=0))[0] == ErrorCode.invalid_transaction_timeout
        assert c.written == []

    run(scenario, tmp_path, config={"transaction.max.timeout.ms": "900000"})


def test_a_broker_that_does_not_lead_the_partition_is_not_the_coordinator(
        tmp_path: Path) -> None:
    async def scenario(c: Coordinator) -> None:
        assert (await c.init())[0] == ErrorCode.not_coordinator
        c.coordinator.on_leadership_change(
            TopicPartition(TRANSACTION_STATE_TOPIC, c.coordinator.state_manager.partition_for(
                TXN)), True, 6)
        assert (await c.init())[0] == ErrorCode.coordinator_load_in_progress
        await until(loaded(c), "the load")
        assert await c.init() == (ErrorCode.none, 1000, 0)

    run(scenario, tmp_path, leads=False)


def test_a_failed_write_changes_nothing(tmp_path: Path) -> None:
    """Below the topic's min ISR the append fails: the producer gets the retriable
    COORDINATOR_NOT_AVAILABLE and the next init bumps from the epoch the log has."""
    async def scenario(c: Coordinator) -> None:
        await c.init()
        c.append_error = ErrorCode.not_enough_replicas
        assert (await c.init())[0] == ErrorCode.coordinator_not_available
        c.append_error = ErrorCode.none
        assert await c.init() == (ErrorCode.none, 1000, 1)

    run(scenario, tmp_path)


def test_an_init_while_a_write_is_in_flight_is_told_to_retry(tmp_path: Path) -> None:
    async def scenario(c: Coordinator) -> None:
        await c.init()
        c.hold = True
        first = asyncio.ensure_future(c.init())
        await until(lambda: c.held, "the first init's write")
        assert (await c.init())[0] == ErrorCode.concurrent_transactions
        c.held.pop()()
        assert await first == (ErrorCode.none, 1000, 1)

    run(scenario, tmp_path)


def test_a_write_acknowledged_after_the_coordinator_moved_is_not_taken(tmp_path: Path) -> None:
    """Kafka's coordinator epoch: the partition was led again (a newer leader epoch) while
    the write was in flight; the producer must find the coordinator again."""
    async def scenario(c: Coordinator) -> None:
        await c.init()
        c.hold = True
        first = asyncio.ensure_future(c.init())
        await until(lambda: c.held, "the first init's write")
        tp = TopicPartition(TRANSACTION_STATE_TOPIC,
                            c.coordinator.state_manager.partition_for(TXN))
        manager = c.coordinator.state_manager
        metadata = manager.get_transaction_state(TXN).metadata
        c.coordinator.on_leadership_change(tp, False, 6)
        c.coordinator.on_leadership_change(tp, True, 7)
        await until(loaded(c), "the load")
        manager.put_transaction_state_if_not_exists(metadata)  # as if the load found it
        c.held.pop()()
        assert (await first)[0] == ErrorCode.not_coordinator

    run(scenario, tmp_path)


# -- DescribeTransactions, ListTransactions --------------------------------------------------


async def answer(c: Coordinator, api: ApiKey, version: int, body: Any) -> Any:
    apis = TxnApis(SimpleNamespace(txn_coordinator=c.coordinator))  # type: ignore[arg-type]
    handler = {ApiKey.DESCRIBE_TRANSACTIONS: apis.handle_describe_transactions,
               ApiKey.LIST_TRANSACTIONS: apis.handle_list_transactions}[api]
    return await handler(Request(api, version, 1, "admin", body))


def test_describe_and_list_show_the_ids_this_broker_coordinates(tmp_path: Path) -> None:
    async def scenario(c: Coordinator) -> None:
        await c.init()
        await c.init(txn="other-writer")
        described = await answer(c, ApiKey.DESCRIBE_TRANSACTIONS, 0,
                                 describe_req.DescribeTransactionsRequest(
                                     transactional_ids=(TXN, "nobody")))
        mine, unknown = described.transaction_states
        assert (mine.error_code, mine.transaction_state, mine.producer_id, mine.producer_epoch,
                mine.transaction_timeout.total_seconds(), mine.topics) == (
            ErrorCode.none, "Empty", 1000, 0, 60.0, ())
        assert round(mine.transaction_start_time.timestamp() * 1000) == -1  # none yet
        assert (unknown.transactional_id, unknown.error_code) == (
            "nobody", ErrorCode.transactional_id_not_found)

        async def listed(version: int, **filters: Any) -> tuple[Any, ...]:
            body = list_req.ListTransactionsRequest(
                state_filters=(), producer_id_filters=(), duration_filter=i64(-1))
            response = await answer(c, ApiKey.LIST_TRANSACTIONS, version,
                                    replace(body, **filters))
            return (response.error_code, response.unknown_state_filters,
                    [(t.transactional_id, t.producer_id, t.transaction_state)
                     for t in response.transaction_states])

        assert await listed(1) == (ErrorCode.none, (), [
            ("orders-writer", 1000, "Empty"), ("other-writer", 1001, "Empty")])
        assert await listed(1, state_filters=("Ongoing", "Lost")) == (
            ErrorCode.none, ("Lost",), [])
        assert await listed(1, producer_id_filters=(i64(1001),)) == (
            ErrorCode.none, (), [("other-writer", 1001, "Empty")])

    run(scenario, tmp_path)


def test_describe_names_the_ids_another_broker_coordinates(tmp_path: Path) -> None:
    async def scenario(c: Coordinator) -> None:
        described = await answer(c, ApiKey.DESCRIBE_TRANSACTIONS, 0,
                                 describe_req.DescribeTransactionsRequest(
                                     transactional_ids=(TXN,)))
        assert described.transaction_states[0].error_code == ErrorCode.not_coordinator

    run(scenario, tmp_path, leads=False)


# -- expiration -------------------------------------------------------------------------------


def wall_clock(c: Coordinator) -> list[int]:
    """The coordinator's wall clock, in ms, as a cell the test moves."""
    clock = [10_000_000]
    c.coordinator.state_manager.now_ms = lambda: clock[0]
    return clock


def test_an_idle_id_expires_with_a_tombstone_and_comes_back_as_a_new_producer(
        tmp_path: Path) -> None:
    """transactional.id.expiration.ms after its last update, an id with no transaction open
    is tombstoned and forgotten; the next instance of it is a new producer id at epoch 0.
    One updated since is kept."""
    async def scenario(c: Coordinator) -> None:
        manager = c.coordinator.state_manager
        clock = wall_clock(c)
        await c.init()
        clock[0] += 500
        await c.init(txn="other-writer")
        clock[0] += 600  # 1,100 ms after the first id's update, 600 after the other's
        manager.remove_expired_transactional_ids()
        assert c.written[-1] == (TXN, None)  # the tombstone
        assert manager.get_transaction_state(TXN) is None
        assert manager.get_transaction_state("other-writer") is not None
        assert await c.init() == (ErrorCode.none, 1002, 0)

    run(scenario, tmp_path, config={"transactional.id.expiration.ms": "1000"})


def test_an_expiration_that_is_not_written_keeps_the_id(tmp_path: Path) -> None:
    async def scenario(c: Coordinator) -> None:
        clock = wall_clock(c)
        await c.init()
        clock[0] += 2000
        c.append_error = ErrorCode.not_enough_replicas
        c.coordinator.state_manager.remove_expired_transactional_ids()
        c.append_error = ErrorCode.none
        assert await c.init() == (ErrorCode.none, 1000, 1)  # the same producer, next epoch

    run(scenario, tmp_path, config={"transactional.id.expiration.ms": "1000"})


def test_expiration_runs_on_its_interval_once_started(tmp_path: Path) -> None:
    async def scenario(c: Coordinator) -> None:
        await c.init()
        c.coordinator.startup()
        await until(lambda: (TXN, None) in c.written, "the tombstone of the expired id")
        c.coordinator.shutdown()

    run(scenario, tmp_path, config={
        "transactional.id.expiration.ms": "1",
        "transaction.remove.expired.transaction.cleanup.interval.ms": "10"})


# -- the records, for any value ---------------------------------------------------------------

PARTITION_SETS = st.frozensets(st.builds(
    TopicPartition, st.text(min_size=1, max_size=20), st.integers(0, 2**31 - 1)), max_size=8)
VALUES = st.builds(
    TransactionLogValue, st.integers(0, 2**63 - 1), st.integers(-1, 2**15 - 1),
    st.integers(1, 2**31 - 1), st.sampled_from(list(TransactionState)), PARTITION_SETS,
    st.integers(-1, 2**62), st.integers(-1, 2**62)).map(
        lambda v: dataclasses.replace(v, partitions=frozenset())
        if v.state is TransactionState.EMPTY else v)
FLEXIBLE_VALUES = st.builds(
    dataclasses.replace, VALUES, previous_producer_id=st.integers(-1, 2**63 - 1),
    next_producer_id=st.integers(-1, 2**63 - 1), next_producer_epoch=st.integers(-1, 2**15 - 1),
    client_transaction_version=st.integers(0, 2))


@given(VALUES, FLEXIBLE_VALUES, st.text(min_size=1, max_size=50))
def test_every_record_reads_back_as_written(value: TransactionLogValue,
                                            flexible: TransactionLogValue, txn: str) -> None:
    assert decode_value(encode_value(value)) == value
    assert decode_value(encode_value(flexible, 1)) == flexible
    assert decode_key(encode_key(txn)) == txn


def _damaged(value: TransactionLogValue, version: int, at: int, byte: int, cut: int
             ) -> bytes:
    """A record written whole, then one byte changed and its tail maybe lost."""
    data = bytearray(encode_value(value, version))
    data[at % len(data)] = byte
    return bytes(data[:len(data) - cut])


@given(st.one_of(st.binary(max_size=200),
                 st.builds(_damaged, FLEXIBLE_VALUES, st.integers(0, 1), st.integers(0, 40),
                           st.integers(0, 255), st.integers(0, 20))))
def test_any_bytes_either_parse_or_are_named_corrupt(data: bytes) -> None:
    """What a replay meets in a damaged partition: a clear error it skips, nothing else."""
    for decode in (decode_key, decode_value):
        with contextlib.suppress(CorruptTransactionRecordError):
            decode(data)


# -- a transaction ----------------------------------------------------------------------------

GONE = TopicPartition("deleted-topic", 0)  # not in the image: its marker is not needed


def states(c: Coordinator) -> list[tuple[TransactionState, int, frozenset[TopicPartition]]]:
    return [(v.state, v.producer_epoch, v.partitions) for _, v in c.written if v is not None]


def test_a_transaction_goes_ongoing_then_prepare_then_complete(tmp_path: Path) -> None:
    """AddPartitionsToTxn (Ongoing), EndTxn (PrepareCommit, answered then), the markers
    (none needed: the topic is gone), CompleteCommit; a retry of the commit is NONE, an
    abort of it INVALID_TXN_STATE, and a stale epoch or another producer id is refused."""
    async def scenario(c: Coordinator) -> None:
        coordinator = c.coordinator
        _, pid, epoch = await c.init()
        add = functools.partial(coordinator.handle_add_partitions_to_transaction,
                                client_transaction_version=1)
        assert await add(TXN, pid, epoch + 1, frozenset({GONE})) == ErrorCode.producer_fenced
        assert await add(TXN, pid + 1, epoch, frozenset({GONE})) == \
            ErrorCode.invalid_producer_id_mapping
        assert await add(TXN, pid, epoch, frozenset({GONE})) == ErrorCode.none
        assert await add(TXN, pid, epoch, frozenset({GONE})) == ErrorCode.none  # no write

        async def end(*args: Any, commit: bool) -> ErrorCode:
            result = await coordinator.handle_end_transaction(
                *args, commit=commit, client_transaction_version=1)
            return result.error

        assert await end(TXN, pid, epoch, commit=True) == ErrorCode.none
        await until(lambda: states(c)[-1][0] is TransactionState.COMPLETE_COMMIT,
                    "CompleteCommit")
        assert states(c) == [
            (TransactionState.EMPTY, 0, frozenset()),
            (TransactionState.ONGOING, 0, frozenset({GONE})),
            (TransactionState.PREPARE_COMMIT, 0, frozenset({GONE})),
            (TransactionState.COMPLETE_COMMIT, 0, frozenset())]
        assert await end(TXN, pid, epoch, commit=True) == ErrorCode.none
        assert await end(TXN, pid, epoch, commit=False) == ErrorCode.invalid_txn_state

    run(scenario, tmp_path)


def test_a_transaction_open_past_its_timeout_is_aborted_with_a_fenced_epoch(
        tmp_path: Path) -> None:
    """Kafka's abortTimedOutTransactions: the coordinator bumps the epoch and aborts; the
    producer that let the transaction hang is fenced from it."""
    async def scenario(c: Coordinator) -> None:
        clock = wall_clock(c)
        coordinator = c.coordinator
        _, pid, epoch = await c.init()
        await coordinator.handle_add_partitions_to_transaction(TXN, pid, epoch,
                                                               frozenset({GONE}), 1)
        clock[0] += MINUTE_MS  # exactly the timeout: not yet past it
        coordinator.abort_timed_out_transactions()
        await asyncio.gather(*c.tasks)  # any abort it started
        assert states(c)[-1][0] is TransactionState.ONGOING
        clock[0] += 1
        coordinator.abort_timed_out_transactions()
        await until(lambda: states(c)[-1][0] is TransactionState.COMPLETE_ABORT,
                    "CompleteAbort")
        assert states(c)[-2:] == [(TransactionState.PREPARE_ABORT, 1, frozenset({GONE})),
                                  (TransactionState.COMPLETE_ABORT, 1, frozenset())]
        ended = await coordinator.handle_end_transaction(TXN, pid, epoch, commit=True,
                                                         client_transaction_version=1)
        assert ended.error == ErrorCode.producer_fenced

    run(scenario, tmp_path)


def test_a_new_instance_aborts_the_open_transaction_before_it_gets_its_epoch(
        tmp_path: Path) -> None:
    """InitProducerId while a transaction is open: the coordinator aborts it with a
    fenced epoch and answers CONCURRENT_TRANSACTIONS; the retry gets the epoch after it."""
    async def scenario(c: Coordinator) -> None:
        _, pid, epoch = await c.init()
        await c.coordinator.handle_add_partitions_to_transaction(TXN, pid, epoch,
                                                                 frozenset({GONE}), 1)
        assert await c.init() == (ErrorCode.concurrent_transactions, -1, -1)
        await until(lambda: states(c)[-1][0] is TransactionState.COMPLETE_ABORT,
                    "CompleteAbort")
        assert await c.init() == (ErrorCode.none, pid, 2)

    run(scenario, tmp_path)
