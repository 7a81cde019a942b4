"""The small experiment the runner's end-to-end tests run: three brokers with short timeouts,
one producer and one consumer at 100 records/s, acks=all, and a fault schedule of the test's
choosing (by default one leader kill), expecting clean. A test that needs another shape
(the cluster's config, the topic, the workload, the names, the expectation) says only what
differs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

LEADER_KILL = """\
    - kind: kill
      target: {role: leader}
      at: 1s
      duration: 2s"""

SMALL_CONFIG: Mapping[str, object] = {
    "min.insync.replicas": 2,
    "replica.lag.time.max.ms": 1500,
    "broker.session.timeout.ms": 1500,
}
"""The BrokerCluster's config unless a test gives its own."""
SMALL_WORKLOAD: Mapping[str, object] = {
    "producers": 1, "consumers": 1, "acks": "all", "retries": 0, "rate": 100}
"""The workload (with the duration given apart) that a test's `workload` changes."""

_TEMPLATE = """
apiVersion: undertow.dev/v1alpha1
kind: BrokerCluster
metadata: {{name: {cluster}}}
spec:
  brokers: 3
  config: {config}
---
apiVersion: undertow.dev/v1alpha1
kind: ChaosExperiment
metadata: {{name: {name}}}
spec:
  cluster: {{ref: {cluster}}}
  topic: {{name: {topic}, partitions: {partitions}, replicationFactor: 3}}
  workload: {workload}
  faults:
{faults}
  expect: {expect}
"""


def _flow(mapping: Mapping[str, object]) -> str:
    """A YAML flow mapping of plain scalars: {a: 1, b: all}."""
    return "{" + ", ".join(f"{key}: {value}" for key, value in mapping.items()) + "}"


def small_experiment(name: str, duration: str = "5s", faults: str = LEADER_KILL, *,
                     cluster: str = "small", config: Mapping[str, object] = SMALL_CONFIG,
                     topic: str = "t", partitions: int = 2,
                     workload: Mapping[str, object] | None = None,
                     expect: str = "clean") -> str:
    """The experiment's YAML; `faults` is the indented list under `faults:`, `config` the
    BrokerCluster's whole config, `workload` what differs from SMALL_WORKLOAD (recordSize,
    say), `cluster` the BrokerCluster's name."""
    return _TEMPLATE.format(
        name=name, cluster=cluster, config=_flow(config), topic=topic, partitions=partitions,
        workload=_flow({**SMALL_WORKLOAD, "duration": duration, **(workload or {})}),
        faults=faults, expect=expect)


def write_small_experiment(path: Path, name: str, duration: str = "5s",
                           faults: str = LEADER_KILL) -> Path:
    path.write_text(small_experiment(name, duration, faults))
    return path
