"""The broker's own code in simulation: the real controller (``ControllerServer``), three real
brokers (``BrokerServer``: the Kafka listener and request handlers, the fetcher with its
fetch sessions, the lifecycle manager's registration and heartbeats) on one virtual-time
loop and the in-memory network, driven through the Kafka protocol by minibroker's own client.

Only the clock, the network and the lifecycle manager's thread are swapped
(``minibroker.environment``); the logs are real files."""

from __future__ import annotations

import asyncio
import datetime
import time
from pathlib import Path

from kio.schema.produce.v9 import request as produce_req
from kio.static.primitive import i16, i32

from minibroker.cluster.log_dir_failure import LOG_DIR_FAILURE_EXIT_CODE
from minibroker.cluster.types import ErrorCode
from minibroker.environment import entered
from minibroker.failpoints import POWER_LOSS_EXIT_CODE
from minibroker.network.client import KafkaConnection
from minibroker.storage.records import build_batch
from minibroker.tools import create_topic, describe_partitions
from undertow.sim.cluster import CONTROLLER, SimulatedCluster, broker_host, until
from undertow.sim.virtual_loop import run_simulation

CONFIG = {"min.insync.replicas": "2", "broker.session.timeout.ms": "3000",
          "replica.lag.time.max.ms": "6000"}


async def scenario(tmp: Path) -> dict:
    loop = asyncio.get_running_loop()
    cluster = SimulatedCluster(loop, tmp, CONFIG)
    await cluster.start()

    async def client_work() -> dict:
        bootstrap = ("broker-1", 9092)
        async def created():  # once the three brokers registered and were unfenced
            return await create_topic(bootstrap, "t", 1, 3, {}) == 0

        await until(created, 30, "the topic to be created")

        async def full_isr():
            (p,) = await describe_partitions(bootstrap, "t")
            return p if len(p.isr) == 3 else None

        before = await until(full_isr, 30, "the ISR to hold all three replicas")
        leader = before.leader
        conn = await KafkaConnection.connect(f"broker-{leader}", 9092, client_id="sim-test")
        sent_at = loop.time()
        response = await conn.request(produce_req.ProduceRequest(
            transactional_id=None, acks=i16(-1), timeout=datetime.timedelta(seconds=10),
            topic_data=(produce_req.TopicProduceData(name="t", partition_data=(
                produce_req.PartitionProduceData(
                    index=i32(0), records=build_batch([b"a", b"b", b"c"])),)),)), timeout=15)
        acked_after = loop.time() - sent_at
        conn.close()
        (answer,) = response.responses[0].partition_responses
        assert answer.error_code == ErrorCode.none, answer

        async def replicated():
            (p,) = await describe_partitions(bootstrap, "t")
            return p if p.high_watermark == 3 else None

        after = await until(replicated, 30, "the high watermark to reach 3")
        return {"before": before, "after": after, "base_offset": answer.base_offset,
                "acked_after_s": acked_after, "at": loop.time()}

    with entered(cluster.environment("client")):
        result = await loop.create_task(client_work())
    for broker_id, broker in cluster.brokers.items():
        with entered(cluster.nodes[broker_host(broker_id)]):
            await loop.create_task(broker.stop())
    with entered(cluster.nodes[CONTROLLER]):
        assert cluster.controller is not None
        await loop.create_task(cluster.controller.stop())
    return result


def test_a_topic_is_created_replicated_and_written_through_the_broker_s_own_handlers(
        tmp_path: Path) -> None:
    started = time.monotonic()
    result = run_simulation(scenario(tmp_path))
    wall = time.monotonic() - started
    assert result["base_offset"] == 0
    assert sorted(result["before"].isr) == [1, 2, 3]
    assert result["after"].high_watermark == 3
    # acks=all waited for both followers' next fetch: a round trip or two on the virtual
    # network, not a real second.
    assert 0 < result["acked_after_s"] < 1.0, result
    assert wall < 60, wall


async def partition(bootstrap: tuple[str, int]):
    (p,) = await describe_partitions(bootstrap, "t")
    return p


async def fault_scenario(tmp: Path) -> dict:
    """Pause the leader past the session timeout, resume it; kill the next leader and
    restart it on its logs: each time the controller moves leadership and the ISR heals."""
    loop = asyncio.get_running_loop()
    cluster = SimulatedCluster(loop, tmp, CONFIG)
    await cluster.start()
    seen: dict = {}

    async def client() -> None:
        async def created():
            return await create_topic(("broker-1", 9092), "t", 1, 3, {}) == 0

        await until(created, 30, "the topic to be created")

        def bootstrap_without(broker_id: int) -> tuple[str, int]:
            return (f"broker-{next(b for b in (1, 2, 3) if b != broker_id)}", 9092)

        first = await until(lambda: _full_isr(("broker-1", 9092)), 30, "a full ISR")
        paused = first.leader
        cluster.pause(broker_host(paused))
        paused_at = loop.time()
        moved = await until(lambda: _led_by_other(bootstrap_without(paused), paused), 30,
                            "a new leader while the old one is paused")
        seen["paused"], seen["moved_after_s"] = paused, loop.time() - paused_at
        cluster.resume(broker_host(paused))
        await until(lambda: _full_isr(bootstrap_without(paused)), 60,
                    "the resumed broker back in the ISR")
        killed = moved.leader
        cluster.kill(broker_host(killed))
        after_kill = await until(lambda: _led_by_other(bootstrap_without(killed), killed), 30,
                                 "a new leader after the kill")
        seen["killed"], seen["after_kill"] = killed, after_kill
        await cluster.start_broker(killed)
        seen["healed"] = await until(lambda: _full_isr(bootstrap_without(killed)), 60,
                                     "the restarted broker back in the ISR")

    with entered(cluster.environment("client")):
        await loop.create_task(client())
    return seen


