"""One typed view of the cluster's replication state, and its two sources."""

from undertow.cluster_view.minibroker import StateDocumentError, broker_report, view_from_states
from undertow.cluster_view.model import (
    NO_LEADER,
    BrokerRegistration,
    BrokerReport,
    ClusterView,
    PartitionView,
    ReplicaState,
)

__all__ = ["NO_LEADER", "BrokerRegistration", "BrokerReport", "ClusterView", "PartitionView",
           "ReplicaState", "StateDocumentError", "broker_report", "view_from_states"]
