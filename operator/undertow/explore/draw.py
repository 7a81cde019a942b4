"""Schedules: fixed faults drawn from a fault space, one seed one schedule.

A `Schedule` is what the simulator runs and the shrinker edits: plain fixed faults (kind,
target selector, start, duration), written back as the experiment file's `faults:` list,
so that `plan()` of the resulting experiment is exactly those faults and any run of it, in
simulation or on real processes, replays them.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from pydantic import ValidationError

from undertow.spec import LoadedExperiment, SpecError, TargetSelector, format_duration
from undertow.spec.errors import format_loc, spec_error_from_validation
from undertow.spec.experiment import ChaosExperiment, check_against_cluster
from undertow.spec.faults import FaultKind, PartitionMode
from undertow.spec.meta import FieldError

from .space import FaultSpace, ms

__all__ = ["FixedFault", "Schedule", "draw", "experiment_with", "selector_yaml"]


@dataclass(frozen=True)
class FixedFault:
    """One fault at a fixed offset: a `faults:` entry without `every` or `count`."""

    kind: FaultKind
    target: TargetSelector
    at_ms: int
    """From the workload's start."""
    duration_ms: int
    network: PartitionMode | None = None
    """partition and delay faults: which links (the spec's default: isolate)."""
    to: TargetSelector | None = None
    """A one-way fault's far side: what the target's packets to are dropped or slowed."""
    grace_period_ms: int | None = None
    """kill and pod-delete only: SIGTERM first, SIGKILL after this long."""
    latency_ms: int | None = None
    """delay faults only: how late each packet of the target's links arrives..."""
    jitter_ms: int = 0
    """... give or take up to this much ..."""
    correlation: float = 0.0
    """... each packet's jitter this percent the one before's."""

    def as_spec(self) -> dict[str, Any]:
        """The `faults:` entry, as an experiment file writes it."""
        entry: dict[str, Any] = {"kind": self.kind, "target": selector_yaml(self.target)}
        if self.kind == "partition" or self.network is not None:
            entry["network"] = {"mode": self.network or "isolate"}
        if self.to is not None:
            entry["network"]["to"] = selector_yaml(self.to)
        if self.kind == "delay":
            assert self.latency_ms is not None, "a drawn delay has its latency"
            entry["delay"] = {"latency": format_duration(self.latency_ms / 1000)}
            if self.jitter_ms:
                entry["delay"]["jitter"] = format_duration(self.jitter_ms / 1000)
                entry["delay"]["correlation"] = self.correlation
        entry["at"] = format_duration(self.at_ms / 1000)
        entry["duration"] = format_duration(self.duration_ms / 1000)
        if self.grace_period_ms is not None:
            entry["gracePeriod"] = format_duration(self.grace_period_ms / 1000)
        return entry

    def describe(self) -> str:
        """One line as the experiment file says it, for progress: ``kill {role: leader}
        at 4s for 2s``."""
        target = _selector_line(self.target)
        if self.to is not None:
            target += f" -> {_selector_line(self.to)}"
        network = f" ({self.network or 'isolate'})" if self.kind == "partition" else ""
        if self.kind == "delay":
            jitter = f"±{_seconds(self.jitter_ms)}" if self.jitter_ms else ""
            network = f" ({_seconds(self.latency_ms or 0)}{jitter})"
        return f"{self.kind}{network} {target} at {_seconds(self.at_ms)} for " \
               f"{_seconds(self.duration_ms)}"

    def to_json(self) -> dict[str, Any]:
        """Every field, the target as its normalised selector: `from_json` gives back an
        equal fault (a Spark task's shrink reports its schedules to the driver so)."""
        return {"kind": self.kind, "target": self.target.model_dump(mode="json",
                                                                   exclude_none=True),
                "at_ms": self.at_ms, "duration_ms": self.duration_ms, "network": self.network,
                "to": None if self.to is None else self.to.model_dump(mode="json",
                                                                      exclude_none=True),
                "grace_period_ms": self.grace_period_ms, "latency_ms": self.latency_ms,
                "jitter_ms": self.jitter_ms, "correlation": self.correlation}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FixedFault:
        to = data.get("to")
        return cls(data["kind"], TargetSelector.model_validate(data["target"]), data["at_ms"],
                   data["duration_ms"], network=data["network"],
                   to=None if to is None else TargetSelector.model_validate(to),
                   grace_period_ms=data["grace_period_ms"], latency_ms=data["latency_ms"],
                   jitter_ms=data["jitter_ms"], correlation=data["correlation"])


