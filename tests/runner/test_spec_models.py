"""The spec models themselves: selector defaults, config rendering, dump round trips."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from undertow.spec import load_experiment
from undertow.spec.cluster import BrokerConfig
from undertow.spec.experiment import ChaosExperiment, ChaosExperimentStatus
from undertow.spec.faults import TargetSelector

REPO = Path(__file__).resolve().parents[2]
FILES = sorted((REPO / "experiments").glob("*.yaml")) + sorted(
    (Path(__file__).parent / "data").glob("spec-*.yaml")
)


@pytest.mark.parametrize(
    ("selector", "partition", "mode", "described"),
    [
        ({"role": "leader"}, 0, "one", "leader of p0"),
        ({"role": "follower", "partition": 3}, 3, "one", "follower of p3"),
        ({"role": "follower", "mode": "all"}, 0, "all", "all followers of p0"),
        ({"role": "all-isr-but-one"}, 0, "all", "all-isr-but-one of p0"),
        ({"role": "isr-member", "mode": "fixed", "value": 2}, 0, "fixed", "2 isr-members of p0"),
        (
            {"role": "isr-member", "mode": "fixed-percent", "value": 50},
            0,
            "fixed-percent",
            "50% of isr-members of p0",
        ),
        ({"role": "controller"}, None, None, "controller"),
        ({"broker": 2}, None, None, "broker 2"),
    ],
)
def test_selector_defaults_and_description(
    selector: dict, partition: int | None, mode: str | None, described: str
) -> None:
    parsed = TargetSelector.model_validate(selector)
    assert parsed.partition == partition
    assert parsed.mode == mode
    assert parsed.describe() == described


def test_config_renders_kafka_overrides() -> None:
    config = BrokerConfig.model_validate(
        {
            "min.insync.replicas": 2,
            "unclean.leader.election.enable": True,
            "replication.truncation.mode": "high-watermark",
        }
    )
    assert config.as_overrides() == {
        "min.insync.replicas": "2",
        "unclean.leader.election.enable": "true",
        "replication.truncation.mode": "high-watermark",
    }


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_dump_round_trips(path: Path) -> None:
    """The spec as run (meta.json) reloads to the same experiment, durations as strings."""
    experiment = load_experiment(path).experiment
    dumped = experiment.model_dump(mode="json", by_alias=True, exclude_none=True)
    text = json.dumps(dumped)
    assert '"duration": 30.0' not in text
    assert ChaosExperiment.model_validate(json.loads(text)) == experiment


def test_dump_writes_durations_canonically() -> None:
    experiment = load_experiment(REPO / "experiments" / "hw-truncation-double-crash.yaml")
    dumped = experiment.experiment.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    sequence = dumped["faults"][0]["sequence"]
    assert sequence["at"] == "4s"
    assert sequence["every"] == "12s"
    assert sequence["steps"][1]["after"] == "1s"
    assert sequence["steps"][1]["timeout"] == "30s"
    assert dumped["workload"]["requestTimeout"] == "5s"


def test_status_reads_operator_output() -> None:
    status = ChaosExperimentStatus.model_validate(
        {
            "phase": "Completed",
            "verdict": "loss",
            "counts": {"acked": 100, "lost": 3},
            "faults": [
                {
                    "fault": "kill",
                    "target": "broker-1",
                    "role": "leader of p0",
                    "injectedAt": "2025-11-22T10:00:00Z",
                    "recoveredAt": "2025-11-22T10:00:04Z",
                }
            ],
            "conditions": [{"type": "Ready", "status": "True", "observedGeneration": 2}],
            "reportRef": {"name": "acks1-report"},
            "observedGeneration": 2,
        }
    )
    assert status.counts == {"acked": 100, "lost": 3}
    assert status.faults is not None
    record = status.faults[0]
    assert record.recovered_at is not None and record.injected_at is not None
    assert (record.recovered_at - record.injected_at).total_seconds() == 4
    assert status.report_ref is not None and status.report_ref.kind == "ConfigMap"
    dumped = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert dumped["faults"][0]["injectedAt"].startswith("2025-11-22T10:00:00")
    assert dumped["reportRef"] == {"kind": "ConfigMap", "name": "acks1-report"}
