"""What the objects of both custom resources share, as pure functions.

``cluster_objects`` builds a BrokerCluster's objects and ``experiment_objects`` a
ChaosExperiment's; both put on every object the metadata built here (the operator's
``managed-by`` label and a controller owner reference, so that deleting the owner deletes
it all), run their containers under the same security contexts, and take their images
and sizes from the operator's configuration (``Images``, ``JobSettings``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from undertow.spec.cluster import DEFAULT_IMAGE

BROKER_UID = 10001
"""The minibroker image's user; the operator image uses the same id."""

LABEL_COMPONENT = "app.kubernetes.io/component"
MANAGED_BY = {"app.kubernetes.io/managed-by": "undertow-operator"}

MAX_DERIVED_NAME = 40
"""Longest cluster or experiment name: derived names (``-controller-0``, the StatefulSet
revision label ``<sts>-<hash>``) must stay within Kubernetes' 63-character limit."""


@dataclass(frozen=True)
class Images:
    """Images the operator puts in pods it creates."""

    operator: str = "undertow/operator:0.1.0"
    """Runner and fault agent (the operator's own image)."""
    analysis: str = "undertow/analysis:0.1.0"
    broker: str = DEFAULT_IMAGE
    """The brokers', where a BrokerCluster leaves `spec.image` at its default: so that the
    chart's `images.registry` reaches them as it does the operator's other images."""
    pull_policy: str = "IfNotPresent"


@dataclass(frozen=True)
class JobSettings:
    """Sizes of what an experiment runs; from the operator's configuration."""

    history_size: str = "1Gi"
    storage_class: str | None = None
    runner_resources: Mapping[str, Any] = field(default_factory=lambda: {
        "requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}})
    analysis_resources: Mapping[str, Any] = field(default_factory=lambda: {
        "requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}})
    agent_resources: Mapping[str, Any] = field(default_factory=lambda: {
        "requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}})
    """The fault agent's container: the agent (15 MB) and, while a delay holds, a delayer
    process for each peer it delays (7 MB each, ``agent/delays.py``); a node a delay
    isolates delays every other pod of its cluster, so 128Mi holds clusters of up to about
    16 brokers (64Mi was OOM-killed at 5, when a delayer took 12 MB)."""
    publish_resources: Mapping[str, Any] = field(default_factory=lambda: {
        "requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}})
    """The analysis Job's second container, which patches the report into its ConfigMap."""
    run_margin_s: int = 900
    """Added to the workload's duration for the runner Job's activeDeadlineSeconds."""


def check_name(name: str, what: str) -> None:
    """Reject names whose derived names would break Kubernetes' limits."""
    if len(name) > MAX_DERIVED_NAME:
        raise ValueError(f"{what} name {name!r} is {len(name)} characters; at most "
                         f"{MAX_DERIVED_NAME} (pod, Job and revision names derive from it)")


def owner_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    """A controller reference to ``owner`` (a full object as the API returns it)."""
    meta = owner["metadata"]
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": meta["name"],
            "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}


def object_meta(name: str, namespace: str, owner: Mapping[str, Any],
                labels: Mapping[str, str],
                annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The metadata of an object ``owner`` owns, with the operator's labels."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace,
                            "labels": {**MANAGED_BY, **labels},
                            "ownerReferences": [owner_reference(owner)]}
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def restricted(uid: int = BROKER_UID, read_only: bool = True) -> dict[str, Any]:
    """A container security context that passes the "restricted" Pod Security Standard."""
    return {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid,
            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": read_only,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def pod_security(uid: int = BROKER_UID) -> dict[str, Any]:
    """The pod security context that goes with ``restricted`` containers."""
    return {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid, "fsGroup": uid,
            "seccompProfile": {"type": "RuntimeDefault"}}


def secret_env(name: str, secret: str, key: str) -> dict[str, Any]:
    """An environment variable ``name`` set from ``key`` of the Secret ``secret``."""
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
