"""The kopf handlers: thin adapters from kopf's callbacks to ``operator.Operator``.

BrokerCluster (``operator.clusters``): create/update/resume apply its objects; a timer
writes its status and takes rollout steps. ChaosExperiment (``operator.experiments``): a
timer advances its phase machine until it is Completed or Failed (one handler only, so two
steps never race); deletion heals and releases the cluster before kopf removes the
finalizer.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from undertow.kube.operator import Operator
from undertow.kube.status import TERMINAL
from undertow.spec import SpecError
from undertow.spec.meta import GROUP, VERSION

FINALIZER = f"{GROUP}/finalizer"
BROKERCLUSTERS = (GROUP, VERSION, "brokerclusters")
CHAOSEXPERIMENTS = (GROUP, VERSION, "chaosexperiments")


def configure(settings: kopf.OperatorSettings) -> None:
    """Keep kopf's bookkeeping in ``undertow.dev`` annotations (the CRDs' status schema
    has no room for it).

    kopf's scanning stays on: it watches CustomResourceDefinitions, so CRDs installed after
    the operator started are served as soon as they appear, and lists the namespaces to
    serve those that exist (the install's ClusterRole grants list and watch on both and
    nothing else cluster-wide). Without those permissions kopf logs "Not enough
    permissions to watch for resources" and serves only the CRDs that existed at start.
    """
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration")
    settings.posting.level = logging.WARNING
    # A timer still inside its (sync) handler when its object is deleted keeps the finalizer
    # until it returns; look again every second rather than every minute.
    settings.background.cancellation_polling = 1.0


def plain(body: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of kopf's body view as plain dicts."""
    return copy.deepcopy(dict(body))


def _changed(current: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    return any(current.get(key) != value for key, value in new.items())


def register(registry: kopf.OperatorRegistry, operator: Operator,
             connection: kopf.ConnectionInfo | None = None) -> None:
    """Add the operator's handlers to ``registry``; log in with ``connection`` when given,
    else as the official client does (in-cluster service account, else kubeconfig)."""
    interval = operator.config.interval_s

    @kopf.on.startup(registry=registry)
    def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return connection or kopf.login_via_client(**kwargs)

    @kopf.on.resume(*BROKERCLUSTERS, registry=registry)
    @kopf.on.create(*BROKERCLUSTERS, registry=registry)
    @kopf.on.update(*BROKERCLUSTERS, field="spec", registry=registry)
    def apply_cluster(body: kopf.Body, **_: Any) -> None:
        try:
            operator.clusters.apply_cluster(plain(body))
        except (SpecError, ValueError) as exc:
            raise kopf.PermanentError(str(exc)) from exc

    @kopf.timer(*BROKERCLUSTERS, interval=interval, registry=registry)
    def cluster_status(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        def notify(reason: str, message: str) -> None:
            kopf.event(body, type="Normal", reason=reason, message=message)

        status = operator.clusters.cluster_status(plain(body), notify)
        if _changed(body.get("status") or {}, status):
            patch["status"] = status

    def running(status: kopf.Status, **_: Any) -> bool:
        return status.get("phase") not in TERMINAL

    @kopf.timer(*CHAOSEXPERIMENTS, interval=interval, when=running, registry=registry)
    def advance_experiment(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        previous = (body.get("status") or {}).get("phase")
        step, status = operator.experiments.advance_experiment(plain(body))
        if status and _changed(body.get("status") or {}, status):
            patch["status"] = status
        if step.phase != previous:
            kind = "Warning" if step.phase == "Failed" else "Normal"
            kopf.event(body, type=kind, reason=step.reason or step.phase,
                       message=f"{step.phase}: {step.message}")

    @kopf.on.delete(*CHAOSEXPERIMENTS, registry=registry)
    def cleanup_experiment(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
        for problem in operator.experiments.cleanup_experiment(plain(body)):
            logger.warning("cleanup: %s", problem)
