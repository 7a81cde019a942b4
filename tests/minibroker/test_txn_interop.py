"""Stock transactional producers against a real 3-broker minibroker cluster: confluent-kafka
(librdkafka 2.x) and kafka-python find the transaction coordinator (the first
FindCoordinator creates ``__transaction_state``) and initialize; each new instance of one
transactional id gets the same producer id and the next epoch, which the coordinator
keeps in ``/v1/state`` and ListTransactions lists, and which fences the instances before
it (an InitProducerId naming an older epoch gets PRODUCER_FENCED); kafka-python's admin
client lists and describes the ids. Then whole transactions: librdkafka's and
kafka-python's producers commit and abort, read_committed consumers of both get only the
committed records, and librdkafka's consume-transform-produce loop commits its input
offsets with its output (send_offsets_to_transaction)."""

from __future__ import annotations

import asyncio
import datetime
import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition
from kio.schema.add_offsets_to_txn.v3 import request as add_offsets_req
from kio.schema.add_partitions_to_txn.v3 import request as add_req
from kio.schema.api_versions.v4 import request as versions_req
from kio.schema.end_txn.v5 import request as end_v5
from kio.schema.find_coordinator.v4 import request as find_req
from kio.schema.init_producer_id.v4 import request as init_req
from kio.schema.list_transactions.v1 import request as list_req
from kio.schema.produce.v9 import request as produce_req
from kio.schema.produce.v12 import request as produce_v12
from kio.schema.txn_offset_commit.v3 import request as txn_commit_req
from kio.static.primitive import i8, i16, i32, i64
from test_broker_processes import get_json, wait_for
from test_interop_clients import BROKERS, Cluster, _minibroker, running_cluster

from minibroker.cluster.types import ErrorCode
from minibroker.network.client import KafkaConnection
from minibroker.storage.records import TRANSACTIONAL_FLAG, build_batch

ABORT_CHECK = "transaction.abort.timed.out.transaction.cleanup.interval.ms"
INIT_TIMEOUT_S = 60  # the first init waits for __transaction_state to be created and led


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # The coordinator looks for timed-out transactions every 0.5 s (Kafka: 10 s).
    with running_cluster(tmp_path_factory.mktemp("txn"), f"{ABORT_CHECK}=500") as (cluster, _):
        yield cluster


def coordinated(cluster: Cluster, transactional_id: str) -> dict[str, Any]:
    """The id as its coordinator's ``/v1/state`` shows it, with the coordinator's id."""
    for broker in range(1, BROKERS + 1):
        url = f"http://127.0.0.1:{cluster.base_port + 100 + broker}/v1/state"
        with urllib.request.urlopen(url, timeout=5) as response:
            owned = json.load(response)["transaction_coordinator"]["owned"]
        for ids in owned.values():
            if transactional_id in ids:
                return {"broker": broker, **ids[transactional_id]}
    raise AssertionError(f"no broker coordinates {transactional_id}")


def partition_states(cluster: Cluster, topic: str, partition: int) -> list[dict[str, Any]]:
    """The partition as each broker's ``/v1/state`` shows it (HW, LSO, LEO, ongoing
    transactions): what a failed wait on a consumer's position says about why."""
    states = []
    for broker in range(1, BROKERS + 1):
        url = f"http://127.0.0.1:{cluster.base_port + 100 + broker}/v1/state"
        with urllib.request.urlopen(url, timeout=5) as response:
            states += [{"broker": broker, **p} for p in json.load(response)["partitions"]
                       if (p["topic"], p["partition"]) == (topic, partition)]
    return states


def ask(cluster: Cluster, broker: int, request: Any) -> Any:
    async def call() -> Any:
        conn = await KafkaConnection.connect("127.0.0.1", cluster.base_port + broker,
                                             client_id="txn-interop")
        try:
            return await conn.request(request, timeout=10)
        finally:
            conn.close()

    return asyncio.run(call())


def init_with_epoch(cluster: Cluster, broker: int, transactional_id: str,
                    producer_id: int, epoch: int) -> ErrorCode:
    answer = ask(cluster, broker, init_req.InitProducerIdRequest(
        transactional_id=transactional_id, transaction_timeout=datetime.timedelta(seconds=60),
        producer_id=i64(producer_id), producer_epoch=i16(epoch)))
    return ErrorCode(answer.error_code)


