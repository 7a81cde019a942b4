"""Faults as the runner gets them: one `spec.faults` entry of an experiment, validated as
when the file is loaded and expanded by the planner, for the tests that build fault units."""

from __future__ import annotations

from typing import Any

from undertow.spec import plan
from undertow.spec.experiment import ChaosExperimentSpec
from undertow.spec.schedule import PlannedFault


def experiment(*faults: dict[str, Any], topic: str = "t") -> ChaosExperimentSpec:
    """A three-broker experiment on `topic` with these `spec.faults` entries, validated."""
    return ChaosExperimentSpec.model_validate({
        "cluster": {"inline": {"brokers": 3}},
        "topic": {"name": topic, "replicationFactor": 3},
        "workload": {"duration": "1h", "consumers": 3},
        "faults": list(faults),
        "expect": "clean",
    })


KIND_SETTINGS: dict[str, dict[str, Any]] = {"delay": {"delay": {"latency": "200ms"}}}
"""What a kind needs besides its target and duration, for the tests of every kind."""


def planned(fault: dict[str, Any]) -> PlannedFault:
    """The one planned fault of an entry such as ``{"kind": "kill", "target": {"role":
    "leader"}}`` (``duration`` defaults to 1m: the tests give units their own time limit;
    a kind's other settings to ``KIND_SETTINGS``)."""
    (only,) = plan(experiment({"duration": "1m", **KIND_SETTINGS.get(fault["kind"], {}),
                               **fault}), seed=0)
    return only
