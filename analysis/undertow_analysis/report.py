"""report.json: its sections, built from the small results the job collects (`build`), and
the text summary.

Everything here is plain Python over bounded data (aggregated counts, fault lists, windows):
the large joins happen in checks.py.

Long (about 520 lines) because report.json has many sections; each is one small function
here, in the order the page shows them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from undertow_analysis import anomalies
from undertow_analysis.grid import CELL_RATIO, Grid
from undertow_history.checker import SKIPPED_NOTE, as_expected, skipped_faults, skipped_text

UNAVAILABLE_MIN_S = 1.0
"""The shortest no_acks window the report keeps: shorter gaps between acknowledgements are a
workload's ordinary waits (a batch, a slow request), not an outage."""
SUMMARY_WINDOWS = 5
"""No-acks windows whose length and start the summary's availability line gives."""
AVAILABILITY_DEFINITION = (
    "Measured on completions, as a producer sees it. A send attempt is in flight from its "
    "invocation to its completion; time is cut into buckets of {resolution_s:g} s "
    "(resolution_s). A no_acks window is a maximal run of buckets during which attempts were "
    "in flight and no acknowledgement completed, kept when at least "
    f"{UNAVAILABLE_MIN_S:g} s long (min_window_s); its failed and indeterminate count the "
    "attempts that completed in it without one. fraction = 1 - no_acks time / time with "
    "attempts in flight (in_flight_s). ack_fraction = acknowledged attempts / attempts, "
    "whenever they completed. An offline window is a maximal run of cluster samples in which "
    "a partition had no leader (leader -1)."
)

SEND_COUNTS = {
    "attempted": "distinct values sent",
    "acked": "values with an ok send",
    "failed": "values whose every send failed definitively",
    "indeterminate": "values with no ok send and at least one timed-out (info) send",
}
INDETERMINATE_COUNTS = {
    "indeterminate_committed": "indeterminate values found in the drain (not loss)",
    "indeterminate_lost": "indeterminate values not in the drain (not loss)",
}
COUNT_HELP = {**SEND_COUNTS, **{k.count: k.help for k in anomalies.KINDS},
              **INDETERMINATE_COUNTS}
"""report.json's counts in their order, each with what it counts (report.html's words): the
sends, the anomaly kinds' (`anomalies.KINDS`), then the indeterminate sends' fate."""
COUNT_NAMES = tuple(COUNT_HELP)
INCOMPLETE_NOTE = ("a failure stopped the run, so records are missing from then on and there "
                   "was no drain: acknowledged records look lost, and the verdict says little")
SHORT_DRAIN_NOTE = ("the drain did not read every partition to its end, so acknowledged "
                    "records past where it stopped are counted lost although a broker may "
                    "still hold them")


def clock_zero(meta: Mapping[str, Any], first_send: float | None) -> float:
    """The zero of every time the report gives (incidents, tables, plots): the workload's
    start, which is also the zero of `undertow run`'s progress lines and fault schedule;
    the run's start for a history without it (a run that stopped before its workload)."""
    for zero in (meta.get("workload_start"), meta.get("start"), first_send):
        if isinstance(zero, int | float) and not isinstance(zero, bool):
            return float(zero)
    return 0.0


def clock(meta: Mapping[str, Any], t0: float) -> dict[str, Any]:
    """report.json's `clock`: what t = 0 is, as a time of day and in words, and whether the
    times are virtual (a simulated run, meta.json's `"platform": "sim"`)."""
    zero_is = ("the workload's start" if meta.get("workload_start") is not None
               else "the run's start")
    utc = datetime.fromtimestamp(t0, UTC)
    return {"zero": t0, "zero_is": zero_is,
            "zero_utc": utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z",
            "virtual": meta.get("platform") == "sim"}


