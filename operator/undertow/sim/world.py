"""`undertow.runner.world.World` in deterministic simulation: `run_experiment`'s phases on
the virtual loop of a `SimPlatform` (`undertow run --platform sim`, and every run of
`undertow explore`: `run_simulated`).

Time is the loop's: a wait runs the loop's events until its condition holds, so the whole
run, cluster, clients, nemesis and sampler, is one thread and one event queue, and the same
seed gives the same history. The workload is the librdkafka-like client models
(`sim.clients`, `sim.group_member`) in place of stock clients; the nodes hand their events
to the history as they log them (`SimPlatform`'s `on_event`), so nothing collects them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from undertow.platform.base import CLIENT, PlatformError, consumer_endpoint
from undertow.runner.abort import Abort
from undertow.runner.events import to_event
from undertow.runner.history import HistoryWriter
from undertow.runner.run import RunResult, partitions_healthy, run_experiment
from undertow.runner.scheduler import Scheduler
from undertow.runner.workload import (
    END_OFFSETS_SHARE,
    SendOutcomes,
    WorkloadConfig,
    outcomes_wait_s,
)
from undertow.runner.world import READY_TIMEOUT_S, Collector
from undertow.sim.clients import ClientEndpoint, SimConsumer, SimProducer
from undertow.sim.group_member import SimGroupMember
from undertow.sim.loop import LoopScheduler
from undertow.sim.platform import NOMINAL, SimPlatform, Timing
from undertow.sim.process import Process
from undertow.spec import LoadedExperiment, choose_seed

log = logging.getLogger("undertow.sim")

MEMBERS_CLOSE_TIMEOUT_S = 60.0
"""How long the group's members may take to commit and leave once stopped."""


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


