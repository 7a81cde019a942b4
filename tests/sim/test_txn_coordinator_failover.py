"""The transaction coordinator in simulation, on three real brokers: InitProducerId for a
transactional id bumps its producer epoch, the epoch is in ``__transaction_state`` before
the producer hears it, and when the coordinator's broker is killed the leader elected for
that partition loads the state from its replica and continues from it: same producer id,
the next epoch, and the instances fenced before stay fenced (Kafka 4.2's
``TransactionCoordinator.handleInitProducerId`` and ``TransactionStateManager`` loading)."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from kio.schema.find_coordinator.v4 import request as find_req
from kio.schema.init_producer_id.v4 import request as init_req
from kio.static.primitive import i8, i16, i64

from minibroker.cluster.types import ErrorCode
from minibroker.environment import entered
from minibroker.network.client import KafkaConnection
from undertow.sim.cluster import SimulatedCluster, broker_host, until
from undertow.sim.virtual_loop import run_simulation

CONFIG = {"min.insync.replicas": "2", "broker.session.timeout.ms": "3000",
          "replica.lag.time.max.ms": "6000"}
TXN_ID = "orders-writer"


async def ask(broker_id: int, request: Any) -> Any:
    conn = await KafkaConnection.connect(broker_host(broker_id), 9092, client_id="txn-test")
    try:
        return await conn.request(request, timeout=5)
    finally:
        conn.close()


def init(expected: tuple[int, int] | None = None) -> init_req.InitProducerIdRequest:
    producer_id, epoch = expected or (-1, -1)
    return init_req.InitProducerIdRequest(
        transactional_id=TXN_ID, transaction_timeout=datetime.timedelta(seconds=60),
        producer_id=i64(producer_id), producer_epoch=i16(epoch))


async def coordinator(asked: int, not_: int | None = None) -> int | None:
    response = await ask(asked, find_req.FindCoordinatorRequest(
        key_type=i8(1), coordinator_keys=(TXN_ID,)))
    (found,) = response.coordinators
    ok = found.error_code == ErrorCode.none and found.node_id != not_
    return found.node_id if ok else None


async def initialized(broker_id: int, expected: tuple[int, int] | None = None
                      ) -> tuple[int, int] | None:
    """(producer id, epoch) once the coordinator answers without a retriable error."""
    answer = await ask(broker_id, init(expected))
    if answer.error_code in (ErrorCode.coordinator_load_in_progress,
                             ErrorCode.coordinator_not_available, ErrorCode.not_coordinator):
        return None
    assert answer.error_code == ErrorCode.none, answer
    return answer.producer_id, answer.producer_epoch


async def on_cluster(tmp: Path, client: Callable[[SimulatedCluster, dict[str, Any]],
                                                  Awaitable[None]]) -> dict[str, Any]:
    """Start a simulated cluster, run ``client`` as a client host, return what it saw."""
    loop = asyncio.get_running_loop()
    cluster = SimulatedCluster(loop, tmp, CONFIG)
    await cluster.start()
    seen: dict[str, Any] = {}
    with entered(cluster.environment("client")):
        await loop.create_task(client(cluster, seen))
    return seen


async def scenario(cluster: SimulatedCluster, seen: dict[str, Any]) -> None:
    # The first FindCoordinator asks the controller for __transaction_state.
    first = await until(lambda: coordinator(1), 60, "a transaction coordinator")
    seen["first"] = await until(lambda: initialized(first), 30, "the first init")
    seen["second"] = await until(lambda: initialized(first), 30, "the second init")
    cluster.kill(broker_host(first))
    other = next(b for b in (1, 2, 3) if b != first)
    moved = await until(lambda: coordinator(other, not_=first), 60,
                        "a new coordinator after the kill")
    seen["third"] = await until(lambda: initialized(moved), 30, "an init on the new one")
    stale = await ask(moved, init(seen["first"]))
    seen["stale"] = stale.error_code
    seen["coordinators"] = (first, moved)


def test_a_new_coordinator_continues_the_producer_epoch_from_the_log(tmp_path: Path) -> None:
    seen = run_simulation(on_cluster(tmp_path, scenario))
    producer_id, epoch = seen["first"]
    assert epoch == 0
    assert seen["second"] == (producer_id, 1)
    first, moved = seen["coordinators"]
    assert moved != first
    # Loaded from the replica of __transaction_state: not a new id, not epoch 0 again.
    assert seen["third"] == (producer_id, 2)
    assert seen["stale"] == ErrorCode.producer_fenced
