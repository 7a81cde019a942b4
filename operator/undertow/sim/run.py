"""One experiment in deterministic simulation, from start to verdict.

The phases of ``undertow.runner.run`` in virtual time, on a ``SimPlatform``:

    start the cluster -> create the topic -> wait for leaders and full ISRs
    -> workload + cluster sampler + nemesis for the workload's duration
    -> heal every fault -> wait for leaders and full ISRs (bounded)
    -> wait for every HW to reach its leader's LEO (bounded)
    -> stop the consumers -> drain every partition with a fresh consumer -> close the history

Everything runs in this thread on one event queue, so the same experiment and seed give the
same history, byte for byte: every time in it is virtual (``VIRTUAL_EPOCH_S`` is time 0), and
the ids the broker draws (cluster, topic, member ids) come from the seed
(``seeded_randomness``).
The fault units, the planner, the target resolution, the sampler's rows and the leader-epoch
gate are the real runner's.
"""

from __future__ import annotations

import contextlib
import logging
import random
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from minibroker.environment import Environment, entered
from undertow.platform.base import CLIENT, PlatformError, consumer_endpoint
from undertow.runner.abort import Abort
from undertow.runner.events import to_event
from undertow.runner.history import HistoryWriter
from undertow.runner.nemesis import EVENT_POLL_S, FaultRun, Nemesis
from undertow.runner.outcomes import LeaderEpochGate
from undertow.runner.run import (
    COMMIT_TIMEOUT_S,
    DRAIN_TIMEOUT_S,
    HEAL_TIMEOUT_S,
    READY_TIMEOUT_S,
    RunResult,
    close_history,
    consumer_group,
    first_meta,
    partitions_committed,
    partitions_healthy,
    workload_config,
)
from undertow.runner.sampler import INTERVAL_S, sample
from undertow.runner.workload import END_OFFSETS_SHARE, WorkloadConfig, outcomes_wait_s
from undertow.sim.clients import ClientEndpoint, SimConsumer, SimProducer
from undertow.sim.group_member import SimGroupMember
from undertow.sim.platform import NOMINAL, SimPlatform, Timing
from undertow.sim.process import Process
from undertow.spec import LoadedExperiment, choose_seed, plan

log = logging.getLogger("undertow.sim")

PROGRESS_S = 1.0
MEMBERS_CLOSE_TIMEOUT_S = 60.0
"""How long the group's members may take to commit and leave once stopped."""


class SimulationUnsupported(PlatformError):
    """The experiment uses something the simulation does not model yet."""


def unsupported(loaded: LoadedExperiment) -> str | None:
    """Why the simulation cannot run ``loaded`` yet, or None (consumer groups and the
    partitions that isolate a consumer are simulated: ``sim/group_member.py``)."""
    del loaded
    return None


def scratch_root() -> Path:
    """Where throwaway simulated clusters and histories go: memory when the machine offers
    it (/dev/shm), else the temporary directory."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() else Path(tempfile.gettempdir())


def seeded_randomness(seed: int) -> contextlib.AbstractContextManager[None]:
    """The broker code's random draws (``minibroker.environment``: the cluster id, topic ids,
    events log ids and group member ids) come from ``seed`` meanwhile, in this thread only:
    the same in every run."""
    return entered(Environment(rng=random.Random(seed)))


@contextlib.contextmanager
def broker_logs(path: Path, clock: Callable[[], float]) -> Iterator[None]:
    """The simulated nodes' logs (minibroker's loggers) go to ``path`` meanwhile, each line
    stamped with the virtual time, as a real node's go to its own log file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(virtual).3f %(levelname)s %(name)s: %(message)s"))

    def stamp(record: logging.LogRecord) -> bool:
        record.virtual = clock()
        return True

    handler.addFilter(stamp)
    logger = logging.getLogger("minibroker")
    previous = logger.propagate, logger.level
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate, level = previous
        logger.setLevel(level)
        handler.close()


