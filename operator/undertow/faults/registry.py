"""Fault units by the kinds experiment files name, and one way to build any of them.

The spec (``spec.faults.FaultKind``) says which kinds exist and validates each fault when
the experiment is loaded; each unit module of this package registers its unit
(``base.fault_unit``), and this module imports them all and checks that every kind of the
spec has exactly one. Every heal path goes through the registry (``faults.heal``), so a
kind added here is healed everywhere.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import get_args

from undertow.faults.base import UNITS, Fault, Listener, Nodes
from undertow.platform.base import Platform
from undertow.spec.faults import FaultKind
from undertow.spec.schedule import PlannedFault


def _units() -> dict[FaultKind, type[Fault]]:
    package = __name__.rpartition(".")[0]
    for module in pkgutil.iter_modules([str(Path(__file__).parent)]):
        importlib.import_module(f"{package}.{module.name}")
    kinds = get_args(FaultKind)
    missing, unknown = set(kinds) - set(UNITS), set(UNITS) - set(kinds)
    if missing or unknown:
        raise ImportError(f"fault kinds of the spec without a unit: {sorted(missing)}; "
                          f"units of no kind the spec knows: {sorted(unknown)}")
    return {kind: UNITS[kind] for kind in kinds}


FAULT_UNITS: dict[FaultKind, type[Fault]] = _units()
"""Every kind of the spec, in its order, with its unit."""


def build_fault(spec: PlannedFault, platform: Platform, nodes: Nodes, *, time_limit_s: float,
                listener: Listener | None = None) -> Fault:
    """The unit for ``spec.kind`` on the nodes its selectors resolved to."""
    return FAULT_UNITS[spec.kind](platform, spec, nodes, time_limit_s=time_limit_s,
                                  listener=listener)
