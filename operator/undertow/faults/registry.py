"""Fault units by the kinds experiment files name, and one way to build any of them.

The spec (``spec.faults.FaultKind``) says which kinds exist and validates each fault when
the experiment is loaded; the registry only maps a kind to its unit.
"""

from __future__ import annotations

from undertow.faults.base import Fault, Listener, Nodes
from undertow.faults.disk_full import DiskFull
from undertow.faults.disk_stall import DiskStall
from undertow.faults.kill import Kill
from undertow.faults.partition import Partition
from undertow.faults.pause import Pause
from undertow.faults.pod_delete import PodDelete
from undertow.faults.power_loss import PowerLoss
from undertow.platform.base import Platform
from undertow.spec.faults import FaultKind
from undertow.spec.schedule import PlannedFault

FAULT_UNITS: dict[FaultKind, type[Fault]] = {
    unit.kind: unit for unit in (Kill, Pause, Partition, DiskStall, DiskFull, PowerLoss,
                                 PodDelete)
}


def build_fault(spec: PlannedFault, platform: Platform, nodes: Nodes, *, time_limit_s: float,
                listener: Listener | None = None) -> Fault:
    """The unit for ``spec.kind`` on the nodes its selectors resolved to."""
    return FAULT_UNITS[spec.kind](platform, spec, nodes, time_limit_s=time_limit_s,
                                  listener=listener)