@dataclass(frozen=True)
class Schedule:
    """Fixed faults ordered by start, the seed the schedule was drawn with (which also
    seeds its simulation) and the shortest duration its space allows (the shrinker's floor).

    Faults may overlap, unlike a `random` schedule's."""

    faults: tuple[FixedFault, ...]
    seed: int
    min_duration_ms: int = 1
    earliest_ms: int = 0
    """The earliest start the shrinker may move a fault to (faults drawn earlier stay)."""

    def __post_init__(self) -> None:
        # Stable: faults that start together keep their order, so equal schedules compare equal.
        object.__setattr__(self, "faults", tuple(sorted(self.faults, key=lambda f: f.at_ms)))

    def with_faults(self, faults: tuple[FixedFault, ...]) -> Schedule:
        """The same schedule (seed, floor) with other faults."""
        return replace(self, faults=faults)

    def as_spec_faults(self) -> list[dict[str, Any]]:
        """The faults as an experiment's `faults:` list: JSON- and YAML-ready."""
        return [f.as_spec() for f in self.faults]

    def describe(self) -> str:
        """The faults on one line, for progress."""
        return "; ".join(f.describe() for f in self.faults) or "no faults"

    def to_json(self) -> dict[str, Any]:
        """Every field: `from_json` gives back an equal schedule."""
        return {"faults": [f.to_json() for f in self.faults], "seed": self.seed,
                "min_duration_ms": self.min_duration_ms, "earliest_ms": self.earliest_ms}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Schedule:
        return cls(tuple(FixedFault.from_json(f) for f in data["faults"]), data["seed"],
                   data["min_duration_ms"], data["earliest_ms"])


def _selector_line(selector: TargetSelector) -> str:
    """``{role: leader}``, as a line of progress names a selector."""
    return "{" + ", ".join(f"{k}: {v}" for k, v in selector_yaml(selector).items()) + "}"


def _seconds(ms: int) -> str:
    """``8.528s``: easier to read in a line of progress than the file's ``8s528ms``."""
    return f"{ms / 1000:g}s"


def selector_yaml(selector: TargetSelector) -> dict[str, Any]:
    """A selector as a person writes it: `{role: leader}`, not the normalised
    `{role: leader, partition: 0, mode: one}` (which loads back to the same selector)."""
    written = selector.model_dump(by_alias=True, exclude_none=True)
    if written.get("partition") == 0:
        del written["partition"]
    default_mode = "all" if selector.role == "all-isr-but-one" else "one"
    if written.get("mode") == default_mode:
        del written["mode"]
    return written


def draw(space: FaultSpace, seed: int) -> Schedule:
    """The schedule of `seed`: the same seed gives the same schedule in every process.

    How many faults, then for each a gap from the previous start (the first from the
    window's start), a kind, a target that kind can hit, a duration and, for a partition, a
    mode, for a delay its latency and jitter, then, when the space's delays are one-way, its
    far side (nothing more is drawn for other kinds, so a space without delays draws what it
    always drew, and one with isolating delays too). Gaps are capped so that the space's
    fewest faults always fit in the window; past those, the schedule ends where the next
    start would fall after the window."""
    rng = random.Random(f"undertow-explore/{seed}")
    count = rng.randint(*space.faults)
    return Schedule(tuple(_faults(space, rng, count)), seed, space.durations_ms[0])


def _faults(space: FaultSpace, rng: random.Random, count: int) -> Iterator[FixedFault]:
    at, end = space.window_ms
    shortest_gap, longest_gap = space.gaps_ms
    for index in range(count):
        still_needed = max(0, space.faults[0] - index - 1) * shortest_gap
        longest = min(longest_gap, end - 1 - at - still_needed)
        if longest < shortest_gap:
            return
        at += rng.randint(shortest_gap, longest)
        kind = rng.choice(space.kinds)
        target = rng.choice(space.targets_for(kind))
        duration = rng.randint(*space.durations_ms)
        network = rng.choice(space.partition_modes) if kind == "partition" else None
        if kind != "delay":
            yield FixedFault(kind, target, at, duration, network=network)
            continue
        delay = space.delay
        assert delay is not None, "a space with delays has their range (FaultSpace)"
        latency = rng.randint(ms(delay.latency.min), ms(delay.latency.max))
        jitter = 0 if delay.jitter is None else rng.randint(ms(delay.jitter.min),
                                                             ms(delay.jitter.max))
        to = None if delay.to is None else rng.choice(delay.to)
        yield FixedFault(kind, target, at, duration, network=None if to is None else "one-way",
                         to=to, latency_ms=latency, jitter_ms=jitter,
                         correlation=delay.correlation)


def experiment_with(loaded: LoadedExperiment, schedule: Schedule) -> LoadedExperiment:
    """`loaded` with the schedule as its only faults and the schedule's seed, validated as a
    file would be (a `SpecError` names the faulty field); nothing is read or written."""
    document = f"ChaosExperiment/{loaded.experiment.metadata.name}"
    data = loaded.experiment.model_dump(mode="json", by_alias=True, exclude_none=True)
    data["spec"]["faults"] = schedule.as_spec_faults()
    data["spec"]["seed"] = schedule.seed
    try:
        experiment = ChaosExperiment.model_validate(data)
    except ValidationError as exc:
        raise spec_error_from_validation(exc, source=str(loaded.source),
                                         document=document) from None
    try:
        check_against_cluster(experiment.spec, loaded.cluster.spec,
                              f"BrokerCluster/{loaded.cluster.metadata.name}")
    except FieldError as exc:
        raise SpecError(exc.message, source=str(loaded.source), document=document,
                        path=format_loc(("spec", *exc.loc))) from None
    return replace(loaded, experiment=experiment)
