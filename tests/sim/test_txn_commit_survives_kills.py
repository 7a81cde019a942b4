"""A decided commit is completed whoever dies, in simulation on three real brokers: the
coordinator (the next one loads PrepareCommit and resends the marker: Kafka 4.2's
``TransactionStateManager`` loading and ``onTransactionLoaded``), or the leader of the
transaction's partition (the marker goes to the next leader: Kafka's
``TransactionMarkerChannelManager`` retrying).

In both, the data partition's leader has a stalled disk, so the coordinator's marker
cannot be written there: EndTxn is answered once PrepareCommit is in
``__transaction_state`` (after the stalled broker leaves that partition's ISR), and a
broker is killed with the marker still pending. Killing the coordinator: the broker
elected for ``__transaction_state`` loads PrepareCommit and sends the marker itself; once
the disk is back, it lands. Killing the leader: the marker goes to the partition's next
leader. Either way the state becomes CompleteCommit, and a read_committed fetch returns
the record with the LSO past the marker (offsets by hand: the record at 0, the COMMIT
marker at 1)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kio.schema.add_partitions_to_txn.v3 import request as add_req
from kio.schema.describe_transactions.v0 import request as describe_req
from kio.schema.end_txn.v3 import request as end_req
from kio.schema.fetch.v12 import request as fetch_req
from kio.schema.produce.v9 import request as produce_req
from kio.static.primitive import i8, i16, i32, i64
from test_txn_coordinator_failover import TXN_ID, ask, coordinator, initialized, on_cluster

from minibroker.cluster.types import ErrorCode
from minibroker.environment import entered
from minibroker.network.client import KafkaConnection
from minibroker.storage.control_records import (
    ControlRecordType,
    EndTransactionMarker,
    end_txn_marker_of,
)
from minibroker.storage.records import (
    TRANSACTIONAL_FLAG,
    build_batch,
    decode_values,
    iter_batches,
)
from minibroker.tools import create_topic, describe_partitions
from undertow.sim.cluster import SimulatedCluster, broker_host, until
from undertow.sim.virtual_loop import run_simulation

CONFIG = {"min.insync.replicas": "2", "broker.session.timeout.ms": "3000",
          "replica.lag.time.max.ms": "6000"}
TOPIC = "orders"


async def answered(broker: int, request: Any) -> str | None:
    """The request's error's name (``none`` for success), None while the coordinator is
    not ready for it."""
    response = await ask(broker, request)
    code = (response.error_code if hasattr(response, "error_code") else
            response.results_by_topic_v3_and_below[0].results_by_partition[0]
            .partition_error_code)
    return None if code in (ErrorCode.coordinator_load_in_progress,
                            ErrorCode.coordinator_not_available,
                            ErrorCode.not_coordinator) else ErrorCode(code).name


async def txn_state(broker: int) -> str:
    response = await ask(broker, describe_req.DescribeTransactionsRequest(
        transactional_ids=(TXN_ID,)))
    return response.transaction_states[0].transaction_state


@dataclass(frozen=True)
class OpenTransaction:
    coordinator: int
    producer_id: int
    epoch: int
    partition: int
    leader: int  # of the partition, not the coordinator; its disk is stalled


async def open_transaction(cluster: SimulatedCluster, seen: dict[str, Any]
                           ) -> OpenTransaction:
    """A transaction with one record in a partition led by another broker than the
    coordinator, whose disk is then stalled (so no marker can land there yet)."""
    first = await until(lambda: coordinator(1), 60, "a transaction coordinator")
    producer_id, epoch = await until(lambda: initialized(first), 30, "the init")
    bootstrap = (broker_host(1), 9092)

    async def created() -> bool:
        return await create_topic(bootstrap, TOPIC, 3, 3, {}) == 0

    await until(created, 30, "the topic")

    async def led_elsewhere() -> tuple[int, int] | None:
        described = await describe_partitions(bootstrap, TOPIC)
        if len(described) < 3 or any(len(p.isr) < 3 for p in described):
            return None
        return next(((p.partition, p.leader) for p in described if p.leader != first),
                    None)

    partition, leader = await until(led_elsewhere, 30, "a partition led elsewhere")
    seen["partition"] = partition
    seen["added"] = await until(lambda: answered(first, add_req.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=TXN_ID, v3_and_below_producer_id=i64(producer_id),
        v3_and_below_producer_epoch=i16(epoch), v3_and_below_topics=(
            add_req.AddPartitionsToTxnTopic(name=TOPIC, partitions=(i32(partition),)),))),
        30, "AddPartitionsToTxn")
    produced = await ask(leader, produce_req.ProduceRequest(
        transactional_id=TXN_ID, acks=i16(-1), timeout=datetime.timedelta(seconds=10),
        topic_data=(produce_req.TopicProduceData(name=TOPIC, partition_data=(
            produce_req.PartitionProduceData(index=i32(partition), records=build_batch(
                [b"order-1"], producer_id=producer_id, producer_epoch=epoch,
                base_sequence=0, attributes=TRANSACTIONAL_FLAG)),)),)))
    seen["produced"] = produced.responses[0].partition_responses[0].error_code
    with entered(cluster.nodes[broker_host(leader)]):
        cluster.brokers[leader].disk_stall.stall(120_000)
    return OpenTransaction(first, producer_id, epoch, partition, leader)


async def commit(txn: OpenTransaction) -> ErrorCode:
    """EndTxn(commit), answered once PrepareCommit is replicated: after the stalled broker
    leaves the ISR of the id's __transaction_state partition (replica.lag.time.max.ms,
    6 s). A retry meanwhile would be CONCURRENT_TRANSACTIONS, so it is sent once."""
    conn = await KafkaConnection.connect(broker_host(txn.coordinator), 9092,
                                         client_id="txn-test")
    try:
        ended = await conn.request(end_req.EndTxnRequest(
            transactional_id=TXN_ID, producer_id=i64(txn.producer_id),
            producer_epoch=i16(txn.epoch), committed=True), timeout=30)
    finally:
        conn.close()
    return ErrorCode(ended.error_code)


async def completed(coordinator_id: int) -> bool:
    return await txn_state(coordinator_id) == "CompleteCommit"


async def read_committed(broker: int, partition: int) -> list[Any]:
    """The partition as a read_committed consumer of ``broker`` sees it, once the LSO is
    past the marker: (HW, LSO, aborted transactions, each batch's records or marker)."""
    async def stable() -> Any:
        response = await ask(broker, fetch_req.FetchRequest(
            replica_id=i32(-1), max_wait=datetime.timedelta(0), min_bytes=i32(1),
            max_bytes=i32(1 << 20), isolation_level=i8(1), session_id=i32(0),
            session_epoch=i32(-1), topics=(fetch_req.FetchTopic(topic=TOPIC, partitions=(
                fetch_req.FetchPartition(
                    partition=i32(partition), current_leader_epoch=i32(-1),
                    fetch_offset=i64(0), last_fetched_epoch=i32(-1),
                    log_start_offset=i64(-1), partition_max_bytes=i32(1 << 20)),)),),
            forgotten_topics_data=(), rack_id=""))
        part = response.responses[0].partitions[0]
        return part if part.error_code == ErrorCode.none and part.last_stable_offset == 2 \
            else None

    fetched = await until(stable, 30, "the LSO past the marker")
    return [fetched.high_watermark, fetched.last_stable_offset, fetched.aborted_transactions,
            [end_txn_marker_of(header, batch) if header.is_control else decode_values(batch)
             for header, batch in iter_batches(fetched.records)]]


async def coordinator_killed(cluster: SimulatedCluster, seen: dict[str, Any]) -> None:
    txn = await open_transaction(cluster, seen)
    seen["ended"] = await commit(txn)
    cluster.kill(broker_host(txn.coordinator))
    other = next(b for b in (1, 2, 3) if b not in (txn.coordinator, txn.leader))
    moved = await until(lambda: coordinator(other, not_=txn.coordinator), 60,
                        "a new coordinator")

    async def resent() -> dict[str, Any] | None:
        return cluster.brokers[moved].txn_coordinator.markers.state().get(TXN_ID)

    seen["resent"] = await until(resent, 30, "the new coordinator resending the marker")
    seen["state_while_stalled"] = await txn_state(moved)
    with entered(cluster.nodes[broker_host(txn.leader)]):
        cluster.brokers[txn.leader].disk_stall.clear()
    await until(lambda: completed(moved), 60, "CompleteCommit")
    seen["fetched"] = await read_committed(txn.leader, txn.partition)
    seen["coordinators"] = (txn.coordinator, moved, txn.leader)


async def leader_killed(cluster: SimulatedCluster, seen: dict[str, Any]) -> None:
    txn = await open_transaction(cluster, seen)
    seen["ended"] = await commit(txn)

    async def pending() -> dict[str, Any] | None:
        return cluster.brokers[txn.coordinator].txn_coordinator.markers.state().get(TXN_ID)

    seen["pending"] = await until(pending, 30, "the marker held by the stalled leader")
    cluster.kill(broker_host(txn.leader))
    await until(lambda: completed(txn.coordinator), 60, "CompleteCommit on the new leader")

    async def new_leader() -> int | None:
        described = await describe_partitions((broker_host(txn.coordinator), 9092), TOPIC)
        found = next((p.leader for p in described if p.partition == txn.partition), -1)
        return found if found not in (-1, txn.leader) else None

    moved = await until(new_leader, 30, "a new leader of the partition")
    seen["fetched"] = await read_committed(moved, txn.partition)
    seen["leaders"] = (txn.leader, moved, txn.coordinator)


def test_a_decided_commit_is_completed_by_the_next_coordinator(tmp_path: Path) -> None:
    seen = run_simulation(on_cluster(tmp_path, coordinator_killed))
    first, moved, leader = seen["coordinators"]
    assert len({first, moved, leader}) == 3
    assert (seen["added"], seen["produced"], seen["ended"]) == (
        "none", ErrorCode.none, ErrorCode.none)
    assert seen["resent"] == {"result": "COMMIT",
                              "remaining": [f"{TOPIC}-{seen['partition']}"]}
    assert seen["state_while_stalled"] == "PrepareCommit"
    # The marker is the new coordinator's: __transaction_state's next leader epoch, 1.
    assert seen["fetched"] == [2, 2, (), [
        [(0, b"order-1")], EndTransactionMarker(ControlRecordType.COMMIT, 1)]]


def test_a_marker_goes_to_the_partitions_next_leader_when_its_leader_dies(
        tmp_path: Path) -> None:
    """The marker cannot land on the stalled leader; the leader is killed; the
    coordinator's marker channel retries (connection reset, then NOT_LEADER_OR_FOLLOWER
    or the new leader from the metadata) until the partition's next leader takes it, and
    writes CompleteCommit. The record was replicated before (acks=all), so the next
    leader has it at offset 0 and the marker at 1, from the first coordinator (epoch
    0)."""
    seen = run_simulation(on_cluster(tmp_path, leader_killed))
    old, new, coordinator_id = seen["leaders"]
    assert new != old and old != coordinator_id
    assert (seen["added"], seen["produced"], seen["ended"]) == (
        "none", ErrorCode.none, ErrorCode.none)
    assert seen["pending"] == {"result": "COMMIT",
                               "remaining": [f"{TOPIC}-{seen['partition']}"]}
    assert seen["fetched"] == [2, 2, (), [
        [(0, b"order-1")], EndTransactionMarker(ControlRecordType.COMMIT, 0)]]