def test_confluent_kafka_initializes_and_each_new_instance_fences_the_last(
        cluster: Cluster) -> None:
    started = time.monotonic()
    first = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "ck-tx"})
    first.init_transactions(INIT_TIMEOUT_S)
    state = coordinated(cluster, "ck-tx")
    assert (state["state"], state["producer_epoch"]) == ("Empty", 0)
    second = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "ck-tx"})
    second.init_transactions(30)
    again = coordinated(cluster, "ck-tx")
    assert (again["producer_id"], again["producer_epoch"]) == (state["producer_id"], 1)
    assert init_with_epoch(cluster, again["broker"], "ck-tx", state["producer_id"], 0) \
        == ErrorCode.producer_fenced
    listed = ask(cluster, again["broker"], list_req.ListTransactionsRequest(
        state_filters=("Empty",), producer_id_filters=(), duration_filter=i64(-1)))
    assert ("ck-tx", state["producer_id"], "Empty") in [
        (t.transactional_id, t.producer_id, t.transaction_state)
        for t in listed.transaction_states]
    assert time.monotonic() - started < INIT_TIMEOUT_S


def test_kafka_python_initializes_a_transactional_producer(cluster: Cluster) -> None:
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap,
                             transactional_id="kp-tx")
    try:
        producer.init_transactions()
    finally:
        producer.close(timeout=5)
    state = coordinated(cluster, "kp-tx")
    assert (state["state"], state["producer_epoch"]) == ("Empty", 0)


def test_kafka_python_admin_lists_and_describes_the_transactional_ids(cluster: Cluster) -> None:
    """kafka-python's KafkaAdminClient asks every broker (ListTransactions) and each id's
    coordinator (DescribeTransactions), as kafka-transactions.sh does."""
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "admin-tx"})
    producer.init_transactions(INIT_TIMEOUT_S)
    state = coordinated(cluster, "admin-tx")
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    try:
        listed = admin.list_transactions()
        described = admin.describe_transactions(["admin-tx"])["admin-tx"]
    finally:
        admin.close()
    assert [(t.transactional_id, t.producer_id, t.state.value)
            for t in listed[state["broker"]] if t.transactional_id == "admin-tx"] == [
        ("admin-tx", state["producer_id"], "Empty")]
    assert (described.coordinator_id, described.state.value, described.producer_id,
            described.producer_epoch, described.transaction_start_time_ms,
            described.topic_partitions) == (
        state["broker"], "Empty", state["producer_id"], 0, -1, set())


EOS_TOPIC = "eos"
# Hand-derived ends: p0 holds c-0..c-2 (0-2), COMMIT (3), a-0..a-2 (4-6), ABORT (7), d-0 (8),
# COMMIT (9); p1 holds c-3, c-4 (0-1), COMMIT (2), a-3, a-4 (3-4), ABORT (5), d-1 (6),
# COMMIT (7).
EOS_END = {0: 10, 1: 8}
COMMITTED = {0: [b"c-0", b"c-1", b"c-2", b"d-0"], 1: [b"c-3", b"c-4", b"d-1"]}
EVERYTHING = {0: [b"c-0", b"c-1", b"c-2", b"a-0", b"a-1", b"a-2", b"d-0"],
              1: [b"c-3", b"c-4", b"a-3", b"a-4", b"d-1"]}


def create_topic(cluster: Cluster, topic: str, partitions: int = 1) -> None:
    """Created with a full replication factor (already there is fine: tests share it)."""
    def created() -> bool:
        result = _minibroker("topics", "create", "--bootstrap",
                             f"127.0.0.1:{cluster.base_port + 1}", "--topic", topic,
                             "--partitions", str(partitions),
                             "--replication-factor", str(BROKERS))
        return result.returncode == 0 or "TOPIC_ALREADY_EXISTS" in result.stderr

    wait_for(created, 45, f"topic {topic}")


def partition_state(cluster: Cluster, topic: str, partition: int) -> dict[str, Any]:
    """The partition as its leader's ``/v1/state`` shows it (HW, LSO)."""
    controller = get_json(cluster.base_port + 100)
    leader = controller["topics"][topic]["partitions"][str(partition)]["leader"]
    return next(p for p in get_json(cluster.base_port + 100 + leader)["partitions"]
                if (p["topic"], p["partition"]) == (topic, partition))