def run_simulated(
    loaded: LoadedExperiment,
    out: Path,
    *,
    seed: int | None = None,
    analyze: Callable[[Path, Path], dict[str, Any]] | None = None,
    on_progress: Callable[[dict[str, Any]], None] = lambda _update: None,
    timing: Timing = NOMINAL,
) -> RunResult:
    reason = unsupported(loaded)
    if reason is not None:
        raise SimulationUnsupported(f"{loaded.experiment.metadata.name}: {reason}")
    spec = loaded.experiment.spec
    seed = choose_seed(spec) if seed is None else seed
    planned = plan(loaded.experiment, seed)
    cluster = loaded.cluster.spec
    abort = Abort()
    history = HistoryWriter(out / "history", abort)
    cfg = workload_config(loaded)
    shutil.rmtree(out / "cluster", ignore_errors=True)
    with seeded_randomness(seed):
        platform = SimPlatform(
            out / "cluster", cluster.brokers, cluster.config.as_overrides(),
            ephemeral_storage=cluster.storage.type == "ephemeral",
            on_event=lambda node, raw: history.event(to_event(node, raw)),
            consumers=spec.isolated_consumers(),  # consumer groups: their own links
            timing=timing)
        meta = first_meta(loaded, seed, planned, cfg, platform.clock(), platform="sim")
        history.write_meta(meta)
        try:
            with broker_logs(out / "cluster" / "nodes.log", platform.clock), platform:
                _Simulation(loaded, platform, history, planned, seed, cfg, meta,
                            on_progress).run()
        finally:
            close_history(history, meta, abort, platform.clock())
    abort.raise_if_set()
    report = analyze(out / "history", out) if analyze is not None else None
    return RunResult(report["verdict"] if report else None, spec.expect, report,
                     out / "history")