def drain_shortfalls(drain: Any, topic: str | None) -> list[dict[str, Any]]:
    """The partitions meta.json's `drain` (partition -> end offset and the offset the drain
    read up to) says the drain did not read to their end: the end unknown (no reachable
    leader after healing) or not reached in time. None for a history without `drain` (an
    older run, another harness). A `drain` of another shape is a clear error."""
    if drain is None:
        return []
    where = "meta.json's drain"
    if not isinstance(drain, dict):
        raise ValueError(f"{where} must be an object of partition -> {{end, read_to}}")
    short = []
    for key, entry in drain.items():
        if not (key.isdigit() and isinstance(entry, dict)
                and isinstance(entry.get("read_to"), int)
                and (entry.get("end") is None or isinstance(entry["end"], int))):
            raise ValueError(f"{where}[{key!r}] must be {{end: offset or null, read_to: "
                             f"offset}} under a partition number, got {entry!r}")
        end, read_to = entry.get("end"), entry["read_to"]
        if end is None or read_to < end:
            short.append({"topic": topic, "partition": int(key), "end": end,
                          "read_to": read_to})
    return sorted(short, key=lambda s: s["partition"])


def shortfall_text(short: dict[str, Any]) -> str:
    where = f"{short['topic']}-{short['partition']}"
    if short["end"] is None:
        return f"{where}: end unknown (no reachable leader after healing), not read"
    return f"{where}: read to offset {short['read_to']} of {short['end']}"


def fault_label(fault: dict[str, Any]) -> str:
    role = f" ({fault['role']})" if fault.get("role") else ""
    return f"#{fault['id']} {fault['fault']} {fault['target']}{role}"


def fault_intervals(faults: list[dict[str, Any]]) -> list[tuple[float, float, str]]:
    """Split overlapping fault windows into disjoint (start, end, label) intervals, labelled
    with every fault active in them, so that a timestamp falls in at most one interval.

    A sweep over the window edges: linear in the number of faults of a week-long soak.
    """
    lasting = [(i, f) for i, f in enumerate(faults) if f["end"] > f["start"]]
    edges = sorted([(f["start"], 1, i) for i, f in lasting]
                   + [(f["end"], 0, i) for i, f in lasting])
    active: dict[int, str] = {}
    intervals: list[tuple[float, float, str]] = []
    previous = None
    for t, starts, i in edges:
        if active and previous is not None and t > previous:
            intervals.append((previous, t, " + ".join(active.values())))
        if starts:
            active[i] = fault_label(faults[i])
        else:
            active.pop(i)
        previous = t
    return intervals


def no_ack_windows(series: Series, t0: float, min_s: float = UNAVAILABLE_MIN_S
                   ) -> tuple[list[dict[str, Any]], float]:
    """The no_acks windows at least `min_s` long (see AVAILABILITY_DEFINITION), and the
    time with attempts in flight, from the series' completion buckets.

    One sweep over the buckets in order: the attempts in flight at a bucket's start are
    those invoked before it less those completed before it, so a bucket without a row (no
    invocation, no completion) is in flight, and then without acknowledgement, when any
    attempt is."""
    width, t_ref = series.grid.width, series.grid.t_ref
    runs: list[list[int]] = []  # [first bucket, end bucket (exclusive), failed, indeterminate]
    current: list[int] | None = None
    in_flight, busy, previous = 0, 0, None

    def unavailable(first: int, end: int, failed: int, indeterminate: int) -> list[int]:
        if current is not None and current[1] == first:
            current[1:] = [end, current[2] + failed, current[3] + indeterminate]
            return current
        runs.append([first, end, failed, indeterminate])
        return runs[-1]

    for bucket, attempted, acked, failed, indeterminate in series.buckets:
        if previous is not None and bucket > previous + 1:  # buckets without a row
            if in_flight > 0:
                busy += bucket - previous - 1
                current = unavailable(previous + 1, bucket, 0, 0)
            else:
                current = None
        if in_flight > 0 or attempted > 0:
            busy += 1
            current = unavailable(bucket, bucket + 1, failed, indeterminate) if not acked \
                else None
        else:
            current = None
        in_flight += attempted - acked - failed - indeterminate
        previous = bucket
    windows = [_window("no_acks", t_ref + first * width, t_ref + end * width, t0,
                       failed=failed, indeterminate=indeterminate)
               for first, end, failed, indeterminate in runs
               if (end - first) * width >= min_s - 1e-9]
    return windows, round(busy * width, 3)


def _window(kind: str, start: float, end: float, t0: float, **extra: Any) -> dict[str, Any]:
    return {"kind": kind, "start": start, "end": end, "start_s": round(start - t0, 3),
            "duration_s": round(end - start, 3), **extra}


