"""The fault space: what `draw` may put in a schedule.

Read from the experiment's `explore` block, else from its first `random` schedule entry,
else a default for its topic. Times are integer milliseconds, as the planner's random
schedules use, so a schedule is the same on every machine.
"""

from __future__ import annotations

from dataclasses import dataclass

from undertow.spec import LoadedExperiment, TargetSelector
from undertow.spec.experiment import ChaosExperimentSpec
from undertow.spec.explore import (
    DEFAULT_KINDS,
    DEFAULT_ROLES,
    EXPLORED_PARTITION_MODES,
    DelayRange,
    ExploreSpec,
    target_problem,
)
from undertow.spec.faults import FaultKind, PartitionMode, RandomSchedule

__all__ = ["FaultSpace", "ms"]


def ms(seconds: float) -> int:
    """Seconds as the whole milliseconds the spec's durations are made of."""
    return round(seconds * 1000)


@dataclass(frozen=True)
class FaultSpace:
    """Kinds by targets, a number of faults, their durations and the gaps between their
    starts, within a window of the workload (all times in ms from the workload's start)."""

    kinds: tuple[FaultKind, ...]
    targets: tuple[TargetSelector, ...]
    faults: tuple[int, int]
    """Fewest and most faults of a schedule."""
    durations_ms: tuple[int, int]
    gaps_ms: tuple[int, int]
    """From the window's start to the first fault's start, then from start to start."""
    window_ms: tuple[int, int]
    """Faults start at or after the first and before the second (the workload's end)."""
    partition_modes: tuple[PartitionMode, ...] = EXPLORED_PARTITION_MODES
    delay: DelayRange | None = None
    """What a drawn delay slows its links by (``delay`` kinds only)."""

    def __post_init__(self) -> None:
        for name in ("faults", "durations_ms", "gaps_ms", "window_ms"):
            low, high = getattr(self, name)
            if not 0 <= low <= high:
                raise ValueError(f"{name} {low}..{high} is not an ordered, non-negative range")
        if self.faults[0] < 1 or self.durations_ms[0] < 1:
            raise ValueError("a schedule has at least one fault, and a fault lasts at least 1 ms")
        if not self.kinds or not self.targets or not self.partition_modes:
            raise ValueError("a fault space needs kinds, targets and partition modes")
        if "delay" in self.kinds and self.delay is None:
            raise ValueError("a fault space with delays needs their latencies' range")
        start, end = self.window_ms
        if start + self.faults[0] * self.gaps_ms[0] >= end:
            raise ValueError(f"{self.faults[0]} fault(s) {self.gaps_ms[0]} ms apart from "
                             f"{start} ms do not all start before {end} ms")
        for kind in self.kinds:
            if not self.targets_for(kind):
                raise ValueError(f"no target of the space can take a {kind}")

    def targets_for(self, kind: FaultKind) -> tuple[TargetSelector, ...]:
        """The targets a `kind` fault may hit (none of power-loss on the controller, ...)."""
        return tuple(t for t in self.targets if target_problem(kind, t) is None)

    @classmethod
    def of(cls, loaded: LoadedExperiment) -> FaultSpace:
        """The experiment's space: its `explore` block, else its first `random` entry,
        else `default_for` its spec."""
        spec = loaded.experiment.spec
        if spec.explore is not None:
            return cls.from_explore(spec.explore, spec)
        for entry in spec.faults:
            if entry.random is not None:
                return cls.from_random(entry.random, spec)
        return cls.default_for(spec)

    @classmethod
    def default_for(cls, spec: ChaosExperimentSpec) -> FaultSpace:
        """Kill, pause, partition, power-loss and pod-delete of the leader, a follower or
        an ISR member of partition 0 (those the replication factor allows), 1 to 4 faults,
        1 to 8 s each, starting 0.5 to 10 s apart."""
        return cls.from_explore(ExploreSpec(), spec)

    @classmethod
    def from_explore(cls, explore: ExploreSpec, spec: ChaosExperimentSpec) -> FaultSpace:
        """The `explore` block's space, its unset fields taken from the defaults."""
        targets = (tuple(explore.targets) if explore.targets is not None
                   else _default_targets(spec.topic.replication_factor))
        kinds = (tuple(explore.kinds) if explore.kinds is not None
                 else tuple(k for k in DEFAULT_KINDS
                            if any(target_problem(k, t) is None for t in targets)))
        durations, gaps = explore.duration_bounds(), explore.gap_bounds()
        return cls(kinds=kinds, targets=targets, faults=explore.fault_bounds(),
                   durations_ms=(ms(durations[0]), ms(durations[1])),
                   gaps_ms=(ms(gaps[0]), ms(gaps[1])),
                   window_ms=(0, ms(spec.workload.duration)),
                   partition_modes=tuple(explore.partition_modes or EXPLORED_PARTITION_MODES),
                   delay=explore.delay)

    @classmethod
    def from_random(cls, schedule: RandomSchedule, spec: ChaosExperimentSpec) -> FaultSpace:
        """A `random` entry's kinds, targets and durations; its `interval` (quiet time
        before each fault) becomes the gap between starts, its `count` the most faults
        (default: as many as fit back to back), its `at` the window's start."""
        start, end = ms(schedule.at), ms(spec.workload.duration)
        interval = (ms(schedule.interval.min), ms(schedule.interval.max))
        durations = (ms(schedule.duration.min), ms(schedule.duration.max))
        most = schedule.count
        if most is None:
            most = max(1, (end - start) // (interval[0] + durations[0]))
        return cls(kinds=tuple(schedule.kinds), targets=tuple(schedule.targets),
                   faults=(1, most), durations_ms=durations, gaps_ms=interval,
                   window_ms=(start, end))


def _default_targets(replication_factor: int) -> tuple[TargetSelector, ...]:
    """Leader, follower and ISR member; a single replica has no follower."""
    roles = [r for r in DEFAULT_ROLES if replication_factor > 1 or r != "follower"]
    return tuple(TargetSelector(role=r) for r in roles)
