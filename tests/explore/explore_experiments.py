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


TINY_CLUSTER: dict[str, Any] = {
    "apiVersion": "undertow.dev/v1alpha1", "kind": "BrokerCluster", "metadata": {"name": "tiny"},
    "spec": {"brokers": 3, "config": {
        "min.insync.replicas": 1, "broker.session.timeout.ms": 1500,
        "replica.lag.time.max.ms": 3000,
        # A follower's fetch waits 500 ms on the leader: acks=1 records the followers
        # have not fetched are always there when the leader dies.
        "replica.fetch.min.bytes": 1048576, "replica.fetch.wait.max.ms": 500}}}
TINY_ACKS1: dict[str, Any] = {
    "apiVersion": "undertow.dev/v1alpha1", "kind": "ChaosExperiment",
    "metadata": {"name": "tiny-acks1"},
    "spec": {"cluster": {"ref": "tiny"},
             "topic": {"name": "t", "partitions": 1, "replicationFactor": 3},
             "workload": {"producers": 1, "consumers": 1, "acks": 1, "rate": 100,
                          "duration": "6s"},
             "explore": {"kinds": ["kill"], "targets": [{"role": "leader"}],
                         "faults": {"min": 1, "max": 2},
                         "duration": {"min": "2s", "max": "3s"},
                         "gap": {"min": "500ms", "max": "1s"}},
             "expect": "loss"}}
"""A small lossy pair for end-to-end explores: every leader kill loses acks=1 records (the
explorer's command tests)."""
