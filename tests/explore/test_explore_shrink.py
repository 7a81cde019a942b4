"""Shrinking: never a bigger schedule, always one that still fails, within the budget, and
down to the one fault a predicate needs."""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from undertow.explore.draw import FixedFault, Schedule
from undertow.explore.shrink import Step, shrink, simpler_targets
from undertow.spec import SpecError, TargetSelector

SELECTORS = [
    {"role": "leader"}, {"role": "follower"}, {"role": "follower", "mode": "all"},
    {"role": "isr-member"}, {"role": "isr-member", "mode": "all"},
    {"role": "isr-member", "mode": "fixed", "value": 2}, {"role": "all-isr-but-one"},
    {"role": "leader", "partition": 1}, {"broker": 1}, {"role": "controller"},
]

faults = st.builds(
    FixedFault,
    kind=st.sampled_from(["kill", "pause", "partition", "power-loss"]),
    target=st.sampled_from(SELECTORS).map(TargetSelector.model_validate),
    at_ms=st.integers(0, 30_000),
    duration_ms=st.integers(1, 8000),
)
schedules = st.builds(Schedule, faults=st.lists(faults, max_size=6).map(tuple),
                      seed=st.integers(0, 1000), min_duration_ms=st.integers(1, 1000))


def _total(schedule: Schedule) -> int:
    return sum(f.duration_ms for f in schedule.faults)


def _key(schedule: Schedule) -> str:
    return json.dumps(schedule.as_spec_faults(), sort_keys=True)


def _leader_kill_of_3s(schedule: Schedule) -> bool:
    return any(f.kind == "kill" and f.target.role == "leader" and f.target.partition == 0
               and f.target.mode == "one" and f.duration_ms >= 3000 for f in schedule.faults)


def _arbitrary(original: Schedule) -> Callable[[Schedule], bool]:
    """Fails for the original and, unpredictably but deterministically, for a third of
    the other schedules."""
    return lambda s: s == original or zlib.crc32(_key(s).encode()) % 3 == 0


def _at_least(total_ms: int) -> Callable[[Schedule], bool]:
    return lambda s: _total(s) >= total_ms


class Counted:
    """A predicate that remembers the schedules it was asked about."""

    def __init__(self, predicate: Callable[[Schedule], bool]) -> None:
        self.predicate = predicate
        self.asked: list[str] = []

    def __call__(self, schedule: Schedule) -> bool:
        self.asked.append(_key(schedule))
        return self.predicate(schedule)


@settings(max_examples=300, deadline=None)
@given(schedule=schedules, family=st.sampled_from(["arbitrary", "at-least", "leader-kill"]),
       budget=st.integers(0, 200), data=st.data())
def test_never_bigger_still_failing_within_budget(schedule: Schedule, family: str,
                                                  budget: int, data: st.DataObject) -> None:
    if family == "arbitrary":
        predicate = _arbitrary(schedule)
    elif family == "at-least":
        predicate = _at_least(data.draw(st.integers(0, _total(schedule)), label="total"))
    else:
        predicate = _leader_kill_of_3s
    if not predicate(schedule):
        schedule = Schedule((*schedule.faults,
                             FixedFault("kill", TargetSelector(role="leader"), 7000, 3500)),
                            schedule.seed, schedule.min_duration_ms)
    assert predicate(schedule)
    counted = Counted(predicate)
    result = shrink(schedule, counted, budget)
    assert predicate(result)
    assert len(result.faults) <= len(schedule.faults)
    assert _total(result) <= _total(schedule)
    assert (result.seed, result.min_duration_ms) == (schedule.seed, schedule.min_duration_ms)
    assert len(counted.asked) <= budget
    assert len(set(counted.asked)) == len(counted.asked), "a candidate is tried once"
    assert shrink(schedule, predicate, budget) == result, "deterministic"


