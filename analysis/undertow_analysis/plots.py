"""The report's timeline as a PNG (matplotlib's Agg canvas, no display, no pyplot state)."""

from __future__ import annotations

import io
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.transforms import blended_transform_factory

FAULT_COLOURS = ("#f4a261", "#8ab17d", "#a48ad4", "#e9c46a", "#7fb7d9", "#e07a9f")
MAX_ISR_LINES = 24
NO_ACKS = "#9b2226"
EVENT_MARKS = ("leader_election", "truncation", "broker_fenced", "group_rebalance",
               "group_stable", "group_empty", "coordinator_load")
"""The events.jsonl types the timeline marks (the job keeps only the loads of the consumer
group's own __consumer_offsets partition)."""
ELECTION_COLOURS = {"clean": "#1d3557", "preferred": "#6a4c93", "unclean": "#d62828",
                    "offline": "#6c757d"}
TRUNCATION_COLOUR = "#e76f51"
FENCED_COLOUR = "#495057"
GROUP_COLOUR = "#2a9d8f"
COORDINATOR_COLOUR = "#b5179e"
LABEL_Y = {"truncation": 0.80, "leader_election": 0.72, "broker_fenced": 0.64,
           "group_rebalance": 0.56, "group_stable": 0.48, "group_empty": 0.48,
           "coordinator_load": 0.40}
"""Where each type's labels go on the top panel (a fraction of its height): one row a type,
so that labels of events close in time do not print over each other."""


