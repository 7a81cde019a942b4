"""`undertow.runner.world.World` over `SimulatedPlatform`: `run_experiment`'s phases with
minibroker's own servers (listener, API handlers, fetcher with its fetch sessions,
controller) on one virtual-time loop (`sim.virtual_loop`).

The run is the one every platform runs; what is this world's is below the interface: time
is the loop's (a wait runs the loop until its condition holds, `VirtualTimeLoop.wait_until`);
the nemesis, the sampler and the event collector are callbacks on the loop's timers; the
workload is the client models (`sim.workload`), each client a host of the virtual network
with connections of its own that speak the Kafka protocol to the brokers
(`sim.kafka_endpoint.KafkaEndpoint`), as each stock client is a process of its own; the
topic is created with a CreateTopics request, as an admin client creates it; the events
are read from each node's events log, as the real collector reads `/v1/events`.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from typing import Any

from minibroker.environment import context_of
from minibroker.tools import request_topic
from undertow.platform.base import client_endpoint
from undertow.platform.errors import PlatformError
from undertow.platform.simulated import SimulatedPlatform
from undertow.runner.abort import Abort
from undertow.runner.events import EventCollector
from undertow.runner.history import HistoryWriter
from undertow.runner.scheduler import Scheduler
from undertow.runner.workload import WorkloadConfig
from undertow.runner.world import READY_TIMEOUT_S, Collector, topic_names
from undertow.sim.cluster import EPOCH
from undertow.sim.kafka_endpoint import KafkaEndpoint
from undertow.sim.virtual_loop import SimulationTimeout, VirtualTimeLoop
from undertow.sim.workload import SimWorkload, drain, holds
from undertow.spec import LoadedExperiment
from undertow.spec.experiment import TopicSpec

CLIENT_HOST = "client"
"""The clients' host on the virtual network (a consumer a partition may isolate has its own,
`client_endpoint`)."""
RETRY_S = 0.5


class VirtualScheduler:
    """`runner.scheduler.Scheduler` on a `VirtualTimeLoop`: callbacks on its timers, in no
    node's context (as the runner's threads are no broker's)."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._loop = loop
        self._timers: list[Any] = []
        self._closed = False

    def monotonic(self) -> float:
        return self._loop.time()

    def call_later(self, delay_s: float, callback: Callable[[], None], name: str) -> None:
        del name
        if not self._closed:
            self._timers = [t for t in self._timers if not t.cancelled()]
            self._timers.append(self._loop.call_later(max(delay_s, 0.0), callback,
                                                      context=contextvars.Context()))

    def shutdown(self, timeout_s: float) -> None:
        del timeout_s  # nothing runs beside the caller
        self._closed = True
        for timer in self._timers:
            timer.cancel()


class SimulatedWorld:
    def __init__(self, platform: SimulatedPlatform) -> None:
        self._platform = platform
        self._loop = platform.loop
        self._contexts: dict[str, contextvars.Context] = {}
        self._endpoints: dict[tuple[str, str], KafkaEndpoint] = {}
        self._topic = ""

    def now(self) -> float:
        return EPOCH + self._loop.time()

    def monotonic(self) -> float:
        return self._loop.time()

    def scheduler(self) -> Scheduler:
        return VirtualScheduler(self._loop)

    def sleep(self, seconds: float, abort: Abort) -> bool:
        until = self._loop.time() + seconds
        self._loop.wait_until(lambda: abort.is_set() or self._loop.time() >= until,
                              seconds + 1.0, f"{seconds:g} s to pass")
        return abort.is_set()

    def until(self, condition: Callable[[], bool], timeout_s: float, what: str,
              abort: Abort) -> None:
        try:
            self._loop.wait_until(lambda: abort.is_set() or holds(condition), timeout_s, what)
        except SimulationTimeout:
            raise PlatformError(f"timed out after {timeout_s:g}s (virtual) waiting for "
                                f"{what}") from None
        abort.raise_if_set()

    def settle(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        try:
            self._loop.wait_until(lambda: holds(condition), timeout_s, "a settle")
        except SimulationTimeout:
            return False
        return True

    def create_topic(self, loaded: LoadedExperiment, abort: Abort) -> None:
        """The experiment's topic, and a pipeline's output topic made the same way."""
        topic = loaded.experiment.spec.topic
        for name in reversed(topic_names(loaded)):  # the experiment's last: `_topic`
            self.create(topic.model_copy(update={"name": name}), abort)

    def create(self, topic: TopicSpec, abort: Abort) -> None:
        """With a CreateTopics request to a broker, retried until one creates it."""
        self._topic = topic.name
        bootstrap = self._platform.cluster.bootstrap

        async def create() -> None:
            failure = "no attempt"
            for attempt in range(int(READY_TIMEOUT_S / RETRY_S)):
                failure = await request_topic(bootstrap[attempt % len(bootstrap)], topic.name,
                                              topic.partitions, topic.replication_factor,
                                              topic.config.as_overrides()) or ""
                if not failure or failure.startswith("TOPIC_ALREADY_EXISTS"):
                    return
                await asyncio.sleep(RETRY_S)
            raise PlatformError(f"topic {topic.name} not created: {failure}")

        task = self._loop.create_task(create(), context=self._context(CLIENT_HOST))
        self.until(task.done, READY_TIMEOUT_S + 1.0, f"topic {topic.name} to be created",
                   abort)
        task.result()

    def workload(self, cfg: WorkloadConfig, history: HistoryWriter,
                 abort: Abort) -> SimWorkload:
        del abort
        self._topic = cfg.topic
        return SimWorkload(self, cfg, history)

    def drain(self, cfg: WorkloadConfig, history: HistoryWriter, abort: Abort,
              timeout_s: float) -> dict[int, tuple[int | None, int]]:
        del abort
        return drain(self, cfg, history, timeout_s)

    def events(self, history: HistoryWriter) -> Collector:
        return EventCollector(self._platform, history, VirtualScheduler(self._loop))

    def history_fields(self) -> dict[str, Any]:
        """The history's clock is virtual (the report says so)."""
        return {"platform": "sim"}

    # ---- ClientSide: each client a host of the virtual network -----------------------------

    def _host(self, client: str) -> str:
        endpoint = client_endpoint(client)
        return endpoint if endpoint in self._platform.client_endpoints else CLIENT_HOST

    def _context(self, host: str) -> contextvars.Context:
        if host not in self._contexts:
            self._contexts[host] = context_of(self._platform.client_environment(host))
        return self._contexts[host]

    def endpoint(self, client: str, topic: str | None = None) -> KafkaEndpoint:
        """A client's own connections, as each stock client has (made among its code), its
        metadata of `topic` (default the experiment's)."""
        key = (client, topic or self._topic)
        if key not in self._endpoints:
            self._endpoints[key] = KafkaEndpoint(self._platform.cluster.bootstrap, key[1])
        return self._endpoints[key]

    def among(self, client: str, action: Callable[[], None]) -> None:
        self._loop.call_soon(action, context=self._context(self._host(client)))

    def later(self, client: str, delay_s: float, action: Callable[[], None]) -> None:
        self._loop.call_later(delay_s, action, context=self._context(self._host(client)))
