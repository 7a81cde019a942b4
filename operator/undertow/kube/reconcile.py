"""What the operator does for each object, as plain functions of the API and the clock.

One reconciler per custom resource: ``cluster_reconciler.BrokerClusterReconciler`` and
``experiment_reconciler.ChaosExperimentReconciler``, which ``operator.Operator`` holds for
the kopf handlers; this module is what both share. The handlers call the reconcilers and
only them; decisions come from ``status.advance`` and ``rollout.plan`` (pure), side effects
go through ``KubeApi`` and the pods' HTTP endpoints. Every action is idempotent: a handler
that runs twice, or after a crash, creates nothing twice and fails on nothing that is
already done or already gone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from undertow.kube.api import ApiError, KubeApi
from undertow.kube.config import OperatorConfig

Notify = Callable[[str, str], None]
"""Posts an Event about the object being handled: (reason, message)."""


def utc_now() -> datetime:
    """The reconcilers' default clock."""
    return datetime.now(UTC)


class Reconciler:
    """What every reconciler works with: the API, the operator's configuration, the clock."""

    def __init__(self, api: KubeApi, config: OperatorConfig,
                 clock: Callable[[], datetime] = utc_now) -> None:
        self.api = api
        self.config = config
        self.clock = clock

    def _create(self, body: Mapping[str, Any]) -> None:
        """Create ``body`` unless an object of that name exists (never changed after)."""
        try:
            self.api.create(body)
        except ApiError as exc:
            if exc.status != 409:
                raise


def source_of(body: Mapping[str, Any]) -> str:
    """How spec errors name the object ``body``: ``Kind namespace/name``."""
    meta = body["metadata"]
    return f"{body['kind']} {meta.get('namespace')}/{meta['name']}"