def timeline_png(
    *,
    width: float,
    acks: list[tuple[int, int]],
    isr: list[dict[str, Any]],
    faults: list[dict[str, Any]],
    unavailable: list[dict[str, Any]],
    lost_t: list[float],
    events: list[dict[str, Any]],
) -> bytes:
    """Acks per second and ISR size per partition over the run (seconds since start).

    acks: (bucket, acks) per `width`-second bucket; isr: rows of topic, partition, bucket,
    isr, offline; faults: report faults (start_s, end_s, fault); lost_t: send times of lost
    records; events: events.jsonl rows of the `EVENT_MARKS` types with t_s. Fault windows
    are shaded on both panels, lost records marked on the top one; elections (coloured by
    kind), truncations and fences are drawn across both with the broker they concern, so
    that the band where records were lost shows without reading.
    """
    fig = Figure(figsize=(11, 6), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))

    xs = [b * width for b, _ in sorted(acks)]
    ys = [n / width for _, n in sorted(acks)]
    top.step(xs, ys, where="post", color="#264653", linewidth=1.2, label="acks/s")
    top.set_ylabel("acknowledged sends / s")
    top.set_title("Timeline")

    colours: dict[str, str] = {}
    for f in faults:
        colour = colours.setdefault(f["fault"], FAULT_COLOURS[len(colours) % len(FAULT_COLOURS)])
        for ax in (top, bottom):
            ax.axvspan(f["start_s"], f["end_s"], color=colour, alpha=0.25, linewidth=0)
    handles = [Patch(color=c, alpha=0.25, label=f"fault: {k}") for k, c in colours.items()]
    no_acks = [w for w in unavailable if w["kind"] == "no_acks"]
    for w in no_acks:
        top.axvspan(w["start_s"], w["start_s"] + w["duration_s"], facecolor="none",
                    edgecolor=NO_ACKS, hatch="///", linewidth=0)
    if no_acks:
        handles.append(Patch(facecolor="none", edgecolor=NO_ACKS, hatch="///", label="no acks"))
    if lost_t:
        marks = blended_transform_factory(top.transData, top.transAxes)
        top.plot(lost_t, [0.96] * len(lost_t), "x", color="#d62828", transform=marks,
                 markersize=6, label=f"lost record sent ({len(lost_t)} shown)")
    handles += _mark_events(events, top, bottom)
    top.legend(handles=top.get_legend_handles_labels()[0] + handles, loc="lower left",
               fontsize=8, ncols=3)
    top.set_ylim(bottom=0)

    by_partition: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in isr:
        by_partition.setdefault((row["topic"], row["partition"]), []).append(row)
    for n, (key, rows) in enumerate(sorted(by_partition.items())[:MAX_ISR_LINES]):
        rows.sort(key=lambda r: r["bucket"])
        nudge = 0.04 * (n - len(by_partition) / 2)  # keep equal ISR sizes from hiding each other
        bottom.step([r["bucket"] * width for r in rows], [r["isr"] + nudge for r in rows],
                    where="post", linewidth=1, label=f"{key[0]}-{key[1]}")
        offline = [r["bucket"] * width for r in rows if r["offline"]]
        if offline:
            bottom.plot(offline, [0] * len(offline), "|", color="#d62828", markersize=10)
    bottom.set_ylabel("ISR size")
    bottom.set_xlabel("seconds since start")
    bottom.set_ylim(bottom=-0.3)
    if by_partition:
        bottom.legend(loc="lower left", fontsize=7, ncols=8, title="partition (| = offline)",
                      title_fontsize=7)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _mark_events(events: list[dict[str, Any]], top: Any, bottom: Any) -> list[Any]:
    """Vertical lines for elections, fences, the consumer group's rebalances (shaded until
    the generation they lead to is stable) and generations, and its coordinator's moves;
    triangles for truncations. Each is labelled with its broker (the new leader, the fenced,
    truncating or coordinating broker), its group or its generation; a label close to the
    previous one of its type goes a little lower. Returns the legend's handles."""
    labels = blended_transform_factory(top.transData, top.transAxes)
    seen: dict[str, Any] = {}
    left, right = top.get_xlim()
    near = 0.025 * (right - left)
    last: dict[str, tuple[float, int]] = {}
    rebalancing: dict[str | None, float] = {}
    for e in sorted(events, key=lambda e: e["t_s"]):
        x, kind = e["t_s"], e["type"]
        colour, name, style, text = _mark(e)
        if kind == "truncation":
            top.plot([x], [0.88], "v", color=colour, transform=labels, markersize=7)
        else:
            for ax in (top, bottom):
                ax.axvline(x, color=colour, linewidth=1.1 if style == "-" else 0.9,
                           linestyle=style, alpha=0.8)
        if kind == "group_rebalance":
            rebalancing.setdefault(e.get("group"), x)
        elif kind in ("group_stable", "group_empty") and e.get("group") in rebalancing:
            top.axvspan(rebalancing.pop(e.get("group")), x, color=GROUP_COLOUR, alpha=0.12,
                        linewidth=0)
        previous_x, level = last.get(kind, (None, 0))
        level = (level + 1) % 3 if previous_x is not None and x - previous_x < near else 0
        last[kind] = (x, level)
        top.text(x, LABEL_Y[kind] - 0.035 * level, text, color=colour, transform=labels,
                 fontsize=6.5, ha="center")
        seen.setdefault(name, Line2D([], [], color=colour, label=name,
                                     marker="v" if kind == "truncation" else None,
                                     linestyle="none" if kind == "truncation" else style))
    return list(seen.values())


def _mark(e: dict[str, Any]) -> tuple[str, str, str, str]:
    """An event's colour, legend entry, line style and label."""
    kind = e["type"]
    if kind == "leader_election":
        who = e["leader"]
        return (ELECTION_COLOURS.get(e["kind"], "#1d3557"), f"election: {e['kind']}", "-",
                "offline" if who == -1 else f"lead b{who}")
    if kind == "broker_fenced":
        return FENCED_COLOUR, "broker fenced", ":", f"fence b{e['broker']}"
    if kind == "truncation":
        return TRUNCATION_COLOUR, "truncation", "none", f"b{e['broker']}"
    if kind == "group_rebalance":
        return GROUP_COLOUR, "group rebalance", "--", f"rebalance {e.get('group') or ''}"
    if kind in ("group_stable", "group_empty"):
        text = f"gen {e.get('generation')}" + (" (empty)" if kind == "group_empty" else "")
        return GROUP_COLOUR, "group generation", "-.", text
    return COORDINATOR_COLOUR, "coordinator moved", ":", f"coord b{e['broker']}"
