"""The ChaosExperiment reconciler: what the operator does for an experiment.

``advance_experiment`` observes the experiment, its cluster and its Jobs, lets
``status.advance`` decide the next step of the phase machine and takes it (the inline
cluster, the runner's and the analysis' Jobs from ``experiment_objects``);
``cleanup_experiment`` stops it when it is deleted. Healing the cluster and releasing its
lock are the BrokerCluster reconciler's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from undertow.kube import status as st
from undertow.kube.api import ApiError, KubeApi
from undertow.kube.cluster_objects import ANNOTATION_LOCK, ClusterNames
from undertow.kube.cluster_reconciler import BrokerClusterReconciler, cluster_spec
from undertow.kube.config import OperatorConfig
from undertow.kube.experiment_objects import (
    REPORT_KEY,
    ExperimentNames,
    analysis_job,
    experiment_names,
    experiment_setup,
    inline_cluster,
    runner_job,
)
from undertow.kube.objects import check_name
from undertow.kube.reconcile import Reconciler, source_of, utc_now
from undertow.platform.base import PlatformError
from undertow.spec import ChaosExperiment, SpecError, parse_document
from undertow.spec.errors import format_loc
from undertow.spec.experiment import check_against_cluster, check_stock_clients
from undertow.spec.meta import FieldError


class ChaosExperimentReconciler(Reconciler):
    """Reconciles ChaosExperiments: their phase machine, their Jobs and their deletion."""

    def __init__(self, api: KubeApi, config: OperatorConfig, clusters: BrokerClusterReconciler,
                 clock: Callable[[], datetime] = utc_now) -> None:
        super().__init__(api, config, clock)
        self.clusters = clusters
        """Heals the experiment's cluster and releases it."""

    def advance_experiment(self, body: Mapping[str, Any]) -> tuple[st.Step, dict[str, Any]]:
        """Observe, decide (``status.advance``), act; return the step and the status patch."""
        previous = body.get("status") or {}
        phase = previous.get("phase")
        names = experiment_names(body)
        if phase in st.TERMINAL:
            return st.Step(phase, "none", "", ""), {}
        experiment, cluster, cluster_name, obs = self._observe(body, names, previous)
        step = st.advance(obs)
        seed = previous.get("seed")
        if step.action == "prepare" and experiment is not None \
                and experiment.spec.cluster.inline is not None and cluster is None:
            self.api.apply(inline_cluster(body))
        elif step.action == "start-runner" and experiment is not None and cluster is not None:
            seed = seed if seed is not None else experiment_seed(experiment,
                                                                 body["metadata"]["uid"])
            if not self._start_runner(body, names, experiment, cluster, seed):
                step = st.Step("Pending", "none", "ClusterBusy",
                               f"BrokerCluster {cluster_name} was taken by another experiment")
        elif step.action == "heal" and phase != "Healing" and cluster_name:
            self.clusters.heal_cluster(ClusterNames(cluster_name, names.namespace),
                                       _brokers(cluster))
        elif step.action == "start-analysis":
            self._create(analysis_job(body, self.config.images, self.config.jobs))
        elif step.action == "finish" and cluster_name:
            self.clusters.release_cluster(names.namespace, cluster_name, names.experiment)
        patch = st.experiment_status(
            step, previous=previous, generation=body["metadata"].get("generation"),
            report=obs.report, report_ref={"kind": "ConfigMap", "name": names.report,
                                           "key": REPORT_KEY}, now=self.clock())
        if seed is not None:
            patch["seed"] = seed
        return step, patch

    def _observe(self, body: Mapping[str, Any], names: ExperimentNames,
                 previous: Mapping[str, Any],
                 ) -> tuple[ChaosExperiment | None, dict[str, Any] | None, str | None,
                            st.Observation]:
        phase = previous.get("phase")
        try:
            check_name(names.experiment, "ChaosExperiment")
            experiment = parse_document(dict(body), source_of(body), 0).resource
            assert isinstance(experiment, ChaosExperiment)
        except (SpecError, ValueError) as exc:
            return None, None, None, st.Observation(phase, spec_error=str(exc))
        cluster_name = experiment.spec.cluster.ref or names.experiment
        cluster = self.api.get("BrokerCluster", names.namespace, cluster_name)
        fields: dict[str, Any] = {"phase": phase, "heal_timeout_s": self.config.heal_timeout_s}
        if cluster is None:
            fields.update(cluster="missing",
                          cluster_message=f"no BrokerCluster {cluster_name} in "
                                          f"{names.namespace}")
        else:
            try:
                cluster_model = cluster_spec(cluster)
                check_against_cluster(experiment.spec, cluster_model,
                                      f"BrokerCluster/{cluster_name}")
                check_stock_clients(experiment.spec)
            except SpecError as exc:
                fields["spec_error"] = f"BrokerCluster/{cluster_name}: {exc}"
            except FieldError as exc:
                fields["spec_error"] = f"{format_loc(('spec', *exc.loc))}: {exc.message}"
            lock = (cluster["metadata"].get("annotations") or {}).get(ANNOTATION_LOCK)
            if lock and lock != names.experiment:
                fields.update(cluster="busy", cluster_message=f"experiment {lock} is running "
                                                              f"on BrokerCluster {cluster_name}")
            elif not st.cluster_ready(cluster):
                fields.update(cluster="not-ready",
                              cluster_message=f"BrokerCluster {cluster_name} is not ready")
            else:
                fields["cluster"] = "ready"
        fields["runner"], fields["runner_message"] = job_state(
            self.api.get("Job", names.namespace, names.runner), "runner")
        if phase == "Healing":
            heal = self.clusters.heal_cluster(ClusterNames(cluster_name, names.namespace),
                                              _brokers(cluster))
            fields.update(heal_problems=heal.problems, brokers_ready=heal.brokers_ready,
                          healing_for_s=st.healing_for(previous.get("conditions"),
                                                       self.clock()))
        if phase == "Analyzing":
            fields["analysis"], fields["analysis_message"] = job_state(
                self.api.get("Job", names.namespace, names.analysis), "analysis")
            if fields["analysis"] == "succeeded":
                fields["report"], fields["report_error"] = self._report(names)
        return experiment, cluster, cluster_name, st.Observation(**fields)

    def _start_runner(self, body: Mapping[str, Any], names: ExperimentNames,
                      experiment: ChaosExperiment, cluster: Mapping[str, Any],
                      seed: int) -> bool:
        """Take the cluster, then create the runner's objects; False when it was taken."""
        cluster_name = cluster["metadata"]["name"]
        lock: dict[str, Any] = {"annotations": {ANNOTATION_LOCK: names.experiment}}
        if cluster["metadata"].get("resourceVersion"):
            # Optimistic concurrency: two experiments racing for the cluster cannot both win.
            lock["resourceVersion"] = cluster["metadata"]["resourceVersion"]
        try:
            self.api.patch("BrokerCluster", names.namespace, cluster_name, {"metadata": lock})
        except ApiError as exc:
            if exc.status == 409:
                return False
            raise
        for obj in experiment_setup(body, cluster if experiment.spec.cluster.ref else None,
                                    cluster_name, _brokers(cluster), self.config.jobs):
            self._create(obj)
        self._create(runner_job(body, cluster_name, seed, experiment.spec.workload.duration,
                                self.config.images, self.config.jobs))
        return True

    def _report(self, names: ExperimentNames) -> tuple[dict[str, Any] | None, str]:
        config_map = self.api.get("ConfigMap", names.namespace, names.report)
        text = ((config_map or {}).get("data") or {}).get(REPORT_KEY)
        if not text:
            return None, f"ConfigMap {names.report} has no {REPORT_KEY}"
        try:
            report = json.loads(text)
        except ValueError as exc:
            return None, f"ConfigMap {names.report}: {REPORT_KEY} is not JSON ({exc})"
        if not isinstance(report, dict) or report.get("verdict") not in ("clean", "loss",
                                                                          "anomalies"):
            return None, f"ConfigMap {names.report}: {REPORT_KEY} has no verdict"
        return report, ""

    def cleanup_experiment(self, body: Mapping[str, Any]) -> list[str]:
        """On deletion: stop the runner, heal every fault, release the cluster.

        Never raises: the finalizer must come off whatever is already gone or broken
        (problems are returned for the log; the agents' deadlines still bound any fault).
        """
        names = experiment_names(body)
        problems: list[str] = []
        for job in (names.runner, names.analysis):
            try:
                self.api.delete("Job", names.namespace, job, propagation="Background")
            except ApiError as exc:
                problems.append(f"deleting Job {job}: {exc}")
        spec = body.get("spec") or {}
        cluster_name = (spec.get("cluster") or {}).get("ref") or names.experiment
        try:
            cluster = self.api.get("BrokerCluster", names.namespace, cluster_name)
            if cluster is not None:
                heal = self.clusters.heal_cluster(ClusterNames(cluster_name, names.namespace),
                                                  _brokers(cluster))
                problems += heal.problems
                self.clusters.release_cluster(names.namespace, cluster_name, names.experiment)
        except (ApiError, PlatformError) as exc:
            problems.append(f"healing BrokerCluster {cluster_name}: {exc}")
        return problems


def experiment_seed(experiment: ChaosExperiment, uid: str) -> int:
    """The spec's seed, else one derived from the object's uid: each experiment object gets
    its own, and a step repeated on a stale view of the object picks the same one."""
    if experiment.spec.seed is not None:
        return experiment.spec.seed
    return int.from_bytes(hashlib.sha256(uid.encode()).digest()[:4], "big") % 2**31


def job_state(job: Mapping[str, Any] | None, what: str) -> tuple[st.JobState, str]:
    if job is None:
        return "absent", f"the {what} Job is gone"
    status = job.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Complete":
            return "succeeded", ""
        if condition.get("type") == "Failed":
            detail = condition.get("message") or condition.get("reason") or "failed"
            return "failed", f"the {what} Job failed: {detail}"
    if status.get("succeeded"):
        return "succeeded", ""
    if status.get("failed"):
        return "failed", f"the {what} Job failed"
    return "active", ""


def _brokers(cluster: Mapping[str, Any] | None) -> int:
    return int(((cluster or {}).get("spec") or {}).get("brokers") or 0)

