"""Experiment files for the explorer's tests: a three-broker cluster and an experiment whose
topic, faults and `explore` block each test chooses."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"

WriteExperiment = Callable[..., Path]
"""The `write_experiment_file` fixture: `experiment_docs` keywords in, a file's path out."""


def experiment_docs(*, replication_factor: int = 3, duration: str = "30s",
                    faults: list[dict[str, Any]] | None = None,
                    explore: dict[str, Any] | None = None,
                    workload: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The BrokerCluster and ChaosExperiment documents, as a file holds them."""
    spec: dict[str, Any] = {
        "cluster": {"ref": "three"},
        "topic": {"name": "t", "replicationFactor": replication_factor},
        "workload": {"acks": "all", "duration": duration, **(workload or {})},
        "faults": faults or [],
        "expect": "clean",
    }
    if explore is not None:
        spec["explore"] = explore
    return [
        {"apiVersion": "undertow.dev/v1alpha1", "kind": "BrokerCluster",
         "metadata": {"name": "three"}, "spec": {"brokers": 3}},
        {"apiVersion": "undertow.dev/v1alpha1", "kind": "ChaosExperiment",
         "metadata": {"name": "explored"}, "spec": spec},
    ]
