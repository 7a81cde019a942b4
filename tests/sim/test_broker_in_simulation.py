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
from minibroker.environment import Environment, entered
from minibroker.network.client import KafkaConnection
from minibroker.storage.records import build_batch
from minibroker.tools import create_topic, describe_partitions
from undertow.sim.virtual_loop import VirtualTimeLoop, run_simulation
from undertow.sim.virtual_streams import VirtualNetwork

SECRET = b"simulated-cluster-secret-32-byte"
EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z: the simulation's time 0
CONFIG = {"min.insync.replicas": "2", "broker.session.timeout.ms": "3000",
          "replica.lag.time.max.ms": "6000"}


async def until(condition, timeout_s: float, what: str):
    """Poll ``condition`` (a coroutine function) on the virtual clock; a poll that takes
    over a second (a paused broker answers nothing) counts as not yet."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            async with asyncio.timeout(1.0):
                if found := await condition():
                    return found
        except (TimeoutError, OSError):
            pass
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not within {timeout_s} s (virtual): {what}")
        await asyncio.sleep(0.1)


class SimulatedCluster:
    """The real controller and brokers as nodes of the virtual loop, each in its own
    environment (host, network, clock), killed, paused and restarted as processes are."""

    def __init__(self, loop: VirtualTimeLoop, tmp: Path) -> None:
        self.loop, self.tmp = loop, tmp
        self.net = VirtualNetwork(loop, latency_s=0.001)
        self.nodes: dict[str, Environment] = {}
        self.brokers: dict[int, BrokerServer] = {}

    def environment(self, host: str) -> Environment:
        return self.net.environment(host, wall_clock=lambda: EPOCH + self.loop.time())

    async def run_on(self, host: str, coroutine):
        """Start ``host``'s new incarnation (a node of the loop) with ``coroutine``."""
        node = self.nodes[host] = self.environment(host)
        self.loop.add_node(node)
        with entered(node):
            return await self.loop.create_task(coroutine)

    async def start(self) -> None:
        await self.run_on("controller", self._controller())
        for broker_id in (1, 2, 3):
            await self.start_broker(broker_id)

    async def _controller(self) -> ControllerServer:
        server = ControllerServer(self.tmp / "controller", CONFIG, SECRET)
        await server.start("0.0.0.0", 9093, None)
        return server

    async def start_broker(self, broker_id: int) -> None:
        async def start() -> BrokerServer:
            broker = BrokerServer(BrokerOptions(
                broker_id=broker_id, listen=("0.0.0.0", 9092),
                advertised=(f"broker-{broker_id}", 9092), controller=("controller", 9093),
                data_dir=self.tmp / f"broker-{broker_id}", config=CONFIG,
                controller_secret=SECRET))
            await broker.start()
            return broker

        self.brokers[broker_id] = await self.run_on(f"broker-{broker_id}", start())

    def kill(self, broker_id: int) -> None:
        host = f"broker-{broker_id}"
        self.loop.kill(self.nodes[host])
        self.net.reset_host(host)


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
    cluster = SimulatedCluster(loop, tmp)
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
        cluster.loop.pause(cluster.nodes[f"broker-{paused}"])
        paused_at = loop.time()
        moved = await until(lambda: _led_by_other(bootstrap_without(paused), paused), 30,
                            "a new leader while the old one is paused")
        seen["paused"], seen["moved_after_s"] = paused, loop.time() - paused_at
        cluster.loop.resume(cluster.nodes[f"broker-{paused}"])
        await until(lambda: _full_isr(bootstrap_without(paused)), 60,
                    "the resumed broker back in the ISR")
        killed = moved.leader
        cluster.kill(killed)
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
