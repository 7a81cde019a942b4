"""The small experiment the runner's end-to-end tests run: three brokers with short timeouts,
one producer and one consumer at 100 records/s, acks=all, and a fault schedule of the test's
choosing (by default one leader kill), expecting clean."""

from __future__ import annotations

from pathlib import Path

LEADER_KILL = """\
    - kind: kill
      target: {role: leader}
      at: 1s
      duration: 2s"""

_TEMPLATE = """
apiVersion: undertow.dev/v1alpha1
kind: BrokerCluster
metadata: {{name: small}}
spec:
  brokers: 3
  config:
    min.insync.replicas: 2
    replica.lag.time.max.ms: 1500
    broker.session.timeout.ms: 1500
---
apiVersion: undertow.dev/v1alpha1
kind: ChaosExperiment
metadata: {{name: {name}}}
spec:
  cluster: {{ref: small}}
  topic: {{name: t, partitions: 2, replicationFactor: 3}}
  workload: {{producers: 1, consumers: 1, acks: all, retries: 0, rate: 100,
             duration: {duration}}}
  faults:
{faults}
  expect: clean
"""


def small_experiment(name: str, duration: str = "5s", faults: str = LEADER_KILL) -> str:
    """The experiment's YAML; `faults` is the indented list under `faults:`."""
    return _TEMPLATE.format(name=name, duration=duration, faults=faults)


def write_small_experiment(path: Path, name: str, duration: str = "5s",
                           faults: str = LEADER_KILL) -> Path:
    path.write_text(small_experiment(name, duration, faults))
    return path
