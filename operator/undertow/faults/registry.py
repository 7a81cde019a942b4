"""Fault kinds by the names experiment files use, and one way to build any of them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from undertow.faults.base import Fault, FaultError, Listener
from undertow.faults.disk_stall import DiskStall
from undertow.faults.kill import Kill
from undertow.faults.partition import Partition
from undertow.faults.pause import Pause
from undertow.faults.pod_delete import PodDelete
from undertow.faults.power_loss import PowerLoss
from undertow.platform.base import Platform

FAULT_KINDS: dict[str, type[Fault]] = {
    unit.kind: unit for unit in (Kill, Pause, Partition, DiskStall, PowerLoss, PodDelete)
}
PARTITION_MODES = ("isolate", "split", "one-way")


def build_fault(kind: str, platform: Platform, target: str | None, *, time_limit_s: float,
                listener: Listener | None = None, **options: Any) -> Fault:
    """The unit for ``kind`` on a concrete ``target`` node.

    Partitions take ``mode`` (``isolate``, the default; ``split`` with ``groups`` and no
    target; ``one-way`` with ``to``) and, for ``isolate``, ``clients``; pod-delete takes
    ``grace_period_s``. The other kinds take no options.
    """
    unit = FAULT_KINDS.get(kind)
    if unit is None:
        raise FaultError(f"unknown fault kind {kind!r}; kinds are {', '.join(FAULT_KINDS)}")
    if unit is PodDelete:
        unknown = set(options) - {"grace_period_s"}
        if unknown:
            raise FaultError(f"pod-delete: unknown options {', '.join(sorted(unknown))}")
        if target is None:
            raise FaultError("pod-delete needs a target node")
        return PodDelete(platform, target, time_limit_s=time_limit_s, listener=listener,
                         grace_period_s=float(options.get("grace_period_s", 0.0)))
    if unit is not Partition:
        if options:
            raise FaultError(f"{kind} takes no options, got {', '.join(sorted(options))}")
        if target is None:
            raise FaultError(f"{kind} needs a target node")
        return unit(platform, target, time_limit_s=time_limit_s, listener=listener)
    return _partition(platform, target, time_limit_s=time_limit_s, listener=listener,
                      **options)


def _partition(platform: Platform, target: str | None, *, time_limit_s: float,
               listener: Listener | None, mode: str = "isolate",
               to: str | Sequence[str] | None = None,
               groups: Sequence[Sequence[str]] | None = None, clients: bool | None = None,
               **unknown: Any) -> Partition:
    if unknown:
        raise FaultError(f"partition: unknown options {', '.join(sorted(unknown))}")
    if mode not in PARTITION_MODES:
        raise FaultError(f"partition mode must be one of {', '.join(PARTITION_MODES)}, "
                         f"got {mode!r}")
    for option, value, allowed in (("to", to, "one-way"), ("groups", groups, "split"),
                                   ("clients", clients, "isolate")):
        if value is not None and mode != allowed:
            raise FaultError(f"partition {mode}: option {option!r} is for {allowed} only")
    if mode == "split":
        if target is not None:
            raise FaultError("partition split: takes groups, not a target")
        if groups is None:
            raise FaultError("partition split: needs groups")
        return Partition.split(platform, groups, time_limit_s=time_limit_s, listener=listener)
    if target is None:
        raise FaultError(f"partition {mode}: needs a target node")
    if mode == "one-way":
        if to is None:
            raise FaultError("partition one-way: needs 'to', the far side")
        return Partition.one_way(platform, target, to, time_limit_s=time_limit_s,
                                 listener=listener)
    return Partition.isolate(platform, target, clients=bool(clients),
                             time_limit_s=time_limit_s, listener=listener)
