"""One experiment from start to verdict, on any ``Platform``.

    start the cluster -> create the topic -> wait for leaders and full ISRs
    -> `before_workload` (`undertow run`: wait for the pre-started analysis to warm up)
    -> workload + cluster sampler + nemesis for the workload's duration
    -> heal every fault -> wait for leaders and full ISRs (bounded)
    -> wait for every HW to reach its leader's LEO (bounded: the drain reads to the HW)
    -> stop the run-phase consumers -> drain every partition with a fresh consumer
    -> close the history -> the history checker's verdict (`undertow.runner.verdict`)
    -> stop the cluster -> the Spark report, which must agree with that verdict

Each step from the workload's end to the report is timed (`undertow.runner.phases`): the
record is written to the run directory (and `undertow run` prints it under the report).

Every way out (normal end, Ctrl-C, SIGTERM, an exception) goes through the same ``finally``
blocks: faults recovered, workload stopped, platform stopped. The guardian process of the
local platform covers the case where this process itself is killed.

A failure in any of the run's threads, a history write above all, aborts the run through
its `Abort` (`undertow.runner.abort`): every wait of the run gives way to it within half a
second, the run stops as on Ctrl-C, meta.json says the history is incomplete and why, and
`run_experiment` raises that failure (`RunAborted`) as the run's one error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from undertow.platform.base import (
    Platform,
    PlatformError,
    client_endpoint,
    sigterm_as_interrupt,
)
from undertow.runner.abort import Abort, RunAborted
from undertow.runner.group_member import GroupSettings
from undertow.runner.history import HistoryWriter
from undertow.runner.nemesis import Nemesis
from undertow.runner.phases import PhaseClock
from undertow.runner.phases import write as write_timings
from undertow.runner.pipeline import PipelineSettings
from undertow.runner.sampler import ClusterSampler
from undertow.runner.transactional_producer import TxnSettings
from undertow.runner.verdict import agreement_text, disagreement, first_verdict
from undertow.runner.workload import MEMBERS_CLOSE_TIMEOUT_S, WorkloadConfig, outcomes_wait_s
from undertow.runner.world import READY_TIMEOUT_S, World
from undertow.spec import LoadedExperiment, PlannedFault, choose_seed, plan
from undertow_history.checker import HANGING_GRACE_S

log = logging.getLogger("undertow.run")

HEAL_TIMEOUT_S = 45.0
DRAIN_TIMEOUT_S = 60.0
COMMIT_TIMEOUT_S = 15.0
PROGRESS_S = 0.5
"""The fault phase's beat: a progress update, and the longest an abort waits to be seen."""


@dataclass
class RunResult:
    verdict: str | None
    expect: str
    report: dict[str, Any] | None
    history_dir: Path
    timings: dict[str, Any] | None = None
    """The phases after the workload (`undertow.runner.phases`); None when the run never
    reached the workload's end."""
    disagreement: str | None = None
    """Where the Spark report differs from the history checker's verdict printed first
    (`undertow.runner.verdict`): a bug in one of them."""


def workload_config(loaded: LoadedExperiment) -> WorkloadConfig:
    spec = loaded.experiment.spec
    w = spec.workload
    c = w.consumer
    group = None
    if c.mode == "subscribe":
        assert c.group_id and c.commit and c.commit_interval and c.isolation_level, \
            "the spec fills in every subscribe default"
        # KIP-848: the coordinator's session (minibroker's default is Kafka's 45 s).
        session_s = (
            (loaded.cluster.spec.config.group_consumer_session_timeout_ms or 45_000) / 1000
            if c.group_protocol == "consumer" else c.session_timeout or 6.0)
        group = GroupSettings(
            group_id=c.group_id, commit=c.commit,
            commit_interval_ms=int(c.commit_interval * 1000),
            isolation_level=c.isolation_level, static_membership=bool(c.static_membership),
            session_timeout_ms=int(session_s * 1000), group_protocol=c.group_protocol or
            "classic")
    return WorkloadConfig(
        topic=spec.topic.name, partitions=spec.topic.partitions, producers=w.producers,
        consumers=w.consumers, acks=str(w.acks), retries=w.retries,
        request_timeout_ms=int(w.request_timeout * 1000), rate=float(w.rate),
        record_size=w.record_size, idempotent=w.idempotent or w.transactions is not None,
        group=group, rebalance_every_s=c.rebalance_every,
        transactions=None if w.transactions is None else TxnSettings(
            records_per_transaction=w.transactions.records_per_transaction,
            abort_ratio=w.transactions.abort_ratio,
            timeout_ms=int(w.transactions.timeout * 1000),
            transaction_version=w.transactions.transaction_version),
        pipeline=None if w.pipeline is None else PipelineSettings(
            output_topic=str(w.pipeline.output_topic), kill_every_s=w.pipeline.kill_every),
        process_producers=spec.paused_clients())


