"""`spec.explore`: the fault space block of ChaosExperiment, validated like the rest of the
spec (one error naming the field), in the CRD, and ignored by the planner."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from explore_experiments import WriteExperiment, experiment_docs

from undertow.spec import SpecError, load_experiment, plan
from undertow.spec.crd import crds
from undertow.spec.experiment import ChaosExperiment

FULL = {
    "kinds": ["kill", "power-loss", "partition"],
    "targets": [{"role": "leader"}, {"role": "follower", "mode": "all"}],
    "faults": {"min": 1, "max": 3},
    "duration": {"min": "500ms", "max": "4s"},
    "gap": {"min": "1s", "max": 6},
    "partitionModes": ["isolate"],
}


def test_a_full_block_loads(write_experiment_file: WriteExperiment) -> None:
    explore = load_experiment(write_experiment_file(explore=FULL)).experiment.spec.explore
    assert explore is not None
    assert explore.kinds == ["kill", "power-loss", "partition"]
    assert [t.describe() for t in explore.targets or []] == ["leader of p0", "all followers of p0"]
    assert explore.fault_bounds() == (1, 3)
    assert explore.duration_bounds() == (0.5, 4.0)
    assert explore.gap_bounds() == (1.0, 6.0)
    assert explore.partition_modes == ["isolate"]


def test_every_field_is_optional(write_experiment_file: WriteExperiment) -> None:
    explore = load_experiment(write_experiment_file(explore={})).experiment.spec.explore
    assert explore is not None
    assert (explore.fault_bounds(), explore.duration_bounds(), explore.gap_bounds()) == (
        (1, 4), (1.0, 8.0), (0.5, 10.0))


def test_the_block_is_not_the_schedule(write_experiment_file: WriteExperiment) -> None:
    """`undertow run` injects `faults` only: the explored targets plan nothing and give no
    consumer links of its own."""
    path = write_experiment_file(
        explore={"kinds": ["partition"], "targets": [{"consumer": 0}]},
        faults=[{"kind": "kill", "target": {"role": "leader"}, "at": "1s", "duration": "1s"}])
    spec = load_experiment(path).experiment.spec
    assert [p.kind for p in plan(spec, 1)] == ["kill"]
    assert spec.own_link_clients() == ()


def test_dump_round_trips(write_experiment_file: WriteExperiment) -> None:
    experiment = load_experiment(write_experiment_file(explore=FULL)).experiment
    dumped = json.loads(json.dumps(experiment.model_dump(mode="json", by_alias=True,
                                                         exclude_none=True)))
    assert dumped["spec"]["explore"]["duration"] == {"min": "500ms", "max": "4s"}
    assert ChaosExperiment.model_validate(dumped) == experiment


CASES: list[tuple[str, dict[str, Any], str]] = [
    ("count-order", {"explore": {"faults": {"min": 3, "max": 2}}},
     "spec.explore.faults.max: 2 is below min 3"),
    ("count-zero", {"explore": {"faults": {"min": 0, "max": 2}}},
     "spec.explore.faults.min: expected greater than or equal to 1, got 0"),
    ("duration-zero", {"explore": {"duration": {"min": 0, "max": "2s"}}},
     "spec.explore.duration.min: must be positive: a fault that lasts no time is never "
     "injected"),
    ("gap-order", {"explore": {"gap": {"min": "2s", "max": "1s"}}},
     "spec.explore.gap.max: 1s is below min 2s"),
    ("bad-duration", {"explore": {"gap": {"min": "2q", "max": "1s"}}},
     "spec.explore.gap.min: invalid duration '2q': expected e.g. '500ms', '30s', '1m30s'"),
    ("split", {"explore": {"partitionModes": ["isolate", "split"]}},
     "spec.explore.partitionModes[1]: split is not explored yet: only isolate partitions are "
     "drawn (split and one-way need a far side)"),
    ("unknown-key", {"explore": {"count": 3}},
     "spec.explore.count: unknown field 'count'; expected one of: kinds, targets, faults, "
     "duration, gap, partitionModes, delay"),
    ("delay-without-range", {"explore": {"kinds": ["kill", "delay"]}},
     "spec.explore.kinds[1]: a drawn delay needs `delay: {latency: {min, max}}` to draw its "
     "latency from"),
    ("range-without-delay",
     {"explore": {"kinds": ["kill"], "delay": {"latency": {"min": "10ms", "max": "1s"}}}},
     "spec.explore.delay: only with delay among `kinds`: nothing draws it"),
    ("delay-jitter-above-latency",
     {"explore": {"kinds": ["delay"], "delay": {"latency": {"min": "10ms", "max": "1s"},
                                                "jitter": {"min": "0s", "max": "20ms"}}}},
     "spec.explore.delay.jitter.max: 20ms is above the least latency 10ms: a packet could "
     "arrive before it was sent"),
    ("delay-of-nothing",
     {"explore": {"kinds": ["delay"], "delay": {"latency": {"min": "0s", "max": "1s"}}}},
     "spec.explore.delay.latency.min: must be positive: a delay of no time slows nothing"),
    ("bad-kind", {"explore": {"kinds": ["explode"]}},
     "spec.explore.kinds[0]: expected 'kill', 'pause', 'partition', 'delay', 'disk-stall', "
     "'disk-full', 'power-loss' or 'pod-delete', got 'explode'"),
    ("kind-without-target",
     {"explore": {"kinds": ["kill", "power-loss"], "targets": [{"role": "controller"}]}},
     "spec.explore.kinds[1]: no target in 'targets' can take a power-loss: power-loss is a "
     "broker failpoint; the controller has none"),
    ("target-without-kind",
     {"explore": {"kinds": ["kill"], "targets": [{"role": "leader"}, {"consumer": 0}]}},
     "spec.explore.targets[1]: no kind in 'kinds' can hit it: a consumer or producer can "
     "only be the target of a partition or delay of mode isolate (its links to every broker "
     "cut or slowed) or one-way (its packets to the `to` broker), and a producer also of a "
     "pause (SIGSTOP of its own process)"),
    ("client-far-side",
     {"explore": {"kinds": ["delay"], "targets": [{"producer": 0}],
                  "delay": {"latency": {"min": "1s", "max": "2s"}, "to": [{"consumer": 0}]}}},
     "spec.explore.delay.to[0]: the far side of a one-way delay is a broker (clients reach "
     "brokers only)"),
    ("no-txn-coordinator",
     {"explore": {"kinds": ["delay"], "targets": [{"producer": 0}],
                  "delay": {"latency": {"min": "1s", "max": "2s"},
                            "to": [{"role": "txn-coordinator"}]}}},
     "spec.explore.delay.to[0].role: txn-coordinator needs transactional producers "
     "(workload.transactions)"),
    ("no-follower", {"replication_factor": 1, "explore": {"targets": [{"role": "follower"}]}},
     "spec.explore.targets[0].role: no follower can exist with replicationFactor 1"),
    ("no-broker", {"explore": {"targets": [{"broker": 5}]}},
     "spec.explore.targets[0].broker: broker 5 does not exist: BrokerCluster/three has "
     "brokers 0..2"),
    ("no-group", {"explore": {"targets": [{"role": "group-coordinator"}]}},
     "spec.explore.targets[0].role: group-coordinator needs a consumer group "
     "(workload.consumer.mode: subscribe)"),
    ("too-many-to-fit", {"duration": "30s",
                         "explore": {"faults": {"min": 3, "max": 4}, "gap": {"min": "10s",
                                                                             "max": "12s"}}},
     "spec.explore.faults.min: 3 fault(s) starting 10s apart do not all start before the "
     "workload ends (workload.duration 30s)"),
    ("default-gaps-do-not-fit", {"duration": "2s", "explore": {"faults": {"min": 4, "max": 4}}},
     "spec.explore.faults.min: 4 fault(s) starting 500ms apart do not all start before the "
     "workload ends (workload.duration 2s)"),
    ("gap-too-long", {"duration": "5s", "explore": {"gap": {"min": "5s", "max": "6s"}}},
     "spec.explore.gap.min: 1 fault(s) starting 5s apart do not all start before the "
     "workload ends (workload.duration 5s)"),
]


@pytest.mark.parametrize(("change", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_one_clear_error(write_experiment_file: WriteExperiment, change: dict[str, Any],
                         message: str) -> None:
    path = write_experiment_file(**change)
    with pytest.raises(SpecError) as info:
        load_experiment(path)
    assert str(info.value) == f"{path}: ChaosExperiment/explored: {message}"


def _crd_validator() -> jsonschema.Draft4Validator:
    crd = crds()["chaosexperiments.undertow.dev.yaml"]
    return jsonschema.Draft4Validator(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def test_the_crd_takes_the_block() -> None:
    _, experiment = experiment_docs(explore=FULL)
    assert list(_crd_validator().iter_errors(experiment)) == []


@pytest.mark.parametrize(("field", "value", "keyword"), [
    ("kinds", ["explode"], "enum"),
    ("kinds", [], "minItems"),
    ("faults", {"min": 1}, "required"),
    ("gap", {"min": "1q", "max": "2s"}, "pattern"),
    ("partitionModes", ["sideways"], "enum"),
])
def test_the_crd_rejects_bad_values(field: str, value: Any, keyword: str) -> None:
    _, experiment = experiment_docs(explore={**FULL, field: value})
    assert [e.validator for e in _crd_validator().iter_errors(experiment)] == [keyword]


def test_the_committed_crd_has_the_block() -> None:
    committed = (Path(__file__).resolve().parents[2] / "manifests" / "crds"
                 / "chaosexperiments.undertow.dev.yaml").read_text()
    assert "partitionModes:" in committed
