"""Timing variants: a schedule counts as robust only when the nominal timing and all
variants but one lose by the same mechanism, each variant runs with its own timing and
shifted faults, and the check stops as soon as the answer is known."""

from __future__ import annotations

from collections.abc import Callable

from undertow.explore.draw import FixedFault, Schedule
from undertow.explore.robust import VARIANTS, loses_robustly
from undertow.explore.runs import Outcome
from undertow.sim.timing import NOMINAL, Timing
from undertow.spec import TargetSelector

SCHEDULE = Schedule((FixedFault("kill", TargetSelector(role="leader"), 2000, 3000),
                     FixedFault("kill", TargetSelector(role="follower"), 2500, 3000)), seed=7)


def outcome(mechanism: str | None) -> Outcome:
    mechanisms = {mechanism: 3} if mechanism else {}
    return Outcome(7, 2, "[]", "loss" if mechanism else "clean", 3 if mechanism else 0, {},
                   mechanisms, 0.1)


def test_every_variant_runs_with_its_timing_and_shift() -> None:
    seen: list[tuple[Timing, tuple[int, ...]]] = []

    def trial(schedule: Schedule, timing: Timing) -> Outcome:
        seen.append((timing, tuple(f.at_ms for f in schedule.faults)))
        return outcome("unclean_election")

    assert loses_robustly(trial, SCHEDULE, "unclean_election")
    assert len(seen) == len(VARIANTS) and seen[0] == (NOMINAL, (2000, 2500))
    assert {timing for timing, _ in seen} > {NOMINAL}  # some variants change the timing
    moved = {starts for _, starts in seen} - {(2000, 2500)}
    assert (2137, 2637) in moved  # the whole schedule later, its gap kept
    assert (2000, 2200) in moved and (2000, 2800) in moved  # the gap narrower, wider


def test_a_loss_at_nominal_timing_only_is_not_robust_and_the_check_stops_there() -> None:
    calls: list[Timing] = []

    def trial(schedule: Schedule, timing: Timing) -> Outcome:
        calls.append(timing)
        return outcome("power_loss" if len(calls) == 1 else None)

    assert not loses_robustly(trial, SCHEDULE, "power_loss")
    assert len(calls) == 3  # nominal, then two misses


def test_one_variant_may_miss_but_never_the_nominal_timing() -> None:
    def missing(index: int) -> Callable[[Schedule, Timing], Outcome]:
        calls: list[int] = []

        def trial(schedule: Schedule, timing: Timing) -> Outcome:
            calls.append(1)
            return outcome(None if len(calls) - 1 == index else "disk_lost")
        return trial

    assert all(loses_robustly(missing(i), SCHEDULE, "disk_lost")
               for i in range(1, len(VARIANTS)))
    assert not loses_robustly(missing(0), SCHEDULE, "disk_lost")


def test_another_mechanism_does_not_count() -> None:
    assert not loses_robustly(lambda s, t: outcome("disk_lost"), SCHEDULE, "power_loss")
