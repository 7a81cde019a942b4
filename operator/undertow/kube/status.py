"""Status of both kinds, computed purely from what the operator observed.

BrokerCluster: ``readyBrokers``, a ``Ready`` condition with reason and message, and
``observedGeneration`` (Strimzi's shape).

ChaosExperiment: a phase machine, one step per observation::

    Pending -> Running -> Healing -> Analyzing -> Completed
       \\          \\         \\           \\-> Failed (analysis failed, no report)
        \\          \\         \\-> Failed (the runner failed; healed first all the same)
         \\-> Failed (invalid spec)

Healing is the operator's own: whatever the runner did or did not recover, every fault
agent and failpoint is cleared and the brokers are ready again before the analysis (or
after ``heal_timeout`` it goes on; the agents' own deadlines still hold).
Conditions: ``Healing`` (True from when healing began, so its lastTransitionTime times
it) and ``Succeeded`` (the verdict matched the expectation).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from undertow.kube.pods import PodView
from undertow.kube.rollout import RolloutDecision
from undertow_history.checker import skipped_text

JobState = Literal["absent", "active", "succeeded", "failed"]
ClusterState = Literal["missing", "not-ready", "busy", "ready"]
Action = Literal["none", "prepare", "start-runner", "heal", "start-analysis", "finish"]
TERMINAL = ("Completed", "Failed")


def timestamp(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_timestamp(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def set_condition(conditions: Sequence[Mapping[str, Any]] | None, kind: str, status: bool,
                  reason: str, message: str, generation: int | None,
                  now: datetime) -> list[dict[str, Any]]:
    """``conditions`` with ``kind`` set; its lastTransitionTime moves only when its status
    changes (metav1.Condition's rule)."""
    value = "True" if status else "False"
    result, found = [], False
    for old in conditions or ():
        if old.get("type") != kind:
            result.append(dict(old))
            continue
        found = True
        since = old.get("lastTransitionTime") if old.get("status") == value else None
        result.append(_condition(kind, value, reason, message, generation,
                                 since or timestamp(now)))
    if not found:
        result.append(_condition(kind, value, reason, message, generation, timestamp(now)))
    return result


def _condition(kind: str, value: str, reason: str, message: str, generation: int | None,
               since: str) -> dict[str, Any]:
    condition = {"type": kind, "status": value, "reason": reason, "message": message,
                 "lastTransitionTime": since}
    if generation is not None:
        condition["observedGeneration"] = generation
    return condition


def find_condition(conditions: Sequence[Mapping[str, Any]] | None,
                   kind: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions or () if c.get("type") == kind), None)


# ---- BrokerCluster --------------------------------------------------------------------------


def cluster_status(*, brokers: int, pods: Sequence[PodView], generation: int | None,
                   conditions: Sequence[Mapping[str, Any]] | None,
                   rollout: RolloutDecision | None, spec_error: str | None,
                   now: datetime) -> dict[str, Any]:
    """``status`` of a BrokerCluster with ``brokers`` desired brokers."""
    ready = sorted(p.node for p in pods if p.ready and p.node and p.node.startswith("broker-"))
    controller_ready = any(p.ready and p.node == "controller" for p in pods)
    if spec_error:
        ok, reason, message = False, "InvalidSpec", spec_error
    elif not controller_ready:
        ok, reason, message = False, "ControllerNotReady", "the controller pod is not ready"
    elif len(ready) < brokers:
        ok, reason = False, "BrokersNotReady"
        message = f"{len(ready)}/{brokers} brokers ready"
    elif rollout is not None and rollout.in_progress:
        ok, reason, message = False, "RollingUpdate", rollout.reason
    else:
        ok, reason, message = True, "AllBrokersReady", f"{brokers}/{brokers} brokers ready"
    return {
        "readyBrokers": len(ready),
        "conditions": set_condition(conditions, "Ready", ok, reason, message, generation, now),
        "observedGeneration": generation,
    }


def cluster_ready(cluster: Mapping[str, Any]) -> bool:
    status = cluster.get("status") or {}
    ready = find_condition(status.get("conditions"), "Ready")
    return bool(ready and ready.get("status") == "True"
                and status.get("readyBrokers") == cluster.get("spec", {}).get("brokers"))


# ---- ChaosExperiment ------------------------------------------------------------------------


@dataclass(frozen=True)
class Observation:
    """What the operator saw of an experiment and everything it depends on."""

    phase: str | None
    spec_error: str | None = None
    cluster: ClusterState = "missing"
    cluster_message: str = ""
    runner: JobState = "absent"
    runner_message: str = ""
    heal_problems: tuple[str, ...] = ()
    brokers_ready: bool = False
    healing_for_s: float = 0.0
    heal_timeout_s: float = 120.0
    analysis: JobState = "absent"
    analysis_message: str = ""
    report: Mapping[str, Any] | None = None
    report_error: str = ""


@dataclass(frozen=True)
class Step:
    phase: str
    action: Action
    reason: str
    message: str
    healed: bool = True
    """Leaving Healing: False when it timed out instead."""


