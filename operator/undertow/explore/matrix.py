"""``undertow explore --matrix``: which configurations lose acknowledged records under which
faults, as a probability per cell.

Configurations are acks x min.insync.replicas x replication factor x unclean election x
fsync policy x rule set, on the file's cluster, topic and workload, and one transactional
row (`TRANSACTIONAL`: the safe configuration with transactional producers); fault classes
are groups of fault kinds. Every cell gets the
same budget of drawn schedules (the same seeds in every cell, so cells differ only by what
they vary), all run as one Spark job; a cell's probability of loss comes with its 95 % Wilson
score interval and the mechanism behind most of its losses.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Any

from undertow.explore.runs import Outcome, dominant
from undertow.spec import LoadedExperiment
from undertow.spec.workload import Workload

Z_95 = 1.959964


@dataclass(frozen=True)
class Configuration:
    acks: int | str
    """1 or "all", as the workload takes it."""
    min_insync_replicas: int
    replication_factor: int
    unclean: bool
    fsync: bool
    """fsync every message (``log.flush.interval.messages=1``) or leave it to the page cache
    (Kafka's default)."""
    rules: str
    """``current``: Kafka 4.2's (leader epochs, KAFKA-15583's HW rule, KIP-966's ELR);
    ``legacy``: pre-KIP-101 high-watermark truncation, the HW rule of Kafka <= 3.6 and no
    ELR."""
    transactional: bool = False
    """The producers are transactional (`workload.transactions` with its defaults), with
    `__transaction_state` replicated as the topic is."""

    @property
    def label(self) -> str:
        return (f"acks={self.acks} RF={self.replication_factor} "
                f"minISR={self.min_insync_replicas} "
                f"unclean={'on' if self.unclean else 'off'} "
                f"fsync={'each' if self.fsync else 'never'} rules={self.rules}"
                + (" transactions" if self.transactional else ""))

    def broker_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "min.insync.replicas": self.min_insync_replicas,
            "unclean.leader.election.enable": self.unclean}
        if self.fsync:
            config["log.flush.interval.messages"] = 1
        if self.rules == "legacy":
            config.update({"replication.truncation.mode": "high-watermark",
                           "high.watermark.min.isr.rule": "legacy",
                           "eligible.leader.replicas.version": 0})
        if self.transactional:
            config.update({"transaction.state.log.replication.factor":
                           self.replication_factor,
                           "transaction.state.log.min.isr": self.min_insync_replicas})
        return config

    def apply(self, loaded: LoadedExperiment) -> LoadedExperiment:
        """``loaded`` with this configuration: its cluster's config, its topic's replication
        factor, its workload's acks."""
        cluster_spec = loaded.cluster.spec
        merged = {**cluster_spec.config.model_dump(by_alias=True, exclude_none=True),
                  **self.broker_config()}
        cluster = loaded.cluster.model_copy(update={"spec": cluster_spec.model_copy(update={
            "config": type(cluster_spec.config).model_validate(merged)})})
        spec = loaded.experiment.spec
        workload = spec.workload.model_copy(update={"acks": self.acks})
        if self.transactional:
            workload = Workload.model_validate({
                **workload.model_dump(by_alias=True, exclude_none=True), "transactions": {},
                "retries": max(workload.retries, 1)})
        topic = spec.topic.model_copy(update={"replication_factor": self.replication_factor})
        experiment = loaded.experiment.model_copy(update={"spec": spec.model_copy(update={
            "workload": workload, "topic": topic})})
        return replace(loaded, cluster=cluster, experiment=experiment)


DEFAULT_AXES: dict[str, tuple[Any, ...]] = {
    "acks": (1, "all"),
    "min_insync_replicas": (1, 2),
    "replication_factor": (2, 3),
    "unclean": (False, True),
    "fsync": (False, True),
    "rules": ("current", "legacy"),
}
TRANSACTIONAL = Configuration(acks="all", min_insync_replicas=2, replication_factor=3,
                              unclean=False, fsync=False, rules="current", transactional=True)
"""The transactional row: the configuration Kafka recommends, with transactional producers
(transactional.id, read_committed consumers) and `__transaction_state` replicated as the
topic."""
FAULT_CLASSES: dict[str, tuple[str, ...]] = {
    "crash": ("kill",),
    "power loss": ("power-loss",),
    "network": ("partition", "pause"),
    "disk loss": ("pod-delete",),
}
"""Fault classes by the kinds they draw from; ``disk loss`` needs ephemeral storage."""


def configurations(axes: dict[str, tuple[Any, ...]] = DEFAULT_AXES) -> list[Configuration]:
    names = list(axes)
    return [Configuration(**dict(zip(names, values, strict=True)))
            for values in itertools.product(*(axes[n] for n in names))]