class _Simulation:
    def __init__(self, loaded: LoadedExperiment, platform: SimPlatform, history: HistoryWriter,
                 planned: list, seed: int, cfg: WorkloadConfig, meta: dict[str, Any],
                 on_progress: Callable[[dict[str, Any]], None]) -> None:
        self.loaded = loaded
        self.platform = platform
        self.loop = platform.loop
        self.history = history
        self.cfg = cfg
        self.meta = meta
        self.on_progress = on_progress
        self.topic = loaded.experiment.spec.topic
        self.gate = LeaderEpochGate(self._record_send)
        self.counts = {"ok": 0, "fail": 0, "info": 0}
        # consumer groups (sim/group_member.py): the group, for the nemesis and the sampler
        self.group_id = cfg.group.group_id if cfg.group is not None else None
        self.nemesis = Nemesis(platform, planned, self.topic.name, history, seed,
                               self.group_id, clock=platform.clock)
        self.client = ClientEndpoint(platform.network, Process(self.loop, CLIENT, 1), CLIENT,
                                     platform.bootstrap_addresses())
        self._sampling = True

    # ---- the phases ---------------------------------------------------------------------------

    def run(self) -> None:
        topic, platform, loop = self.topic, self.platform, self.loop
        controller = platform.controller.controller
        assert controller is not None
        controller.create_topic(topic.name, topic.partitions, topic.replication_factor,
                                topic.config.as_overrides())
        loop.wait_until(lambda: partitions_healthy(platform, topic.name,
                                                   topic.replication_factor),
                        READY_TIMEOUT_S * 1000, "every partition to have a leader and a full ISR")
        loop.wait_until(platform.metadata_propagated, READY_TIMEOUT_S * 1000,
                        "every broker to apply the controller's metadata")
        self.on_progress({"phase": "starting"})
        producers = [SimProducer(i, self.client, self.cfg, self._submit, platform.clock)
                     for i in range(self.cfg.producers)]
        consumers: list[SimConsumer | SimGroupMember] = [
            self._group_member(i) if self.cfg.group is not None else  # consumer groups
            SimConsumer(f"c{i}", self._client_for(f"c{i}"), topic.name, topic.partitions,
                        self._reader("run"), platform.clock, first=i)
            for i in range(self.cfg.consumers)]
        start = platform.clock()
        self.meta["workload_start"] = start
        self._sample()
        for worker in (*consumers, *producers):
            worker.start()
        self._start_rebalancer(consumers)  # consumer groups
        self._start_nemesis(start)
        duration = self.loaded.experiment.spec.workload.duration
        end_ms = loop.now_ms() + duration * 1000
        while loop.now_ms() < end_ms:
            loop.run_until(min(end_ms, loop.now_ms() + PROGRESS_S * 1000))
            self.on_progress({"phase": "faults", "elapsed": platform.clock() - start,
                              "total": duration, "counts": dict(self.counts), "errors": {},
                              "acks_per_second": 0.0, "active_faults": self.nemesis.active(),
                              "partitions": []})
        for producer in producers:
            producer.stop()
        self.nemesis.stop()
        self.on_progress({"phase": "healing", "partitions": []})
        loop.run_while_not(lambda: all(p.outstanding == 0 for p in producers),
                           outcomes_wait_s(self.cfg) * 1000)
        rf = topic.replication_factor
        self.meta["healed"] = loop.run_while_not(
            lambda: partitions_healthy(platform, topic.name, rf), HEAL_TIMEOUT_S * 1000)
        if self.meta["healed"]:
            self.meta["committed"] = loop.run_while_not(
                lambda: partitions_committed(platform, topic.name), COMMIT_TIMEOUT_S * 1000)
        for consumer in consumers:
            consumer.stop()
        # consumer groups: the members commit and leave, as the real ones do as they close
        members = [c for c in consumers if isinstance(c, SimGroupMember)]
        loop.run_while_not(lambda: all(m.closed for m in members),
                           MEMBERS_CLOSE_TIMEOUT_S * 1000)
        if self.group_id is not None:
            self.meta["consumer_group"] = consumer_group(platform, self.group_id)
        for producer in producers:
            producer.close()
        self.on_progress({"phase": "draining", "partitions": []})
        drained = self._drain()
        self.meta["drain"] = {str(p): {"end": end, "read_to": pos}
                              for p, (end, pos) in drained.items()}
        self.meta["faults_skipped"] = [
            {"index": r.planned.index, "kind": r.planned.kind, "reason": r.skipped}
            for r in self.nemesis.runs if r.skipped]
        self._sampling = False
        self.gate.close()

    # ---- the workload's records ------------------------------------------------------------

    def _submit(self, send: dict[str, Any]) -> None:
        if send["status"] == "fail":
            self.gate.hold(send)
        else:
            self._record_send(send)

    def _record_send(self, send: dict[str, Any]) -> None:
        self.history.send(**send)
        self.counts[send["status"]] += 1

    def _reader(self, phase: str) -> Callable[[str, int, int, str, float], None]:
        def read(consumer: str, partition: int, offset: int, value: str, t: float) -> None:
            self.history.read(consumer=consumer, phase=phase, topic=self.topic.name,
                              partition=partition, offset=offset, value=value, t=t)

        return read

    def _sample(self) -> None:
        if not self._sampling:
            return
        began = self.platform.clock()
        samples = sample(self.platform, self.topic.name, self.group_id,
                         clock=self.platform.clock)
        for record in samples:
            self.history.cluster_sample(record)
        self.gate.observe(began, samples)
        self.loop.call_later(INTERVAL_S * 1000, self._sample)

    # ---- consumer groups (sim/group_member.py) ---------------------------------------------

    def _client_for(self, consumer: str) -> ClientEndpoint:
        """Where consumer ``c1`` connects: links of its own when a partition may isolate it
        (``Platform.bootstrap_for``), else the clients'."""
        endpoint = consumer_endpoint(consumer)
        if endpoint not in self.platform.consumer_endpoints:
            return self.client
        return ClientEndpoint(self.platform.network, Process(self.loop, endpoint, 1), endpoint,
                              self.platform.bootstrap_addresses())

    def _group_member(self, index: int) -> SimGroupMember:
        assert self.cfg.group is not None
        name = f"c{index}"
        return SimGroupMember(name, self._client_for(name), self.topic.name, self.cfg.group,
                              self.history, self.platform.clock, first=index)

    def _start_rebalancer(self, consumers: list[SimConsumer | SimGroupMember]) -> None:
        """``Workload``'s rebalancer: every ``rebalance_every_s`` the next member leaves the
        group and joins again, until the members stop."""
        every = self.cfg.rebalance_every_s
        members = [c for c in consumers if isinstance(c, SimGroupMember)]
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
            self.loop.call_later(every * 1000, rebalance)

        self.loop.call_later(every * 1000, rebalance)

    def _drain(self) -> dict[int, tuple[int | None, int]]:
        """A fresh consumer reads each partition from its start to its end (the HW), as
        ``runner.workload.drain``: ends asked for a quarter of the time, then read."""
        loop = self.loop
        consumer = SimConsumer("drain", self.client, self.topic.name, self.topic.partitions,
                               self._reader("drain"), self.platform.clock)
        ends: dict[int, int | None] = dict.fromkeys(range(self.topic.partitions))
        consumer.end_offsets(lambda p, end: ends.__setitem__(p, end))
        loop.run_while_not(lambda: all(e is not None for e in ends.values()),
                           DRAIN_TIMEOUT_S * END_OFFSETS_SHARE * 1000)
        known = [p for p, end in ends.items() if end is not None]
        consumer.start(known)
        loop.run_while_not(
            lambda: all(consumer.positions.get(p, 0) >= (ends[p] or 0) for p in known),
            DRAIN_TIMEOUT_S * (1 - END_OFFSETS_SHARE) * 1000)
        consumer.stop()
        return {p: (end, consumer.positions.get(p, 0)) for p, end in ends.items()}

    # ---- the nemesis in virtual time --------------------------------------------------------

    def _start_nemesis(self, start: float) -> None:
        self.nemesis.start_time = start
        for run in self.nemesis.runs:
            planned = run.planned
            if planned.trigger is None:
                assert planned.at is not None
                self.loop.call_later(planned.at * 1000, lambda r=run: self._inject(r))
            else:
                self._await_trigger(run, self.loop.now_ms() + planned.trigger.timeout * 1000)

    def _await_trigger(self, run: FaultRun, deadline_ms: float) -> None:
        trigger = run.planned.trigger
        assert trigger is not None
        previous = self.nemesis.runs[trigger.of]
        if self.nemesis.stopped:
            return
        if previous.skipped is not None:
            run.skipped = f"fault {trigger.of} was skipped"
        elif self.nemesis.event_check(trigger.event, previous)():
            self.loop.call_later(trigger.delay * 1000, lambda: self._inject(run))
        elif self.loop.now_ms() > deadline_ms:
            run.skipped = f"{trigger.event} of fault {trigger.of} did not come in time"
        else:
            self.loop.call_later(EVENT_POLL_S * 1000,
                                 lambda: self._await_trigger(run, deadline_ms))

    def _inject(self, run: FaultRun) -> None:
        if self.nemesis.stopped:
            return
        try:
            self.nemesis.inject(run)
        except Exception as exc:
            run.skipped = f"{type(exc).__name__}: {exc}"
            log.info("Fault %d (%s) not injected: %s", run.planned.index, run.planned.kind, exc)
            return
        self._watch_recovery(run)

    def _watch_recovery(self, run: FaultRun) -> None:
        if all(u.state in ("recovered", "failed") for u in run.units):
            run.recovered.set()
        elif not self.nemesis.stopped:
            self.loop.call_later(EVENT_POLL_S * 1000, lambda: self._watch_recovery(run))
