"""A `ClusterView` as plain text: what ``undertow describe`` prints, greppable in pipes."""

from __future__ import annotations

from undertow.cluster_view.model import ClusterView


def render(view: ClusterView) -> str:
    def ids(values: tuple[int, ...]) -> str:
        return ",".join(map(str, values)) or "-"

    brokers = ", ".join(
        f"{b.broker_id}{' (fenced)' if b.fenced else ''}{f' rack {b.rack}' if b.rack else ''}"
        for b in sorted(view.brokers.values(), key=lambda b: b.broker_id))
    controller = "unknown" if view.controller is None else str(view.controller)
    # KIP-966's eligible leader replicas get a column only when some partition has them.
    with_elr = any(p.elr for p in view.partitions.values())
    rows = [("partition", "leader", "epoch", "ISR", *(("ELR",) if with_elr else ()),
             "replicas", "HW")]
    for (topic, index), p in sorted(view.partitions.items()):
        # KIP-704: an uncleanly elected leader is RECOVERING until its ISR first grows.
        leader = (f"{p.leader}{' (recovering)' if p.leader_recovery_state == 'RECOVERING' else ''}"
                  if p.has_leader else "offline")
        rows.append((f"{topic}-{index}", leader,
                     str(p.leader_epoch) if p.leader_epoch >= 0 else "?", ids(p.isr),
                     *((ids(p.elr),) if with_elr else ()), ids(p.replicas),
                     "?" if p.high_watermark is None else str(p.high_watermark)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [f"brokers: {brokers or 'none'}; controller: {controller}"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
              for row in rows]
    return "\n".join(lines)