def wilson(losses: int, runs: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a proportion: sound at 0 and at 1, where the normal
    approximation collapses to a point."""
    if runs == 0:
        return 0.0, 1.0
    p = losses / runs
    denominator = 1 + z * z / runs
    centre = (p + z * z / (2 * runs)) / denominator
    half = z * math.sqrt(p * (1 - p) / runs + z * z / (4 * runs * runs)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class Cell:
    configuration: Configuration
    fault_class: str
    runs: int
    losses: int
    errors: int
    mechanisms: dict[str, int]
    """Schedules per dominant mechanism."""

    @property
    def probability(self) -> float:
        return self.losses / self.runs if self.runs else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.losses, self.runs)

    @property
    def mechanism(self) -> str | None:
        return dominant(self.mechanisms)

    def to_json(self) -> dict[str, Any]:
        low, high = self.interval
        return {"configuration": self.configuration.label, "fault_class": self.fault_class,
                "runs": self.runs, "losses": self.losses, "errors": self.errors,
                "probability": self.probability, "low": low, "high": high,
                "mechanism": self.mechanism, "mechanisms": self.mechanisms}


def _loss_label(outcome: Outcome) -> str | None:
    """What a losing schedule counts under: its mechanism, or, when it lost no acknowledged
    record (a misplaced or phantom record, say), the anomaly kinds that made the verdict."""
    if outcome.verdict != "loss":
        return None  # the matrix counts losses: an anomaly alone is no cell's loss
    if outcome.mechanism is not None:
        return outcome.mechanism
    kinds = sorted(k for k, n in outcome.counts.items() if n and k != "lost")
    return "+".join(kinds) or None


def cell_of(configuration: Configuration, fault_class: str, outcomes: list[Outcome]) -> Cell:
    mechanisms: dict[str, int] = {}
    for o in outcomes:
        if (label := _loss_label(o)) is not None:
            mechanisms[label] = mechanisms.get(label, 0) + 1
    return Cell(configuration, fault_class, sum(o.verdict != "error" for o in outcomes),
                sum(o.verdict == "loss" for o in outcomes),
                sum(o.verdict == "error" for o in outcomes), mechanisms)


def run_matrix(spark: Any, loaded: LoadedExperiment, budget: int,
               configs: list[Configuration] | None = None,
               fault_classes: dict[str, tuple[str, ...]] | None = None,
               first_seed: int = 1) -> list[Cell]:
    """Every (configuration, fault class) cell, ``budget`` schedules each, in one Spark job."""
    from undertow.explore.draw import draw, experiment_with
    from undertow.explore.runs import simulate
    from undertow.explore.space import FaultSpace
    from undertow.explore.spark import outcomes

    configs = [*configurations(), TRANSACTIONAL] if configs is None else configs
    classes = dict(FAULT_CLASSES if fault_classes is None else fault_classes)
    if loaded.cluster.spec.storage.type != "ephemeral":
        classes.pop("disk loss", None)  # a deleted pod keeps its disk: nothing to lose
    base = FaultSpace.of(loaded)
    cells = [(c, name) for c in configs for name in classes]
    trials = {i: (c.apply(loaded), replace(base, kinds=classes[name]))
              for i, (c, name) in enumerate(cells)}

    def run(key: int) -> Outcome:
        cell, seed = divmod(key, budget)
        trial, space = trials[cell]
        schedule = draw(space, first_seed + seed)
        outcome = simulate(experiment_with(trial, schedule), first_seed + seed,
                           schedule.as_spec_faults())
        return replace(outcome, seed=key)

    rows = outcomes(spark, list(range(len(cells) * budget)), run).collect()
    by_cell: dict[int, list[Outcome]] = {}
    for row in rows:
        outcome = Outcome.from_json(row.asDict())
        by_cell.setdefault(outcome.seed // budget, []).append(outcome)
    return [cell_of(c, name, by_cell.get(i, [])) for i, (c, name) in enumerate(cells)]


def render_matrix(cells: list[Cell], title: str) -> str:
    """An HTML heat map: a row per configuration, a column per fault class; each cell the
    probability of loss with its interval and dominant mechanism."""
    import html

    classes = list(dict.fromkeys(c.fault_class for c in cells))
    labels = list(dict.fromkeys(c.configuration.label for c in cells))
    at = {(c.configuration.label, c.fault_class): c for c in cells}

    def colour(p: float) -> str:
        red, green = round(255 * min(1.0, 0.15 + p)), round(255 * (1 - p) * 0.85 + 30)
        return f"rgb({red},{green},{max(0, green - 40)})" if p > 0 else "#e8f5e9"

    head = "".join(f"<th>{html.escape(name)}</th>" for name in classes)
    body = []
    for label in labels:
        tds = []
        for name in classes:
            c = at[(label, name)]
            low, high = c.interval
            mechanism = html.escape(c.mechanism or "")
            tds.append(f'<td style="background:{colour(c.probability)}" title="{c.losses} of '
                       f'{c.runs}"><b>{100 * c.probability:.0f} %</b> '
                       f'<small>[{100 * low:.0f}-{100 * high:.0f}]</small><br>'
                       f'<small>{mechanism}</small></td>')
        body.append(f"<tr><th>{html.escape(label)}</th>{''.join(tds)}</tr>")
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}'
            f'</title><style>body{{font-family:system-ui,sans-serif;margin:2em}}'
            f'table{{border-collapse:collapse}}td,th{{border:1px solid #bbb;padding:4px 8px;'
            f'font-size:13px;text-align:left}}td{{min-width:9em}}</style></head><body>'
            f'<h1>{html.escape(title)}</h1><p>Probability that a drawn fault schedule loses '
            f'acknowledged records, with its 95 % Wilson interval and the mechanism behind '
            f'most losses; {cells[0].runs if cells else 0} schedules per cell.</p>'
            f'<table><tr><th>configuration</th>{head}</tr>{"".join(body)}</table>'
            f'</body></html>')


def markdown_table(cells: list[Cell]) -> str:
    """The matrix as a Markdown table (the README's)."""
    classes = list(dict.fromkeys(c.fault_class for c in cells))
    labels = list(dict.fromkeys(c.configuration.label for c in cells))
    at = {(c.configuration.label, c.fault_class): c for c in cells}
    lines = ["| configuration | " + " | ".join(classes) + " |",
             "|---|" + "---|" * len(classes)]
    for label in labels:
        row = []
        for name in classes:
            c = at[(label, name)]
            low, high = c.interval
            mechanism = f" {c.mechanism}" if c.mechanism else ""
            row.append(f"{100 * c.probability:.0f}% [{100 * low:.0f}-{100 * high:.0f}]"
                       f"{mechanism}")
        lines.append(f"| {label} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"