def consumer_group(platform: Platform, group_id: str) -> dict[str, Any] | None:
    """meta.json's `consumer_group`: the group and the `__consumer_offsets` partition that
    holds it, from the cluster's metadata (None while the topic does not exist)."""
    try:
        p = platform.cluster_view().group_partition(group_id)
    except KeyError:
        return None
    return {"group_id": group_id, "offsets_topic": p.topic, "offsets_partition": p.partition}


def max_run_duration_s(loaded: LoadedExperiment) -> float:
    """The longest, in seconds, a run of `loaded` can take to close its history once its
    platform has started: the bounds of its waits in turn (the topic's creation, the
    cluster's readiness, the workload, the producers' last outcomes, the healing, the commit,
    the consumers' close, the drain). The platform's own start and the faults' recovery are
    not counted."""
    return (2 * READY_TIMEOUT_S + loaded.experiment.spec.workload.duration
            + outcomes_wait_s(workload_config(loaded)) + HEAL_TIMEOUT_S + COMMIT_TIMEOUT_S
            + MEMBERS_CLOSE_TIMEOUT_S
            + transactions_end_timeout_s(workload_config(loaded)) * (
                2 if loaded.experiment.spec.workload.pipeline else 1)
            + DRAIN_TIMEOUT_S * (2 if loaded.experiment.spec.workload.pipeline else 1))


def partitions_healthy(platform: Platform, topic: str, replication_factor: int) -> bool:
    """Every partition has a leader and a full ISR, as the controller sees it."""
    return platform.cluster_view().healthy(topic, replication_factor)


def partitions_committed(platform: Platform, topic: str) -> bool:
    """Every partition's high watermark has reached its leader's log end offset. Once the
    producers have stopped, what a leader acknowledged is then what a consumer can read: an
    acks=1 record that no follower has fetched yet lies above the HW, and a drain that stops
    at an earlier HW would count it lost although no broker dropped it."""
    partitions = platform.cluster_view(replicas=True).topic_partitions(topic)
    return bool(partitions) and all(
        p.has_leader and p.high_watermark is not None and p.leader in p.log_end_offsets
        and p.high_watermark >= p.log_end_offsets[p.leader] for p in partitions)


def transactions_ended(platform: Platform, topic: str) -> bool:
    """Every partition's last stable offset has reached its high watermark: no transaction
    is open on it. Once the producers have stopped, a transaction still open ends within its
    timeout (the coordinator aborts it, `TransactionStateManager.timedOutTransactions`), and a
    drain that read committed before then would count what lies past it lost."""
    partitions = platform.cluster_view(replicas=True).topic_partitions(topic)
    return bool(partitions) and all(
        p.last_stable_offset is None or p.high_watermark is None
        or p.last_stable_offset >= p.high_watermark for p in partitions)


def transactions_end_timeout_s(cfg: WorkloadConfig) -> float:
    """How long the run waits for the transactions still open to end: the producers'
    transaction.timeout.ms and the hanging-transaction check's grace (HANGING_GRACE_S), past
    which one still open is a hanging transaction; 0 without transactions."""
    return 0.0 if cfg.transactions is None else \
        cfg.transactions.timeout_ms / 1000 + HANGING_GRACE_S


def _settle(meta: dict[str, Any], key: str, wait: Callable[[], None]) -> None:
    """One bounded wait after the faults: meta[key] says whether it was met; the drain goes
    ahead either way (an abort still stops the run)."""
    try:
        wait()
        meta[key] = True
    except RunAborted:
        raise
    except Exception as exc:
        meta[key] = False
        log.warning("%s; draining anyway", exc)