def advance(obs: Observation) -> Step:
    """The experiment's next phase and what the operator must do to get there."""
    phase = obs.phase or "Pending"
    if phase in TERMINAL:
        return Step(phase, "none", "", "")
    if obs.spec_error:
        return Step("Failed", "finish", "InvalidSpec", obs.spec_error)
    if phase == "Pending":
        if obs.cluster == "ready":
            return Step("Running", "start-runner", "Started", "the runner Job is running")
        reason = {"missing": "ClusterNotFound", "not-ready": "WaitingForCluster",
                  "busy": "ClusterBusy"}[obs.cluster]
        return Step("Pending", "prepare", reason, obs.cluster_message)
    if phase == "Running":
        if obs.runner == "active":
            return Step("Running", "none", "Started", "the runner Job is running")
        if obs.runner == "succeeded":
            return Step("Healing", "heal", "RunnerSucceeded", "the runner finished; healing")
        message = obs.runner_message or "the runner Job is gone"
        return Step("Healing", "heal", "RunnerFailed", f"{message}; healing")
    if phase == "Healing":
        healed = not obs.heal_problems and obs.brokers_ready
        if not healed and obs.healing_for_s < obs.heal_timeout_s:
            waiting = "; ".join(obs.heal_problems) or "waiting for every broker to be ready"
            return Step("Healing", "heal", "Healing", waiting)
        if obs.runner != "succeeded":
            return Step("Failed", "finish", "RunnerFailed",
                        obs.runner_message or "the runner Job is gone", healed)
        return Step("Analyzing", "start-analysis", "Analyzing", "the analysis Job is running",
                    healed)
    # Analyzing
    if obs.analysis in ("absent", "active"):
        return Step("Analyzing", "start-analysis" if obs.analysis == "absent" else "none",
                    "Analyzing", "the analysis Job is running")
    if obs.analysis == "failed":
        return Step("Failed", "finish", "AnalysisFailed", obs.analysis_message)
    if obs.report is None:
        return Step("Failed", "finish", "ReportMissing",
                    obs.report_error or "the analysis finished without a report")
    verdict, expect = obs.report.get("verdict"), obs.report.get("expect")
    skipped = obs.report.get("faults_skipped") or []
    if skipped:  # the run did not test the experiment's schedule: not a pass, whatever it found
        return Step("Completed", "finish", "FaultsSkipped",
                    f"verdict {verdict}, expected {expect}, but {len(skipped)} planned "
                    f"fault(s) not injected: {skipped_text(skipped)}")
    return Step("Completed", "finish", "AsExpected" if verdict == expect else "Unexpected",
                f"verdict {verdict}, expected {expect}")


def experiment_status(step: Step, *, previous: Mapping[str, Any], generation: int | None,
                      report: Mapping[str, Any] | None, report_ref: Mapping[str, str],
                      now: datetime) -> dict[str, Any]:
    """The status fields to write after ``step`` (a merge patch of ``status``)."""
    conditions = previous.get("conditions")
    status: dict[str, Any] = {"phase": step.phase, "observedGeneration": generation}
    if step.phase == "Healing":
        conditions = set_condition(conditions, "Healing", True, step.reason, step.message,
                                   generation, now)
    elif previous.get("phase") == "Healing":
        reason, message = ("Healed", "every fault agent and failpoint cleared") if step.healed \
            else ("HealTimeout", "gave up waiting; the fault agents' deadlines still hold")
        conditions = set_condition(conditions, "Healing", False, reason, message, generation,
                                   now)
    if step.phase == "Completed":
        assert report is not None
        status.update(verdict=report.get("verdict"), counts=_counts(report),
                      faults=fault_records(report), reportRef=dict(report_ref))
        conditions = set_condition(conditions, "Succeeded", step.reason == "AsExpected",
                                   step.reason, step.message, generation, now)
    elif step.phase == "Failed":
        conditions = set_condition(conditions, "Succeeded", False, step.reason, step.message,
                                   generation, now)
    status["conditions"] = conditions or []
    return status


def _counts(report: Mapping[str, Any]) -> dict[str, int]:
    return {k: int(v) for k, v in (report.get("counts") or {}).items()
            if isinstance(v, int | float)}


def fault_records(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One record per fault window of the report: what, on whom, chosen how, and when."""
    records = []
    for fault in report.get("faults") or []:
        record = {"fault": str(fault.get("fault")), "target": str(fault.get("target"))}
        if fault.get("role"):
            record["role"] = str(fault["role"])
        for key, field in (("start", "injectedAt"), ("end", "recoveredAt")):
            if isinstance(fault.get(key), int | float):
                record[field] = timestamp(datetime.fromtimestamp(fault[key], UTC))
        records.append(record)
    return records


def healing_for(conditions: Sequence[Mapping[str, Any]] | None, now: datetime) -> float:
    """Seconds since healing began (0 when it has not)."""
    healing = find_condition(conditions, "Healing")
    if not healing or healing.get("status") != "True" or not healing.get("lastTransitionTime"):
        return 0.0
    return max(0.0, (now - parse_timestamp(healing["lastTransitionTime"])).total_seconds())