def read_partitions(cluster: Cluster, isolation: str) -> dict[int, list[bytes]]:
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": isolation,
                         "isolation.level": isolation, "enable.auto.commit": False})
    tps = [TopicPartition(EOS_TOPIC, p, 0) for p in EOS_END]
    consumer.assign(tps)
    read: dict[int, list[bytes]] = {p: [] for p in EOS_END}
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline and any(
                tp.offset < EOS_END[tp.partition] for tp in consumer.position(tps)):
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                read[message.partition()].append(message.value())
        assert {tp.partition: tp.offset for tp in consumer.position(tps)} == EOS_END
    finally:
        consumer.close()
    return read


def test_confluent_kafka_commits_and_aborts_and_read_committed_sees_only_the_commits(
        cluster: Cluster) -> None:
    """librdkafka's transactional producer, begin to commit and abort, on two partitions
    led by different brokers; the LSO holds while a transaction is open; a read_committed
    consumer gets the committed records only, a read_uncommitted one all of them."""
    create_topic(cluster, EOS_TOPIC, 2)
    wait_for(lambda: all(len(partition_state(cluster, EOS_TOPIC, p)["isr"]) == BROKERS
                         for p in EOS_END), 30, "full ISRs")
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "ck-eos",
                         "linger.ms": 0})
    producer.init_transactions(INIT_TIMEOUT_S)

    def transaction(label: str, counts: tuple[int, int], commit: bool) -> None:
        producer.begin_transaction()
        values = iter(range(sum(counts)))
        for partition, count in enumerate(counts):
            for _ in range(count):
                producer.produce(EOS_TOPIC, f"{label}-{next(values)}".encode(),
                                 partition=partition)
        producer.flush(30)
        if label == "a":
            # Open, flushed: the LSO of each partition is the transaction's first offset.
            assert [partition_state(cluster, EOS_TOPIC, p)["last_stable_offset"]
                    for p in EOS_END] == [4, 3]
        (producer.commit_transaction if commit else producer.abort_transaction)(30)

    transaction("c", (3, 2), commit=True)
    transaction("a", (3, 2), commit=False)
    transaction("d", (1, 1), commit=True)
    # EndTxn is answered once PrepareCommit is written; CompleteCommit follows the markers.
    wait_for(lambda: coordinated(cluster, "ck-eos")["state"] == "CompleteCommit", 30,
             "CompleteCommit after the markers")
    wait_for(lambda: [partition_state(cluster, EOS_TOPIC, p)["last_stable_offset"]
                      for p in EOS_END] == [EOS_END[0], EOS_END[1]], 30,
             "the LSOs past the last markers")
    assert read_partitions(cluster, "read_committed") == COMMITTED
    assert read_partitions(cluster, "read_uncommitted") == EVERYTHING


def test_confluent_kafka_consume_transform_produce_commits_offsets_with_the_transaction(
        cluster: Cluster) -> None:
    """Kafka Streams' loop with librdkafka: read input in a group, write output and commit
    the input offsets in one transaction (send_offsets_to_transaction: AddOffsetsToTxn, then
    TxnOffsetCommit with the member id and generation, KIP-447). The committed transaction
    moves the group's offset and its output is visible; the aborted one does neither."""
    for topic in ("pipe-in", "pipe-out"):
        create_topic(cluster, topic)
    source = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(6):
        source.produce("pipe-in", f"in-{i}".encode(), partition=0)
    assert source.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "pipeline",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    consumer.subscribe(["pipe-in"])
    producer = Producer({"bootstrap.servers": cluster.bootstrap,
                         "transactional.id": "pipeline-0"})
    producer.init_transactions(INIT_TIMEOUT_S)
    tp = TopicPartition("pipe-in", 0)

    def transform(count: int, commit: bool) -> None:
        read: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(read) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                read.append(message.value())
        assert len(read) == count
        producer.begin_transaction()
        for value in read:
            producer.produce("pipe-out", value.replace(b"in", b"out"), partition=0)
        producer.send_offsets_to_transaction(consumer.position([tp]),
                                             consumer.consumer_group_metadata(), 30)
        # Written before the end: librdkafka's abort purges records not yet sent, which on a
        # busy machine can be all of them, leaving the output with no aborted record to skip.
        assert producer.flush(30) == 0
        (producer.commit_transaction if commit else producer.abort_transaction)(30)

    try:
        transform(3, commit=True)
        assert consumer.committed([tp], 10)[0].offset == 3
        transform(3, commit=False)
        assert consumer.committed([tp], 10)[0].offset == 3  # the abort dropped 6
    finally:
        consumer.close()
    wait_for(lambda: coordinated(cluster, "pipeline-0")["state"] == "CompleteAbort", 30,
             "CompleteAbort after the markers")
    reader = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "pipe-reader",
                       "isolation.level": "read_committed", "enable.auto.commit": False})
    out = TopicPartition("pipe-out", 0, 0)
    reader.assign([out])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        # 3 records, COMMIT, 3 records, ABORT: the end is offset 8.
        while reader.position([out])[0].offset < 8 and time.monotonic() < deadline:
            message = reader.poll(0.5)
            if message is not None and message.error() is None:
                got.append(message.value())
        assert reader.position([out])[0].offset == 8, json.dumps(
            partition_states(cluster, "pipe-out", 0))
    finally:
        reader.close()
    assert got == [b"out-0", b"out-1", b"out-2"]


