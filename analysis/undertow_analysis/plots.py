"""The report's timeline as a PNG (matplotlib's Agg canvas, no display, no pyplot state).

Four panels over one x axis, seconds since the report's t = 0 (`report.clock`):

- sends per second by completion (Jepsen's `rate`): acknowledged, failed, indeterminate,
  with the no-acks windows shaded and their lengths written on them, and lost records
  marked when they were acknowledged;
- every send attempt's latency at its completion (Jepsen's `latency-raw`), coloured by
  outcome on a log scale, with the p50 and p99 of the acknowledged ones: one point per
  non-empty cell of the series' 2-D histogram, so a week-long run draws as many as a minute;
- one lane per node: each fault from injected to healed (solid, with its kind and #id), then
  from healed to recovered (hatched, a tick at recovered); elections on the new leader's
  lane, fences, truncations and coordinator moves on their broker's, explained by the
  legend; the consumer group's rebalances on a lane of their own;
- the ISR size of each partition, where no leader is marked, and (dashed) the number of its
  eligible leader replicas (KIP-966) wherever it has some.

The figure is FIGURE_WIDTH inches at DPI, the width report.html shows it at, and no text is
smaller than MIN_FONT points (a point is DPI / 72 pixels there).

Long (about 520 lines): four panels sharing one axis, one clock and one legend; each panel
is a function of its own.
"""

from __future__ import annotations

import io
import itertools
import math
from collections.abc import Iterable
from typing import Any

from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter
from matplotlib.transforms import blended_transform_factory

from undertow_analysis import report

FIGURE_WIDTH = 11.5  # inches: report.html shows the PNG at most 1150 px wide
DPI = 100
MIN_FONT = 10.0  # points; at DPI 100 that is 13.9 px
FONTS = {"font.size": MIN_FONT, "axes.titlesize": 11.0, "axes.labelsize": MIN_FONT,
         "xtick.labelsize": MIN_FONT, "ytick.labelsize": MIN_FONT,
         "legend.fontsize": MIN_FONT, "legend.title_fontsize": MIN_FONT}
RATE_BINS = 80
"""About this many bins across the rate panel: wider than the series' buckets on short runs,
whose completions come in bursts (a batch, a fetch) that would make a finer rate a comb."""
CLIP_BINS = 10  # see _rate_top
QUANTILE_WINDOW_S = 1.0  # the latency lines' window (at least one cell column)
MAX_ISR_LINES = 24
OUTCOME_COLOURS = {"acked": "#1d3557", "failed": "#d62828", "indeterminate": "#f4a261"}
OUTCOME_NAMES = {"acked": "acknowledged", "failed": "failed", "indeterminate": "indeterminate"}
FAULT_COLOURS = ("#e76f51", "#8ab17d", "#a48ad4", "#e9c46a", "#7fb7d9", "#e07a9f")
NO_ACKS = "#9b2226"
LOST = "#d62828"
HELD = "#7b2cbf"
LSO_HELD_MIN_S = 5.0
UNCONSUMED = "#f77f00"
"""The shortest stretch of a last stable offset held below the HW that the ISR panel hatches:
shorter ones are transactions still open, as they are while they write."""
EVENT_MARKS = ("leader_election", "truncation", "broker_fenced", "group_rebalance",
               "group_stable", "group_empty", "coordinator_load", "leader_recovery")
"""The events.jsonl types the timeline marks (the job keeps only the elections, truncations
and coordinator loads of the consumer group's own __consumer_offsets partition, not of the
other internal partitions)."""
ELECTION_COLOURS = {"clean": "#1d3557", "preferred": "#6a4c93", "unclean": "#d62828",
                    "offline": "#6c757d", "elr": "#2a9d8f", "last_known_leader": "#f77f00"}
