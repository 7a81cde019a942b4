"""`spec.explore`: the fault space `undertow explore` draws schedules from.

    explore:
      kinds: [kill, power-loss]                      # default: kill, pause, partition,
                                                     #   power-loss, pod-delete
      targets: [{role: leader}, {role: follower}]    # default: leader, follower, isr-member
      faults: {min: 1, max: 3}                       # faults per schedule (default 1..4)
      duration: {min: 1s, max: 8s}                   # how long each lasts (default 1s..8s)
      gap: {min: 500ms, max: 10s}                    # between two starts (default 500ms..10s)
      partitionModes: [isolate]                      # partition faults only (default isolate)
      delay: {latency: {min: 50ms, max: 1s}}         # delay faults only: what to draw from
      #   to: [{role: txn-coordinator}]              #   one-way, from the target to one of these

Every field is optional: what is left out comes from the defaults above. Unlike a `random`
schedule, drawn faults may overlap: each one's start is a `gap` after the previous start,
whatever the previous one's `duration`. The file's own `faults` are what `undertow run`
injects; `explore` is read by `undertow explore` only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from pydantic import Field, model_validator

from .durations import format_duration
from .faults import (
    BROKER_ONLY_KINDS,
    CLIENT_TARGETS,
    DurationRange,
    FaultKind,
    PartitionMode,
    TargetSelector,
)
from .meta import FieldError, SpecModel

__all__ = [
    "DEFAULT_DURATION_S",
    "DEFAULT_FAULTS",
    "DEFAULT_GAP_S",
    "DEFAULT_KINDS",
    "DEFAULT_ROLES",
    "EXPLORED_PARTITION_MODES",
    "CountRange",
    "DelayRange",
    "ExploreSpec",
    "target_problem",
]

DEFAULT_KINDS: tuple[FaultKind, ...] = ("kill", "pause", "partition", "power-loss", "pod-delete")
"""The kinds explored when `kinds` is left out: process death with and without the page
cache, a stalled process, a cut network, a lost disk."""
DEFAULT_ROLES = ("leader", "follower", "isr-member")
"""The roles (of partition 0, mode one) explored when `targets` is left out."""
DEFAULT_FAULTS = (1, 4)
DEFAULT_DURATION_S = (1.0, 8.0)
DEFAULT_GAP_S = (0.5, 10.0)
EXPLORED_PARTITION_MODES: tuple[PartitionMode, ...] = ("isolate",)
"""What `partitionModes` may hold so far: split and one-way need a far side to draw."""


def target_problem(kind: FaultKind, selector: TargetSelector) -> str | None:
    """Why a `kind` fault cannot hit `selector` (the rules `faults` entries obey), or None.

    A client can be isolated, so a client target takes partition and delay faults (the
    explored ones isolate their target, so that is all it needs), and a producer can be
    paused too (SIGSTOP of its own process, held as a node's in simulation)."""
    if kind in BROKER_ONLY_KINDS and selector.role == "controller":
        return BROKER_ONLY_KINDS[kind]
    takes = ("partition", "delay", "pause") if selector.producer is not None \
        else ("partition", "delay")
    if selector.client is not None and kind not in takes:
        return CLIENT_TARGETS
    return None


class CountRange(SpecModel):
    """A whole number drawn uniformly from `min` to `max`."""

    min: Annotated[int, Field(ge=1)]
    max: Annotated[int, Field(ge=1)]

    @model_validator(mode="after")
    def _ordered(self) -> CountRange:
        if self.min > self.max:
            raise FieldError(("max",), f"{self.max} is below min {self.min}")
        return self


class DelayRange(SpecModel):
    """What a drawn `delay` fault slows its links by: a latency drawn uniformly (in
    milliseconds) from `latency`, a jitter from `jitter` (default none), and `correlation`
    percent as given (Chaos Mesh's NetworkChaos delay fields, tc netem's); with `to`, which
    links: the packets the target sends to one of `to`, drawn per fault (a one-way delay),
    instead of every link of the target both ways."""

    latency: DurationRange
    jitter: DurationRange | None = None
    correlation: float = Field(0.0, ge=0, le=100)
    to: list[TargetSelector] | None = Field(None, min_length=1)
    """One-way delays: each drawn delay slows what its target sends to a broker drawn from
    these (e.g. a producer's requests to its transaction coordinator, and not its Produce
    requests to the partitions' leaders: Jepsen's delayed EndTxn); default: isolating
    delays."""

    @model_validator(mode="after")
    def _check(self) -> DelayRange:
        if self.latency.min <= 0:
            raise FieldError(("latency", "min"), "must be positive: a delay of no time slows "
                                                 "nothing")
        if self.jitter is not None and self.jitter.max > self.latency.min:
            raise FieldError(("jitter", "max"),
                             f"{format_duration(self.jitter.max)} is above the least latency "
                             f"{format_duration(self.latency.min)}: a packet could arrive "
                             "before it was sent")
        for index, selector in enumerate(self.to or ()):
            if selector.client is not None or selector.role == "controller":
                raise FieldError(("to", index), "the far side of a one-way delay is a "
                                                "broker (clients reach brokers only)")
        return self


class ExploreSpec(SpecModel):
    """The fault space of `undertow explore`: which kinds hit which targets, how many
    faults a schedule has, how long each lasts and how far apart they start. Fields left
    out take the defaults named in each one's description."""

    kinds: list[FaultKind] | None = Field(None, min_length=1)
    """Kinds to draw from (default: kill, pause, partition, power-loss and pod-delete, those
    that some target can take)."""
    targets: list[TargetSelector] | None = Field(None, min_length=1)
    """Selectors to draw from (default: leader, follower and isr-member of partition 0, those
    the topic's replication factor allows)."""
    faults: CountRange | None = None
    """How many faults a schedule has (default 1 to 4); fewer when the workload ends first."""
    duration: DurationRange | None = None
    """How long each fault lasts (default 1s to 8s)."""
    gap: DurationRange | None = None
    """Time from one fault's start to the next one's, and from the workload's start to the
    first fault (default 500ms to 10s). Faults overlap when a gap is shorter than a
    duration."""
    partition_modes: list[PartitionMode] | None = Field(None, min_length=1)
    """How partition faults cut (default: isolate, the only mode explored so far)."""
    delay: DelayRange | None = None
    """What delay faults slow their links by, drawn per fault; needed with `delay` among
    `kinds` (delays isolate their target, as the explored partitions do)."""

    @model_validator(mode="after")
    def _check(self) -> ExploreSpec:
        if self.duration is not None and self.duration.min <= 0:
            raise FieldError(("duration", "min"), "must be positive: a fault that lasts no "
                                                  "time is never injected")
        for index, mode in enumerate(self.partition_modes or ()):
            if mode not in EXPLORED_PARTITION_MODES:
                raise FieldError(("partitionModes", index),
                                 f"{mode} is not explored yet: only isolate partitions are "
                                 "drawn (split and one-way need a far side)")
        delays = self.kinds is not None and "delay" in self.kinds
        if delays and self.delay is None:
            assert self.kinds is not None
            raise FieldError(("kinds", self.kinds.index("delay")),
                             "a drawn delay needs `delay: {latency: {min, max}}` to draw its "
                             "latency from")
        if self.delay is not None and not delays:
            raise FieldError(("delay",), "only with delay among `kinds`: nothing draws it")
        if self.kinds is not None and self.targets is not None:
            for index, kind in enumerate(self.kinds):
                if all(target_problem(kind, t) for t in self.targets):
                    raise FieldError(("kinds", index), f"no target in 'targets' can take a {kind}: "
                                                       f"{target_problem(kind, self.targets[0])}")
        if self.targets is not None:
            kinds = self.kinds or DEFAULT_KINDS
            for index, selector in enumerate(self.targets):
                if all(target_problem(kind, selector) for kind in kinds):
                    raise FieldError(("targets", index),
                                     f"no kind in 'kinds' can hit it: "
                                     f"{target_problem(kinds[0], selector)}")
        return self

    def fault_bounds(self) -> tuple[int, int]:
        """`faults` as (min, max), defaults filled in."""
        return (self.faults.min, self.faults.max) if self.faults else DEFAULT_FAULTS

    def duration_bounds(self) -> tuple[float, float]:
        """`duration` in seconds as (min, max), defaults filled in."""
        return (self.duration.min, self.duration.max) if self.duration else DEFAULT_DURATION_S

    def gap_bounds(self) -> tuple[float, float]:
        """`gap` in seconds as (min, max), defaults filled in."""
        return (self.gap.min, self.gap.max) if self.gap else DEFAULT_GAP_S

    def check_window(self, workload_duration: float) -> None:
        """Reject a space whose fewest faults cannot all start before the workload ends."""
        fewest, _ = self.fault_bounds()
        gap, _ = self.gap_bounds()
        if fewest * gap >= workload_duration:
            loc = ("faults", "min") if self.faults else ("gap", "min")
            raise FieldError(loc, f"{fewest} fault(s) starting {format_duration(gap)} apart do "
                                  "not all start before the workload ends (workload.duration "
                                  f"{format_duration(workload_duration)})")

    def selectors(self) -> Iterator[tuple[tuple[str | int, ...], TargetSelector]]:
        """Every selector of `targets` and `delay.to` with its path, for checks against the
        cluster."""
        for index, selector in enumerate(self.targets or ()):
            yield ("targets", index), selector
        for index, selector in enumerate(self.delay.to or () if self.delay else ()):
            yield ("delay", "to", index), selector
