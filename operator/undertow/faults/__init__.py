"""Fault units: one per kind, each with a symmetric inject/recover pair (Chaos Mesh's habit).

Units are built from the fault's spec and act on concrete node names through a
``Platform``; choosing which node (the leader of a partition, a follower) happens before a
unit is built, and its result is a ``Nodes``. ``heal`` undoes every kind on a whole
cluster through the registry.
"""

from undertow.faults.base import Fault, FaultError, Nodes
from undertow.faults.heal import clear, heal
from undertow.faults.registry import FAULT_UNITS, build_fault

__all__ = ["FAULT_UNITS", "Fault", "FaultError", "Nodes", "build_fault", "clear", "heal"]
