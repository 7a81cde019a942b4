"""The experiment spec: one pydantic model that loads experiment files, generates the
CRDs and feeds the fault planner."""

from .cluster import BrokerCluster, BrokerClusterSpec, BrokerClusterStatus, BrokerConfig
from .durations import format_duration, parse_duration
from .errors import SpecError
from .experiment import ChaosExperiment, ChaosExperimentSpec, ChaosExperimentStatus
from .faults import NetworkFault, ScheduleEntry, TargetSelector
from .loader import Document, LoadedExperiment, load_documents, load_experiment, parse_document
from .schedule import PlannedFault, Trigger, choose_seed, plan

__all__ = [
    "BrokerCluster",
    "BrokerClusterSpec",
    "BrokerClusterStatus",
    "BrokerConfig",
    "ChaosExperiment",
    "ChaosExperimentSpec",
    "ChaosExperimentStatus",
    "Document",
    "LoadedExperiment",
    "NetworkFault",
    "PlannedFault",
    "ScheduleEntry",
    "SpecError",
    "TargetSelector",
    "Trigger",
    "choose_seed",
    "format_duration",
    "load_documents",
    "load_experiment",
    "parse_document",
    "parse_duration",
    "plan",
]