def run_experiment(
    loaded: LoadedExperiment,
    platform: Platform,
    out: Path,
    *,
    seed: int | None = None,
    analyze: Callable[[Path, Path], dict[str, Any]] | None = None,
    on_progress: Callable[[dict[str, Any]], None] = lambda _update: None,
    before_workload: Callable[[], None] = lambda: None,
) -> RunResult:
    spec = loaded.experiment.spec
    missing = [c for c in spec.own_link_clients()
               if client_endpoint(c) not in platform.client_endpoints]
    if missing:  # before anything starts: the partitions could not be injected
        raise PlatformError(f"the schedule isolates client(s) {', '.join(missing)}, which "
                            f"need links of their own: run it on the local platform with "
                            f"--network proxy, or in simulation")
    if spec.paused_clients() and (why := platform.client_pause_unsupported()):
        raise PlatformError(f"the schedule pauses {', '.join(spec.paused_clients())}, and {why}")
    seed = choose_seed(spec) if seed is None else seed
    planned = plan(loaded.experiment, seed)
    if any(p.kind == "delay" for p in planned) and (why := platform.delay_unsupported()):
        raise PlatformError(f"the schedule delays links, and {why}")
    abort = Abort()
    history = HistoryWriter(out / "history", abort)
    cfg = workload_config(loaded)
    world = platform.world()
    meta = first_meta(loaded, seed, planned, cfg, world.now(), **world.history_fields())
    history.write_meta(meta)
    if abort.reason is not None:  # not even meta.json could be written: nothing has started
        history.close()
        abort.raise_if_set()
    log.info("Running %s (seed %d, %d planned faults) into %s", meta["experiment"], seed,
             len(planned), out)
    phases = PhaseClock()
    stopping = None
    first = None
    try:
        with abort.catching_thread_exceptions(), sigterm_as_interrupt(), platform:
            try:
                run_phases(world, loaded, platform, history, abort, planned, seed, cfg, meta,
                           on_progress, before_workload, phases)
            finally:  # before the cluster stops: the analysis waiting for it starts sooner
                close_history(history, meta, abort, world.now())
                phases.mark("history")
                stopping = phases.now()
            if analyze is not None and abort.reason is None:  # before the cluster's stop
                first = first_verdict(out / "history", spec.expect)
                phases.mark("verdict")
                stopping = phases.now()
    finally:
        close_history(history, meta, abort, world.now())  # the platform did not start
    if stopping is not None:
        phases.time_beside("cluster stop", stopping)
    abort.raise_if_set()  # the last meta.json could not be written
    report, difference = None, None
    if analyze is not None:
        report = analyze(out / "history", out)
        phases.mark("report")
        if first is not None:
            difference = disagreement(first, report)
            print(agreement_text(difference), flush=True)
    timings = _report_timings(phases, out)
    verdict = report["verdict"] if report else None
    return RunResult(verdict, spec.expect, report, out / "history", timings, difference)


def _report_timings(phases: PhaseClock, out: Path) -> dict[str, Any] | None:
    """Write the phases after the workload beside the history (`undertow run` prints them
    under the verdict: `phases.summary_line`); nothing for a run that stopped before its
    workload ended."""
    if not phases.started:
        return None
    record = phases.record()
    try:
        write_timings(out, record)
    except OSError as exc:  # the run and its verdict stand without it
        log.warning("the phase timings could not be written: %s", exc)
    return record


def first_meta(loaded: LoadedExperiment, seed: int, planned: list[PlannedFault],
               cfg: WorkloadConfig, start: float, **more: Any) -> dict[str, Any]:
    """meta.json as a run writes it first (`more`: fields of one platform, e.g. the
    simulation's `platform`); `close_history` completes it."""
    spec = loaded.experiment.spec
    return {
        "experiment": loaded.experiment.metadata.name,
        "source": str(loaded.source),
        "spec": spec.model_dump(mode="json", by_alias=True, exclude_none=True),
        "cluster": loaded.cluster.spec.model_dump(mode="json", by_alias=True, exclude_none=True),
        "seed": seed,
        "plan": [p.to_json() for p in planned],
        "idempotent": cfg.idempotent,
        "expect": spec.expect,
        **more,
        "start": start,
        "end": None,
        "incomplete": False,
        "incomplete_reason": None,
        "consumer_group": None,
        "transactions": None if cfg.transactions is None else {
            "timeout_s": cfg.transactions.timeout_ms / 1000},
        "pipeline": None if cfg.pipeline is None else {
            "input_topic": cfg.topic, "output_topic": cfg.pipeline.output_topic,
            "members": cfg.consumers, "drain": None},
        "faults_skipped": [],  # the nemesis's, written once the faults are over
        "consumers_not_closed": [],
    }


def close_history(history: HistoryWriter, meta: dict[str, Any], abort: Abort,
                  end: float) -> None:
    """Close the history with meta.json's `end` (once): every line is written by then."""
    if meta["end"] is not None:
        return
    meta["end"] = end
    if abort.reason is not None:
        meta["incomplete"], meta["incomplete_reason"] = True, str(abort.reason)
    history.finish(meta)


