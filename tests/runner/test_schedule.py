"""The fault planner: deterministic, seeded where random, selectors left for the runner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from undertow.spec import choose_seed, load_experiment, plan
from undertow.spec.experiment import ChaosExperiment

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"


def random_experiment() -> ChaosExperiment:
    return load_experiment(DATA / "spec-random.yaml").experiment


def random_faults(experiment: ChaosExperiment, seed: int) -> list:
    return [f for f in plan(experiment, seed) if f.origin == "spec.faults[1].random"]


def test_fixed_schedule_ignores_seed() -> None:
    experiment = load_experiment(DATA / "spec-base.yaml").experiment
    first = plan(experiment, 1)
    assert first == plan(experiment, 2)
    assert [(f.kind, f.at, f.duration) for f in first] == [("kill", 5.0, 2.0), ("pause", 10.0, 1.5)]
    assert first[1].target is not None and first[1].target.partition == 1


def test_same_seed_same_plan_across_loads() -> None:
    assert plan(random_experiment(), 42) == plan(random_experiment(), 42)


def test_different_seeds_different_random_plans() -> None:
    experiment = random_experiment()
    plans = [[f.to_json() for f in random_faults(experiment, seed)] for seed in range(6)]
    assert all(plans), "every seed draws at least one fault in 57 s"
    assert len({json.dumps(p) for p in plans}) == len(plans)


@pytest.mark.parametrize("seed", [0, 1, 99, 2**31 - 1])
def test_random_draws_stay_in_bounds(seed: int) -> None:
    experiment = random_experiment()
    schedule = experiment.spec.faults[1].random
    assert schedule is not None
    faults = random_faults(experiment, seed)
    previous_end = schedule.at
    for fault in faults:
        assert fault.at is not None and fault.trigger is None
        assert 0.5 <= round(fault.at - previous_end, 3) <= 3.0
        assert 0.2 <= fault.duration <= 2.0
        assert fault.at < experiment.spec.workload.duration
        assert fault.kind in schedule.kinds
        assert fault.target in schedule.targets
        assert (fault.network is not None) == (fault.kind == "partition")
        previous_end = fault.at + fault.duration
    # drawing stopped because the next fault would start after the workload ends
    assert previous_end + 3.0 >= experiment.spec.workload.duration


def test_random_count_limits_draws() -> None:
    data = yaml.safe_load((DATA / "spec-random.yaml").read_text())
    data["spec"]["faults"][1]["random"]["count"] = 3
    experiment = ChaosExperiment.model_validate(data)
    assert len(random_faults(experiment, 5)) == 3
    assert [f.to_json() for f in random_faults(experiment, 5)] == [
        f.to_json() for f in random_faults(random_experiment(), 5)[:3]
    ]


def draws(faults: list) -> list[tuple]:
    return [(f.kind, f.target, f.at, f.duration) for f in faults]


def test_entries_draw_from_their_own_streams() -> None:
    """Adding a random entry must not reshuffle the draws of an existing one."""
    data = yaml.safe_load((DATA / "spec-random.yaml").read_text())
    extra = dict(data["spec"]["faults"][1])
    data["spec"]["faults"].append(extra)
    experiment = ChaosExperiment.model_validate(data)
    assert draws(random_faults(experiment, 11)) == draws(random_faults(random_experiment(), 11))
    added = [f for f in plan(experiment, 11) if f.origin == "spec.faults[3].random"]
    assert added and draws(added) != draws(random_faults(experiment, 11))


def test_sequence_steps_wait_on_previous_step() -> None:
    faults = plan(random_experiment(), 3)
    sequence = [f for f in faults if f.origin.startswith("spec.faults[2]")]
    # every 15 s from 20 s while the workload (60 s) runs: 20, 35, 50
    firsts = [f for f in sequence if f.trigger is None]
    assert [f.at for f in firsts] == [20.0, 35.0, 50.0]
    for first in firsts:
        second = faults[first.index + 1]
        assert second.origin == "spec.faults[2].sequence.steps[1]"
        assert second.at is None
        assert second.trigger is not None
        assert second.trigger.of == first.index
        assert second.trigger.event == "recovered"
        assert second.trigger.delay == 0.0
        assert second.repeat == first.repeat
        assert second.target is not None and second.target.role == "leader"


def test_plan_is_ordered_and_numbered() -> None:
    faults = plan(random_experiment(), 8)
    assert [f.index for f in faults] == list(range(len(faults)))
    starts = []
    for fault in faults:
        root = fault if fault.trigger is None else faults[fault.trigger.of]
        assert root.at is not None
        starts.append(root.at)
    assert starts == sorted(starts)


def test_every_without_count_repeats_until_workload_ends() -> None:
    faults = plan(load_experiment(REPO / "experiments" / "leader-pause.yaml").experiment, 0)
    assert [f.at for f in faults] == [6.0, 20.0]
    data = yaml.safe_load_all((REPO / "experiments" / "leader-pause.yaml").read_text())
    experiment = next(d for d in data if d["kind"] == "ChaosExperiment")
    del experiment["spec"]["faults"][0]["count"]
    unbounded = plan(ChaosExperiment.model_validate(experiment), 0)
    assert [f.at for f in unbounded] == [6.0, 20.0, 34.0]


def test_plan_does_not_touch_the_experiment() -> None:
    experiment = random_experiment()
    before = experiment.model_dump()
    plan(experiment, 5)
    assert experiment.model_dump() == before


def test_plan_serialises_to_json() -> None:
    faults = plan(load_experiment(REPO / "experiments" / "unclean-election.yaml").experiment, 0)
    assert json.loads(json.dumps([f.to_json() for f in faults])) == [
        {
            "index": 0,
            "kind": "kill",
            "target": {"role": "follower", "partition": 0, "mode": "all"},
            "role": "all followers of p0",
            "network": None,
            "duration": "12s",
            "at": "5s",
            "trigger": None,
            "origin": "spec.faults[0].sequence.steps[0]",
            "repeat": 0,
        },
        {
            "index": 1,
            "kind": "kill",
            "target": {"role": "leader", "partition": 0, "mode": "one"},
            "role": "leader of p0",
            "network": None,
            "duration": "15s",
            "at": None,
            "trigger": {"event": "out-of-sync", "of": 0, "delay": "3s", "timeout": "30s"},
            "origin": "spec.faults[0].sequence.steps[1]",
            "repeat": 0,
        },
    ]


def test_choose_seed() -> None:
    experiment = random_experiment()
    assert experiment.spec.seed is None
    seeds = {choose_seed(experiment.spec) for _ in range(5)}
    assert all(0 <= s < 2**31 for s in seeds) and len(seeds) > 1
    seeded = experiment.spec.model_copy(update={"seed": 1234})
    assert choose_seed(seeded) == 1234


def test_pod_delete_carries_its_grace_period(tmp_path: Path) -> None:
    docs = list(yaml.safe_load_all(
        (REPO / "experiments" / "pod-delete-ephemeral.yaml").read_text()))
    docs[1]["spec"]["faults"][0]["sequence"]["steps"][0]["gracePeriod"] = "5s"
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    faults = plan(load_experiment(path).experiment, 1)
    assert [(f.kind, f.grace_period) for f in faults] == [("pod-delete", 5.0),
                                                          ("pod-delete", 0.0)]
    assert faults[0].to_json()["grace_period"] == "5s"


def test_kill_carries_its_grace_period_only_when_it_has_one() -> None:
    """A kill with a gracePeriod is a clean shutdown in place (SIGTERM first); without one
    it is SIGKILL at once, and its plan line is what it always was."""
    base = list(yaml.safe_load_all((DATA / "spec-base.yaml").read_text()))[1]
    base["spec"]["faults"][0]["gracePeriod"] = "5s"
    faults = plan(ChaosExperiment.model_validate(base), 1)
    assert [(f.kind, f.grace_period) for f in faults] == [("kill", 5.0), ("pause", 0.0)]
    assert faults[0].to_json()["grace_period"] == "5s"
    assert "grace_period" not in faults[1].to_json()
    base["spec"]["faults"][0]["gracePeriod"] = "0s"
    (clean, _) = plan(ChaosExperiment.model_validate(base), 1)
    assert clean.grace_period == 0.0 and "grace_period" not in clean.to_json()
