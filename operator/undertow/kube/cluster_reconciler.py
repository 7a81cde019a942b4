"""The BrokerCluster reconciler: what the operator does for a cluster.

``apply_cluster`` creates or updates the cluster's objects (``cluster_objects``);
``cluster_status`` observes its pods and takes the next rolling-restart step that
``rollout.plan`` decides. The ChaosExperiment reconciler also calls it on the cluster an
experiment runs on: ``heal_cluster`` removes every fault from its pods and
``release_cluster`` drops the experiment's lock.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from undertow import faults
from undertow.cluster_view import view_from_states
from undertow.kube import rollout
from undertow.kube import status as st
from undertow.kube.cluster_objects import (
    ANNOTATION_LOCK,
    LABEL_CLUSTER,
    STATEFULSET_IMMUTABLE,
    ClusterNames,
    cluster_names,
    cluster_objects,
    controller_secret,
    fault_secret,
    storage_change,
)
from undertow.kube.objects import check_name
from undertow.kube.platform import KubernetesPlatform, KubernetesPlatformConfig, read_tokens
from undertow.kube.pods import PodView, pod_view
from undertow.kube.reconcile import Notify, Reconciler, source_of
from undertow.platform.admin import AdminClient
from undertow.platform.base import CONTROLLER, PlatformError, broker_id_of, broker_node
from undertow.platform.control import EndpointError
from undertow.spec import BrokerCluster, BrokerClusterSpec, SpecError
from undertow.spec.errors import spec_error_from_validation


@dataclass(frozen=True)
class Heal:
    problems: tuple[str, ...]
    brokers_ready: bool


class BrokerClusterReconciler(Reconciler):
    """Reconciles BrokerClusters: their objects, their status and their rolling restarts."""

    def apply_cluster(self, body: Mapping[str, Any]) -> None:
        """Create or update the cluster's Secrets, NetworkPolicy, ConfigMap, Services and
        StatefulSets. The Secrets are made once and never changed: a new controller secret
        would lock every running broker out of its controller.

        A smaller ``brokers`` is not applied here: the status timer scales down one broker
        at a time, when it is safe.
        """
        spec = cluster_spec(body)
        names = cluster_names(body)
        check_name(names.cluster, "BrokerCluster")
        if self.api.get("Secret", names.namespace, names.secret) is None:
            self._create(fault_secret(body, secrets.token_hex(16), secrets.token_hex(16)))
        if self.api.get("Secret", names.namespace, names.controller_secret) is None:
            self._create(controller_secret(body, secrets.token_hex(32)))
        current = self.api.get("StatefulSet", names.namespace, names.brokers)
        problem = storage_change(current, spec)
        if problem is not None:
            raise SpecError(problem)
        replicas = spec.brokers
        if current is not None:
            replicas = max(spec.brokers, int(current.get("spec", {}).get("replicas") or 0))
        for obj in cluster_objects(body, spec, self.config.images, self.config.jobs,
                                   broker_replicas=replicas,
                                   operator_namespace=self.config.operator_namespace):
            immutable = STATEFULSET_IMMUTABLE if obj["kind"] == "StatefulSet" else ()
            self.api.apply(obj, immutable=immutable)

    def cluster_status(self, body: Mapping[str, Any], notify: Notify) -> dict[str, Any]:
        """Observe the pods, take the next rollout step if one is due, return the status."""
        names = cluster_names(body)
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

    # ---- for the experiment running on the cluster -------------------------------------------

    def heal_cluster(self, names: ClusterNames, brokers: int) -> Heal:
        """Undo every kind of fault on every pod of the cluster (``faults.clear``: each
        registered kind's ``clear`` through the Kubernetes platform's primitives), without
        waiting: the phase machine waits for the pods to be ready. An endpoint that cannot
        be reached is no problem (its pod, with its rules, holds, failpoints and processes,
        is gone or restarting); one that answers with an error is."""
        try:
            failpoint_token, agent_token = read_tokens(self.api, names)
        except PlatformError as exc:
            return Heal((str(exc),), False)
        pods = self.cluster_pods(names)
        nodes = [pod.node for pod in pods if pod.node is not None]
        ordinals = [broker_id_of(node) for node in nodes if node != CONTROLLER]
        platform = KubernetesPlatform(KubernetesPlatformConfig(
            namespace=names.namespace, cluster=names.cluster,
            brokers=max(brokers, *(i + 1 for i in ordinals), 1),
            failpoint_token=failpoint_token, agent_token=agent_token,
            endpoints=self.config.endpoints, control_timeout_s=self.config.http_timeout_s),
            self.api)
        problems = faults.clear(platform, nodes)
        ready = {p.node for p in pods if p.ready}
        wanted = {CONTROLLER, *(broker_node(i) for i in range(brokers))}
        return Heal(tuple(problems), wanted <= ready)

    def release_cluster(self, namespace: str, cluster_name: str, experiment: str) -> None:
        """Drop the experiment's lock on the cluster (only its own, only if still there)."""
        cluster = self.api.get("BrokerCluster", namespace, cluster_name)
        if cluster is None:
            return
        if (cluster["metadata"].get("annotations") or {}).get(ANNOTATION_LOCK) == experiment:
            self.api.patch("BrokerCluster", namespace, cluster_name,
                           {"metadata": {"annotations": {ANNOTATION_LOCK: None}}})


def cluster_spec(body: Mapping[str, Any]) -> BrokerClusterSpec:
    """The validated spec of a BrokerCluster object; ``SpecError`` naming the field."""
    try:
        return BrokerCluster.model_validate(_document(body)).spec
    except ValidationError as exc:
        raise spec_error_from_validation(exc, source=source_of(body),
                                         document=f"BrokerCluster/"
                                                  f"{body['metadata']['name']}") from None


def _document(body: Mapping[str, Any]) -> dict[str, Any]:
    return {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}

