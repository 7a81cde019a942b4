"""The fault planner: `spec.faults` expanded into a flat, ordered list of planned faults.

Pure and deterministic: the same experiment and seed give the same plan. Only `random`
schedules use the seed (each entry from its own stream, so adding an entry does not
reshuffle the others); fixed schedules ignore it. Targets stay selectors: the runner
resolves them from live metadata at injection time.
"""

from __future__ import annotations

import math
import random
import secrets
from dataclasses import dataclass, replace
from typing import Any

from .durations import format_duration
from .errors import format_loc
from .experiment import ChaosExperiment, ChaosExperimentSpec
from .faults import (
    DurationRange,
    Event,
    FaultAction,
    FaultKind,
    NetworkDelay,
    NetworkFault,
    RandomSchedule,
    TargetSelector,
)

__all__ = ["PlannedFault", "Trigger", "choose_seed", "plan"]


@dataclass(frozen=True)
class Trigger:
    """Start `delay` seconds after fault `of` (a plan index) reached `event`; skip
    this fault and those that wait on it when the event has not come within `timeout`."""

    event: Event
    of: int
    delay: float
    timeout: float


@dataclass(frozen=True)
class PlannedFault:
    """One fault the runner will inject: at a fixed offset, or on a trigger."""

    index: int
    kind: FaultKind
    target: TargetSelector | None
    """None only for split partitions, whose `network.groups` name the sides."""
    network: NetworkFault | None
    duration: float
    at: float | None
    """Seconds after the workload starts; None when `trigger` decides."""
    trigger: Trigger | None
    origin: str
    """The spec path it came from, e.g. `spec.faults[2].sequence.steps[1]`."""
    repeat: int = 0
    """Which repetition of an `every` schedule (or which draw of a random one)."""
    grace_period: float = 0.0
    """kill and pod-delete only: seconds between SIGTERM and SIGKILL (0: SIGKILL at once)."""
    delay: NetworkDelay | None = None
    """delay only: how late the links' packets arrive."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict, for logs and the run's metadata."""
        return {
            "index": self.index,
            "kind": self.kind,
            "target": self.target.model_dump(by_alias=True, exclude_none=True)
            if self.target
            else None,
            "role": self.target.describe() if self.target else "split",
            "network": self.network.model_dump(by_alias=True, exclude_none=True)
            if self.network
            else None,
            "duration": format_duration(self.duration),
            "at": None if self.at is None else format_duration(self.at),
            "trigger": None
            if self.trigger is None
            else {
                "event": self.trigger.event,
                "of": self.trigger.of,
                "delay": format_duration(self.trigger.delay),
                "timeout": format_duration(self.trigger.timeout),
            },
            "origin": self.origin,
            "repeat": self.repeat,
            # A kill's only when it has one, so that a plain kill's line is what it was.
            **({"grace_period": format_duration(self.grace_period)}
               if self.kind == "pod-delete" or self.grace_period > 0 else {}),
            **({"delay": self.delay.model_dump(by_alias=True)} if self.delay else {}),
        }


@dataclass(eq=False)
class _Draft:
    """A planned fault before sorting: indices (and so trigger targets) are not known yet."""

    key: tuple[float, int, int, int]
    fault: PlannedFault
    waits_on: _Draft | None = None
    trigger: tuple[Event, float, float] | None = None


def choose_seed(spec: ChaosExperimentSpec) -> int:
    """The spec's seed, or a fresh one the runner must record to replay the run."""
    return spec.seed if spec.seed is not None else secrets.randbelow(2**31)


def plan(experiment: ChaosExperiment | ChaosExperimentSpec, seed: int) -> list[PlannedFault]:
    """Expand the schedule; ordered by start time (triggered steps follow their sequence)."""
    spec = experiment.spec if isinstance(experiment, ChaosExperiment) else experiment
    end = spec.workload.duration
    drafts: list[_Draft] = []
    for e, entry in enumerate(spec.faults):
        origin = format_loc(("spec", "faults", e))
        if entry.kind is not None:
            for r, at in enumerate(_starts(entry.at, entry.every, entry.count, end)):
                drafts.append(_Draft((at, e, r, 0), _planned(entry, at, origin, r)))
        elif entry.sequence is not None:
            sequence = entry.sequence
            for r, at in enumerate(_starts(sequence.at, sequence.every, sequence.count, end)):
                previous: _Draft | None = None
                for s, step in enumerate(sequence.steps):
                    where = f"{origin}.sequence.steps[{s}]"
                    draft = _Draft(
                        (at, e, r, s), _planned(step, at if previous is None else None, where, r)
                    )
                    if previous is not None:
                        assert step.when is not None
                        draft.waits_on = previous
                        draft.trigger = (step.when, step.after, step.timeout)
                    drafts.append(draft)
                    previous = draft
        elif entry.random is not None:
            drafts.extend(_random_drafts(e, entry.random, seed, end, f"{origin}.random"))
    drafts.sort(key=lambda d: d.key)
    position = {id(d): i for i, d in enumerate(drafts)}
    planned = []
    for index, draft in enumerate(drafts):
        trigger = None
        if draft.trigger is not None and draft.waits_on is not None:
            event, delay, timeout = draft.trigger
            trigger = Trigger(event, position[id(draft.waits_on)], delay, timeout)
        planned.append(replace(draft.fault, index=index, trigger=trigger))
    return planned


def _planned(action: FaultAction, at: float | None, origin: str, repeat: int) -> PlannedFault:
    assert action.kind is not None and action.duration is not None
    return PlannedFault(
        index=-1,
        kind=action.kind,
        target=action.target,
        network=action.network,
        duration=action.duration,
        at=at,
        trigger=None,
        origin=origin,
        repeat=repeat,
        grace_period=action.grace_period or 0.0,
        delay=action.delay,
    )


def _starts(at: float, every: float | None, count: int | None, end: float) -> list[float]:
    if every is None:
        return [at]
    if count is None:
        count = math.ceil((end - at) / every)
    return [at + i * every for i in range(count) if at + i * every < end]


def _random_drafts(
    entry: int, schedule: RandomSchedule, seed: int, end: float, origin: str
) -> list[_Draft]:
    """Draw faults one after the other; times in integer milliseconds so no float drift."""
    rng = random.Random(f"{seed}/{entry}")
    drafts: list[_Draft] = []
    t_ms, end_ms = round(schedule.at * 1000), round(end * 1000)
    while schedule.count is None or len(drafts) < schedule.count:
        t_ms += _draw_ms(rng, schedule.interval)
        if t_ms >= end_ms:
            break
        kind = rng.choice(schedule.kinds)
        target = rng.choice(schedule.targets)
        duration_ms = _draw_ms(rng, schedule.duration)
        fault = PlannedFault(
            index=-1,
            kind=kind,
            target=target,
            network=NetworkFault() if kind == "partition" else None,
            duration=duration_ms / 1000,
            at=t_ms / 1000,
            trigger=None,
            origin=origin,
            repeat=len(drafts),
        )
        drafts.append(_Draft((t_ms / 1000, entry, len(drafts), 0), fault))
        t_ms += duration_ms
    return drafts


def _draw_ms(rng: random.Random, bounds: DurationRange) -> int:
    return rng.randint(round(bounds.min * 1000), round(bounds.max * 1000))