def test_kafka_python_commits_and_aborts_and_its_read_committed_consumer_agrees(
        cluster: Cluster) -> None:
    """kafka-python's transactional producer (its own transaction manager, not
    librdkafka's): a committed and an aborted transaction; its read_committed consumer gets
    the committed records only. Ends by hand: c-0, c-1 (0-1), COMMIT (2), a-0 (3), ABORT
    (4)."""
    create_topic(cluster, "kp-eos", 1)
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap, transactional_id="kp-eos")
    try:
        producer.init_transactions()
        producer.begin_transaction()
        for value in (b"c-0", b"c-1"):
            producer.send("kp-eos", value, partition=0)
        producer.commit_transaction()
        producer.begin_transaction()
        producer.send("kp-eos", b"a-0", partition=0)
        producer.flush()  # else the abort drops it unsent, and the end is 4
        producer.abort_transaction()
    finally:
        producer.close(timeout=5)
    consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap,
                             isolation_level="read_committed", enable_auto_commit=False)
    tp = KafkaTopicPartition("kp-eos", 0)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    read: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while consumer.position(tp) < 5 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                read.extend(record.value for record in records)
        assert consumer.position(tp) == 5  # read to the end, past the ABORT marker
    finally:
        consumer.close()
    assert read == [b"c-0", b"c-1"]


def initialized_on_a_new_topic(cluster: Cluster, topic: str, transactional_id: str
                               ) -> tuple[dict[str, Any], int]:
    """A one-partition topic with a full ISR and the id initialized by librdkafka (whose
    producer id and epoch a raw client then writes with): the id's coordinator state and
    the partition's leader."""
    create_topic(cluster, topic, 1)
    wait_for(lambda: len(partition_state(cluster, topic, 0)["isr"]) == BROKERS, 30,
             "a full ISR")
    Producer({"bootstrap.servers": cluster.bootstrap,
              "transactional.id": transactional_id}).init_transactions(INIT_TIMEOUT_S)
    leader = get_json(cluster.base_port + 100)["topics"][topic]["partitions"]["0"]["leader"]
    return coordinated(cluster, transactional_id), leader


