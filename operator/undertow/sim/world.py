"""`undertow.runner.world.World` in deterministic simulation: `run_experiment`'s phases on
the virtual loop of a `SimPlatform` (`undertow run --platform sim`, and every run of
`undertow explore`: `run_simulated`).

Time is the loop's: a wait runs the loop's events until its condition holds, so the whole
run, cluster, clients, nemesis and sampler, is one thread and one event queue, and the same
seed gives the same history. The workload is the librdkafka-like client models
(`sim.clients`, `sim.group_member`) in place of stock clients; the nodes hand their events
to the history as they log them (`SimPlatform.record_events`), so nothing collects them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from undertow.platform.base import CLIENT, Platform, PlatformError, consumer_endpoint
from undertow.platform.simulated import SimulatedPlatform
from undertow.runner.abort import Abort
from undertow.runner.events import to_event
from undertow.runner.history import HistoryWriter
from undertow.runner.run import RunResult, partitions_healthy, run_experiment
from undertow.runner.scheduler import Scheduler
from undertow.runner.workload import WorkloadConfig
from undertow.runner.world import READY_TIMEOUT_S, Collector
from undertow.sim.clients import ClientEndpoint
from undertow.sim.loop import LoopScheduler
from undertow.sim.platform import SimPlatform
from undertow.sim.process import Process
from undertow.sim.timing import NOMINAL, Timing
from undertow.sim.workload import SimWorkload, drain, holds
from undertow.spec import LoadedExperiment, choose_seed


class _EventSink:
    """The simulated nodes hand their events to the history as they log them, those of the
    cluster's start first (`SimPlatform.record_events`): nothing to collect, nothing missed."""

    def __init__(self, platform: SimPlatform, history: HistoryWriter) -> None:
        self._platform = platform
        self._history = history

    def start(self) -> None:
        self._platform.record_events(lambda node, raw: self._history.event(to_event(node, raw)))

    def stop(self) -> None:
        """The sink stays: events logged until the history closes are still written."""


class SimWorld:
    def __init__(self, platform: SimPlatform) -> None:
        self._platform = platform
        self._loop = platform.loop
        self.client = ClientEndpoint(platform.network, Process(self._loop, CLIENT, 1), CLIENT,
                                     platform.bootstrap_addresses())

    def now(self) -> float:
        return self._platform.clock()

    def monotonic(self) -> float:
        return self._loop.now_ms() / 1000

    def scheduler(self) -> Scheduler:
        return LoopScheduler(self._loop)

    def sleep(self, seconds: float, abort: Abort) -> bool:
        self._loop.run_until(self._loop.now_ms() + seconds * 1000)
        return abort.is_set()

    def until(self, condition: Callable[[], bool], timeout_s: float, what: str,
              abort: Abort) -> None:
        if not self._loop.run_while_not(lambda: abort.is_set() or holds(condition),
                                        timeout_s * 1000):
            raise PlatformError(f"timed out after {timeout_s:g}s (virtual) waiting for {what}")
        abort.raise_if_set()

    def create_topic(self, loaded: LoadedExperiment, abort: Abort) -> None:
        """At the controller, as the admin client's CreateTopics would; returns once every
        broker applied the controller's metadata, so that the first sends find the leaders."""
        topic = loaded.experiment.spec.topic
        controller = self._platform.controller.controller
        assert controller is not None
        controller.create_topic(topic.name, topic.partitions, topic.replication_factor,
                                topic.config.as_overrides())
        self.until(lambda: partitions_healthy(self._platform, topic.name,
                                              topic.replication_factor),
                   READY_TIMEOUT_S, "every partition to have a leader and a full ISR", abort)
        self.until(self._platform.metadata_propagated, READY_TIMEOUT_S,
                   "every broker to apply the controller's metadata", abort)

    def workload(self, cfg: WorkloadConfig, history: HistoryWriter,
                 abort: Abort) -> SimWorkload:
        del abort
        return SimWorkload(self, cfg, history)

    def drain(self, cfg: WorkloadConfig, history: HistoryWriter, abort: Abort,
              timeout_s: float) -> dict[int, tuple[int | None, int]]:
        del abort  # one thread: a failure stops the loop's caller directly
        return drain(self, cfg, history, timeout_s)

    def events(self, history: HistoryWriter) -> Collector:
        return _EventSink(self._platform, history)

    def history_fields(self) -> dict[str, Any]:
        """The history's clock is virtual (the report says so)."""
        return {"platform": "sim"}

    # ---- ClientSide: the clients on the nodes' message network ---------------------------

    def endpoint(self, client: str) -> ClientEndpoint:
        """The clients' endpoint; a consumer (``c1``) that a partition may isolate has links
        of its own (``Platform.bootstrap_for``)."""
        endpoint = consumer_endpoint(client)
        if endpoint not in self._platform.consumer_endpoints:
            return self.client
        return ClientEndpoint(self._platform.network, Process(self._loop, endpoint, 1),
                              endpoint, self._platform.bootstrap_addresses())

    def among(self, client: str, action: Callable[[], None]) -> None:
        del client  # one process for all of them
        action()

    def later(self, client: str, delay_s: float, action: Callable[[], None]) -> None:
        del client
        self._loop.call_later(delay_s * 1000, action)

    def settle(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        return self._loop.run_while_not(condition, timeout_s * 1000)


SIMULATOR = "UNDERTOW_SIMULATOR"
"""Which simulated cluster `simulated_platform` makes, while both exist: ``copies`` (the
default: `SimPlatform`, the simulator's own broker, controller and fetcher around the
broker's core) or ``servers`` (`SimulatedPlatform`, minibroker's own servers).
docs/simulation.md, step 11."""


def simulated_platform(loaded: LoadedExperiment, root: Path, seed: int,
                       timing: Timing = NOMINAL, simulator: str | None = None) -> Platform:
    """The experiment's cluster in simulation (nodes' data under ``root``), on
    ``simulator``, by default the one ``UNDERTOW_SIMULATOR`` names."""
    simulator = simulator or os.environ.get(SIMULATOR, "copies")
    platform: type[SimPlatform] | type[SimulatedPlatform]
    if simulator == "servers":
        platform = SimulatedPlatform
    elif simulator == "copies":
        platform = SimPlatform
    else:
        raise ValueError(f"{SIMULATOR}={simulator!r}: expected copies or servers")
    cluster = loaded.cluster.spec
    shutil.rmtree(root, ignore_errors=True)  # the nodes' data start empty
    return platform(root, cluster.brokers, cluster.config.as_overrides(),
                    ephemeral_storage=cluster.storage.type == "ephemeral", seed=seed,
                    consumers=loaded.experiment.spec.isolated_consumers(), timing=timing)


def run_simulated(loaded: LoadedExperiment, out: Path, *, seed: int | None = None,
                  timing: Timing = NOMINAL, simulator: str | None = None) -> RunResult:
    """`run_experiment` of `loaded` on its simulated cluster (under `out`/cluster), without
    an analysis: the history in `out`/history."""
    seed = choose_seed(loaded.experiment.spec) if seed is None else seed
    platform = simulated_platform(loaded, out / "cluster", seed, timing, simulator)
    return run_experiment(loaded, platform, out, seed=seed)
