"""The operator the kopf handlers (``handlers.py``) call: one reconciler per custom resource.

A ChaosExperiment runs on a BrokerCluster, so its reconciler holds the cluster's: it heals
the cluster's faults and releases it through ``BrokerClusterReconciler``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from undertow.kube.api import KubeApi
from undertow.kube.cluster_reconciler import BrokerClusterReconciler
from undertow.kube.config import OperatorConfig
from undertow.kube.experiment_reconciler import ChaosExperimentReconciler
from undertow.kube.reconcile import utc_now


class Operator:
    """``clusters`` reconciles BrokerClusters, ``experiments`` ChaosExperiments."""

    def __init__(self, api: KubeApi, config: OperatorConfig,
                 clock: Callable[[], datetime] = utc_now) -> None:
        self.config = config
        self.clusters = BrokerClusterReconciler(api, config, clock)
        self.experiments = ChaosExperimentReconciler(api, config, self.clusters, clock)