def test_kip_890_a_transactional_produce_to_a_partition_outside_the_transaction_is_refused(
        cluster: Cluster) -> None:
    """transaction.partition.verification.enable (the default): the leader asks the
    coordinator first, so a batch for a partition the producer never added (a late or
    stray write that would open a transaction nobody ends) gets INVALID_TXN_STATE and is
    not appended; once AddPartitionsToTxn put the partition in, the same batch is taken."""
    state, leader = initialized_on_a_new_topic(cluster, "verify", "verify-tx")
    producer_id, epoch = state["producer_id"], state["producer_epoch"]
    batch = build_batch([b"stray"], producer_id=producer_id, producer_epoch=epoch,
                        base_sequence=0, attributes=TRANSACTIONAL_FLAG)

    def produce() -> ErrorCode:
        answer = ask(cluster, leader, produce_req.ProduceRequest(
            transactional_id="verify-tx", acks=i16(-1), timeout=datetime.timedelta(seconds=10),
            topic_data=(produce_req.TopicProduceData(name="verify", partition_data=(
                produce_req.PartitionProduceData(index=i32(0), records=batch),)),)))
        return ErrorCode(answer.responses[0].partition_responses[0].error_code)

    assert produce() == ErrorCode.invalid_txn_state
    assert partition_state(cluster, "verify", 0)["log_end_offset"] == 0
    added = ask(cluster, state["broker"], add_req.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id="verify-tx", v3_and_below_producer_id=i64(producer_id),
        v3_and_below_producer_epoch=i16(epoch), v3_and_below_topics=(
            add_req.AddPartitionsToTxnTopic(name="verify", partitions=(i32(0),)),)))
    assert added.results_by_topic_v3_and_below[0].results_by_partition[0] \
        .partition_error_code == ErrorCode.none
    assert produce() == ErrorCode.none


def test_a_transaction_left_open_is_aborted_after_its_timeout_and_its_producer_fenced(
        cluster: Cluster) -> None:
    """A librdkafka producer begins, writes and then goes quiet: after its
    transaction.timeout.ms the coordinator aborts the transaction with the epoch bumped, so
    the LSO moves past it (no hanging transaction), read_committed consumers never see its
    record, and the producer's late commit is refused."""
    create_topic(cluster, "hang", 1)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "hang-tx",
                         "transaction.timeout.ms": 2000, "message.timeout.ms": 1500})
    producer.init_transactions(INIT_TIMEOUT_S)
    epoch = coordinated(cluster, "hang-tx")["producer_epoch"]
    producer.begin_transaction()
    producer.produce("hang", b"never-committed", partition=0)
    assert producer.flush(10) == 0
    assert partition_state(cluster, "hang", 0)["last_stable_offset"] == 0  # open
    wait_for(lambda: coordinated(cluster, "hang-tx")["state"] == "CompleteAbort", 30,
             "the coordinator's abort")
    assert coordinated(cluster, "hang-tx")["producer_epoch"] == epoch + 1
    # The record (0) and the ABORT marker (1): stable, nothing left open.
    wait_for(lambda: partition_state(cluster, "hang", 0)["last_stable_offset"] == 2, 30,
             "the LSO past the abort")
    assert partition_state(cluster, "hang", 0)["ongoing_transactions"] == 0
    with pytest.raises(KafkaException):
        producer.commit_transaction(10)


def test_kip_890_offsets_committed_outside_the_transaction_are_refused(
        cluster: Cluster) -> None:
    """TxnOffsetCommit is verified too: before AddOffsetsToTxn the group's offsets
    partition is not in the transaction (INVALID_TXN_STATE, nothing written); after it,
    the same commit is taken."""
    Producer({"bootstrap.servers": cluster.bootstrap,
              "transactional.id": "offsets-tx"}).init_transactions(INIT_TIMEOUT_S)
    state = coordinated(cluster, "offsets-tx")
    producer_id, epoch = state["producer_id"], state["producer_epoch"]

    def group_coordinator() -> int | None:
        answer = ask(cluster, 1, find_req.FindCoordinatorRequest(
            key_type=i8(0), coordinator_keys=("offsets-group",)))
        (found,) = answer.coordinators
        return found.node_id if found.error_code == ErrorCode.none else None

    wait_for(lambda: group_coordinator() is not None, 30, "the group's coordinator")
    group_broker = group_coordinator()
    assert group_broker is not None

    def commit_offsets() -> ErrorCode:
        answer = ask(cluster, group_broker, txn_commit_req.TxnOffsetCommitRequest(
            transactional_id="offsets-tx", group_id="offsets-group",
            producer_id=i64(producer_id), producer_epoch=i16(epoch),
            generation_id=i32(-1), member_id="", group_instance_id=None,
            topics=(txn_commit_req.TxnOffsetCommitRequestTopic(name="verify", partitions=(
                txn_commit_req.TxnOffsetCommitRequestPartition(
                    partition_index=i32(0), committed_offset=i64(1),
                    committed_leader_epoch=i32(-1), committed_metadata=""),)),)))
        return ErrorCode(answer.topics[0].partitions[0].error_code)

    create_topic(cluster, "verify")
    assert commit_offsets() == ErrorCode.invalid_txn_state
    added = ask(cluster, state["broker"], add_offsets_req.AddOffsetsToTxnRequest(
        transactional_id="offsets-tx", producer_id=i64(producer_id),
        producer_epoch=i16(epoch), group_id="offsets-group"))
    assert added.error_code == ErrorCode.none
    assert commit_offsets() == ErrorCode.none


