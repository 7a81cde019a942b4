"""`ChaosExperiment`: a workload against a topic, a fault schedule and the expected verdict.

Checks that need the cluster (a broker id that does not exist, a replication factor above
the broker count, `min.insync.replicas` above the replication factor, selectors that can
never match) live in `check_against_cluster`: the loader runs it once a `{ref: NAME}`
is resolved, the model runs it itself for an `{inline: ...}` cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field, model_validator

from .cluster import BrokerClusterSpec, TopicConfig
from .durations import format_duration
from .explore import ExploreSpec
from .faults import NETWORK_KINDS, PARTITION_ROLES, FaultAction, ScheduleEntry, TargetSelector
from .meta import (
    API_VERSION,
    Conditions,
    FieldError,
    ObjectMeta,
    SpecModel,
    StatusModel,
    one_of,
)
from .workload import Workload

__all__ = [
    "ChaosExperiment",
    "ChaosExperimentSpec",
    "ChaosExperimentStatus",
    "ClusterSource",
    "FaultRecord",
    "Phase",
    "ReportRef",
    "TopicSpec",
    "Verdict",
    "check_against_cluster",
    "check_simulated_clients",
    "check_stock_clients",
]

Phase = Literal["Pending", "Running", "Healing", "Analyzing", "Completed", "Failed"]
Verdict = Literal["clean", "loss", "anomalies"]


class TopicSpec(SpecModel):
    """The topic the workload writes, created by the runner before the faults start."""

    name: str = Field(min_length=1, max_length=249, pattern=r"^[a-zA-Z0-9._-]+$")
    partitions: Annotated[int, Field(ge=1)] = 1
    replication_factor: Annotated[int, Field(ge=1)]
    config: TopicConfig = Field(default_factory=TopicConfig)
    """Topic-level overrides of the cluster's broker config."""


class ClusterSource(SpecModel):
    """The cluster to run against: `{ref: NAME}` of a BrokerCluster, or `{inline: SPEC}`."""

    model_config = one_of("ref", "inline")

    ref: str | None = Field(None, min_length=1)
    """Name of a BrokerCluster in the same file, in files passed along, or in the namespace."""
    inline: BrokerClusterSpec | None = None

    @model_validator(mode="after")
    def _one_of(self) -> ClusterSource:
        if (self.ref is None) == (self.inline is None):
            raise FieldError((), "set exactly one of 'ref' or 'inline'")
        return self