def offline_windows(rows: list[dict[str, Any]], t0: float) -> list[dict[str, Any]]:
    return [_window("offline", r["start"], r["end"], t0, topic=r["topic"],
                    partition=r["partition"]) for r in rows]


def availability(series: Series, no_acks: list[dict[str, Any]], in_flight_s: float,
                 offline: list[dict[str, Any]]) -> dict[str, Any]:
    """report.json's availability (AVAILABILITY_DEFINITION)."""
    unavailable_s = round(sum(w["duration_s"] for w in no_acks), 3)
    attempted = series.attempts
    acked = sum(b[2] for b in series.buckets)
    return {
        "definition": AVAILABILITY_DEFINITION.format(resolution_s=series.grid.width),
        "resolution_s": series.grid.width,
        "min_window_s": UNAVAILABLE_MIN_S,
        "in_flight_s": in_flight_s,
        "unavailable_s": unavailable_s,
        "fraction": round(1 - unavailable_s / in_flight_s, 6) if in_flight_s else None,
        "no_ack_windows": len(no_acks),
        "longest_s": max((w["duration_s"] for w in no_acks), default=0.0),
        "attempts": attempted,
        "acked_attempts": acked,
        "ack_fraction": _ratio(acked, attempted),
        "partition_offline_s": round(sum(w["duration_s"] for w in offline), 3),
    }


def latency_percentiles(histogram: list[tuple[int, int, float]],
                        quantiles: dict[str, float] | None = None) -> dict[str, float | None]:
    """Nearest-rank percentiles from (bucket, count, largest latency in the bucket) rows of
    `checks.send_series`: the largest latency of the bucket holding the rank, so at most one
    bucket width (0.1 %) above the exact value, and exact when the bucket holds one latency."""
    quantiles = quantiles or {"p50": 0.5, "p99": 0.99, "p999": 0.999}
    rows = sorted(histogram)
    total = sum(count for _, count, _ in rows)
    found: dict[str, float | None] = {}
    for name, q in quantiles.items():
        rank, seen, found[name] = max(1, math.ceil(q * total)), 0, None
        for _, count, largest in rows:
            seen += count
            if total and seen >= rank:
                found[name] = largest
                break
    return found


def _ratio(a: int, b: int) -> float | None:
    return round(a / b, 6) if b else None


OUTCOMES = ("acked", "failed", "indeterminate")
"""A send attempt's outcomes, in the order of the series' columns."""


@dataclass(frozen=True)
class Series:
    """The send series the job collects from `checks.send_series`, on its `grid`.

    buckets: per bucket of grid.width seconds since grid.t_ref with an invocation or a
    completion, in order: (bucket, attempts invoked in it, attempts that completed in it
    acknowledged, failed, indeterminate). cells: the 2-D histogram of completions, (column
    of grid.column seconds since grid.t_ref, latency bucket of `CELL_RATIO`, outcome
    (one of OUTCOMES), attempts)."""

    grid: Grid
    buckets: list[tuple[int, int, int, int, int]]
    cells: list[tuple[int, int, str, int]]

    @property
    def attempts(self) -> int:
        return sum(b[1] for b in self.buckets)


