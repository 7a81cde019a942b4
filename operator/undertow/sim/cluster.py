"""The simulated cluster: minibroker's own controller and brokers as nodes of one
virtual-time loop (``virtual_loop.py``) over the in-memory network (``virtual_streams.py``).

Each node runs the production classes (``ControllerServer``, ``BrokerServer``: the Kafka
listener and API handlers, the fetcher with its KIP-227 fetch sessions, the lifecycle
manager's registration and heartbeats) in an environment of its own
(``minibroker.environment``: its host on the network, the virtual wall clock, its event
queue on the loop). Faults act as they do on processes: a pause holds the node's callbacks
(SIGSTOP), a kill drops them and resets its connections (SIGKILL), a restart is a new
incarnation on the same data directory; a partition blocks links. The logs are real files.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar

from minibroker.broker import BrokerOptions, BrokerServer
from minibroker.controller.server import ControllerServer
from minibroker.environment import Environment, NodeHalted, entered
from undertow.sim.virtual_loop import SimulationTimeout, VirtualTimeLoop
from undertow.sim.virtual_streams import VirtualNetwork

T = TypeVar("T")

SECRET = b"simulated-cluster-secret-32-byte"
"""The controller channel's shared secret (``rpc_auth``): every node of the simulation
knows it, as every pod of a run mounts the run's."""
EPOCH = 1_767_225_600.0
"""The virtual wall clock at the loop's time 0 (2026-01-01T00:00:00Z): record timestamps."""
CONTROLLER = "controller"
CONTROLLER_PORT = 9093
KAFKA_PORT = 9092


def broker_host(broker_id: int) -> str:
    return f"broker-{broker_id}"


class SimulatedCluster:
    """The real controller and brokers as nodes of the virtual loop, each in its own
    environment (host, network, clock), killed, paused and restarted as processes are."""

    def __init__(self, loop: VirtualTimeLoop, workdir: Path, config: Mapping[str, str],
                 broker_ids: tuple[int, ...] = (1, 2, 3), latency_s: float = 0.001,
                 seed: int = 0) -> None:
        self.loop, self.workdir, self.config = loop, workdir, dict(config)
        self.broker_ids, self.seed = broker_ids, seed
        self._incarnations: dict[str, int] = {}
        self.net = VirtualNetwork(loop, latency_s=latency_s)
        self.nodes: dict[str, Environment] = {}
        self.brokers: dict[int, BrokerServer] = {}
        self.controller: ControllerServer | None = None
        self.halted: dict[str, int] = {}
        """The exit status of each host whose node halted itself (its last incarnation)."""

    @property
    def bootstrap(self) -> list[tuple[str, int]]:
        return [(broker_host(b), KAFKA_PORT) for b in self.broker_ids]

    def environment(self, host: str) -> Environment:
        """A new incarnation of ``host``: its random source is seeded with the cluster's
        seed, the host and the incarnation's number (a string seed is hashed with SHA-512,
        the same under every PYTHONHASHSEED)."""
        incarnation = self._incarnations[host] = self._incarnations.get(host, 0) + 1
        node: Environment | None = None

        def halt(status: int) -> None:  # Kafka's Exit.halt: the process is gone
            assert node is not None
            self.halted[host] = status
            if self.nodes.get(host) is node:
                self.kill(host)
            raise NodeHalted(status)

        node = dataclasses.replace(
            self.net.environment(host, wall_clock=lambda: EPOCH + self.loop.time(),
                                 rng=random.Random(f"{self.seed}/{host}/{incarnation}")),
            halt=halt)
        return node

    async def run_on(self, host: str, coroutine: Coroutine[Any, Any, T]) -> T:
        """Start ``host``'s new incarnation (a node of the loop) with ``coroutine``."""
        node = self.nodes[host] = self.environment(host)
        self.loop.add_node(node)
        with entered(node):
            return await self.loop.create_task(coroutine)

    async def start(self) -> None:
        await self.start_controller()
        for broker_id in self.broker_ids:
            await self.start_broker(broker_id)

    async def start_controller(self) -> None:
        """A new incarnation of the controller on its data directory."""
        async def start() -> ControllerServer:
            server = ControllerServer(self.workdir / CONTROLLER, self.config, SECRET)
            await server.start("0.0.0.0", CONTROLLER_PORT, None)
            return server

        self.controller = await self.run_on(CONTROLLER, start())

    def incarnation(self, host: str) -> int:
        """How many times ``host`` has started."""
        return self._incarnations.get(host, 0)

    async def start_broker(self, broker_id: int) -> None:
        """A new incarnation of the broker on its data directory (first start or restart)."""
        async def start() -> BrokerServer:
            broker = BrokerServer(BrokerOptions(
                broker_id=broker_id, listen=("0.0.0.0", KAFKA_PORT),
                advertised=(broker_host(broker_id), KAFKA_PORT),
                controller=(CONTROLLER, CONTROLLER_PORT),
                data_dir=self.workdir / broker_host(broker_id), config=self.config,
                controller_secret=SECRET))
            await broker.start()
            return broker

        self.brokers[broker_id] = await self.run_on(broker_host(broker_id), start())

    def kill(self, host: str) -> None:
        """SIGKILL: nothing of the node runs again, its connections reset, its files
        closed."""
        self.loop.kill(self.nodes[host])
        self.net.reset_host(host)
        for broker_id, broker in self.brokers.items():
            if broker_host(broker_id) == host:
                self._close_files(broker)

    def close_files(self) -> None:
        """The end of the run: every broker's files closed, as the end of its process
        closes them (a worker of ``undertow explore`` runs thousands of clusters)."""
        for broker in self.brokers.values():
            self._close_files(broker)

    @staticmethod
    def _close_files(broker: BrokerServer) -> None:
        """What the kernel does for a process that ends: its log segments' descriptors
        closed, nothing flushed (``LogManager.close``). The segments are raw descriptors
        (``os.open``), which no garbage collection closes: without this, each simulated
        broker left its own open for the life of the worker."""
        broker.replica_manager.log_manager.close()

    def power_loss(self, broker_id: int) -> None:
        """The broker's power-loss failpoint: what it did not fsync is gone, and so is it."""
        host = broker_host(broker_id)
        with entered(self.nodes[host]), contextlib.suppress(NodeHalted):
            self.brokers[broker_id].power_loss()

    def pause(self, host: str) -> None:
        self.loop.pause(self.nodes[host])

    def resume(self, host: str) -> None:
        self.loop.resume(self.nodes[host])


async def until(condition: Callable[[], Awaitable[T | None]], timeout_s: float,
                what: str) -> T:
    """What ``condition`` (a coroutine function) returns once it is truthy, polled every
    100 ms of the loop's clock; a poll that takes over a second (a paused broker answers
    nothing) or fails on the network counts as not yet. ``SimulationTimeout`` after
    ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            async with asyncio.timeout(1.0):
                if found := await condition():
                    return found
        except (TimeoutError, OSError):
            pass
        if loop.time() > deadline:
            raise SimulationTimeout(f"not within {timeout_s:g} s (virtual): {what}")
        await asyncio.sleep(0.1)
