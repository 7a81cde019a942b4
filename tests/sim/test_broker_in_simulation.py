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

from minibroker.broker import BrokerOptions, BrokerServer
from minibroker.cluster.types import ErrorCode
from minibroker.controller.server import ControllerServer
from minibroker.environment import entered
from minibroker.network.client import KafkaConnection
from minibroker.storage.records import build_batch
from minibroker.tools import create_topic, describe_partitions
from undertow.sim.virtual_loop import VirtualTimeLoop
from undertow.sim.virtual_streams import VirtualNetwork

SECRET = b"simulated-cluster-secret-32-byte"
EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z: the simulation's time 0
CONFIG = {"min.insync.replicas": "2", "broker.session.timeout.ms": "3000",
          "replica.lag.time.max.ms": "6000"}


async def until(condition, timeout_s: float, what: str):
    """Poll ``condition`` (a coroutine function) on the virtual clock."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not (found := await condition()):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not within {timeout_s} s (virtual): {what}")
        await asyncio.sleep(0.1)
    return found


async def scenario(tmp: Path) -> dict:
    loop = asyncio.get_running_loop()
    net = VirtualNetwork(loop, latency_s=0.001)

    def env(host: str):
        return entered(net.environment(host, wall_clock=lambda: EPOCH + loop.time()))

    async def start_controller() -> ControllerServer:
        server = ControllerServer(tmp / "controller", CONFIG, SECRET)
        await server.start("0.0.0.0", 9093, None)
        return server

    async def start_broker(broker_id: int) -> BrokerServer:
        broker = BrokerServer(BrokerOptions(
            broker_id=broker_id, listen=("0.0.0.0", 9092), advertised=(f"broker-{broker_id}", 9092),
            controller=("controller", 9093), data_dir=tmp / f"broker-{broker_id}",
            config=CONFIG, controller_secret=SECRET))
        await broker.start()
        return broker

    with env("controller"):
        controller = await loop.create_task(start_controller())
    brokers = {}
    for broker_id in (1, 2, 3):
        with env(f"broker-{broker_id}"):
            brokers[broker_id] = await loop.create_task(start_broker(broker_id))

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

    with env("client"):
        result = await loop.create_task(client_work())
    for broker_id, broker in brokers.items():
        with env(f"broker-{broker_id}"):
            await loop.create_task(broker.stop())
    await controller.stop()
    return result


def test_a_topic_is_created_replicated_and_written_through_the_broker_s_own_handlers(
        tmp_path: Path) -> None:
    started = time.monotonic()
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        result = runner.run(scenario(tmp_path))
    wall = time.monotonic() - started
    assert result["base_offset"] == 0
    assert sorted(result["before"].isr) == [1, 2, 3]
    assert result["after"].high_watermark == 3
    # acks=all waited for both followers' next fetch: a round trip or two on the virtual
    # network, not a real second.
    assert 0 < result["acked_after_s"] < 1.0, result
    assert wall < 60, wall