def run_phases(world: World, loaded: LoadedExperiment, platform: Platform,
               history: HistoryWriter, abort: Abort, planned: list[PlannedFault], seed: int,
               cfg: WorkloadConfig, meta: dict[str, Any],
               on_progress: Callable[[dict[str, Any]], None],
               before_workload: Callable[[], None], phases: PhaseClock) -> None:
    """The run from the topic's creation to the drain, in `world` (real or simulated); fills
    in `meta` and marks `phases` as it goes."""
    spec = loaded.experiment.spec
    topic, rf = spec.topic.name, spec.topic.replication_factor
    topics = [topic] if cfg.pipeline is None else [topic, cfg.pipeline.output_topic]
    world.create_topic(loaded, abort)
    world.until(lambda: all(partitions_healthy(platform, t, rf) for t in topics),
                READY_TIMEOUT_S, "every partition to have a leader and a full ISR", abort)
    on_progress({"phase": "starting"})
    before_workload()
    group_id = cfg.group.group_id if cfg.group is not None else None
    workload = world.workload(cfg, history, abort)
    sampler = ClusterSampler(platform, topics, history, on_round=workload.epoch_gate.observe,
                             group_id=group_id, clock=world.now, scheduler=world.scheduler())
    nemesis = Nemesis(platform, planned, topic, history, seed, group_id, clock=world.now,
                      scheduler=world.scheduler())
    events = world.events(history)
    events.start()
    sampler.start()
    try:
        start, started = world.now(), phases.now()
        meta["workload_start"] = start
        workload.start()
        nemesis.start(start)
        duration = spec.workload.duration
        try:
            while (elapsed := world.now() - start) < duration:
                on_progress({"phase": "faults", "elapsed": elapsed, "total": duration,
                             **workload.progress(), "active_faults": nemesis.active(),
                             "partitions": sampler.latest})
                # The last beat ends with the workload, not up to a beat after it.
                if world.sleep(min(PROGRESS_S, max(0.0, duration - elapsed)), abort):
                    break
            # The wall clock's workload end: in simulation the virtual workload ran faster.
            phases.start(min(started + duration, phases.now()))
        finally:
            workload.stop_producers()
            nemesis.stop(aborting=abort.is_set())
        phases.mark("healing")
        abort.raise_if_set()
        on_progress({"phase": "healing", "partitions": sampler.latest})
        workload.await_outcomes()
        phases.mark("last sends")
        _settle(meta, "healed", lambda: world.until(
            lambda: all(partitions_healthy(platform, t, rf) for t in topics), HEAL_TIMEOUT_S,
            "every partition to have a leader and a full ISR after healing", abort))
        if meta["healed"]:
            _settle(meta, "committed", lambda: world.until(
                lambda: partitions_committed(platform, topic), COMMIT_TIMEOUT_S,
                "every high watermark to reach its leader's log end", abort))
        if meta["healed"] and cfg.transactions is not None:
            _settle(meta, "transactions_ended", lambda: world.until(
                lambda: transactions_ended(platform, topic), transactions_end_timeout_s(cfg),
                "every transaction left open to end (each partition's last stable offset to "
                "reach its high watermark)", abort))
        phases.mark("recovery")
        meta["consumers_not_closed"] = workload.stop_consumers()
        if meta["consumers_not_closed"]:
            log.warning(
                "%s did not commit and leave the group within %.0f s (librdkafka's close "
                "waits for as long as the group's coordinator does not answer); draining "
                "without %s", ", ".join(meta["consumers_not_closed"]),
                MEMBERS_CLOSE_TIMEOUT_S,
                "them" if len(meta["consumers_not_closed"]) > 1 else "it")
        if cfg.pipeline is not None and meta["healed"]:
            output = cfg.pipeline.output_topic
            _settle(meta, "output_ended", lambda: world.until(
                lambda: partitions_committed(platform, output)
                and transactions_ended(platform, output), transactions_end_timeout_s(cfg),
                "the pipeline's output: every transaction to end, every high watermark to "
                "reach its leader's log end", abort))
        if group_id is not None:
            meta["consumer_group"] = consumer_group(platform, group_id)
        on_progress({"phase": "draining", "partitions": sampler.latest})
        drained = world.drain(cfg, history, abort, DRAIN_TIMEOUT_S)
        abort.raise_if_set()
        meta["drain"] = {str(p): {"end": end, "read_to": pos}
                         for p, (end, pos) in drained.items()}
        if cfg.pipeline is not None:
            drained = world.drain(replace(cfg, topic=cfg.pipeline.output_topic), history,
                                  abort, DRAIN_TIMEOUT_S)
            abort.raise_if_set()
            meta["pipeline"]["drain"] = {str(p): {"end": end, "read_to": pos}
                                         for p, (end, pos) in drained.items()}
        phases.mark("drain")
        meta["faults_skipped"] = [
            {"index": r.planned.index, "kind": r.planned.kind, "reason": r.skipped}
            for r in nemesis.runs if r.skipped]
    finally:
        workload.stop()
        sampler.stop()
        events.stop()
        workload.epoch_gate.close()