@settings(max_examples=200, deadline=None)
@given(schedule=schedules)
def test_down_to_the_one_fault_the_predicate_needs(schedule: Schedule) -> None:
    schedule = Schedule((*schedule.faults,
                         FixedFault("kill", TargetSelector(role="isr-member", mode="all"),
                                    12_000, 7999),
                         FixedFault("kill", TargetSelector(role="leader"), 9000, 4000)),
                        schedule.seed, schedule.min_duration_ms)
    result = shrink(schedule, _leader_kill_of_3s, 10_000)
    (fault,) = result.faults
    assert (fault.kind, fault.target, fault.at_ms) == ("kill", TargetSelector(role="leader"), 0)
    assert fault.duration_ms >= 3000
    assert max(schedule.min_duration_ms, fault.duration_ms // 2) < 3000, "halved no further"


def test_shrinks_in_order_remove_shorten_earlier_narrow() -> None:
    """A realistic loss: the leader isolated for long enough while an ISR member is killed
    in the middle of it; the third fault plays no part."""
    schedule = Schedule((
        FixedFault("pause", TargetSelector(role="follower"), 2000, 5000),
        FixedFault("partition", TargetSelector(role="leader"), 8000, 8000, network="isolate"),
        FixedFault("kill", TargetSelector(role="isr-member", mode="all"), 9500, 6000),
    ), seed=4, min_duration_ms=1000)

    def loses(s: Schedule) -> bool:
        isolations = [f for f in s.faults if f.kind == "partition" and f.duration_ms >= 2000]
        kills = [f for f in s.faults if f.kind == "kill" and f.target.role != "leader"]
        return any(i.at_ms <= k.at_ms <= i.at_ms + i.duration_ms - 1000 and k.duration_ms >= 1500
                   for i in isolations for k in kills)

    result = shrink(schedule, loses, 200)
    assert result.as_spec_faults() == [
        {"kind": "partition", "target": {"role": "leader"}, "network": {"mode": "isolate"},
         "at": "0s", "duration": "2s"},
        {"kind": "kill", "target": {"role": "follower"}, "at": "0s", "duration": "1s500ms"},
    ]


def test_no_fault_moves_before_the_earliest_start() -> None:
    """Real clients need a moment to send anything: a shrunk fault stays at or after
    `earliest_ms`, and one drawn earlier stays where it was."""
    late = Schedule((FixedFault("kill", TargetSelector(role="leader"), 7000, 4000),),
                    seed=2, earliest_ms=2000)
    assert [f.at_ms for f in shrink(late, lambda s: True, 100).faults] == [2000]
    early = Schedule((FixedFault("kill", TargetSelector(role="leader"), 500, 4000),
                      FixedFault("pause", TargetSelector(role="follower"), 6000, 2000)),
                     seed=2, earliest_ms=2000)
    shrunk = shrink(early, lambda s: len(s.faults) == 2, 100)
    assert [f.at_ms for f in shrunk.faults] == [500, 2000]


def test_the_budget_stops_it_with_the_last_accepted_schedule() -> None:
    schedule = Schedule(tuple(FixedFault("kill", TargetSelector(role="leader"), 1000 * i, 4000)
                              for i in range(1, 5)), seed=1, min_duration_ms=1000)
    counted = Counted(lambda s: True)
    result = shrink(schedule, counted, 2)
    assert len(counted.asked) == 2
    assert len(result.faults) == 2, "two removals accepted, then the budget is spent"
    assert shrink(schedule, counted, 0) == schedule


@settings(max_examples=100, deadline=None)
@given(schedule=schedules, budget=st.integers(0, 60))
def test_each_kept_edit_is_told_as_it_is_kept(schedule: Schedule, budget: int) -> None:
    """`on_step` hears every schedule the shrink moves to, in order, with the tries spent:
    its last is the result, so a shrink stopped early still has its best so far."""
    predicate = _arbitrary(schedule)
    steps: list[Step] = []
    counted = Counted(predicate)
    result = shrink(schedule, counted, budget, steps.append)
    assert [predicate(step.schedule) for step in steps] == [True] * len(steps)
    assert (steps[-1].schedule if steps else schedule) == result
    tries = [step.tries for step in steps]
    assert tries == sorted(set(tries)) and all(1 <= t <= len(counted.asked) for t in tries)
    assert all(step.edit for step in steps)


@settings(max_examples=100, deadline=None)
@given(schedule=schedules)
def test_a_schedule_comes_back_equal_from_json(schedule: Schedule) -> None:
    """A Spark task sends its best schedule so far to the driver as JSON."""
    assert Schedule.from_json(json.loads(json.dumps(schedule.to_json()))) == schedule


def test_a_kept_edit_says_what_it_did() -> None:
    schedule = Schedule((FixedFault("kill", TargetSelector(role="leader"), 3000, 4000),
                         FixedFault("pause", TargetSelector(role="follower"), 5000, 2000)),
                        seed=1, min_duration_ms=4000)
    steps: list[Step] = []
    shrink(schedule, lambda s: any(f.kind == "kill" for f in s.faults), 10, steps.append)
    assert [(step.edit, step.schedule.describe()) for step in steps] == [
        ("removed fault 2", "kill {role: leader} at 3s for 4s"),
        ("moved every fault earlier", "kill {role: leader} at 0s for 4s")]


def test_a_candidate_the_spec_rejects_does_not_fail() -> None:
    """Narrowing an isr-member to a follower of a single-replica topic: the caller's
    experiment_with raises SpecError, which counts as not failing."""
    schedule = Schedule((FixedFault("kill", TargetSelector(role="isr-member"), 0, 1000),),
                        seed=1, min_duration_ms=1000)

    def still_fails(s: Schedule) -> bool:
        role = s.faults[0].target.role
        if role == "follower":
            raise SpecError("no follower can exist with replicationFactor 1")
        return role == "isr-member"

    assert shrink(schedule, still_fails, 10) == schedule


@pytest.mark.parametrize(("selector", "simpler"), [
    ({"role": "leader"}, []),
    ({"role": "follower"}, []),
    ({"role": "leader", "mode": "all"}, [{"role": "leader"}]),
    ({"role": "follower", "mode": "all"}, [{"role": "follower"}]),
    ({"role": "follower", "mode": "fixed-percent", "value": 50, "partition": 2},
     [{"role": "follower", "partition": 2}]),
    ({"role": "isr-member"}, [{"role": "leader"}, {"role": "follower"}]),
    ({"role": "isr-member", "mode": "all"},
     [{"role": "leader"}, {"role": "follower"}, {"role": "isr-member"}]),
    ({"role": "all-isr-but-one"},
     [{"role": "leader"}, {"role": "follower"}, {"role": "isr-member"}]),
    ({"broker": 1}, []),
    ({"consumer": 0}, []),
    ({"role": "controller"}, []),
    ({"role": "group-coordinator"}, []),
])
def test_simpler_targets(selector: dict[str, object], simpler: list[dict[str, object]]) -> None:
    assert simpler_targets(TargetSelector.model_validate(selector)) == [
        TargetSelector.model_validate(s) for s in simpler]