class ChaosExperimentSpec(SpecModel):
    """One experiment: what to write, what to break and what the history should show."""

    cluster: ClusterSource
    topic: TopicSpec
    workload: Workload = Field(default_factory=Workload)
    faults: list[ScheduleEntry] = Field(default_factory=list)
    """The fault schedule; empty for a baseline run."""
    expect: Literal["clean", "anomalies", "loss"]
    """clean: no acknowledged write may be lost, and nothing read that should not be.
    anomalies: the experiment demonstrates anomalies that lose no acknowledged write (a read
    of an aborted transaction's records, a torn transaction, ...). loss: the experiment
    demonstrates loss."""
    seed: Annotated[int, Field(ge=0)] | None = None
    """Seed of random schedules; unset: the runner picks one and records it."""
    explore: ExploreSpec | None = None
    """The fault space `undertow explore` draws schedules from (default: one derived from
    a `random` entry of `faults`, else kill, pause, partition, power-loss and pod-delete of
    the leader, a follower or an ISR member). `undertow run` ignores it."""

    @model_validator(mode="after")
    def _check(self) -> ChaosExperimentSpec:
        end = self.workload.duration
        ends = f"after the workload ends (workload.duration {format_duration(end)})"
        for index, entry in enumerate(self.faults):
            prefix: tuple[str | int, ...] = ("faults", index)
            at, every, count = entry.at, entry.every, entry.count
            if entry.sequence is not None:
                prefix += ("sequence",)
                at, every, count = entry.sequence.at, entry.sequence.every, entry.sequence.count
            elif entry.random is not None:
                prefix += ("random",)
                at, every, count = entry.random.at, None, None
            if at >= end:
                raise FieldError((*prefix, "at"), f"starts at {format_duration(at)}, {ends}")
            if every is not None and count is not None and at + (count - 1) * every >= end:
                last = format_duration(at + (count - 1) * every)
                raise FieldError(
                    (*prefix, "count"), f"injection {count} would start at {last}, {ends}"
                )
        if self.explore is not None:
            try:
                self.explore.check_window(end)
            except FieldError as exc:
                raise FieldError(("explore", *exc.loc), exc.message) from None
        if self.workload.consumer.mode != "subscribe":
            for loc, selector in self.all_selectors():
                if selector.role == "group-coordinator":
                    raise FieldError((*loc, "role"), "group-coordinator needs a consumer group "
                                                     "(workload.consumer.mode: subscribe)")
        if self.workload.transactions is None:
            for loc, selector in self.all_selectors():
                if selector.role == "txn-coordinator":
                    raise FieldError((*loc, "role"), "txn-coordinator needs transactional "
                                                     "producers (workload.transactions)")
        if (pipeline := self.workload.pipeline) is not None:
            pipeline.output_topic = pipeline.output_topic or f"{self.topic.name}-out"
            if pipeline.output_topic == self.topic.name:
                raise FieldError(("workload", "pipeline", "outputTopic"),
                                 "must differ from topic.name: the pipeline reads that one")
        if self.cluster.inline is not None:
            check_against_cluster(self, self.cluster.inline, "the inline cluster")
        return self

    def min_insync_replicas(self, cluster: BrokerClusterSpec) -> tuple[int, str]:
        """The topic's effective min.insync.replicas and who set it."""
        if self.topic.config.min_insync_replicas is not None:
            return self.topic.config.min_insync_replicas, "the topic config"
        if cluster.config.min_insync_replicas is not None:
            return cluster.config.min_insync_replicas, "the cluster config"
        return 1, "the default"

    def own_link_clients(self) -> tuple[str, ...]:
        """The clients a partition or delay isolates (``c1``, ``p0``), which need links of
        their own."""
        return self._clients_hit(NETWORK_KINDS)

    def paused_clients(self) -> tuple[str, ...]:
        """The producers a pause hits (``p0``), which run as processes of their own."""
        return self._clients_hit(("pause",))

    def _clients_hit(self, kinds: tuple[str, ...]) -> tuple[str, ...]:
        """The clients the schedule's faults of `kinds` target."""
        found: set[str] = set()
        for entry in self.faults:
            actions: list[FaultAction] = [entry] if entry.kind is not None else list(
                entry.sequence.steps if entry.sequence else ())
            for action in actions:
                if action.kind in kinds:
                    found |= {s.client for _, s in action.selectors() if s.client is not None}
            if entry.random is not None and set(entry.random.kinds) & set(kinds):
                found |= {t.client for t in entry.random.targets if t.client is not None}
        return tuple(sorted(found))

    def selectors(self) -> Iterator[tuple[tuple[str | int, ...], TargetSelector]]:
        """Every target selector in the schedule with its path below `spec`."""
        for index, entry in enumerate(self.faults):
            for loc, selector in entry.selectors():
                yield ("faults", index, *loc), selector
            for s, step in enumerate(entry.sequence.steps if entry.sequence else ()):
                for loc, selector in step.selectors():
                    yield ("faults", index, "sequence", "steps", s, *loc), selector
            for t, selector in enumerate(entry.random.targets if entry.random else ()):
                yield ("faults", index, "random", "targets", t), selector

    def all_selectors(self) -> Iterator[tuple[tuple[str | int, ...], TargetSelector]]:
        """`selectors()` and those of the `explore` space: the explored targets must make
        sense for the cluster too, but are not the schedule (no consumer needs links of its
        own for them)."""
        yield from self.selectors()
        if self.explore is not None:
            for loc, selector in self.explore.selectors():
                yield ("explore", *loc), selector


def check_against_cluster(
    spec: ChaosExperimentSpec, cluster: BrokerClusterSpec, cluster_name: str
) -> None:
    """Reject what this cluster can never run; `FieldError` locations are below `spec`."""
    rf = spec.topic.replication_factor
    if rf > cluster.brokers:
        raise FieldError(
            ("topic", "replicationFactor"),
            f"{rf} exceeds the {cluster.brokers} brokers of {cluster_name}",
        )
    min_isr, source = spec.min_insync_replicas(cluster)
    if min_isr > rf:
        loc: tuple[str | int, ...] = ("topic", "replicationFactor")
        if source == "the topic config":
            loc = ("topic", "config", "min.insync.replicas")
        raise FieldError(
            loc,
            f"min.insync.replicas {min_isr} (from {source}) exceeds replicationFactor {rf}: "
            "no acks=all write could ever succeed",
        )
    for loc, selector in spec.all_selectors():
        _check_selector(loc, selector, spec, cluster, cluster_name)
    txns = spec.workload.transactions
    level = cluster.config.transaction_version
    if txns is not None and txns.transaction_version == 2 and level not in (None, 2):
        raise FieldError(
            ("workload", "transactions", "transactionVersion"),
            f"2 needs the cluster's transaction.version at 2, and {cluster_name} sets it to "
            f"{level} (a Java 4.x client would fall back to version 1 there)")
    offsets_rf = cluster.config.offsets_topic_replication_factor
    if spec.workload.consumer.mode == "subscribe" and offsets_rf is not None \
            and offsets_rf > cluster.brokers:
        raise FieldError(
            ("workload", "consumer", "mode"),
            f"a consumer group needs __consumer_offsets, whose offsets.topic.replication.factor "
            f"{offsets_rf} (in {cluster_name}'s config) exceeds its {cluster.brokers} brokers: "
            "the topic could never be created")


