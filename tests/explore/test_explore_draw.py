"""Drawing schedules: one seed one schedule in any process, inside the space, and written
back as fixed faults that the planner gives back exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest
from explore_experiments import EXPERIMENTS, WriteExperiment
from hypothesis import given, settings
from hypothesis import strategies as st

from undertow.explore.draw import FixedFault, Schedule, draw, experiment_with
from undertow.explore.space import FaultSpace
from undertow.spec import LoadedExperiment, SpecError, TargetSelector, load_experiment, plan
from undertow.spec.explore import DelayRange

ACKS1 = load_experiment(EXPERIMENTS / "acks1-leader-kill.yaml")
SPACES = {
    "default": FaultSpace.of(ACKS1),
    "tight": FaultSpace(
        kinds=("kill", "partition", "power-loss"),
        targets=(TargetSelector(role="leader"), TargetSelector(role="controller"),
                 TargetSelector(role="all-isr-but-one")),
        faults=(3, 6), durations_ms=(1, 50), gaps_ms=(0, 9000), window_ms=(2000, 20_000)),
    "delays": FaultSpace(
        kinds=("delay", "kill"),
        targets=(TargetSelector(role="leader"), TargetSelector(producer=0)),
        faults=(1, 4), durations_ms=(1000, 8000), gaps_ms=(500, 10_000),
        window_ms=(0, 36_000),
        delay=DelayRange.model_validate({"latency": {"min": "50ms", "max": "1s"},
                                         "jitter": {"min": "0s", "max": "50ms"},
                                         "correlation": 25})),
}


def _faults(schedule: Schedule) -> list[tuple[object, ...]]:
    return [(f.kind, f.target.describe(), f.at_ms, f.duration_ms, f.network)
            for f in schedule.faults]


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**40), name=st.sampled_from(sorted(SPACES)))
def test_a_schedule_stays_inside_its_space(seed: int, name: str) -> None:
    space = SPACES[name]
    schedule = draw(space, seed)
    assert schedule == draw(space, seed)
    assert schedule.seed == seed
    assert schedule.min_duration_ms == space.durations_ms[0]
    assert space.faults[0] <= len(schedule.faults) <= space.faults[1]
    previous = space.window_ms[0]
    for fault in schedule.faults:
        assert fault.kind in space.kinds
        assert fault.target in space.targets_for(fault.kind)
        assert space.gaps_ms[0] <= fault.at_ms - previous <= space.gaps_ms[1]
        assert fault.at_ms < space.window_ms[1]
        assert space.durations_ms[0] <= fault.duration_ms <= space.durations_ms[1]
        assert fault.network == ("isolate" if fault.kind == "partition" else None)
        assert fault.grace_period_ms is None
        if fault.kind == "delay":
            assert fault.latency_ms is not None and 50 <= fault.latency_ms <= 1000
            assert 0 <= fault.jitter_ms <= 50 and fault.correlation == 25
        else:
            assert (fault.latency_ms, fault.jitter_ms) == (None, 0)
        assert FixedFault.from_json(json.loads(json.dumps(fault.to_json()))) == fault
        previous = fault.at_ms


def test_seeds_give_different_schedules_and_faults_may_overlap() -> None:
    schedules = [draw(SPACES["default"], seed) for seed in range(40)]
    assert len({json.dumps(s.as_spec_faults()) for s in schedules}) == 40
    assert {len(s.faults) for s in schedules} == {1, 2, 3, 4}
    overlapping = [s for s in schedules
                   if any(b.at_ms < a.at_ms + a.duration_ms
                          for a, b in zip(s.faults, s.faults[1:], strict=False))]
    assert overlapping


def test_the_same_seed_gives_the_same_schedule_in_another_process() -> None:
    """`random.Random(str)` does not depend on the process's string hashing."""
    code = ("import json; from undertow.spec import load_experiment; "
            "from undertow.explore.space import FaultSpace; "
            "from undertow.explore.draw import draw; "
            f"s = FaultSpace.of(load_experiment({str(EXPERIMENTS / 'acks1-leader-kill.yaml')!r}));"
            " print(json.dumps([draw(s, n).as_spec_faults() for n in range(5)]))")
    outputs = {subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                              text=True, env={**os.environ, "PYTHONHASHSEED": hash_seed}).stdout
               for hash_seed in ("1", "2")}
    here = json.dumps([draw(SPACES["default"], n).as_spec_faults() for n in range(5)])
    assert outputs == {here + "\n"}


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), plan_seed=st.integers(0, 2**31))
def test_the_planner_gives_exactly_the_drawn_faults(seed: int, plan_seed: int) -> None:
    schedule = draw(SPACES["default"], seed)
    trial = experiment_with(ACKS1, schedule)
    planned = plan(trial.experiment, plan_seed)
    assert [(p.kind, p.target.describe() if p.target else None, round(p.at * 1000) if p.at
             is not None else None, round(p.duration * 1000),
             p.network.mode if p.network else None) for p in planned] == _faults(schedule)
    assert all(p.trigger is None and p.grace_period == 0 for p in planned)
    assert trial.experiment.spec.seed == seed


def test_grace_periods_and_network_modes_reach_the_plan(acks1: LoadedExperiment) -> None:
    schedule = Schedule((
        FixedFault("partition", TargetSelector(role="leader"), 4000, 2000),
        FixedFault("kill", TargetSelector(role="follower", mode="all"), 1500, 3000,
                   grace_period_ms=250),
    ), seed=9)
    assert [f.kind for f in schedule.faults] == ["kill", "partition"], "ordered by start"
    assert schedule.as_spec_faults() == [
        {"kind": "kill", "target": {"role": "follower", "mode": "all"}, "at": "1s500ms",
         "duration": "3s", "gracePeriod": "250ms"},
        {"kind": "partition", "target": {"role": "leader"}, "network": {"mode": "isolate"},
         "at": "4s", "duration": "2s"},
    ]
    kill, partition = plan(experiment_with(acks1, schedule).experiment, 0)
    assert (kill.grace_period, kill.target, kill.at) == (0.25, schedule.faults[0].target, 1.5)
    assert partition.network is not None and partition.network.mode == "isolate"


