"""What the operator does for each object, as plain functions of the API and the clock.

The kopf handlers call these and only these; decisions come from ``status.advance`` and
``rollout.plan`` (pure), side effects go through ``KubeApi`` and the pods' HTTP
endpoints. Every action is idempotent: a handler that runs twice, or after a crash,
creates nothing twice and fails on nothing that is already done or already gone.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from undertow.cluster_view import view_from_states
from undertow.kube import rollout
from undertow.kube import status as st
from undertow.kube.agent import AgentClient
from undertow.kube.api import ApiError, KubeApi
from undertow.kube.config import OperatorConfig
from undertow.kube.platform import read_tokens
from undertow.kube.pods import PodView, pod_view
from undertow.kube.resources import (
    ANNOTATION_LOCK,
    LABEL_CLUSTER,
    REPORT_KEY,
    STATEFULSET_IMMUTABLE,
    ClusterNames,
    ExperimentNames,
    analysis_job,
    check_name,
    cluster_objects,
    experiment_setup,
    fault_secret,
    inline_cluster,
    runner_job,
    storage_change,
)
from undertow.platform.admin import AdminClient
from undertow.platform.base import CONTROLLER, PlatformError, broker_id_of, broker_node
from undertow.platform.control import EndpointError, EndpointRefused, EndpointUnreachable
from undertow.spec import (
    BrokerCluster,
    BrokerClusterSpec,
    ChaosExperiment,
    SpecError,
    parse_document,
)
from undertow.spec.errors import format_loc, spec_error_from_validation
from undertow.spec.experiment import check_against_cluster
from undertow.spec.meta import FieldError

log = logging.getLogger("undertow.kube.operator")

Notify = Callable[[str, str], None]
"""Posts an Event about the object being handled: (reason, message)."""


@dataclass(frozen=True)
class Heal:
    problems: tuple[str, ...]
    brokers_ready: bool


class Operator:
    def __init__(self, api: KubeApi, config: OperatorConfig,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.api = api
        self.config = config
        self.clock = clock

    # ---- BrokerCluster ----------------------------------------------------------------------

    def apply_cluster(self, body: Mapping[str, Any]) -> None:
        """Create or update the cluster's Secret, ConfigMap, Services and StatefulSets.

        A smaller ``brokers`` is not applied here: the status timer scales down one broker
        at a time, when it is safe.
        """
        spec = cluster_spec(body)
        names = _cluster_names(body)
        check_name(names.cluster, "BrokerCluster")
        if self.api.get("Secret", names.namespace, names.secret) is None:
            self._create(fault_secret(body, secrets.token_hex(16), secrets.token_hex(16)))
        current = self.api.get("StatefulSet", names.namespace, names.brokers)
        problem = storage_change(current, spec)
        if problem is not None:
            raise SpecError(problem)
        replicas = spec.brokers
        if current is not None:
            replicas = max(spec.brokers, int(current.get("spec", {}).get("replicas") or 0))
        for obj in cluster_objects(body, spec, self.config.images, self.config.jobs,
                                   broker_replicas=replicas):
            immutable = STATEFULSET_IMMUTABLE if obj["kind"] == "StatefulSet" else ()
            self.api.apply(obj, immutable=immutable)

    def cluster_status(self, body: Mapping[str, Any], notify: Notify) -> dict[str, Any]:
        """Observe the pods, take the next rollout step if one is due, return the status."""
        names = _cluster_names(body)
        try:
            spec = cluster_spec(body)
            spec_error = None
        except SpecError as exc:
            spec, spec_error = None, str(exc)
        if spec is not None:
            spec_error = storage_change(
                self.api.get("StatefulSet", names.namespace, names.brokers), spec)
        pods = self.cluster_pods(names)
        decision = None
        if spec is not None and spec_error is None:
            decision = self._roll(body, names, spec.brokers, spec.config.min_insync_replicas,
                                  pods, notify)
        return st.cluster_status(
            brokers=spec.brokers if spec else 0, pods=pods,
            generation=body["metadata"].get("generation"),
            conditions=(body.get("status") or {}).get("conditions"),
            rollout=decision, spec_error=spec_error, now=self.clock())

    def cluster_pods(self, names: ClusterNames) -> list[PodView]:
        return [pod_view(p, names)
                for p in self.api.list("Pod", names.namespace, {LABEL_CLUSTER: names.cluster})]

    def _roll(self, body: Mapping[str, Any], names: ClusterNames, desired: int,
              min_isr: int | None, pods: list[PodView], notify: Notify) -> rollout.RolloutDecision:
        sts = self.api.get("StatefulSet", names.namespace, names.brokers)
        if sts is None:
            return rollout.RolloutDecision("none")
        update_revision = (sts.get("status") or {}).get("updateRevision")
        current = int(sts.get("spec", {}).get("replicas") or 0)
        brokers = [p for p in pods if p.node and p.node.startswith("broker-")]
        controller_sts = self.api.get("StatefulSet", names.namespace, names.controller) or {}
        controller_pod = rollout.ControllerPod(
            next((p for p in pods if p.node == CONTROLLER), None),
            (controller_sts.get("status") or {}).get("updateRevision"))
        if not rollout.pending(brokers, desired=desired, current_replicas=current,
                               update_revision=update_revision, controller=controller_pod):
            return rollout.RolloutDecision("none")
        states = {}
        for pod in brokers:
            with contextlib.suppress(EndpointError):
                states[broker_id_of(pod.node)] = self._get_state(names, pod.node)
        try:
            controller = self._get_state(names, CONTROLLER)
        except EndpointError:
            controller = None
        locked = (body["metadata"].get("annotations") or {}).get(ANNOTATION_LOCK)
        decision = rollout.plan(brokers, desired=desired, current_replicas=current,
                                update_revision=update_revision,
                                view=view_from_states(controller or {}, states),
                                default_min_isr=min_isr or 1,
                                locked_by=locked, controller=controller_pod)
        if decision.action == "restart-controller":
            self.api.delete("Pod", names.namespace, names.pod(CONTROLLER))
            notify("RollingRestart", f"restarting {names.pod(CONTROLLER)}: {decision.reason}")
        elif decision.action == "restart":
            pod_name = names.pod(broker_node(decision.broker or 0))
            self.api.delete("Pod", names.namespace, pod_name)
            notify("RollingRestart", f"restarting {pod_name}: {decision.reason}")
        elif decision.action == "scale-down":
            self.api.patch("StatefulSet", names.namespace, names.brokers,
                           {"spec": {"replicas": current - 1}})
            notify("ScaledDown", f"removed broker-{decision.broker}: {decision.reason}")
        return decision

    def _get_state(self, names: ClusterNames, node: str) -> dict[str, Any]:
        return AdminClient(self._url(names, node, self.config.endpoints.admin_port),
                           timeout_s=self.config.http_timeout_s).state()

    def _url(self, names: ClusterNames, node: str, port: int) -> str:
        host = self.config.endpoints.host_template.format(
            pod=names.pod(node), service=names.service(node), namespace=names.namespace)
        return f"http://{host}:{port}"

    # ---- healing ----------------------------------------------------------------------------

    def heal_cluster(self, names: ClusterNames, brokers: int) -> Heal:
        """Ask every pod's fault agent to remove its faults and every broker to lift its disk
        stall. An endpoint that cannot be reached is no problem: its pod, with its rules and
        its processes, is gone (or restarting); an endpoint that answers with an error is."""
        try:
            failpoint_token, agent_token = read_tokens(self.api, names)
        except PlatformError as exc:
            return Heal((str(exc),), False)
        problems: list[str] = []
        pods = self.cluster_pods(names)
        for pod in pods:
            if pod.node is None:
                continue
            agent = AgentClient(self._url(names, pod.node, self.config.endpoints.agent_port),
                                agent_token, timeout_s=self.config.http_timeout_s)
            try:
                agent.heal()
            except EndpointRefused as exc:
                problems.append(f"{pod.node}: {exc}")
            except EndpointUnreachable:
                pass  # the pod is gone (or restarting), its rules and processes with it
            if pod.node == CONTROLLER:
                continue
            broker = AdminClient(self._url(names, pod.node, self.config.endpoints.admin_port),
                                 failpoint_token, timeout_s=self.config.http_timeout_s)
            try:
                broker.clear_failpoint("disk-stall")
            except EndpointRefused as exc:
                problems.append(f"{pod.node}: {exc}")
            except EndpointUnreachable:
                pass  # the broker is gone (or restarting), its stall with it
        ready = {p.node for p in pods if p.ready}
        wanted = {CONTROLLER, *(broker_node(i) for i in range(brokers))}
        return Heal(tuple(problems), wanted <= ready)

    # ---- ChaosExperiment --------------------------------------------------------------------

    def advance_experiment(self, body: Mapping[str, Any]) -> tuple[st.Step, dict[str, Any]]:
        """Observe, decide (``status.advance``), act; return the step and the status patch."""
        previous = body.get("status") or {}
        phase = previous.get("phase")
        names = _experiment_names(body)
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
            self.heal_cluster(ClusterNames(cluster_name, names.namespace),
                              _brokers(cluster))
        elif step.action == "start-analysis":
            self._create(analysis_job(body, self.config.images, self.config.jobs))
        elif step.action == "finish" and cluster_name:
            self.release_cluster(names.namespace, cluster_name, names.experiment)
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
            experiment = parse_document(dict(body), _source(body), 0).resource
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
            heal = self.heal_cluster(ClusterNames(cluster_name, names.namespace),
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

    def release_cluster(self, namespace: str, cluster_name: str, experiment: str) -> None:
        """Drop the experiment's lock on the cluster (only its own, only if still there)."""
        cluster = self.api.get("BrokerCluster", namespace, cluster_name)
        if cluster is None:
            return
        if (cluster["metadata"].get("annotations") or {}).get(ANNOTATION_LOCK) == experiment:
            self.api.patch("BrokerCluster", namespace, cluster_name,
                           {"metadata": {"annotations": {ANNOTATION_LOCK: None}}})

    def cleanup_experiment(self, body: Mapping[str, Any]) -> list[str]:
        """On deletion: stop the runner, heal every fault, release the cluster.

        Never raises: the finalizer must come off whatever is already gone or broken
        (problems are returned for the log; the agents' deadlines still bound any fault).
        """
        names = _experiment_names(body)
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
                heal = self.heal_cluster(ClusterNames(cluster_name, names.namespace),
                                         _brokers(cluster))
                problems += heal.problems
                self.release_cluster(names.namespace, cluster_name, names.experiment)
        except (ApiError, PlatformError) as exc:
            problems.append(f"healing BrokerCluster {cluster_name}: {exc}")
        return problems

    # ---- helpers ----------------------------------------------------------------------------

    def _create(self, body: Mapping[str, Any]) -> None:
        """Create ``body`` unless an object of that name exists (never changed after)."""
        try:
            self.api.create(body)
        except ApiError as exc:
            if exc.status != 409:
                raise


def cluster_spec(body: Mapping[str, Any]) -> BrokerClusterSpec:
    """The validated spec of a BrokerCluster object; ``SpecError`` naming the field."""
    try:
        return BrokerCluster.model_validate(_document(body)).spec
    except ValidationError as exc:
        raise spec_error_from_validation(exc, source=_source(body),
                                         document=f"BrokerCluster/"
                                                  f"{body['metadata']['name']}") from None


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


def _document(body: Mapping[str, Any]) -> dict[str, Any]:
    return {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}


def _source(body: Mapping[str, Any]) -> str:
    meta = body["metadata"]
    return f"{body['kind']} {meta.get('namespace')}/{meta['name']}"


def _brokers(cluster: Mapping[str, Any] | None) -> int:
    return int(((cluster or {}).get("spec") or {}).get("brokers") or 0)


def _cluster_names(body: Mapping[str, Any]) -> ClusterNames:
    return ClusterNames(body["metadata"]["name"], body["metadata"]["namespace"])


def _experiment_names(body: Mapping[str, Any]) -> ExperimentNames:
    return ExperimentNames(body["metadata"]["name"], body["metadata"]["namespace"])