async def _full_isr(bootstrap: tuple[str, int]):
    p = await partition(bootstrap)
    return p if len(p.isr) == 3 else None


async def _led_by_other(bootstrap: tuple[str, int], broker_id: int):
    p = await partition(bootstrap)
    return p if p.leader not in (broker_id, -1) else None


def test_a_paused_and_a_killed_leader_are_replaced_and_rejoin_the_isr(tmp_path: Path) -> None:
    seen = run_simulation(fault_scenario(tmp_path))
    # Fenced once its heartbeats stopped for broker.session.timeout.ms (3 s), not before.
    assert 3.0 <= seen["moved_after_s"] < 6.0, seen
    assert seen["after_kill"].leader not in (seen["killed"], -1)
    # The restarted broker came back as a follower of the leader elected at its kill.
    assert sorted(seen["healed"].isr) == [1, 2, 3]
    assert (seen["healed"].leader, seen["healed"].leader_epoch) == (
        seen["after_kill"].leader, seen["after_kill"].leader_epoch)


def test_a_simulated_run_is_the_same_every_time(tmp_path: Path) -> None:
    """The real brokers' scheduling, on the virtual clock, repeats exactly."""
    runs = [run_simulation(fault_scenario(tmp_path / str(i))) for i in range(2)]
    assert runs[0] == runs[1]


async def produce(address: tuple[str, int], values: list[bytes]) -> ErrorCode:
    conn = await KafkaConnection.connect(*address, client_id="sim-test")
    try:
        response = await conn.request(produce_req.ProduceRequest(
            transactional_id=None, acks=i16(1), timeout=datetime.timedelta(seconds=5),
            topic_data=(produce_req.TopicProduceData(name="t", partition_data=(
                produce_req.PartitionProduceData(
                    index=i32(0), records=build_batch(values)),)),)), timeout=10)
    finally:
        conn.close()
    return response.responses[0].partition_responses[0].error_code


async def disk_scenario(tmp: Path) -> dict:
    """A full disk under the leader, then a power loss of the next one: each halts itself
    through ``Environment.halt`` (a dead node here, ``os._exit`` in a process), the
    controller moves leadership, and each restarts on what its disk kept."""
    loop = asyncio.get_running_loop()
    cluster = SimulatedCluster(loop, tmp, CONFIG)
    await cluster.start()
    seen: dict = {}

    async def client() -> None:
        await until(lambda: _created(("broker-1", 9092)), 30, "the topic to be created")
        first = await until(lambda: _full_isr(("broker-1", 9092)), 30, "a full ISR")
        full = first.leader
        cluster.brokers[full].disk_full.fill(60_000)
        seen["full_answer"] = await produce((broker_host(full), 9092), [b"a"])
        other = ("broker-" + str(next(b for b in (1, 2, 3) if b != full)), 9092)
        moved = await until(lambda: _led_by_other(other, full), 30, "a leader after the halt")
        seen["full"], seen["full_status"] = full, cluster.halted.get(broker_host(full))
        await cluster.start_broker(full)
        await until(lambda: _full_isr(other), 60, "the restarted broker back in the ISR")
        lost = moved.leader
        cluster.power_loss(lost)
        seen["lost_status"] = cluster.halted.get(broker_host(lost))
        await cluster.start_broker(lost)
        seen["healed"] = await until(lambda: _full_isr((broker_host(full), 9092)), 60,
                                     "the broker back after its power loss")

    with entered(cluster.environment("client")):
        await loop.create_task(client())
    return seen


async def _created(bootstrap: tuple[str, int]) -> bool:
    return await create_topic(bootstrap, "t", 1, 3, {}) == 0


def test_a_full_disk_and_a_power_loss_halt_the_broker_as_its_process_would(
        tmp_path: Path) -> None:
    seen = run_simulation(disk_scenario(tmp_path))
    assert seen["full_answer"] == ErrorCode.kafka_storage_error, seen
    assert seen["full_status"] == LOG_DIR_FAILURE_EXIT_CODE
    assert seen["lost_status"] == POWER_LOSS_EXIT_CODE
    assert sorted(seen["healed"].isr) == [1, 2, 3]
