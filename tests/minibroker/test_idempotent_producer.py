"""Idempotent producers (KIP-98): producer state rules on a real ``Log``, failover and
truncation in the step-by-step ``SimCluster``, producer id allocation, and confluent-kafka
with ``enable.idempotence`` across a real leader kill."""

from __future__ import annotations

import asyncio
import datetime
import struct
import threading
import time
from collections import Counter
from pathlib import Path

import crc32c
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from kio.schema.init_producer_id.v4 import request as init_req
from kio.schema.produce.v9 import request as produce_req
from kio.static.primitive import i16, i32, i64
from stepper import SimCluster
from test_broker_processes import TOPIC, ProcessCluster, wait_for

from minibroker.cluster.types import ErrorCode, TopicPartition
from minibroker.controller.quorum_controller import PRODUCER_ID_BLOCK_SIZE, QuorumController
from minibroker.events import ReplicationEventLog
from minibroker.network.client import KafkaConnection
from minibroker.producer_id_manager import ProducerIdAllocationError, ProducerIdManager
from minibroker.storage.durability import DurabilityTracker
from minibroker.storage.log import Log
from minibroker.storage.producer_state import (
    BatchMetadata,
    InvalidProducerBatchError,
    InvalidProducerEpochError,
    OutOfOrderSequenceError,
)
from minibroker.storage.records import TRANSACTIONAL_FLAG, build_batch, decode_values

MAX_SEQUENCE = 2**31 - 1