def test_transaction_version_2_bumps_the_epoch_per_transaction_and_fences_a_late_batch(
        cluster: Cluster) -> None:
    """A client on transaction version 2 (KIP-890 part 2), over the wire as the Java 4.x
    client speaks it: ApiVersions shows the feature finalized; Produce v12 adds its
    partition without AddPartitionsToTxn; EndTxn v5 answers the next epoch. A batch of the
    committed transaction that arrives late, after its marker, is refused
    (INVALID_PRODUCER_EPOCH) where version 1 would put it in the next transaction; a
    read_committed consumer gets the committed transaction only."""
    state, leader = initialized_on_a_new_topic(cluster, "tv2", "tv2-tx")
    versions = ask(cluster, 1, versions_req.ApiVersionsRequest(
        client_software_name="undertow-test", client_software_version="1"))
    assert [(f.name, f.min_version_level, f.max_version_level)
            for f in versions.finalized_features] == [("transaction.version", 2, 2)]
    assert [(f.name, f.min_version, f.max_version) for f in versions.supported_features] \
        == [("transaction.version", 0, 2)]
    assert versions.finalized_features_epoch >= 0
    producer_id, epoch = state["producer_id"], state["producer_epoch"]

    def produce(value: bytes, producer_epoch: int, sequence: int) -> ErrorCode:
        answer = ask(cluster, leader, produce_v12.ProduceRequest(
            transactional_id="tv2-tx", acks=i16(-1), timeout=datetime.timedelta(seconds=10),
            topic_data=(produce_v12.TopicProduceData(name="tv2", partition_data=(
                produce_v12.PartitionProduceData(index=i32(0), records=build_batch(
                    [value], producer_id=producer_id, producer_epoch=producer_epoch,
                    base_sequence=sequence, attributes=TRANSACTIONAL_FLAG)),)),)))
        return ErrorCode(answer.responses[0].partition_responses[0].error_code)

    def end(producer_epoch: int, commit: bool) -> tuple[ErrorCode, int, int]:
        answer = ask(cluster, state["broker"], end_v5.EndTxnRequest(
            transactional_id="tv2-tx", producer_id=i64(producer_id),
            producer_epoch=i16(producer_epoch), committed=commit))
        return ErrorCode(answer.error_code), answer.producer_id, answer.producer_epoch

    assert produce(b"t1-0", epoch, 0) == ErrorCode.none  # added by the leader's request
    assert coordinated(cluster, "tv2-tx")["partitions"] == ["tv2-0"]
    assert end(epoch, commit=True) == (ErrorCode.none, producer_id, epoch + 1)
    wait_for(lambda: partition_state(cluster, "tv2", 0)["last_stable_offset"] == 2, 30,
             "the commit marker below the high watermark")
    assert produce(b"t1-late", epoch, 1) == ErrorCode.invalid_producer_epoch
    assert produce(b"t2-0", epoch + 1, 0) == ErrorCode.none
    assert end(epoch + 1, commit=False) == (ErrorCode.none, producer_id, epoch + 2)
    wait_for(lambda: partition_state(cluster, "tv2", 0)["last_stable_offset"] == 4, 30,
             "the abort marker below the high watermark")

    def read(isolation: str) -> list[bytes]:
        consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": isolation,
                             "isolation.level": isolation, "enable.auto.commit": False})
        consumer.assign([TopicPartition("tv2", 0, 0)])
        values: list[bytes] = []
        deadline = time.monotonic() + 30
        try:
            while consumer.position([TopicPartition("tv2", 0)])[0].offset < 4:
                assert time.monotonic() < deadline, (isolation, values)
                message = consumer.poll(0.5)
                if message is not None and message.error() is None:
                    values.append(message.value())
        finally:
            consumer.close()
        return values

    assert read("read_committed") == [b"t1-0"]
    assert read("read_uncommitted") == [b"t1-0", b"t2-0"]
