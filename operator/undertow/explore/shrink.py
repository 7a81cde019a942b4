"""Shrinking: the smallest schedule that still loses data the same way.

A schedule found by drawing has faults that play no part in the loss, durations longer than
it needs, starts later than it needs and targets wider than it needs. `shrink` makes it
simpler one edit at a time, in this order, each kept only while the caller's `still_fails`
holds (for `undertow explore`: the simulation still loses acknowledged records by the same
mechanism):

1. remove a fault (but not the last);
2. halve a fault's duration, no shorter than the space's shortest;
3. start the whole schedule earlier (at the workload's start or the schedule's
   `earliest_ms`, else halfway there), then each fault (at the previous fault's start, else
   halfway there), so faults keep their order;
4. target one process instead of several: `isr-member` and `all-isr-but-one` become the
   `leader` or a `follower`, mode `all`/`fixed`/`fixed-percent` becomes mode `one`.

and starts over until no edit is kept (a fixpoint) or `budget` calls of `still_fails` are
spent. Every edit removes a fault or makes a number smaller, so it terminates; it is
deterministic, and a candidate tried once is never run again (`still_fails` is assumed
deterministic: the simulation is, per seed).

Each kept edit is told to `on_step` (what it did, the schedule it gave, the calls spent so
far): `undertow explore` shows it, and keeps it as the best so far should it be stopped.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace

from undertow.spec import SpecError, TargetSelector

from .draw import FixedFault, Schedule

__all__ = ["Step", "shrink", "simpler_targets"]

Edit = Callable[[Schedule, int], list[Schedule]]
"""Candidates that simplify fault `i` of a schedule, the most preferred first."""


@dataclass(frozen=True)
class Step:
    """One kept edit: what it did (``removed fault 2``), the schedule it gave, and how many
    calls of `still_fails` the shrink had spent then."""

    edit: str
    schedule: Schedule
    tries: int


class _Spent(Exception):
    """The budget of `still_fails` calls is used up."""


class _Shrinker:
    """The schedule shrunk so far, and `still_fails` with a budget, a memory of what was
    tried, and a candidate the spec rejects (say, a follower of a single-replica topic)
    taken as one that does not fail."""

    def __init__(self, schedule: Schedule, still_fails: Callable[[Schedule], bool],
                 budget: int, on_step: Callable[[Step], None]) -> None:
        self.current = schedule
        self._still_fails = still_fails
        self._budget = budget
        self._left = budget
        self._tried: dict[str, bool] = {}
        self._on_step = on_step

    def _fails(self, candidate: Schedule) -> bool:
        key = json.dumps([candidate.seed, candidate.as_spec_faults()], sort_keys=True)
        if key not in self._tried:
            if self._left <= 0:
                raise _Spent
            self._left -= 1
            try:
                self._tried[key] = bool(self._still_fails(candidate))
            except SpecError:
                self._tried[key] = False
        return self._tried[key]

    def apply(self, edit: Edit, says: str) -> bool:
        """Apply `edit` to each fault in turn, again and again while a candidate is
        accepted; whether any was. `says` names the edit to `on_step` (``{n}``: the
        fault's number, from 1)."""
        accepted = False
        index = 0
        while index < len(self.current.faults):
            for candidate in edit(self.current, index):
                if self._fails(candidate):
                    self.current = candidate
                    accepted = True
                    self._on_step(Step(says.format(n=index + 1), candidate,
                                       self._budget - self._left))
                    break
            else:
                index += 1
        return accepted


def shrink(schedule: Schedule, still_fails: Callable[[Schedule], bool], budget: int,
           on_step: Callable[[Step], None] = lambda _step: None) -> Schedule:
    """The simplest schedule reached from `schedule` by edits `still_fails` accepts, with at
    most `budget` calls of it. Never more faults, nor a longer total duration, than
    `schedule`; `schedule` itself when no edit is accepted."""
    shrinker = _Shrinker(schedule, still_fails, budget, on_step)
    try:
        progressed = True
        while progressed:
            progressed = False
            for edit, says in _EDITS:
                progressed = shrinker.apply(edit, says) or progressed
    except _Spent:
        pass
    return shrinker.current


def _with(schedule: Schedule, index: int, fault: FixedFault) -> Schedule:
    faults = list(schedule.faults)
    faults[index] = fault
    return schedule.with_faults(tuple(faults))


def _remove(schedule: Schedule, index: int) -> list[Schedule]:
    """Fault `index` left out; never the last one (a loss without faults is the baseline's
    business, not a schedule's, and asking costs a run)."""
    faults = schedule.faults
    if len(faults) == 1:
        return []
    return [schedule.with_faults(faults[:index] + faults[index + 1:])]


def _shorten(schedule: Schedule, index: int) -> list[Schedule]:
    fault = schedule.faults[index]
    shorter = max(schedule.min_duration_ms, fault.duration_ms // 2)
    if shorter >= fault.duration_ms:
        return []
    return [_with(schedule, index, replace(fault, duration_ms=shorter))]


def _shift_all_earlier(schedule: Schedule, index: int) -> list[Schedule]:
    """Every fault moved so that the first starts with the workload, else by half the first
    one's start: the gaps between them (often what the loss depends on) stay as they are.
    A whole-schedule edit: offered at index 0 only."""
    if index != 0 or not schedule.faults:
        return []
    room = schedule.faults[0].at_ms - schedule.earliest_ms
    return [schedule.with_faults(tuple(replace(f, at_ms=f.at_ms - shift)
                                       for f in schedule.faults))
            for shift in _earlier_by(room)]


def _start_earlier(schedule: Schedule, index: int) -> list[Schedule]:
    """Fault `index` moved to the previous fault's start (or the workload's), else halfway
    there; it stays behind the faults before it."""
    fault = schedule.faults[index]
    floor = max(schedule.faults[index - 1].at_ms if index else 0, schedule.earliest_ms)
    return [_with(schedule, index, replace(fault, at_ms=fault.at_ms - shift))
            for shift in _earlier_by(fault.at_ms - floor)]


def _earlier_by(room: int) -> list[int]:
    """All of `room` first (one call when the start does not matter), then half of it."""
    return [room, room // 2] if room > 1 else [room] if room == 1 else []


def _narrow(schedule: Schedule, index: int) -> list[Schedule]:
    fault = schedule.faults[index]
    return [_with(schedule, index, replace(fault, target=t))
            for t in simpler_targets(fault.target)]


_EDITS: tuple[tuple[Edit, str], ...] = (
    (_remove, "removed fault {n}"),
    (_shorten, "shortened fault {n}"),
    (_shift_all_earlier, "moved every fault earlier"),
    (_start_earlier, "moved fault {n} earlier"),
    (_narrow, "narrowed fault {n}'s target"),
)
"""The edits in the order `shrink` tries them, each with what it says in a `Step`."""


def simpler_targets(selector: TargetSelector) -> list[TargetSelector]:
    """Selectors of fewer, plainer processes than `selector`, the plainest first: the
    leader, a follower, then one ISR member. Brokers by id, consumers, the controller and
    the group coordinator are single processes already."""
    role, partition = selector.role, selector.partition
    if role is None or partition is None:
        return []
    simpler = []
    if role in ("isr-member", "all-isr-but-one"):
        simpler += [TargetSelector(role="leader", partition=partition),
                    TargetSelector(role="follower", partition=partition)]
    if role == "all-isr-but-one" or selector.mode != "one":
        single = "isr-member" if role == "all-isr-but-one" else role
        simpler.append(TargetSelector(role=single, partition=partition))
    return simpler
