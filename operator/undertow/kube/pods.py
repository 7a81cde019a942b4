"""What the operator and the platform need to know about a pod, read from its API object."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from undertow.kube.cluster_objects import LABEL_REVISION, ClusterNames
from undertow.kube.objects import LABEL_COMPONENT

MAIN_CONTAINER = "minibroker"


@dataclass(frozen=True)
class PodView:
    name: str
    node: str | None
    """``controller`` or ``broker-N``; None for a pod that is not one of the cluster's."""
    component: str | None
    ready: bool
    """The Ready condition is True and the pod is not being deleted."""
    terminating: bool
    running: bool
    """The minibroker container is running (a paused process still counts)."""
    revision: str | None
    ip: str | None
    uid: str | None
    restarts: int


def _condition(status: Mapping[str, Any], kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True"
               for c in status.get("conditions") or [])


def pod_view(body: Mapping[str, Any], names: ClusterNames) -> PodView:
    meta, status = body.get("metadata", {}), body.get("status") or {}
    labels = meta.get("labels") or {}
    terminating = bool(meta.get("deletionTimestamp"))
    main = next((c for c in status.get("containerStatuses") or []
                 if c.get("name") == MAIN_CONTAINER), {})
    return PodView(
        name=meta["name"],
        node=names.node_of(meta["name"]),
        component=labels.get(LABEL_COMPONENT),
        ready=_condition(status, "Ready") and not terminating,
        terminating=terminating,
        running="running" in (main.get("state") or {}) and not terminating,
        revision=labels.get(LABEL_REVISION),
        ip=status.get("podIP"),
        uid=meta.get("uid"),
        restarts=int(main.get("restartCount") or 0),
    )
