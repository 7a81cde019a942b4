"""report.json: its sections, built from the small results the job collects (`build`), and
the text summary.

Everything here is plain Python over bounded data (aggregated counts, fault lists, windows):
the large joins happen in checks.py.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from undertow_analysis import anomalies

AVAILABILITY_DEFINITION = (
    "A second (since the run's start) is available when at least one send attempt invoked in "
    "it was acknowledged. fraction = available seconds / seconds with send attempts; "
    "ack_fraction = acknowledged attempts / attempts. A no_acks window is a maximal run of "
    "consecutive seconds with attempts and no acknowledged attempt; an offline window is a "
    "maximal run of cluster samples in which a partition had no leader (leader -1)."
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


def no_ack_windows(seconds: list[int], t_ref: float, t0: float) -> list[dict[str, Any]]:
    """Merge seconds (since t_ref) with attempts and no acknowledgement into maximal runs."""
    windows: list[dict[str, Any]] = []
    for s in sorted(seconds):
        if windows and windows[-1]["_last"] == s - 1:
            windows[-1]["_last"] = s
        else:
            windows.append({"_first": s, "_last": s})
    return [
        _window("no_acks", t_ref + w["_first"], t_ref + w["_last"] + 1, t0) for w in windows
    ]


def _window(kind: str, start: float, end: float, t0: float, **extra: Any) -> dict[str, Any]:
    return {"kind": kind, "start": start, "end": end, "start_s": round(start - t0, 3),
            "duration_s": round(end - start, 3), **extra}


def offline_windows(rows: list[dict[str, Any]], t0: float) -> list[dict[str, Any]]:
    return [_window("offline", r["start"], r["end"], t0, topic=r["topic"],
                    partition=r["partition"]) for r in rows]


def availability(
    attempted: int, acked: int, seconds: int, available_seconds: int,
    offline: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "definition": AVAILABILITY_DEFINITION,
        "seconds": seconds,
        "available_seconds": available_seconds,
        "fraction": _ratio(available_seconds, seconds),
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


Series = list[tuple[int, int, int]]
"""Per second with send attempts: (second since the run's t_ref, attempts invoked in it, how
many of those were acknowledged), in order (`checks.send_series`)."""


def _availability(series: Series, t_ref: float, t0: float, offline: list[dict[str, Any]]
                  ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The availability section and the unavailable windows, no-acks and offline, in order."""
    summary = availability(
        attempted=sum(a for _, a, _ in series), acked=sum(k for _, _, k in series),
        seconds=len(series), available_seconds=sum(1 for *_, k in series if k), offline=offline)
    no_acks = no_ack_windows([s for s, _, k in series if not k], t_ref, t0)
    return summary, sorted(no_acks + offline, key=lambda w: (w["start"], w["kind"]))


def acks_per_bucket(series: Series, t_ref: float, t0: float, width: float
                    ) -> list[tuple[int, int]]:
    """Acknowledged attempts per `width`-second bucket since t0 (the timeline's curve)."""
    buckets: dict[int, int] = {}
    for second, _, acked in series:
        bucket = math.floor((second + t_ref - t0) / width)
        buckets[bucket] = buckets.get(bucket, 0) + acked
    return sorted(buckets.items())


def build(meta: Mapping[str, Any], *, history: str, outputs: Mapping[str, str],
          counts: dict[str, int], series: Series, latency: list[tuple[int, int, float]],
          t_ref: float, t0: float, t_end: float, last_read: float | None,
          faults: list[dict[str, Any]], offline: list[dict[str, Any]],
          explained: dict[str, Any], first_lost: dict[str, Any] | None,
          malformed: dict[str, Any], drain_short: list[dict[str, Any]]) -> dict[str, Any]:
    """report.json's content from what the job collected: `meta` (meta.json), the history's
    URI, the outputs' (by file name), the counts, the send series and latency histogram
    (`checks.send_series`), the run's reference time, start and end, its last read, the
    faults, the rows of `checks.offline_windows`, the explanations (`explain`), the
    earliest-sent lost record of anomalies/, the malformed lines (`History.malformed`) and
    the drain's shortfalls (`drain_shortfalls`). The verdict is `anomalies.verdict`."""
    idempotent = bool(meta.get("idempotent", False))
    verdict = anomalies.verdict(counts, idempotent)
    summary, windows = _availability(series, t_ref, t0, offline_windows(offline, t0))
    latency_ms = latency_percentiles(latency)
    return clean_json({
        "verdict": verdict,
        "expect": meta.get("expect"),
        "as_expected": verdict == meta.get("expect") if meta.get("expect") else None,
        "counts": counts,
        "latency_ms": {k: latency_ms[k] for k in ("p50", "p99", "p999")},
        "availability": summary,
        "unavailable_windows": windows,
        "faults": faults,
        "explained": explained,
        "first_loss": first_lost and {**first_lost,
                                      "t_rel_s": round(first_lost["t_invoke"] - t0, 3)},
        "malformed": malformed,
        "run": {"start": t0, "end": t_end, "duration_s": round(t_end - t0, 3),
                "last_read": last_read},
        "history": history,
        "experiment": meta.get("experiment"),
        "idempotent": idempotent,
        "incomplete": bool(meta.get("incomplete", False)),
        "incomplete_reason": meta.get("incomplete_reason"),
        "drain_short": drain_short,
        "consumer_group": meta.get("consumer_group"),
        "outputs": {"json": outputs["report.json"], "html": outputs["report.html"],
                    "anomalies": outputs["anomalies"]},
    })


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
    cuts = explained["truncations"]
    if cuts:
        cut_acked = explained["truncations_cut_acked"]
        lines.append(f"truncations: {len(cuts)}, " + (
            "each dropped only unacknowledged records" if not cut_acked
            else f"{cut_acked} cut acknowledged records"))
    else:
        lines.append("truncations: none")
    groups = explained["duplicates"]
    if groups:
        by_mechanism: dict[str, int] = {}
        for g in groups:
            by_mechanism[g["mechanism_name"]] = by_mechanism.get(g["mechanism_name"], 0) + (
                g["duplicates"])
        lines.append(f"duplicates: {sum(by_mechanism.values()):,} ("
                     + "; ".join(f"{name}: {n:,}" for name, n in by_mechanism.items()) + ")")
    return lines


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
    lines.append(f"availability {frac} of {av['seconds']} s; "
                 f"{len(report['unavailable_windows'])} unavailable window(s); "
                 f"{len(report['faults'])} fault(s) injected")
    first = report.get("first_loss")
    if first:
        lines.append(f"first loss  {first['value']} at {first['topic']}-{first['partition']}"
                     f"@{first['offset']}, sent at +{first['t_rel_s']:.3f} s, "
                     f"fault: {first['fault'] or 'none active'}")
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
