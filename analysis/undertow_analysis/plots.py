"""The report's timeline as a PNG (matplotlib's Agg canvas, no display, no pyplot state)."""

from __future__ import annotations

import io
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.transforms import blended_transform_factory

FAULT_COLOURS = ("#f4a261", "#8ab17d", "#a48ad4", "#e9c46a", "#7fb7d9", "#e07a9f")
MAX_ISR_LINES = 24
NO_ACKS = "#9b2226"


def timeline_png(
    *,
    width: float,
    acks: list[tuple[int, int]],
    isr: list[dict[str, Any]],
    faults: list[dict[str, Any]],
    unavailable: list[dict[str, Any]],
    lost_t: list[float],
) -> bytes:
    """Acks per second and ISR size per partition over the run (seconds since start).

    acks: (bucket, acks) per `width`-second bucket; isr: rows of topic, partition, bucket,
    isr, offline; faults: report faults (start_s, end_s, fault); lost_t: send times of lost
    records. Fault windows are shaded on both panels, lost records marked on the top one.
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