def _holds(condition: Callable[[], bool]) -> bool:
    """`condition()`, an error counting as not yet (as `RealWorld.until`'s)."""
    try:
        return condition()
    except Exception:
        return False


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
        if not self._loop.run_while_not(lambda: abort.is_set() or _holds(condition),
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
        del abort  # one thread: a failure stops the loop's caller directly
        return SimWorkload(self, cfg, history)

    def drain(self, cfg: WorkloadConfig, history: HistoryWriter, abort: Abort,
              timeout_s: float) -> dict[int, tuple[int | None, int]]:
        """A fresh consumer reads each partition from its start to its end (the HW), as
        ``runner.workload.drain``: ends asked for a share of the time, then read."""
        del abort
        loop = self._loop
        consumer = SimConsumer("drain", self.client, cfg.topic, cfg.partitions,
                               _reader(history, cfg.topic, "drain"), self.now)
        ends: dict[int, int | None] = dict.fromkeys(range(cfg.partitions))
        consumer.end_offsets(lambda p, end: ends.__setitem__(p, end))
        loop.run_while_not(lambda: all(e is not None for e in ends.values()),
                           timeout_s * END_OFFSETS_SHARE * 1000)
        known = [p for p, end in ends.items() if end is not None]
        consumer.start(known)
        loop.run_while_not(
            lambda: all(consumer.positions.get(p, 0) >= (ends[p] or 0) for p in known),
            timeout_s * (1 - END_OFFSETS_SHARE) * 1000)
        consumer.stop()
        return {p: (end, consumer.positions.get(p, 0)) for p, end in ends.items()}

    def events(self, history: HistoryWriter) -> Collector:
        return _EventSink(self._platform, history)

    def history_fields(self) -> dict[str, Any]:
        """The history's clock is virtual (the report says so)."""
        return {"platform": "sim"}

    def client_for(self, consumer: str) -> ClientEndpoint:
        """Where consumer ``c1`` connects: links of its own when a partition may isolate it
        (``Platform.bootstrap_for``), else the clients'."""
        endpoint = consumer_endpoint(consumer)
        if endpoint not in self._platform.consumer_endpoints:
            return self.client
        return ClientEndpoint(self._platform.network, Process(self._loop, endpoint, 1),
                              endpoint, self._platform.bootstrap_addresses())


def _reader(history: HistoryWriter, topic: str, phase: str
            ) -> Callable[[str, int, int, str, float], None]:
    def read(consumer: str, partition: int, offset: int, value: str, t: float) -> None:
        history.read(consumer=consumer, phase=phase, topic=topic, partition=partition,
                     offset=offset, value=value, t=t)

    return read


class SimWorkload:
    """`runner.workload.Workload` over the client models: producers, the run's consumers (a
    group's members with `cfg.group`) and the rebalancer, on the virtual loop."""

    def __init__(self, world: SimWorld, cfg: WorkloadConfig, history: HistoryWriter) -> None:
        self._world = world
        self._loop = world._loop
        self._cfg = cfg
        self._history = history
        self.outcomes = SendOutcomes(history)
        self.epoch_gate = self.outcomes.epoch_gate
        self.producers = [SimProducer(i, world.client, cfg, self.outcomes.submit, world.now)
                          for i in range(cfg.producers)]
        self.consumers: list[SimConsumer | SimGroupMember] = [
            self._group_member(i) if cfg.group is not None else
            SimConsumer(f"c{i}", world.client_for(f"c{i}"), cfg.topic, cfg.partitions,
                        _reader(history, cfg.topic, "run"), world.now, first=i)
            for i in range(cfg.consumers)]

    def start(self) -> None:
        for worker in (*self.consumers, *self.producers):
            worker.start()
        self._start_rebalancer()

    def progress(self) -> dict[str, Any]:
        return self.outcomes.progress(0.0)  # a rate of wall-clock acks says nothing here

    def stop_producers(self) -> None:
        for producer in self.producers:
            producer.stop()

    def await_outcomes(self) -> None:
        self._loop.run_while_not(lambda: all(p.outstanding == 0 for p in self.producers),
                                 outcomes_wait_s(self._cfg) * 1000)

    def stop_consumers(self) -> None:
        """The members commit and leave, as the real ones do as they close; the producers'
        clients close."""
        for consumer in self.consumers:
            consumer.stop()
        members = self._members()
        self._loop.run_while_not(lambda: all(m.closed for m in members),
                                 MEMBERS_CLOSE_TIMEOUT_S * 1000)
        for producer in self.producers:
            producer.close()

    def stop(self) -> None:
        for producer in self.producers:
            producer.stop()
        for consumer in self.consumers:
            consumer.stop()

    def _members(self) -> list[SimGroupMember]:
        return [c for c in self.consumers if isinstance(c, SimGroupMember)]

    def _group_member(self, index: int) -> SimGroupMember:
        assert self._cfg.group is not None
        name = f"c{index}"
        return SimGroupMember(name, self._world.client_for(name), self._cfg.topic,
                              self._cfg.group, self._history, self._world.now, first=index)

    def _start_rebalancer(self) -> None:
        """``Workload``'s rebalancer: every ``rebalance_every_s`` the next member leaves the
        group and joins again, until the members stop."""
        every = self._cfg.rebalance_every_s
        members = self._members()
        if every is None or not members:
            return
        turn = 0

        def rebalance() -> None:
            nonlocal turn
            member = members[turn % len(members)]
            if member.stopping:
                return
            log.info("%s leaves the group and joins again", member.name)
            member.rejoin()
            turn += 1
            self._loop.call_later(every * 1000, rebalance)

        self._loop.call_later(every * 1000, rebalance)


def run_simulated(loaded: LoadedExperiment, out: Path, *, seed: int | None = None,
                  timing: Timing = NOMINAL) -> RunResult:
    """`run_experiment` of `loaded` on its simulated cluster (under `out`/cluster), without
    an analysis: the history in `out`/history."""
    seed = choose_seed(loaded.experiment.spec) if seed is None else seed
    platform = SimPlatform.for_experiment(loaded, out / "cluster", seed, timing)
    return run_experiment(loaded, platform, out, seed=seed)
