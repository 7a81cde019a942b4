"""Stock transactional producers against a real 3-broker minibroker cluster: confluent-kafka
(librdkafka 2.x) and kafka-python find the transaction coordinator (the first
FindCoordinator creates ``__transaction_state``) and initialize; each new instance of one
transactional id gets the same producer id and the next epoch, which the coordinator
keeps in ``/v1/state`` and ListTransactions lists, and which fences the instances before
it (an InitProducerId naming an older epoch gets PRODUCER_FENCED); kafka-python's admin
client lists and describes the ids."""

from __future__ import annotations

import asyncio
import datetime
import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer
from kafka import KafkaAdminClient, KafkaProducer
from kio.schema.init_producer_id.v4 import request as init_req
from kio.schema.list_transactions.v1 import request as list_req
from kio.static.primitive import i16, i64
from test_interop_clients import BROKERS, Cluster, running_cluster

from minibroker.cluster.types import ErrorCode
from minibroker.network.client import KafkaConnection

INIT_TIMEOUT_S = 60  # the first init waits for __transaction_state to be created and led


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("txn")) as (cluster, _process):
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