ELECTION_NAMES = {"elr": "ELR, KIP-966", "last_known_leader": "last known leader, KIP-966"}
"""An election kind's words in the legend where its code would say little."""
TRUNCATION_COLOUR = "#e76f51"
FENCED_COLOUR = "#212529"
GROUP_COLOUR = "#2a9d8f"
COORDINATOR_COLOUR = "#b5179e"
CONTROLLER, CLIENTS, GROUP = "controller", "clients", "group"
LANE_IN = 0.5  # inches of the lanes' panel per lane
BAR = (0.1, 0.36)  # a fault's bar in its lane: offset from the lane's middle, height
UPPER_ROW, LOWER_ROW = -0.3, -0.1
RECOVERED_MIN_PX = 4  # a fault narrower than this gets no tick at recovered: it would hide it
"""Where events are marked in a lane (offsets from its middle; the axis runs downwards):
elections, fences and generations above truncations and coordinator moves, which can come
at the same moment on the same broker."""
MARKS = {  # an event type's marker, colour and legend entry (elections: by kind)
    "broker_fenced": ("X", FENCED_COLOUR, "broker fenced"),
    "truncation": ("v", TRUNCATION_COLOUR, "log truncated"),
    "coordinator_load": ("s", COORDINATOR_COLOUR, "group coordinator moved here"),
    "group_stable": ("D", GROUP_COLOUR, "group generation stable"),
    "group_empty": ("D", "#6c757d", "group left empty"),
    # KIP-704: the uncleanly elected leader's first ISR change ended RECOVERING (its start is
    # the unclean election's own mark).
    "leader_recovery": ("^", ELECTION_COLOURS["unclean"], "recovered from the unclean "
                                                          "election (KIP-704)"),
}


def timeline_png(**panels: Any) -> bytes:
    """The timeline (`timeline_figure`, same arguments) as PNG bytes."""
    fig = timeline_figure(**panels)
    buf = io.BytesIO()
    with rc_context(FONTS):
        fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def timeline_figure(
    *,
    series: report.Series,
    t0: float,
    t_end: float,
    clock: dict[str, Any] | None,
    isr: list[dict[str, Any]],
    isr_width: float,
    faults: list[dict[str, Any]],
    unavailable: list[dict[str, Any]],
    lost_t: list[float],
    events: list[dict[str, Any]],
    brokers: int | None = None,
    unconsumed: list[tuple[float, float]] | None = None,
) -> Figure:
    """The four panels (see the module docstring). series: the send series; t0, t_end: the
    report's zero and the run's end; clock: report.json's `clock` (the x axis says what
    t = 0 is); isr: rows of topic, partition, bucket (of `isr_width` seconds since t0),
    isr, offline; faults: report faults (id, fault, target, start_s, healed_s, end_s);
    unavailable: report windows; lost_t: when lost records were acknowledged (seconds
    since t0); events: events.jsonl rows of the EVENT_MARKS types with t_s; brokers: the
    cluster's size (its brokers get lanes even when nothing happened to them); unconsumed:
    the consumer group's unconsumed stretches (`consumption.summary`), (start, end) in
    seconds since t0, banded on the ISR panel."""
    lanes = fault_lanes(faults, events, brokers)
    with rc_context(FONTS):
        fig = Figure(figsize=(FIGURE_WIDTH, 7.4 + LANE_IN * len(lanes)), dpi=DPI,
                     layout="constrained")
        FigureCanvasAgg(fig)
        rate, latency, lane, isr_ax = fig.subplots(
            4, 1, sharex=True, height_ratios=(2.3, 2.5, 0.6 + LANE_IN * len(lanes), 1.5))
        x_end = max(t_end - t0, 1.0)
        first = min([0.0] + [b * series.grid.width + series.grid.t_ref - t0
                             for b, *_ in series.buckets[:1]])
        rate.set_xlim(first, x_end)
        _rates(rate, series, t0, x_end - first, unavailable, lost_t)
        _latencies(latency, series, t0, unavailable)
        _lanes(lane, lanes, faults, events)
        _isr(isr_ax, isr, isr_width, unconsumed or [])
        for ax in (rate, latency, lane, isr_ax):
            ax.grid(axis="x", color="#dee2e6", linewidth=0.8)
            ax.set_axisbelow(True)
        isr_ax.set_xlabel(_x_label(clock))
    return fig


