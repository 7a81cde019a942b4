"""The minibroker source of a `ClusterView`: the controller's and the brokers' ``/v1/state``.

The controller's document gives registrations (fenced, broker epoch), partition
registrations (with KIP-966's ELR and last known ELR, absent from an older controller: none)
and topic configs; each broker's own document gives its replicas' log end
offsets and, where it leads, the high watermark. Defaults are explicit and conservative:
a registration that does not say it is unfenced counts as fenced, so nothing is aimed at
or waited for on a broker the controller has not declared live.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from undertow.cluster_view.model import (
    NO_LEADER,
    BrokerRegistration,
    BrokerReport,
    ClusterView,
    PartitionView,
    ReplicaState,
)


class StateDocumentError(ValueError):
    """A ``/v1/state`` document lacks a field every minibroker writes (version skew)."""


def view_from_states(controller: Mapping[str, Any],
                     broker_states: Mapping[int, Mapping[str, Any]] | None = None
                     ) -> ClusterView:
    """The view from the controller's document and the documents of the brokers that
    answered (broker id -> document; None or empty: the controller's half only)."""
    try:
        reports = {broker_id: broker_report(state)
                   for broker_id, state in (broker_states or {}).items()}
        replicas = {(r.topic, r.partition, report.broker_id): r
                    for report in reports.values() for r in report.replicas}
        partitions = {}
        for topic, entry in controller.get("topics", {}).items():
            for index, reg in entry.get("partitions", {}).items():
                key = (topic, int(index))
                partitions[key] = _partition(topic, int(index), reg, replicas)
        brokers = {int(b["id"]): BrokerRegistration(
            broker_id=int(b["id"]), fenced=bool(b.get("fenced", True)),
            broker_epoch=b.get("broker_epoch"), rack=b.get("rack"))
            for b in controller.get("brokers", [])}
        configs = {topic: dict(entry.get("config") or {})
                   for topic, entry in controller.get("topics", {}).items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise StateDocumentError(f"controller state: {exc!r}") from exc
    return ClusterView(brokers=brokers, controller=None, partitions=partitions,
                       topic_configs=configs, reports=reports)


def broker_report(state: Mapping[str, Any]) -> BrokerReport:
    """One broker's own ``/v1/state``."""
    try:
        return BrokerReport(
            broker_id=int(state["broker_id"]), broker_epoch=state.get("broker_epoch"),
            replicas=tuple(ReplicaState(
                topic=p["topic"], partition=int(p["partition"]),
                is_leader=p["role"] == "leader", leader=int(p["leader"]),
                leader_epoch=int(p["leader_epoch"]), isr=tuple(p["isr"]),
                high_watermark=int(p["high_watermark"]),
                log_end_offset=int(p["log_end_offset"]),
                last_stable_offset=(None if p.get("last_stable_offset") is None
                                    else int(p["last_stable_offset"])))
                for p in state.get("partitions", [])))
    except (KeyError, TypeError, ValueError) as exc:
        raise StateDocumentError(f"broker state: {exc!r}") from exc


def _partition(topic: str, index: int, reg: Mapping[str, Any],
               replicas: Mapping[tuple[str, int, int], ReplicaState]) -> PartitionView:
    leader = int(reg["leader"])
    on_leader = replicas.get((topic, index, leader)) if leader != NO_LEADER else None
    return PartitionView(
        topic=topic, partition=index, leader=leader, leader_epoch=int(reg["leader_epoch"]),
        isr=tuple(reg["isr"]), replicas=tuple(reg["replicas"]),
        # KIP-966's fields: absent from a controller from before them, which keeps no ELR.
        elr=tuple(int(b) for b in reg.get("elr") or ()),
        last_known_elr=tuple(int(b) for b in reg.get("last_known_elr") or ()),
        leader_recovery_state=reg.get("leader_recovery_state"),  # absent before KIP-704's
        high_watermark=on_leader.high_watermark if on_leader else None,
        last_stable_offset=on_leader.last_stable_offset if on_leader else None,
        log_end_offsets={b: r.log_end_offset for (t, i, b), r in sorted(replicas.items())
                         if (t, i) == (topic, index)})