def batch(pid: int, epoch: int, seq: int, count: int = 1, label: str = "v") -> bytes:
    return build_batch([f"{label}-{pid}-{epoch}-{seq + i}".encode() for i in range(count)],
                       producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def open_log(directory: Path) -> Log:
    return Log(directory, durability=DurabilityTracker())


def values(log: Log) -> list[bytes | None]:
    return [v for _, v in decode_values(log.read(log.log_start_offset, 1 << 30))]


def retained(log: Log, pid: int) -> list[BatchMetadata]:
    entry = log.producer_state.last_entry(pid)
    return [] if entry is None else list(entry.batches)


# ---- the producer state rules on one log ----------------------------------------------


def test_a_retry_gets_the_original_offsets_and_is_not_appended_again(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    first = batch(7, 0, 0, 3)
    assert log.append_as_leader(first, 0).first_offset == 0
    log.append_as_leader(build_batch([b"plain"]), 0)  # no producer id: as before
    second = batch(7, 0, 3, 2)
    assert log.append_as_leader(second, 0).first_offset == 4

    for retry, (first_offset, last_offset) in ((first, (0, 2)), (second, (4, 5))):
        info = log.append_as_leader(retry, 0)
        assert (info.duplicate, info.first_offset, info.last_offset) == (
            True, first_offset, last_offset)
    assert log.log_end_offset == 6
    assert Counter(values(log)).most_common(1)[0][1] == 1


def test_only_the_last_five_batches_are_recognised_as_retries(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for seq in range(6):
        log.append_as_leader(batch(7, 0, seq), 0)
    assert log.append_as_leader(batch(7, 0, 1), 0).first_offset == 1  # 5th most recent
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(batch(7, 0, 0), 0)  # 6th most recent: forgotten
    assert log.log_end_offset == 6


def test_a_gap_or_an_overlap_in_the_sequence_is_out_of_order(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(batch(7, 0, 0, 2), 0)
    with pytest.raises(OutOfOrderSequenceError, match="sent sequence 3 after 1"):
        log.append_as_leader(batch(7, 0, 3), 0)
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(batch(7, 0, 1, 2), 0)  # overlaps, but is not the same batch
    assert log.log_end_offset == 2
    assert log.append_as_leader(batch(7, 0, 2), 0).first_offset == 2


def test_an_older_epoch_is_fenced_and_a_new_epoch_starts_at_zero(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    old = batch(7, 0, 0)
    log.append_as_leader(old, 0)
    with pytest.raises(OutOfOrderSequenceError, match="new epoch 1"):
        log.append_as_leader(batch(7, 1, 5), 0)
    assert log.append_as_leader(batch(7, 1, 0), 0).first_offset == 1
    with pytest.raises(InvalidProducerEpochError):
        log.append_as_leader(batch(7, 0, 1), 0)
    with pytest.raises(InvalidProducerEpochError):
        log.append_as_leader(old, 0)  # not a retry any more: its epoch was bumped
    assert log.log_end_offset == 2


def test_an_unknown_producer_may_start_at_any_sequence(tmp_path: Path) -> None:
    """Kafka 3.x (KIP-360): its earlier batches may have been truncated away."""
    log = open_log(tmp_path)
    assert log.append_as_leader(batch(9, 4, 17), 0).first_offset == 0
    assert retained(log, 9) == [BatchMetadata(17, 17, 0, 0)]


def test_sequence_numbers_wrap_after_the_largest_int32(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(batch(7, 0, MAX_SEQUENCE - 1, 3), 0)
    assert retained(log, 7) == [BatchMetadata(MAX_SEQUENCE - 1, 0, 0, 2)]
    assert log.append_as_leader(batch(7, 0, 1), 0).first_offset == 3
    assert log.append_as_leader(batch(7, 0, MAX_SEQUENCE - 1, 3), 0).duplicate


def test_batches_a_producer_cannot_send_are_invalid(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    with pytest.raises(InvalidProducerBatchError, match="base sequence -1"):
        log.append_as_leader(batch(7, 0, -1), 0)
    control = bytearray(batch(7, 0, 0))
    control[22] |= 0x30  # attributes: isTransactional, isControl
    struct.pack_into(">I", control, 17, crc32c.crc32c(control[21:]))
    with pytest.raises(InvalidProducerBatchError, match="control records"):
        log.append_as_leader(bytes(control), 0)
    assert log.log_end_offset == 0


def test_the_state_is_rebuilt_from_the_log_when_it_is_reopened(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(batch(7, 0, 0, 2), 0)
    log.append_as_leader(batch(8, 0, 0), 0)
    log.append_as_leader(batch(7, 0, 2, 2), 0)
    log.close()
    reopened = open_log(tmp_path)
    assert retained(reopened, 7) == [BatchMetadata(0, 1, 0, 1), BatchMetadata(2, 3, 3, 4)]
    assert reopened.append_as_leader(batch(7, 0, 2, 2), 0).first_offset == 3
    assert reopened.append_as_leader(batch(7, 0, 4), 0).first_offset == 5


def test_truncation_rolls_the_producer_state_back(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(batch(7, 0, 0, 2), 0)  # offsets 0-1
    log.append_as_leader(build_batch([b"plain"]), 0)  # 2
    retried_later = batch(7, 0, 2, 2)
    log.append_as_leader(retried_later, 0)  # 3-4
    log.append_as_leader(batch(8, 0, 0), 0)  # 5
    log.truncate_to(3)
    assert retained(log, 7) == [BatchMetadata(0, 1, 0, 1)]
    assert log.producer_state.last_entry(8) is None
    # The removed batch is new again to this log; the kept one is still a retry.
    assert not log.append_as_leader(retried_later, 1).duplicate
    assert log.append_as_leader(batch(7, 0, 0, 2), 1).first_offset == 0
    log.truncate_fully_and_start_at(10)
    assert log.producer_state.producers == {}


def test_crc_recovery_rolls_the_producer_state_back(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(batch(7, 0, 0), 0)
    torn = batch(7, 0, 1)
    log.append_as_leader(torn, 0)
    log.close()
    segment = tmp_path / f"{0:020d}.log"
    data = bytearray(segment.read_bytes())
    data[-1] ^= 0xFF  # the second batch's last byte: its CRC no longer matches
    segment.write_bytes(bytes(data))
    recovered = open_log(tmp_path)
    assert recovered.log_end_offset == 1
    assert retained(recovered, 7) == [BatchMetadata(0, 0, 0, 0)]
    info = recovered.append_as_leader(torn, 0)
    assert (info.duplicate, info.first_offset) == (False, 1)


# ---- replication: failover and follower truncation (SimCluster) -----------------------

TP = TopicPartition("orders", 0)


def fail_over(sim: SimCluster) -> tuple[int, int]:
    """Crash the leader; returns (old leader, new leader) once the controller elected one."""
    old = sim.leader_of(TP)
    sim.crash(old)
    sim.advance(4000)
    new = sim.leader_of(TP)
    assert new not in (old, -1)
    return old, new


def test_a_new_leader_deduplicates_a_retry_of_what_the_old_leader_appended(
        tmp_path: Path) -> None:
    sim = SimCluster(tmp_path, config={"min.insync.replicas": "2"})
    sim.create_topic("orders")
    sim.produce(TP, ["a", "b"], producer=(7, 0, 0))
    # Committed, but say the answer never reaches the producer: it retries after the failover.
    lost_ack = sim.produce(TP, ["c", "d"], producer=(7, 0, 2))
    sim.replicate()
    assert lost_ack.acknowledged and lost_ack.result.base_offset == 2
    _, new = fail_over(sim)

    retry = sim.produce(TP, ["c", "d"], producer=(7, 0, 2))
    sim.replicate()
    assert retry.acknowledged and retry.result.base_offset == 2
    assert sim.produce(TP, ["e"], producer=(7, 0, 4), acks=1).result.error == ErrorCode.none
    gap = sim.produce(TP, ["g"], producer=(7, 0, 6), acks=1)
    assert gap.result.error == ErrorCode.out_of_order_sequence_number
    sim.produce(TP, ["x"], producer=(7, 1, 0), acks=1)
    assert sim.produce(TP, ["f"], producer=(7, 0, 5), acks=1).result.error == (
        ErrorCode.invalid_producer_epoch)
    sim.replicate()
    assert [v for _, v in sim.read_committed(TP)] == [b"a", b"b", b"c", b"d", b"e", b"x"]
    assert sim.leader_of(TP) == new


@pytest.mark.parametrize("mode", ["leader-epoch", "high-watermark"])
def test_follower_truncation_rolls_back_the_producer_state(tmp_path: Path, mode: str) -> None:
    sim = SimCluster(tmp_path, config={"replication.truncation.mode": mode})
    sim.create_topic("orders")
    sim.produce(TP, ["a"], producer=(7, 0, 0), acks=1)
    sim.replicate()
    sim.advance(1500)  # the HW (1) is checkpointed: high-watermark mode truncates to it
    unreplicated = sim.produce(TP, ["b"], producer=(7, 0, 1), acks=1)
    assert unreplicated.result.base_offset == 1
    old, new = fail_over(sim)
    # The producer's retry of the unreplicated batch is new to the new leader.
    retry = sim.produce(TP, ["b"], producer=(7, 0, 1), acks=1)
    sim.produce(TP, ["c"], producer=(7, 0, 2), acks=1)
    assert retry.result.base_offset == 1
    leader_state = list(sim.replica(new, TP).log.producer_state.last_entry(7).batches)

    sim.start(old)
    if mode == "leader-epoch":  # before it asks the leader: its own copy of the batch
        assert list(sim.replica(old, TP).log.producer_state.last_entry(7).batches)[-1] == (
            BatchMetadata(1, 1, 1, 1))
    # (high-watermark: it truncated as it became a follower, at its start)
    sim.truncate_followers(old)
    assert list(sim.replica(old, TP).log.producer_state.last_entry(7).batches) == [
        BatchMetadata(0, 0, 0, 0)]
    sim.replicate()
    assert list(sim.replica(old, TP).log.producer_state.last_entry(7).batches) == leader_state
    assert sim.log_values(old, TP) == sim.log_values(new, TP)


# ---- producer ids -----------------------------------------------------------------------


def test_producer_id_blocks_are_unique_across_brokers_and_controller_restarts(
        tmp_path: Path) -> None:
    events = ReplicationEventLog(tmp_path)
    controller = QuorumController(clock_ms=lambda: 0.0, events=events, data_dir=tmp_path)
    epochs = {b: controller.register_broker(b, f"inc-{b}", "127.0.0.1", 9000 + b)
              for b in (1, 2)}
    blocks = [controller.allocate_producer_ids(b, epoch) for b, epoch in epochs.items()]
    restarted = QuorumController(clock_ms=lambda: 0.0, events=events, data_dir=tmp_path)
    blocks.append(restarted.allocate_producer_ids(1, epochs[1]))
    assert all(error == ErrorCode.none for error, _, _ in blocks)
    ids = [i for _, start, count in blocks for i in range(start, start + count)]
    assert len(ids) == len(set(ids)) == 3 * PRODUCER_ID_BLOCK_SIZE
    assert restarted.allocate_producer_ids(1, epochs[1] - 1)[0] == (
        ErrorCode.stale_broker_epoch)
    assert restarted.allocate_producer_ids(3, 1)[0] == ErrorCode.broker_id_not_registered


def test_producer_id_manager_shares_one_allocation_and_retries_after_a_failure() -> None:
    calls: list[int] = []

    async def allocate_block() -> tuple[int, int]:
        calls.append(len(calls))
        if len(calls) == 1:
            raise ProducerIdAllocationError("controller unreachable")
        await asyncio.sleep(0.01)  # in flight while the other callers come
        return 1000 * len(calls), 2

    async def scenario() -> None:
        manager = ProducerIdManager(allocate_block)
        with pytest.raises(ProducerIdAllocationError):
            await manager.generate_producer_id()
        ids = await asyncio.gather(*(manager.generate_producer_id() for _ in range(3)))
        assert sorted(ids) == [2000, 2001, 3000]
        assert len(calls) == 3

    asyncio.run(scenario())


# ---- real processes: confluent-kafka across a leader kill -------------------------------

RECORDS = 3000


class IdempotentWorkload:
    """confluent-kafka with enable.idempotence and acks=all sending RECORDS unique values."""

    def __init__(self, bootstrap: str) -> None:
        self.acked: dict[bytes, int] = {}
        self.errors: list[str] = []
        self.done = threading.Event()
        self._producer = Producer({
            "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
            "linger.ms": 2, "message.timeout.ms": 30000, "retry.backoff.ms": 50})
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _on_delivery(self, err: object, msg: object) -> None:
        if err is None:
            self.acked[msg.value()] = msg.offset()
        else:
            self.errors.append(str(err))

    def _run(self) -> None:
        for seq in range(RECORDS):
            self._producer.produce(TOPIC, f"v-{seq}".encode(), partition=0,
                                   on_delivery=self._on_delivery)
            self._producer.poll(0.002)
        self._producer.flush(45)
        self.done.set()


async def _connect(port: int) -> KafkaConnection:
    return await KafkaConnection.connect("127.0.0.1", port, client_id="idempotent-test")


def init_producer_id(port: int) -> int:
    async def run() -> int:
        conn = await _connect(port)
        try:
            answer = await conn.request(init_req.InitProducerIdRequest(
                transactional_id=None, transaction_timeout=datetime.timedelta(0),
                producer_id=i64(-1), producer_epoch=i16(-1)), timeout=10)
        finally:
            conn.close()
        assert (answer.error_code, answer.producer_epoch) == (ErrorCode.none, 0)
        return answer.producer_id

    return asyncio.run(run())


def produce(port: int, records: bytes) -> int:
    """Base offset of one acks=all Produce of ``records`` to partition 0."""

    async def run() -> int:
        conn = await _connect(port)
        try:
            response = await conn.request(produce_req.ProduceRequest(
                transactional_id=None, acks=i16(-1), timeout=datetime.timedelta(seconds=10),
                topic_data=(produce_req.TopicProduceData(name=TOPIC, partition_data=(
                    produce_req.PartitionProduceData(index=i32(0), records=records),)),)),
                timeout=15)
        finally:
            conn.close()
        (answer,) = response.responses[0].partition_responses
        assert answer.error_code == ErrorCode.none, answer
        return answer.base_offset

    return asyncio.run(run())


def partition_state(cluster: ProcessCluster, broker_id: int) -> dict:
    return next(p for p in cluster.broker_state(broker_id)["partitions"] if p["topic"] == TOPIC)


def drain(bootstrap: str, end: int) -> list[tuple[int, bytes]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "drain",
                         "enable.auto.commit": False})
    consumer.assign([KafkaTopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
    records: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 30
    while (not records or records[-1][0] < end - 1) and time.monotonic() < deadline:
        records += [(m.offset(), m.value()) for m in consumer.consume(1000, 0.5)
                    if not m.error()]
    consumer.close()
    return records


@pytest.mark.slow
def test_confluent_idempotent_producer_writes_each_value_once_across_a_leader_kill(
        tmp_path: Path) -> None:
    cluster = ProcessCluster(tmp_path, {"min.insync.replicas": "2",
                                        "replica.lag.time.max.ms": "2000",
                                        "broker.session.timeout.ms": "2000"})
    try:
        cluster.create_topic()
        old_leader = cluster.partition()["leader"]
        old_port = cluster.ports[old_leader][0]
        # A batch whose acknowledgement is "lost": its producer retries it after the failover.
        pid = init_producer_id(old_port)
        lost_ack = build_batch([b"raw-0", b"raw-1"], producer_id=pid, producer_epoch=0,
                               base_sequence=0)
        raw_offset = produce(old_port, lost_ack)
        workload = IdempotentWorkload(cluster.bootstrap)
        wait_for(lambda: len(workload.acked) > 500, 30, "acknowledged writes")
        cluster.kill(old_leader)
        wait_for(lambda: cluster.partition()["leader"] not in (old_leader, -1), 20,
                 "a new leader")
        new_leader = cluster.partition()["leader"]
        assert produce(cluster.ports[new_leader][0], lost_ack) == raw_offset
        assert workload.done.wait(60), "the producer did not finish"
        assert workload.errors == []
        assert len(workload.acked) == RECORDS

        cluster.start(old_leader)
        wait_for(lambda: len(cluster.partition()["isr"]) == 3, 30, "the old leader to rejoin")
        # Its new incarnation hands out ids from a new block, never its old one's.
        assert init_producer_id(old_port) // PRODUCER_ID_BLOCK_SIZE > pid // PRODUCER_ID_BLOCK_SIZE
        wait_for(lambda: len({(partition_state(cluster, b)["log_end_offset"],
                               partition_state(cluster, b)["producers"])
                              for b in (1, 2, 3)}) == 1, 20, "replicas to converge")
        end = partition_state(cluster, cluster.partition()["leader"])["high_watermark"]
        records = drain(cluster.bootstrap, end)
        assert [offset for offset, _ in records] == list(range(end))
        duplicated = [v for v, n in Counter(v for _, v in records).items() if n > 1]
        assert duplicated == []
        read = {value: offset for offset, value in records}
        assert {v: read.get(v) for v in workload.acked} == workload.acked
        assert read[b"raw-0"] == raw_offset
        assert partition_state(cluster, 1)["producers"] >= 2
    finally:
        cluster.stop()


def test_producer_ids_expire_unless_their_transaction_is_open(tmp_path: Path) -> None:
    """producer.id.expiration.ms (Kafka's removeExpiredProducers): a producer whose last
    batch is that old is forgotten (a retry of its batch is then taken as new); one with a
    transaction open is kept whatever its age."""
    log = open_log(tmp_path)
    log.append_as_leader(build_batch([b"a"], producer_id=7, producer_epoch=0,
                                     base_sequence=0, timestamp_ms=1_000), 0)
    log.append_as_leader(build_batch([b"b"], producer_id=8, producer_epoch=0,
                                     base_sequence=0, timestamp_ms=1_500), 0)
    log.append_as_leader(build_batch([b"t"], producer_id=9, producer_epoch=0,
                                     base_sequence=0, timestamp_ms=1_000,
                                     attributes=TRANSACTIONAL_FLAG), 0)
    state = log.producer_state
    assert state.remove_expired_producers(now_ms=1_999, expiration_ms=1_000) == []
    assert state.remove_expired_producers(now_ms=2_000, expiration_ms=1_000) == [7]
    assert sorted(state.producers) == [8, 9]
    assert state.remove_expired_producers(now_ms=10_000, expiration_ms=1_000) == [8]
    assert sorted(state.producers) == [9]  # its transaction is open
    retry = log.append_as_leader(build_batch([b"a"], producer_id=7, producer_epoch=0,
                                             base_sequence=0, timestamp_ms=1_000), 0)
    assert not retry.duplicate and retry.first_offset == 3