def _x_label(clock: dict[str, Any] | None) -> str:
    if not clock:
        return "seconds since the run's start"
    at = str(clock.get("zero_utc") or "")
    when = f" (t = 0 at {at[11:19]} UTC)" if len(at) >= 19 else ""
    return f"seconds since {clock.get('zero_is') or 'the start'}{when}"


def _titled(ax: Axes, title: str, handles: list[Any]) -> None:
    """The panel's title, and under it, above the panel, its legend (in as many columns as
    fit the panel's width): it hides no data."""
    ncols = _columns([h.get_label() for h in handles])
    rows = math.ceil(len(handles) / ncols) if handles else 0
    ax.set_title(title, loc="left", pad=4 + rows * 1.75 * MIN_FONT, fontweight="bold")
    if handles:
        ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=ncols,
                  frameon=False, borderaxespad=0.15, handletextpad=0.4, columnspacing=1.4)


LEGEND_WIDTH_PX = 0.85 * FIGURE_WIDTH * DPI  # what a panel's legend may span


def _columns(labels: list[str]) -> int:
    """The most columns in which a legend of `labels` fits LEGEND_WIDTH_PX: matplotlib
    fills it column by column, the first ones one entry longer when the entries do not
    divide evenly, each as wide as its longest label (estimated generously) beside its
    handle."""
    em = MIN_FONT * DPI / 72
    for ncols in range(len(labels), 1, -1):
        rows, longer = divmod(len(labels), ncols)
        bounds = [i * rows + min(i, longer) for i in range(ncols + 1)]
        columns = [labels[a:b] for a, b in itertools.pairwise(bounds)]
        if sum(max(len(t) for t in c) * 0.6 * em + 3.8 * em for c in columns) <= (
                LEGEND_WIDTH_PX):
            return ncols
    return 1


def _px_per_unit(ax: Axes) -> float:
    """Horizontal pixels per second of the x axis, from the axes' share of the figure."""
    left, right = ax.get_xlim()
    return ax.get_position().width * FIGURE_WIDTH * DPI / max(right - left, 1e-9)


def _fits(ax: Axes, seconds: float, text: str) -> bool:
    """`text` at MIN_FONT fits in `seconds` of the x axis (a generous width per glyph)."""
    return seconds * _px_per_unit(ax) >= len(text) * 0.62 * MIN_FONT * DPI / 72 + 6


def _rates(ax: Axes, series: report.Series, t0: float, span: float,
           unavailable: list[dict[str, Any]], lost_t: list[float]) -> None:
    grid = series.grid
    width = grid.width * max(1, round(_nice(span / RATE_BINS) / grid.width))
    rows = report.completion_rates(series, t0, width)
    handles: list[Any] = []
    if rows:
        xs = [r[0] for r in rows] + [rows[-1][0] + width]
        for i, outcome in enumerate(report.OUTCOMES):
            ys = [r[i + 1] for r in rows]
            if outcome != "acked" and not any(ys):
                continue
            line, = ax.step(xs, ys + ys[-1:], where="post", color=OUTCOME_COLOURS[outcome],
                            linewidth=1.6 if outcome == "acked" else 1.2,
                            label=OUTCOME_NAMES[outcome])
            handles.append(line)
    no_acks = [w for w in unavailable if w["kind"] == "no_acks"]
    label_at = blended_transform_factory(ax.transData, ax.transAxes)
    _spans(ax, [(w["start_s"], w["start_s"] + w["duration_s"]) for w in no_acks],
           color=NO_ACKS, alpha=0.13)
    for w in no_acks:
        start, length = w["start_s"], w["duration_s"]
        text = f"{length:.1f} s"
        if _fits(ax, length, text):
            ax.text(start + length / 2, 0.97, text, transform=label_at, ha="center", va="top",
                    color=NO_ACKS, fontsize=MIN_FONT, fontweight="bold")
    if no_acks:
        handles.append(Patch(color=NO_ACKS, alpha=0.2,
                             label=f"no acks (≥ {report.UNAVAILABLE_MIN_S:g} s), its length"))
    if lost_t:
        ax.plot(lost_t, [0.08] * len(lost_t), "x", color=LOST, transform=label_at,
                markersize=7, markeredgewidth=1.5)
        handles.append(Line2D([], [], marker="x", color=LOST, linestyle="none",
                              markeredgewidth=1.5,
                              label=f"lost record, when acknowledged ({len(lost_t):,} shown)"))
    top = _rate_top([r[1:] for r in rows])
    peak = max((max(r[1:]) for r in rows), default=0.0)
    if peak > top:  # the backlog acknowledged at once after an outage: marked, not drawn
        clipped = [r[0] + width / 2 for r in rows if max(r[1:]) > top]
        ax.plot(clipped, [top] * len(clipped), "^", color=OUTCOME_COLOURS["acked"],
                markersize=7, clip_on=False)
        handles.append(Line2D([], [], marker="^", color=OUTCOME_COLOURS["acked"],
                              linestyle="none",
                              label=f"above the axis (peak {peak:,.0f}/s)"))
    ax.set_ylim(0, top)
    ax.yaxis.set_major_locator(MaxNLocator(5, integer=True))
    ax.set_ylabel("sends / s")
    bin_text = f"{width * 1000:.0f} ms" if width < 1 else f"{width:g} s"
    _titled(ax, f"Sends per second, by completion ({bin_text} bins)", handles)


