"""Fault units: one per kind, each with a symmetric inject/recover pair (Chaos Mesh's habit).

Units act on concrete node names through a ``Platform``; choosing which node (the leader
of a partition, a follower) happens before a unit is built.
"""

from undertow.faults.base import Fault, FaultError
from undertow.faults.registry import FAULT_KINDS, build_fault

__all__ = ["FAULT_KINDS", "Fault", "FaultError", "build_fault"]