def _availability(series: Series, t0: float, offline: list[dict[str, Any]],
                  faults: list[dict[str, Any]]
                  ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The availability section and the unavailable windows, no-acks and offline, in order,
    each with the ids of the faults active during it."""
    no_acks, in_flight_s = no_ack_windows(series, t0)
    summary = availability(series, no_acks, in_flight_s, offline)
    windows = sorted(no_acks + offline, key=lambda w: (w["start"], w["kind"]))
    for w in windows:
        w["faults"] = [f["id"] for f in faults if f["start"] < w["end"] and f["end"] > w["start"]]
    return summary, windows


def completion_rates(series: Series, t0: float, width: float
                     ) -> list[tuple[float, float, float, float]]:
    """(start of a `width`-second bin, in seconds since t0; acknowledged, failed and
    indeterminate completions per second in it) for every bin from the first bucket to the
    last, so a bin without completions shows 0 (`width` a multiple of the grid's)."""
    if not series.buckets:
        return []
    grid = series.grid
    per = max(1, round(width / grid.width))
    sums: dict[int, list[int]] = {}
    for bucket, _, acked, failed, indeterminate in series.buckets:
        row = sums.setdefault(bucket // per, [0, 0, 0])
        row[0] += acked
        row[1] += failed
        row[2] += indeterminate
    span = per * grid.width
    first, last = min(sums), max(sums)
    return [(grid.t_ref + b * span - t0, *(n / span for n in sums.get(b, (0, 0, 0))))
            for b in range(first, last + 1)]


def _cell_ms(bucket: int) -> float:
    """A latency cell's representative latency: the geometric middle of its bounds."""
    return float(CELL_RATIO ** (bucket + 0.5))


def latency_points(series: Series, t0: float) -> list[tuple[float, float, str, int]]:
    """(time in seconds since t0, latency in ms, outcome, attempts) for every non-empty
    latency cell: the middle of its column and of its latency bucket."""
    grid = series.grid
    return [(grid.t_ref + (column + 0.5) * grid.column - t0, _cell_ms(bucket), outcome, n)
            for column, bucket, outcome, n in series.cells]


def latency_quantiles(series: Series, t0: float, window: float = 1.0,
                      quantiles: tuple[float, ...] = (0.5, 0.99)
                      ) -> list[tuple[float, list[float]]]:
    """(middle of a window, in seconds since t0; each quantile's latency in ms) of the
    acknowledged attempts that completed in each `window`-second window (at least a cell
    column), nearest rank over the cells."""
    grid = series.grid
    per = max(1, round(window / grid.column))
    by_window: dict[int, dict[int, int]] = {}
    for column, bucket, outcome, n in series.cells:
        if outcome == "acked":
            cells = by_window.setdefault(column // per, {})
            cells[bucket] = cells.get(bucket, 0) + n
    span = per * grid.column
    lines = []
    for w, cells in sorted(by_window.items()):
        total, found = sum(cells.values()), []
        for q in quantiles:
            rank, seen = max(1, math.ceil(q * total)), 0
            for bucket in sorted(cells):
                seen += cells[bucket]
                if seen >= rank:
                    found.append(_cell_ms(bucket))
                    break
        lines.append((grid.t_ref + (w + 0.5) * span - t0, found))
    return lines


def build(meta: Mapping[str, Any], *, history: str, outputs: Mapping[str, str],
          counts: dict[str, int], series: Series, latency: list[tuple[int, int, float]],
          t0: float, t_end: float, last_read: float | None,
          faults: list[dict[str, Any]], offline: list[dict[str, Any]],
          first_lost: dict[str, Any] | None,
          malformed: dict[str, Any], drain_short: list[dict[str, Any]],
          consumption: dict[str, Any] | None = None) -> dict[str, Any]:
    """report.json's content from what the job collected: `meta` (meta.json), the history's
    URI, the outputs' (by file name), the counts, the send series and latency histogram
    (`checks.send_series`), the run's start (t0, the zero of every time) and end, its last
    read, the faults, the rows of `checks.offline_windows`, the earliest-sent lost record of
    anomalies/, the malformed lines (`History.malformed`) and the drain's shortfalls
    (`drain_shortfalls`), and a consumer group's `consumption.summary`. The verdict is
    `anomalies.verdict`. The explanations come last
    (`explained`): the timeline is drawn while they are queried."""
    idempotent = bool(meta.get("idempotent", False))
    verdict = anomalies.verdict(counts, idempotent)
    skipped = skipped_faults(meta.get("faults_skipped"), history)
    summary, windows = _availability(series, t0, offline_windows(offline, t0), faults)
    latency_ms = latency_percentiles(latency)
    return clean_json({
        "verdict": verdict,
        "expect": meta.get("expect"),
        "as_expected": as_expected(verdict, meta.get("expect"), skipped)
        if meta.get("expect") else None,
        "counts": counts,
        "latency_ms": {k: latency_ms[k] for k in ("p50", "p99", "p999")},
        "availability": summary,
        "unavailable_windows": windows,
        "faults": faults,
        "explained": None,
        "first_loss": first_lost and {**first_lost,
                                      "t_rel_s": round(first_lost["t_invoke"] - t0, 3)},
        "malformed": malformed,
        "clock": clock(meta, t0),
        "run": {"start": t0, "end": t_end, "duration_s": round(t_end - t0, 3),
                "last_read": last_read},
        "history": history,
        "experiment": meta.get("experiment"),
        "idempotent": idempotent,
        "incomplete": bool(meta.get("incomplete", False)),
        "incomplete_reason": meta.get("incomplete_reason"),
        "drain_short": drain_short,
        "faults_skipped": skipped,
        "consumer_group": meta.get("consumer_group"),
        "consumption": consumption,
        "outputs": {"json": outputs["report.json"], "html": outputs["report.html"],
                    "anomalies": outputs["anomalies"]},
    })


def explained(built: dict[str, Any], explanations: dict[str, Any]) -> dict[str, Any]:
    """The report `build` made, with the explanations (`explain`) in place."""
    return {**built, "explained": clean_json(explanations)}


def clean_json(value: Any) -> Any:
    """Report values as JSON: NaN/inf become null, tuples lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: clean_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_json(v) for v in value]
    return value


def to_json(report: dict[str, Any]) -> bytes:
    return json.dumps(clean_json(report), indent=2, sort_keys=False).encode()


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


SUMMARY_INCIDENTS = 3
"""Incidents whose sentences the summary prints (report.json and report.html have them all)."""


def _incident_lines(explained: dict[str, Any]) -> list[str]:
    """The summary's explanation: the first incidents' sentences (an unexplained loss
    first, loudly), or what the truncations of a clean run cut."""
    if not explained["events"]:
        return ["(no events.jsonl: the anomalies are not explained)"]
    lines = []
    if explained["unexplained"]:
        lines.append(f"UNEXPLAINED: {explained['unexplained']:,} anomalous records or "
                     f"committed offsets no event explains: a bug in the broker or in the "
                     f"harness")
    incidents = explained["incidents"]
    if incidents:
        lines.append(f"loss incidents: {explained['incident_count']}")
        lines += [f"  {i['id']}. [{i['mechanism_name']}] {i['sentence']}"
                  for i in incidents[:SUMMARY_INCIDENTS]]
        if explained["incident_count"] > SUMMARY_INCIDENTS:
            lines.append(f"  ... {explained['incident_count'] - SUMMARY_INCIDENTS} more in "
                         f"the report")
    lines.append(truncations_line(explained))
    late = explained.get("late_requests") or []
    if late:
        lines.append(f"late EndTxn requests: {explained['late_request_count']}, "
                     f"{explained['late_requests_decided']} of them ended a later transaction")
        lines += [f"  {r['sentence']}" for r in late[:SUMMARY_INCIDENTS]]
    groups = explained["duplicates"]
    if groups:
        by_mechanism: dict[str, int] = {}
        for g in groups:
            by_mechanism[g["mechanism_name"]] = by_mechanism.get(g["mechanism_name"], 0) + (
                g["duplicates"])
        lines.append(f"duplicates: {sum(by_mechanism.values()):,} ("
                     + "; ".join(f"{name}: {n:,}" for name, n in by_mechanism.items()) + ")")
    return lines


def consumption_line(consumed: dict[str, Any]) -> str:
    """The summary's line on the consumer group (`consumption.summary`)."""
    t = consumed["total"]
    longest = max(consumed["stretches"], key=lambda s: s["length_s"], default=None)
    where = (f", longest {longest['length_s']:.1f} s ({longest['topic']}-{longest['partition']}"
             f" at {longest['start_s']:.1f} s)" if longest else "")
    pause = (f", longest pause {t['longest_pause_s']:.1f} s"
             if t["longest_pause_s"] is not None else "")
    return (f"consumer group ({consumed['group_protocol']} protocol): partitions unconsumed "
            f"{t['unconsumed_s']:.1f} s in all{where}; {t['returned_again']:,} records "
            f"returned again; {t['handovers']} handover(s){pause}")


def headline(report: dict[str, Any]) -> str:
    """The banner's numbers in one phrase: "789 of 18,040 acknowledged records lost in 5
    incidents", and any committed offsets lost or other anomalies."""
    c, ex = report["counts"], report["explained"]
    text = f"{c['lost']:,} of {c['acked']:,} acknowledged records lost"
    n = ex.get("record_incidents", 0)
    if c["lost"] and n:
        text += f" in {n:,} incident{'s' if n != 1 else ''}"
    lost_commits = c.get("committed_offsets_lost") or 0
    if lost_commits:
        text += f", {lost_commits:,} committed offset{'s' if lost_commits != 1 else ''} lost"
    text += "".join(f", {c[k]:,} {k.replace('_', ' ')}" for k in anomalies.COUNTS
                    if c[k] and k not in ("lost", "committed_offsets_lost"))
    return text


def truncations_line(explained: dict[str, Any]) -> str:
    """The truncations in one line: how many, and what the acknowledged records they cut
    became (each lost record counted once)."""
    cuts = explained["truncations"]
    if not cuts:
        return "truncations: none"
    records = sum(c["from_offset"] - c["to_offset"] for c in cuts)
    acked = sum(c["acked"] for c in cuts)
    head = f"truncations: {len(cuts)}, {records:,} records cut"
    if not acked:
        return head + ", none of them acknowledged"
    kept = sum(c["kept"] for c in cuts)
    return head + (f", of them acknowledged: {explained['truncations_lost']:,} lost for good"
                   + (f", {kept:,} kept at other offsets" if kept else ""))


def summary_text(report: dict[str, Any]) -> str:
    """The one-screen summary printed on stdout."""
    c = report["counts"]
    expect = report.get("expect")
    verdict = report["verdict"].upper()
    lines = [f"undertow analysis of {report['history']}", ""]
    lines.append(f"VERDICT: {verdict}" + (
        f"   (expected {expect}: {'as expected' if report['as_expected'] else 'UNEXPECTED'})"
        if expect else ""))
    if report["incomplete"]:
        lines.append(f"HISTORY INCOMPLETE: {INCOMPLETE_NOTE} ({report['incomplete_reason']})")
    if report["drain_short"]:
        lines.append(f"DRAIN INCOMPLETE: {SHORT_DRAIN_NOTE} ("
                     + "; ".join(shortfall_text(s) for s in report["drain_short"]) + ")")
    if report.get("faults_skipped"):
        lines.append(f"FAULTS SKIPPED: {SKIPPED_NOTE} "
                     f"({skipped_text(report['faults_skipped'])})")
    lines.append(headline(report))
    clock = report.get("clock")
    if clock:
        lines.append(f"(times: seconds since {clock['zero_is']}, as in the progress lines)")
    lines += _incident_lines(report["explained"])
    lines.append("")
    lines.append(f"sends   attempted {c['attempted']:>12,}  acked {c['acked']:>12,}  "
                 f"failed {c['failed']:>10,}  indeterminate {c['indeterminate']:>10,}")
    lines.append("anomalies")
    for name in anomalies.COUNTS:
        lines.append(f"  {name:<24}{c[name]:>10,}")
    lines.append(f"indeterminate committed {c['indeterminate_committed']:>11,}  "
                 f"lost {c['indeterminate_lost']:>11,}  (never counted as loss)")
    lat = report["latency_ms"]
    lines.append(f"latency (acked)  p50 {_ms(lat['p50'])}  p99 {_ms(lat['p99'])}  "
                 f"p999 {_ms(lat['p999'])}")
    av = report["availability"]
    frac = "-" if av["fraction"] is None else f"{av['fraction']:.1%}"
    no_acks = [w for w in report["unavailable_windows"] if w["kind"] == "no_acks"]
    shown = ", ".join(f"{w['duration_s']:.1f} s at {w['start_s']:.1f} s"
                      for w in no_acks[:SUMMARY_WINDOWS])
    more = ", ..." if len(no_acks) > SUMMARY_WINDOWS else ""
    lines.append(f"availability {frac} of {av['in_flight_s']:.1f} s with sends in flight; "
                 f"{len(no_acks)} window(s) without acks" + (f" ({shown}{more})" if shown else "")
                 + f"; partitions offline {av['partition_offline_s']:.1f} s; "
                 f"{len(report['faults'])} fault(s) injected")
    if report.get("consumption"):
        lines.append(consumption_line(report["consumption"]))
    skipped = report["malformed"]["skipped"]
    if skipped:
        where = ", ".join(f"{m['file'].rsplit('/', 1)[-1]}:{m['line']}"
                          for m in report["malformed"]["lines"][:5])
        more = ", ..." if skipped > 5 else ""
        lines.append(f"malformed lines skipped: {skipped} ({where}{more})")
    lines.append("")
    lines.append(f"report: {report['outputs']['html']}")
    lines.append(f"anomalies: {report['outputs']['anomalies']}")
    return "\n".join(lines)