def _nice(x: float) -> float:
    """The 1-2-5 step (0.1, 0.2, 0.5, 1, 2, ...) nearest to `x` on a log scale."""
    if not x > 0:
        return 1.0
    decade = 10.0 ** math.floor(math.log10(x))
    return min((m * decade for m in (1, 2, 5, 10)), key=lambda s: abs(math.log(s / x)))


def _rate_top(rates: list[tuple[float, ...]]) -> float:
    """The rate axis' top: above the highest bin, or, when a few bins (at most one in
    CLIP_BINS) rise above 2.5 times the median busy bin (the backlog acknowledged at once
    after an outage), above that, so that those few do not flatten the steady rate."""
    busy = sorted(max(r) for r in rates if max(r) > 0)
    if not busy:
        return 1.0
    steady = 2.5 * busy[len(busy) // 2]
    above = sum(1 for b in busy if b > steady)
    return max((steady if 0 < above <= len(busy) / CLIP_BINS else busy[-1]) * 1.15, 1.0)


def _ms_text(ms: float, _pos: Any = None) -> str:
    if ms >= 1000:
        return f"{ms / 1000:g} s"
    return f"{ms:g} ms"


def _latencies(ax: Axes, series: report.Series, t0: float,
               unavailable: list[dict[str, Any]]) -> None:
    points = report.latency_points(series, t0)
    handles: list[Any] = []
    for outcome in report.OUTCOMES:
        mine = [(t, ms) for t, ms, o, _ in points if o == outcome]
        if mine:
            handles.append(ax.scatter([p[0] for p in mine], [p[1] for p in mine], s=7,
                                      color=OUTCOME_COLOURS[outcome], alpha=0.55,
                                      linewidths=0, label=OUTCOME_NAMES[outcome],
                                      rasterized=True))
    lines = report.latency_quantiles(series, t0, QUANTILE_WINDOW_S)
    if lines:
        step = max(QUANTILE_WINDOW_S, series.grid.column)
        xs: list[float] = []
        ys: list[list[float]] = []
        for t, q in lines:  # a window without acknowledgement breaks the lines
            if xs and t - xs[-1] > 1.5 * step:
                xs.append(math.nan)
                ys.append([math.nan] * len(q))
            xs.append(t)
            ys.append(q)
        for i, (name, colour, style) in enumerate((("p50", "#000000", "-"),
                                                   ("p99", "#6a4c93", "--"))):
            line, = ax.plot(xs, [q[i] for q in ys], color=colour, linestyle=style,
                            linewidth=1.4, label=f"{name} of acknowledged")
            handles.append(line)
    _spans(ax, [(w["start_s"], w["start_s"] + w["duration_s"]) for w in unavailable
                if w["kind"] == "no_acks"], color=NO_ACKS, alpha=0.08)
    ax.set_yscale("log")
    if points:
        low = min(ms for _, ms, _, _ in points)
        high = max(ms for _, ms, _, _ in points)
        ax.set_ylim(low / 1.6, high * 1.6)
    ax.yaxis.set_major_locator(LogLocator(base=10))
    ax.yaxis.set_major_formatter(FuncFormatter(_ms_text))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylabel("latency")
    window = f"{QUANTILE_WINDOW_S:g} s" if series.grid.column <= QUANTILE_WINDOW_S \
        else f"{series.grid.column:g} s"
    _titled(ax, f"Latency of every send, at its completion (quantiles per {window})",
            handles)


def fault_lanes(faults: list[dict[str, Any]], events: list[dict[str, Any]],
                brokers: int | None) -> list[str]:
    """The lanes, top to bottom: the controller, every broker, then `clients` when a fault
    cut a consumer off and `group` when the consumer group has events."""
    ids = set(range(brokers or 0))
    for f in faults:
        ids |= {int(n.split("-", 1)[1]) for n in fault_nodes(f["target"])
                if n.startswith("broker-") and n.split("-", 1)[1].isdigit()}
    for e in events:
        for key in ("broker", "leader"):
            if isinstance(e.get(key), int) and e[key] >= 0 and e["type"] != "group_rebalance":
                ids.add(e[key])
    lanes = [CONTROLLER] + [f"broker-{i}" for i in sorted(ids)]
    nodes = {_lane(n) for f in faults for n in fault_nodes(f["target"])}
    lanes += sorted(nodes - {*lanes, CLIENTS})  # a node of another name
    if CLIENTS in nodes:
        lanes.append(CLIENTS)
    if any(e["type"].startswith("group_") for e in events):
        lanes.append(GROUP)
    return lanes


def fault_nodes(target: str) -> list[str]:
    """The nodes a fault's target (as faults.jsonl names it) cut off: the target; the source
    of a one-way partition; the smaller side of a split (the first if equal)."""
    if "|" in target:
        return min((side.split(",") for side in target.split("|")), key=len)
    return [target.split("->", 1)[0]]


def _lane(node: str) -> str:
    return CLIENTS if node.startswith("client") else node


def _lanes(ax: Axes, lanes: list[str], faults: list[dict[str, Any]],
           events: list[dict[str, Any]]) -> None:
    """Each lane is one unit high: faults fill its lower part (the axis runs downwards),
    events are marked in its upper part."""
    y = {name: i for i, name in enumerate(lanes)}
    colours: dict[str, str] = {}
    handles: list[Any] = []
    # Bars are drawn one collection per lane, kind and part: a soak has thousands of faults.
    bars: dict[tuple[int, str, bool], list[tuple[float, float]]] = {}
    recovered: tuple[list[float], list[float]] = ([], [])
    per_s = _px_per_unit(ax)
    for f in faults:
        colour = colours.setdefault(f["fault"], FAULT_COLOURS[len(colours) % len(FAULT_COLOURS)])
        start, end = f["start_s"], f["end_s"]
        healed = end if f.get("healed_s") is None else min(max(f["healed_s"], start), end)
        text = f"{f['fault']} #{f['id']}"
        for node in fault_nodes(f["target"]):
            row = y[_lane(node)]
            middle = row + BAR[0] + BAR[1] / 2
            bars.setdefault((row, colour, False), []).append((start, max(healed - start, 1e-9)))
            if end > healed:
                bars.setdefault((row, colour, True), []).append((healed, end - healed))
            if f.get("recovered", True) and (end - start) * per_s >= RECOVERED_MIN_PX:
                recovered[0].append(end)
                recovered[1].append(middle)
            label = text if _lane(node) != CLIENTS else f"{text} {node.split('-', 1)[-1]}"
            if _fits(ax, healed - start, label):
                ax.text((start + healed) / 2, middle, label, ha="center", va="center",
                        fontsize=MIN_FONT, color="#000000")
    for (row, colour, healing), ranges in bars.items():
        merged = [(a, b - a) for a, b in _merged([(a, a + w) for a, w in ranges])]
        ax.broken_barh(merged, (row + BAR[0], BAR[1]), edgecolor=colour, linewidth=0.6,
                       facecolors="white" if healing else colour,
                       hatch="////" if healing else None)
    ax.plot(*recovered, marker="|", markersize=16, markeredgewidth=2, color="#343a40",
            linestyle="none")
    handles += [Patch(facecolor=c, label=f"{k}: injected → healed") for k, c in colours.items()]
    if faults:
        handles.append(Patch(facecolor="white", edgecolor="#6c757d", hatch="////",
                             label="healed → recovered"))
        handles.append(Line2D([], [], marker="|", markersize=12, markeredgewidth=2,
                              color="#343a40", linestyle="none", label="recovered"))
    handles += _lane_events(ax, y, events)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.set_yticks(range(len(lanes)), lanes)
    ax.tick_params(axis="y", length=0)
    for i in range(0, len(lanes), 2):  # every other lane shaded: what is on which lane shows
        ax.axhspan(i - 0.5, i + 0.5, color="#f1f3f5", linewidth=0, zorder=0)
    _titled(ax, "Faults and cluster events, per node", handles)


def _lane_events(ax: Axes, y: dict[str, int], events: list[dict[str, Any]]) -> list[Any]:
    """Elections on the new leader's lane (the controller's when none was found), fences,
    truncations and coordinator loads on their broker's; the group's rebalances (a band
    until the generation they lead to) and generations on its lane. Returns the legend's
    handles, one per kind of mark present."""
    seen: dict[str, Any] = {}
    points: dict[tuple[str, str, str], tuple[list[float], list[float]]] = {}
    rebalancing: dict[Any, float] = {}

    def mark(lane: str, t: float, marker: str, colour: str, name: str, row: float) -> None:
        if lane not in y:
            return
        xs, ys = points.setdefault((marker, colour, name), ([], []))
        xs.append(t)
        ys.append(y[lane] + row)

    for e in sorted(events, key=lambda e: e["t_s"]):
        kind, t = e["type"], e["t_s"]
        if kind == "leader_election":
            leader = e.get("leader")
            how = e.get("kind") or "clean"
            lane = f"broker-{leader}" if isinstance(leader, int) and leader >= 0 else CONTROLLER
            mark(lane, t, "o", ELECTION_COLOURS.get(how, "#1d3557"),
                 f"elected leader ({ELECTION_NAMES.get(how, how)})" if lane != CONTROLLER
                 else "election found no leader", UPPER_ROW)
        elif kind == "group_rebalance":
            rebalancing.setdefault(e.get("group"), t)
        elif kind == "leader_recovery" and e.get("leader_recovery_state") != "RECOVERED":
            continue
        elif kind in MARKS:
            marker, colour, name = MARKS[kind]
            if kind in ("group_stable", "group_empty"):
                began = rebalancing.pop(e.get("group"), None)
                if began is not None and GROUP in y:
                    ax.broken_barh([(began, max(t - began, 1e-9))], (y[GROUP] + BAR[0], BAR[1]),
                                   facecolors=GROUP_COLOUR, alpha=0.35, linewidth=0)
                    seen.setdefault("rebalance", Patch(facecolor=GROUP_COLOUR, alpha=0.35,
                                                       label="group rebalancing"))
                mark(GROUP, t, marker, colour, name, UPPER_ROW)
            else:
                mark(f"broker-{e.get('broker')}", t, marker, colour, name,
                     UPPER_ROW if kind == "broker_fenced" else LOWER_ROW)
    for began in rebalancing.values():  # not stable again before the run ended
        if GROUP in y:
            ax.broken_barh([(began, ax.get_xlim()[1] - began)], (y[GROUP] + BAR[0], BAR[1]),
                           facecolors=GROUP_COLOUR, alpha=0.35, linewidth=0)
    for (marker, colour, name), (xs, ys) in points.items():
        ax.plot(xs, ys, marker=marker, color=colour, linestyle="none", markersize=8)
        seen.setdefault(name, Line2D([], [], marker=marker, color=colour, linestyle="none",
                                     markersize=8, label=name))
    return list(seen.values())


def _isr(ax: Axes, isr: list[dict[str, Any]], width: float,
         unconsumed: list[tuple[float, float]]) -> None:
    """Each partition's ISR size, and, dashed in the same colour, its ELR size (KIP-966)
    for the partitions that had eligible leader replicas (rows without `elr`: none); and
    banded, when a partition of the consumer group's topic had a record waiting with no
    member reading it (`unconsumed`)."""
    by_partition: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in isr:
        by_partition.setdefault((row["topic"], row["partition"]), []).append(row)
    shown = sorted(by_partition.items())[:MAX_ISR_LINES]
    handles: list[Any] = []
    offline: list[float] = []
    with_elr = False
    for n, (key, rows) in enumerate(shown):
        rows.sort(key=lambda r: r["bucket"])
        # Equal ISR sizes of several partitions stay apart by a hair.
        nudge = 0.05 * (n - (len(shown) - 1) / 2) if len(shown) > 1 else 0.0
        xs = [r["bucket"] * width for r in rows]
        ys = [r["isr"] + nudge for r in rows]
        line, = ax.step([*xs, xs[-1] + width], [*ys, ys[-1]], where="post", linewidth=1.4,
                        label=f"{key[0]}-{key[1]}")
        handles.append(line)
        if any(r.get("elr") for r in rows):
            elr = [(r.get("elr") or 0) + nudge for r in rows]
            ax.step([*xs, xs[-1] + width], [*elr, elr[-1]], where="post", linewidth=1.2,
                    linestyle="--", color=line.get_color())
            with_elr = True
        offline += [r["bucket"] * width for r in rows if r["offline"]]
    if with_elr:
        handles.append(Line2D([], [], color="#6c757d", linestyle="--", linewidth=1.2,
                              label="ELR size (KIP-966)"))
    if offline:
        _spans(ax, _runs(sorted(set(offline)), width), color=LOST, alpha=0.18)
        handles.append(Patch(color=LOST, alpha=0.25, label="no leader"))
    held = [span for _, rows in shown for span in _runs(
        [r["bucket"] * width for r in sorted(rows, key=lambda r: r["bucket"])
         if r.get("lso_held")], width) if span[1] - span[0] >= LSO_HELD_MIN_S]
    if held:
        _spans(ax, _merged(held), facecolor="none", edgecolor=HELD, hatch="//")
        handles.append(Patch(facecolor="none", edgecolor=HELD, hatch="//",
                             label="last stable offset held below the HW (read_committed "
                                   "readers stopped)"))
    if unconsumed:
        _spans(ax, unconsumed, facecolor="none", edgecolor=UNCONSUMED, hatch="\\\\")
        handles.append(Patch(facecolor="none", edgecolor=UNCONSUMED, hatch="\\\\",
                             label="a partition unconsumed (a record waiting, no group "
                                   "member reading it)"))
    top = max((max(r["isr"], r.get("elr") or 0) for r in isr), default=1)
    ax.set_ylim(-0.3, top + 0.5)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("replicas")
    more = f" ({len(shown)} of {len(by_partition)} shown)" if len(by_partition) > len(shown) \
        else ""
    what = "ISR and ELR size" if with_elr else "ISR size"
    _titled(ax, f"{what} per partition{more}", handles)


def _spans(ax: Axes, spans: list[tuple[float, float]], **style: Any) -> None:
    """Bands over the panel's height from each span's start to its end (seconds): one
    collection, where an axvspan each would take a minute for a soak's thousands."""
    if spans:
        ax.add_collection(PolyCollection(
            [[(a, 0), (a, 1), (b, 1), (b, 0)] for a, b in _merged(spans)],
            transform=ax.get_xaxis_transform(), linewidth=0, **style), autolim=False)


def _merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(start, end) spans merged where they overlap or touch: fewer polygons to draw."""
    merged: list[list[float]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _runs(xs: Iterable[float], width: float) -> list[tuple[float, float]]:
    """Consecutive bucket starts merged into (start, end) spans."""
    spans: list[list[float]] = []
    for x in xs:
        if spans and x <= spans[-1][1] + 1e-9:
            spans[-1][1] = x + width
        else:
            spans.append([x, x + width])
    return [(a, b) for a, b in spans]