STOCK_CLIENT_TRANSACTIONS = (
    "2 needs a producer that speaks transaction version 2 (EndTxn v5, Produce v12), as the "
    "Java 4.x client does; the stock producer of local, pod and Kubernetes runs, "
    "confluent-kafka (librdkafka 2.16), speaks version 1. Run it in simulation: undertow "
    "run --platform sim, or undertow explore")


SIMULATED_CONSUMER_PROTOCOL = (
    "the simulator's pipeline members speak the classic protocol only; run a pipeline of "
    "the consumer protocol with the stock client: undertow run FILE (local processes) or "
    "on pods")


def check_simulated_clients(spec: ChaosExperimentSpec) -> None:
    """Reject what the simulator's client models cannot do yet, before a simulated run or
    an exploration starts; `FieldError` locations are below `spec`."""
    if spec.workload.consumer.group_protocol == "consumer" and spec.workload.pipeline:
        raise FieldError(("workload", "consumer", "groupProtocol"),
                         SIMULATED_CONSUMER_PROTOCOL)


def check_stock_clients(spec: ChaosExperimentSpec) -> None:
    """Reject what only the simulator's client models can do, before a run with stock
    clients starts anything; `FieldError` locations are below `spec`."""
    txns = spec.workload.transactions
    if txns is not None and txns.transaction_version == 2:
        raise FieldError(("workload", "transactions", "transactionVersion"),
                         STOCK_CLIENT_TRANSACTIONS)


def _check_selector(
    loc: tuple[str | int, ...],
    selector: TargetSelector,
    spec: ChaosExperimentSpec,
    cluster: BrokerClusterSpec,
    cluster_name: str,
) -> None:
    if selector.client is not None:
        field = selector.client_field
        index, count = ((selector.consumer, spec.workload.consumers) if field == "consumer"
                        else (selector.producer, spec.workload.producers))
        if index is not None and index >= count:
            raise FieldError((*loc, field), f"{field} {selector.client} does not exist: the "
                                            f"workload has {count} {field}(s)")
        return
    if selector.broker is not None:
        if selector.broker >= cluster.brokers:
            raise FieldError(
                (*loc, "broker"),
                f"broker {selector.broker} does not exist: {cluster_name} has brokers "
                f"0..{cluster.brokers - 1}",
            )
        return
    if selector.role not in PARTITION_ROLES:
        return
    assert selector.partition is not None
    if selector.partition >= spec.topic.partitions:
        raise FieldError(
            (*loc, "partition"),
            f"topic {spec.topic.name} has partitions 0..{spec.topic.partitions - 1}",
        )
    rf = spec.topic.replication_factor
    candidates = {"leader": 1, "follower": rf - 1, "isr-member": rf, "all-isr-but-one": rf - 1}
    available = candidates[selector.role]
    if available == 0:
        raise FieldError(
            (*loc, "role"),
            f"no {selector.role} can exist with replicationFactor {rf}",
        )
    if selector.mode == "fixed" and selector.value is not None and selector.value > available:
        raise FieldError(
            (*loc, "value"),
            f"fixed {selector.value}: at most {available} {selector.role} candidate(s) "
            f"with replicationFactor {rf}",
        )


class FaultRecord(StatusModel):
    """One injected fault as the operator saw it (Chaos Mesh keeps the same per-target log)."""

    fault: str
    target: str
    """The process hit: broker-N or controller."""
    role: str | None = None
    """How the target was chosen, e.g. 'leader of p0'."""
    injected_at: datetime | None = None
    recovered_at: datetime | None = None


class ReportRef(StatusModel):
    """Where the analysis report is stored."""

    kind: str = "ConfigMap"
    name: str
    key: str | None = None


class ChaosExperimentStatus(StatusModel):
    """Observed state, written by the operator."""

    phase: Phase | None = None
    verdict: Verdict | None = None
    counts: dict[str, int] | None = None
    """Analysis counts: acked, lost, unseen, duplicates, ..."""
    faults: list[FaultRecord] | None = None
    seed: int | None = None
    """The seed the run used, so a random schedule can be replayed."""
    conditions: Conditions | None = None
    report_ref: ReportRef | None = None
    observed_generation: int | None = None


class ChaosExperiment(SpecModel):
    """A chaos experiment (`kubectl get uce`)."""

    api_version: Literal[API_VERSION]  # type: ignore[valid-type]
    kind: Literal["ChaosExperiment"]
    metadata: ObjectMeta
    spec: ChaosExperimentSpec
    status: ChaosExperimentStatus | None = None
