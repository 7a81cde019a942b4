"""report.html: one self-contained page (inline CSS, PNGs as data URIs), verdict first."""

from __future__ import annotations

import base64
from html import escape
from typing import Any

from undertow_analysis.anomalies import COUNTS as ANOMALY_COUNTS
from undertow_analysis.report import (
    COUNT_HELP,
    INCOMPLETE_NOTE,
    SHORT_DRAIN_NOTE,
    shortfall_text,
)

VERDICT_COLOURS = {"clean": "#2a9d8f", "anomalies": "#e9c46a", "loss": "#d62828"}
CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1150px;color:#1d3557}
.verdict{padding:1em 1.5em;border-radius:8px;color:#fff;font-size:1.6em;font-weight:bold}
table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border:1px solid #ccd;padding:.25em .6em;text-align:left;font-size:.9em}
td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.bad td{background:#fde2e2}
img{max-width:100%}
.muted{color:#667}
.incomplete{margin:.8em 0;padding:.6em 1em;border:2px solid #d62828;border-radius:8px}
.unexplained{color:#d62828}
ol#incidents li{margin:.4em 0}
"""


def _word(value: Any) -> str:
    """A cell's text: booleans as yes/no, None as nothing."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    return "" if value is None else str(value)


def _table(headers: list[str], rows: list[list[Any]], cls: str, row_cls: list[str] | None = None,
           *, none: str | None = None) -> str:
    """A table; with no rows and `none` given, the one line `none` instead."""
    if not rows and none is not None:
        return f'<p class="muted {cls}">{escape(none)}</p>'
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        cells = "".join(
            f'<td class="n">{v:,}</td>' if isinstance(v, int) and not isinstance(v, bool)
            else f"<td>{escape(_word(v))}</td>"
            for v in row)
        rc = f' class="{row_cls[i]}"' if row_cls and row_cls[i] else ""
        body.append(f"<tr{rc}>{cells}</tr>")
    return (f'<table class="{cls}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>')


def _b64(png: bytes) -> str:
    return base64.b64encode(png).decode()


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _records(rows: list[dict[str, Any]], t0: float) -> list[list[Any]]:
    return [
        [r["kind"], r["value"], f"{r['topic']}-{r['partition']}" if r["topic"] else None,
         r["offset"], None if r["t_invoke"] is None else f"+{r['t_invoke'] - t0:.3f}",
         r["fault"] or "none", r["detail"]]
        for r in rows
    ]


def _incomplete(report: dict[str, Any]) -> str:
    """Right under the verdict: a history stopped by a failure (`--allow-incomplete`), a
    drain that did not read every partition to its end."""
    parts = []
    if report["incomplete"]:
        parts.append(f'<div class="incomplete" id="incomplete"><b>Incomplete history:</b> '
                     f"{escape(INCOMPLETE_NOTE)} ({escape(str(report['incomplete_reason']))})."
                     f"</div>")
    if report["drain_short"]:
        where = "; ".join(shortfall_text(s) for s in report["drain_short"])
        parts.append(f'<div class="incomplete" id="drain-short"><b>Incomplete drain:</b> '
                     f"{escape(SHORT_DRAIN_NOTE)} ({escape(where)}).</div>")
    return "".join(parts)


def _explained(report: dict[str, Any]) -> list[str]:
    """The loss incidents, each one sentence (unexplained ones first and in red), and the
    truncations with what they cut: right under the verdict."""
    ex = report["explained"]
    if not ex["events"]:
        return ["<h2>Loss incidents</h2>",
                "<p class='muted' id='incidents'>This history has no events.jsonl (a run from "
                "before broker events, or another Kafka-protocol system): the anomalies below "
                "are not explained.</p>"]
    parts = ["<h2>Loss incidents</h2>"]
    if ex["incidents"]:
        more = (f" ({len(ex['incidents'])} of {ex['incident_count']} shown)"
                if ex["incident_count"] > len(ex["incidents"]) else "")
        if ex["unexplained"]:
            parts.append(f"<p class='unexplained'><b>{ex['unexplained']:,} anomalous records "
                         f"or committed offsets no event explains: a bug in the broker or in "
                         f"the harness.</b></p>")
        items = "".join(
            f"<li class='{'unexplained' if i['mechanism'] == 'unexplained' else ''}'>"
            f"<b>{escape(i['mechanism_name'])}</b>: {escape(i['sentence'])}</li>"
            for i in ex["incidents"])
        parts.append(f"<ol id='incidents'>{items}</ol>{escape(more)}")
    else:
        parts.append("<p class='muted' id='incidents'>None: no acknowledged record or "
                     "committed offset was lost or moved, and no read was contradicted.</p>")
    parts.append("<h2>Truncations</h2>")
    cuts = ex["truncations"]
    if cuts:
        verdict = ("each dropped only records nobody had been told were written"
                   if not ex["truncations_cut_acked"] else
                   f"{ex['truncations_cut_acked']} of them cut acknowledged records")
        parts.append(f"<p class='muted'>{len(cuts)} truncation(s); {escape(verdict)}.</p>")
        parts.append(_table(
            ["at (s)", "broker", "partition", "from", "to", "reason", "acked cut", "lost",
             "what it cut"],
            [[c["t_s"], c["broker"], f"{c['topic']}-{c['partition']}", c["from_offset"],
              c["to_offset"], c["reason"], c["acked"], c["lost"], c["sentence"]]
             for c in cuts], "truncations", ["bad" if c["lost"] else "" for c in cuts]))
    else:
        parts.append("<p class='muted truncations'>No replica truncated its log.</p>")
    if ex["duplicates"]:
        items = "".join(
            f"<li class='{'unexplained' if g['mechanism'] == 'unexplained' else ''}'>"
            f"<b>{escape(g['mechanism_name'])}</b>: {escape(g['sentence'])}</li>"
            for g in ex["duplicates"])
        parts += ["<h2>Duplicates</h2>", f"<ol id='duplicates'>{items}</ol>"]
    return parts


RECORD_HEADERS = ["kind", "value", "partition", "offset", "sent (s)", "fault active", "detail"]


def render(
    report: dict[str, Any],
    *,
    timeline_png: bytes,
    lost: list[dict[str, Any]],
    other: list[dict[str, Any]],
) -> str:
    """The page: verdict, counts, timeline, lost records, other anomalies, latency,
    availability, faults, malformed lines."""
    c, t0 = report["counts"], report["run"]["start"]
    verdict = report["verdict"]
    expect = report.get("expect")
    exp = (f" &mdash; expected {escape(expect)}, "
           f"{'as expected' if report['as_expected'] else 'NOT as expected'}" if expect else "")
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Undertow loss report: "
        f"{escape(verdict)}</title><style>{CSS}</style></head><body>",
        f'<div class="verdict" id="verdict" style="background:{VERDICT_COLOURS[verdict]}">'
        f"Verdict: {escape(verdict)}{exp}</div>",
        _incomplete(report),
        f"<p class='muted'>history {escape(report['history'])}; experiment "
        f"{escape(str(report.get('experiment')))}; idempotent producer: "
        f"{_word(report['idempotent'])}; run {report['run']['duration_s']:.1f} s</p>",
        *_explained(report),
        "<h2>Counts</h2>",
        _table(["count", "value", "meaning"], [[k, c[k], COUNT_HELP[k]] for k in COUNT_HELP],
               "counts", ["bad" if k in ANOMALY_COUNTS and c[k] else "" for k in COUNT_HELP]),
        "<h2>Timeline</h2>",
        f'<img id="timeline" alt="timeline: acks per second, fault windows, lost records, ISR '
        f'size per partition" src="data:image/png;base64,{_b64(timeline_png)}">',
        "<h2>Lost records</h2>",
    ]
    if lost:
        parts.append(f"<p class='muted'>{len(lost):,} of {c['lost']:,} shown, earliest sent "
                     f"first; the full list is in {escape(report['outputs']['anomalies'])}.</p>")
    parts.append(_table(RECORD_HEADERS, _records(lost, t0), "lost",
                        none="No acknowledged record was lost."))
    if other:
        parts += ["<h2>Other anomalies</h2>",
                  "<p class='muted'>the earliest of each kind; all are in anomalies/.</p>",
                  _table(RECORD_HEADERS, _records(other, t0), "anomalies")]
    lat = report["latency_ms"]
    parts += [
        "<h2>Latency of acknowledged sends</h2>",
        _table(["p50 (ms)", "p99 (ms)", "p999 (ms)"],
               [[_ms(lat["p50"]), _ms(lat["p99"]), _ms(lat["p999"])]], "latency"),
    ]
    av = report["availability"]
    parts += [
        "<h2>Availability</h2>",
        f"<p class='muted'>{escape(av['definition'])}</p>",
        _table(["seconds", "available", "fraction", "attempts", "acked", "ack fraction",
                "partition offline (s)"],
               [[av["seconds"], av["available_seconds"], av["fraction"], av["attempts"],
                 av["acked_attempts"], av["ack_fraction"], av["partition_offline_s"]]],
               "availability"),
        _table(["kind", "partition", "start (s)", "duration (s)"],
               [[w["kind"], f"{w['topic']}-{w['partition']}" if "topic" in w else "all",
                 w["start_s"], w["duration_s"]] for w in report["unavailable_windows"]],
               "windows", none="No unavailable window: every second with send attempts had "
                               "an acknowledgement, and every partition always had a leader."),
        "<h2>Faults</h2>",
        _table(["#", "fault", "target", "role", "start (s)", "end (s)", "recovered"],
               [[f["id"], f["fault"], f["target"], f["role"], f["start_s"], f["end_s"],
                 f["recovered"]] for f in report["faults"]], "faults",
               none="No fault was injected."),
    ]
    mal = report["malformed"]
    parts.append(f"<h2>Malformed history lines: {mal['skipped']:,} skipped</h2>")
    if mal["lines"]:
        parts.append(_table(["file", "line", "reason", "text"],
                            [[m["file"], m["line"], m["reason"], m["text"]] for m in mal["lines"]],
                            "malformed"))
    parts.append("</body></html>")
    return "\n".join(parts)