def test_experiment_with_replaces_the_faults_in_memory_only(
        write_experiment_file: WriteExperiment) -> None:
    path = write_experiment_file(faults=[
        {"random": {"kinds": ["kill"], "targets": [{"role": "leader"}],
                    "interval": {"min": "1s", "max": "2s"}, "duration": {"min": "1s",
                                                                         "max": "2s"}}},
        {"kind": "pause", "target": {"role": "follower"}, "at": "1s", "duration": "1s"}])
    text = path.read_text()
    loaded = load_experiment(path)
    before = loaded.experiment.model_dump()
    schedule = Schedule((FixedFault("kill", TargetSelector(role="leader"), 5000, 1000),), 3)
    trial = experiment_with(loaded, schedule)
    assert [e.kind for e in trial.experiment.spec.faults] == ["kill"]
    assert trial.experiment.spec.seed == 3
    assert (trial.cluster, trial.source) == (loaded.cluster, loaded.source)
    assert loaded.experiment.model_dump() == before
    assert path.read_text() == text
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


@pytest.mark.parametrize(("fault", "message"), [
    (FixedFault("kill", TargetSelector(role="follower"), 1000, 1000),
     "spec.faults[0].target.role: no follower can exist with replicationFactor 1"),
    (FixedFault("kill", TargetSelector(role="leader"), 30_000, 1000),
     "spec.faults[0].at: starts at 30s, after the workload ends (workload.duration 30s)"),
    (FixedFault("power-loss", TargetSelector(role="controller"), 1000, 1000),
     "spec.faults[0].target: power-loss is a broker failpoint; the controller has none"),
])
def test_a_schedule_that_does_not_fit_is_a_spec_error(
        write_experiment_file: WriteExperiment, fault: FixedFault, message: str) -> None:
    path = write_experiment_file(replication_factor=1)
    with pytest.raises(SpecError) as info:
        experiment_with(load_experiment(path), Schedule((fault,), 1))
    assert str(info.value) == f"{path}: ChaosExperiment/explored: {message}"


def test_an_empty_schedule_is_a_baseline(acks1: LoadedExperiment) -> None:
    assert plan(experiment_with(acks1, Schedule((), 1)).experiment, 0) == []


def test_a_drawn_delay_reaches_the_plan_with_its_latency(acks1: LoadedExperiment) -> None:
    """A delay's drawn latency and jitter are written as its `delay` block and planned as
    drawn; the experiment file's schedule validates as any file's."""
    schedule = next(s for s in (draw(SPACES["delays"], n) for n in range(100))
                    if any(f.kind == "delay" and f.jitter_ms for f in s.faults))
    delays = [f for f in schedule.faults if f.kind == "delay"]
    planned = [p for p in plan(experiment_with(acks1, schedule).experiment, 0)
               if p.kind == "delay"]
    assert [(round(p.delay.latency * 1000), round(p.delay.jitter * 1000), p.delay.correlation)
            for p in planned if p.delay] == [(f.latency_ms, f.jitter_ms, 25.0) for f in delays]
    assert all(p.network is not None and p.network.mode == "isolate" for p in planned)
    assert "delay (" in schedule.describe()


def test_one_way_delays_go_from_their_target_to_a_drawn_far_side(acks1: LoadedExperiment) -> None:
    """With `delay.to`, each drawn delay slows its target's packets to one of `to` only (a
    producer's requests to one broker, Jepsen's delayed EndTxn), drawn last: a schedule is
    the one the space draws without it up to its first delay's far side."""
    isolating = SPACES["delays"]
    assert isolating.delay is not None
    one_way = replace(isolating, delay=isolating.delay.model_copy(update={"to": [
        TargetSelector(role="leader"), TargetSelector(role="follower")]}))
    schedules = [(draw(isolating, n), draw(one_way, n)) for n in range(40)]
    delays = [f for _, s in schedules for f in s.faults if f.kind == "delay"]
    assert {f.to.role for f in delays if f.to} == {"leader", "follower"}
    assert all(f.network == "one-way" for f in delays)
    for before, after in schedules:
        first = next((i for i, f in enumerate(before.faults) if f.kind == "delay"),
                     len(before.faults) - 1)
        assert [(f.kind, f.target, f.at_ms, f.duration_ms, f.latency_ms, f.jitter_ms)
                for f in before.faults[:first + 1]] == [
            (f.kind, f.target, f.at_ms, f.duration_ms, f.latency_ms, f.jitter_ms)
            for f in after.faults[:first + 1]]
    schedule = next(s for _, s in schedules if any(
        f.kind == "delay" and f.target.producer == 0 for f in s.faults))
    fault = next(f for f in schedule.faults if f.kind == "delay" and f.target.producer == 0)
    assert FixedFault.from_json(json.loads(json.dumps(fault.to_json()))) == fault
    assert f"{{producer: 0}} -> {{role: {fault.to.role}}}" in schedule.describe()
    planned = [p for p in plan(experiment_with(acks1, schedule).experiment, 0)
               if p.kind == "delay" and p.target is not None and p.target.producer == 0]
    assert planned and all(p.network is not None and p.network.mode == "one-way"
                           and p.network.to is not None for p in planned)
