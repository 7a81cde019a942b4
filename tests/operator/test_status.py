"""Status: the Ready condition of a BrokerCluster and the experiment's phase machine."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from undertow.kube.pods import PodView
from undertow.kube.rollout import RolloutDecision
from undertow.kube.status import (
    Observation,
    Step,
    advance,
    cluster_status,
    experiment_status,
    healing_for,
    set_condition,
)

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def pod(node: str, ready: bool = True) -> PodView:
    return PodView(name=f"c-{node}", node=node, component=None, ready=ready,
                   terminating=False, running=True, revision=None, ip=None, uid=None,
                   restarts=0)


def test_a_condition_keeps_its_transition_time_while_its_status_holds() -> None:
    first = set_condition(None, "Ready", False, "BrokersNotReady", "1/3", 1, NOW)
    later = NOW + timedelta(minutes=5)
    same = set_condition(first, "Ready", False, "BrokersNotReady", "2/3", 2, later)
    assert same[0]["lastTransitionTime"] == "2026-01-02T03:04:05Z"
    assert (same[0]["message"], same[0]["observedGeneration"]) == ("2/3", 2)
    flipped = set_condition(same, "Ready", True, "AllBrokersReady", "3/3", 2, later)
    assert flipped[0]["lastTransitionTime"] == "2026-01-02T03:09:05Z"
    assert len(set_condition(flipped, "Other", True, "R", "m", 2, later)) == 2


@pytest.mark.parametrize(("pods", "rollout", "error", "ready", "reason", "message"), [
    ([pod("controller"), pod("broker-0"), pod("broker-1")], None, None, True,
     "AllBrokersReady", "2/2 brokers ready"),
    ([pod("controller"), pod("broker-0"), pod("broker-1", False)], None, None, False,
     "BrokersNotReady", "1/2 brokers ready"),
    ([pod("controller", False), pod("broker-0"), pod("broker-1")], None, None, False,
     "ControllerNotReady", "the controller pod is not ready"),
    ([pod("controller"), pod("broker-0"), pod("broker-1")],
     RolloutDecision("restart", 1, "broker-1 runs an old configuration"), None, False,
     "RollingUpdate", "broker-1 runs an old configuration"),
    ([], None, "spec.brokers: required", False, "InvalidSpec", "spec.brokers: required"),
])
def test_cluster_ready_condition(pods: list[PodView], rollout: RolloutDecision | None,
                                 error: str | None, ready: bool, reason: str,
                                 message: str) -> None:
    status = cluster_status(brokers=2, pods=pods, generation=4, conditions=None,
                            rollout=rollout, spec_error=error, now=NOW)
    (condition,) = status["conditions"]
    assert (condition["status"] == "True", condition["reason"], condition["message"]) == (
        ready, reason, message)
    assert status["observedGeneration"] == 4
    assert status["readyBrokers"] == sum(p.ready for p in pods if p.node != "controller")


@pytest.mark.parametrize(("obs", "phase", "action", "reason"), [
    (Observation(None, cluster="missing"), "Pending", "prepare", "ClusterNotFound"),
    (Observation("Pending", cluster="busy"), "Pending", "prepare", "ClusterBusy"),
    (Observation("Pending", cluster="ready"), "Running", "start-runner", "Started"),
    (Observation("Pending", spec_error="bad"), "Failed", "finish", "InvalidSpec"),
    (Observation("Running", runner="active"), "Running", "none", "Started"),
    (Observation("Running", runner="succeeded"), "Healing", "heal", "RunnerSucceeded"),
    (Observation("Running", runner="failed"), "Healing", "heal", "RunnerFailed"),
    (Observation("Running", runner="absent"), "Healing", "heal", "RunnerFailed"),
    (Observation("Healing", runner="succeeded", brokers_ready=True), "Analyzing",
     "start-analysis", "Analyzing"),
    (Observation("Healing", runner="succeeded", brokers_ready=False), "Healing", "heal",
     "Healing"),
    (Observation("Healing", runner="succeeded", heal_problems=("broker-1: HTTP 500",),
                 brokers_ready=True), "Healing", "heal", "Healing"),
    (Observation("Healing", runner="succeeded", healing_for_s=121), "Analyzing",
     "start-analysis", "Analyzing"),
    (Observation("Healing", runner="failed", brokers_ready=True), "Failed", "finish",
     "RunnerFailed"),
    (Observation("Analyzing", analysis="absent"), "Analyzing", "start-analysis", "Analyzing"),
    (Observation("Analyzing", analysis="active"), "Analyzing", "none", "Analyzing"),
    (Observation("Analyzing", analysis="failed"), "Failed", "finish", "AnalysisFailed"),
    (Observation("Analyzing", analysis="succeeded"), "Failed", "finish", "ReportMissing"),
    (Observation("Analyzing", analysis="succeeded",
                 report={"verdict": "loss", "expect": "loss"}), "Completed", "finish",
     "AsExpected"),
    (Observation("Analyzing", analysis="succeeded",
                 report={"verdict": "loss", "expect": "clean"}), "Completed", "finish",
     "Unexpected"),
    (Observation("Completed"), "Completed", "none", ""),
])
def test_phase_machine(obs: Observation, phase: str, action: str, reason: str) -> None:
    step = advance(obs)
    assert (step.phase, step.action, step.reason) == (phase, action, reason)


def test_healing_is_timed_from_its_condition_and_ends_with_a_reason() -> None:
    healing = experiment_status(Step("Healing", "heal", "Healing", "waiting"),
                                previous={"phase": "Running"}, generation=1, report=None,
                                report_ref={}, now=NOW)
    assert healing_for(healing["conditions"], NOW + timedelta(seconds=42)) == 42
    timed_out = experiment_status(
        Step("Analyzing", "start-analysis", "Analyzing", "", healed=False),
        previous={"phase": "Healing", "conditions": healing["conditions"]}, generation=1,
        report=None, report_ref={}, now=NOW)
    (condition,) = timed_out["conditions"]
    assert (condition["status"], condition["reason"]) == ("False", "HealTimeout")
    assert healing_for(timed_out["conditions"], NOW) == 0


def test_completed_status_carries_the_report() -> None:
    report = {"verdict": "clean", "expect": "clean", "counts": {"acked": 10, "lost": 0},
              "faults": [{"fault": "pause", "target": "broker-0", "role": None, "start": 0.5,
                          "end": 2.0}]}
    status = experiment_status(Step("Completed", "finish", "AsExpected", "verdict clean"),
                               previous={"phase": "Analyzing"}, generation=3, report=report,
                               report_ref={"kind": "ConfigMap", "name": "e-report"}, now=NOW)
    assert status["verdict"] == "clean" and status["counts"] == {"acked": 10, "lost": 0}
    assert status["faults"] == [{"fault": "pause", "target": "broker-0",
                                 "injectedAt": "1970-01-01T00:00:00Z",
                                 "recoveredAt": "1970-01-01T00:00:02Z"}]
    assert status["conditions"][0]["type"] == "Succeeded"
    assert status["conditions"][0]["status"] == "True"
