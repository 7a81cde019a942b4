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
    headline,
    shortfall_text,
)
from undertow_history.checker import SKIPPED_NOTE, skipped_text

VERDICT_COLOURS = {"clean": "#2a9d8f", "anomalies": "#e9c46a", "loss": "#d62828"}
CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1150px;color:#1d3557}
.verdict{padding:1em 1.5em;border-radius:8px;color:#fff;font-size:1.6em;font-weight:bold}
table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border:1px solid #ccd;padding:.25em .6em;text-align:left;font-size:.9em}
td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.total td{font-weight:bold;border-top:2px solid #889}
.verdict small{display:block;font-size:.6em;font-weight:normal;margin-top:.2em}
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


def _s(seconds: float | None) -> str | None:
    """Seconds to a tenth (the series' resolution), None as nothing."""
    return None if seconds is None else f"{seconds:.1f}"


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _zero_is(report: dict[str, Any]) -> str:
    clock = report.get("clock") or {}
    at = str(clock.get("zero_utc") or "")
    return f"{clock.get('zero_is') or 'the run start'}" + (
        f" (t = 0 at {at[11:19]} UTC)" if len(at) >= 19 else "")


def _records(rows: list[dict[str, Any]], t0: float) -> list[list[Any]]:
    return [
        [r["kind"], r["value"], f"{r['topic']}-{r['partition']}" if r["topic"] else None,
         r["offset"], None if r["t_invoke"] is None else f"+{r['t_invoke'] - t0:.3f}",
         r["fault"] or "none", r["detail"]]
        for r in rows
    ]


def _incomplete(report: dict[str, Any]) -> str:
    """Right under the verdict: a history stopped by a failure (`--allow-incomplete`), a
    drain that did not read every partition to its end, planned faults not injected."""
    parts = []
    if report["incomplete"]:
        parts.append(f'<div class="incomplete" id="incomplete"><b>Incomplete history:</b> '
                     f"{escape(INCOMPLETE_NOTE)} ({escape(str(report['incomplete_reason']))})."
                     f"</div>")
    if report["drain_short"]:
        where = "; ".join(shortfall_text(s) for s in report["drain_short"])
        parts.append(f'<div class="incomplete" id="drain-short"><b>Incomplete drain:</b> '
                     f"{escape(SHORT_DRAIN_NOTE)} ({escape(where)}).</div>")
    if report.get("faults_skipped"):
        parts.append(f'<div class="incomplete" id="faults-skipped"><b>Faults skipped:</b> '
                     f"{escape(SKIPPED_NOTE)} "
                     f"({escape(skipped_text(report['faults_skipped']))}).</div>")
    return "".join(parts)


def _example(value: str, where: dict[str, dict[str, Any]]) -> str:
    row = where.get(value)
    if row is None or row.get("topic") is None:
        return escape(value)
    return f"{escape(value)} <span class='muted'>({escape(row['topic'])}-{row['partition']}" \
           f"@{row['offset']})</span>"


def _incident_item(i: dict[str, Any], where: dict[str, dict[str, Any]]) -> str:
    """One incident: its mechanism and sentence, then its records' count, offsets and a few
    examples (anomalies/ has every record)."""
    cls = "unexplained" if i["mechanism"] == "unexplained" else ""
    detail = ""
    if i.get("kind") == "records":
        kinds = ", ".join(f"{i[k]:,} {k.replace('_', ' ')}" for k in ("lost", "misplaced",
                                                                        "phantom_read")
                          if i.get(k))
        examples = ", ".join(_example(v, where) for v in i.get("examples") or [])
        detail = (f"<div class='muted'>{i['records']:,} records ({kinds}) at offsets "
                  f"{i['first_offset']}-{i['last_offset']} of {escape(i['topic'])}-"
                  f"{i['partition']}; e.g. {examples}</div>")
    return (f"<li class='{cls}'><b>{escape(i['mechanism_name'])}</b>: "
            f"{escape(i['sentence'])}{detail}</li>")


def _explained(report: dict[str, Any], lost: list[dict[str, Any]]) -> list[str]:
    """The loss incidents, each one sentence with its records' count and examples
    (unexplained ones first and in red), and the truncations with what they cut: right
    under the verdict."""
    ex = report["explained"]
    if not ex["events"]:
        return ["<h2>Loss incidents</h2>",
                "<p class='muted' id='incidents'>This history has no events.jsonl (a run from "
                "before broker events, or another Kafka-protocol system): the anomalies below "
                "are not explained.</p>"]
    parts = ["<h2>Loss incidents</h2>"]
    where = {r["value"]: r for r in lost}
    if ex["incidents"]:
        more = (f" ({len(ex['incidents'])} of {ex['incident_count']} shown)"
                if ex["incident_count"] > len(ex["incidents"]) else "")
        if ex["unexplained"]:
            parts.append(f"<p class='unexplained'><b>{ex['unexplained']:,} anomalous records "
                         f"or committed offsets no event explains: a bug in the broker or in "
                         f"the harness.</b></p>")
        items = "".join(_incident_item(i, where) for i in ex["incidents"])
        parts.append(f"<ol id='incidents'>{items}</ol>{escape(more)}")
        parts.append(f"<p class='muted'>Every anomalous record is in "
                     f"{escape(report['outputs']['anomalies'])} (Parquet).</p>")
    else:
        parts.append("<p class='muted' id='incidents'>None: no acknowledged record or "
                     "committed offset was lost or moved, and no read was contradicted.</p>")
    parts += ["<h2>Truncations</h2>", *_truncations(report)]
    if ex["duplicates"]:
        items = "".join(
            f"<li class='{'unexplained' if g['mechanism'] == 'unexplained' else ''}'>"
            f"<b>{escape(g['mechanism_name'])}</b>: {escape(g['sentence'])}</li>"
            for g in ex["duplicates"])
        parts += ["<h2>Duplicates</h2>", f"<ol id='duplicates'>{items}</ol>"]
    return parts + _late_requests(ex)


def _late_requests(ex: dict[str, Any]) -> list[str]:
    """The EndTxn requests that reached the coordinator during a later transaction of their
    producer (`late_requests`): those that ended it first, in red."""
    late = ex.get("late_requests") or []
    if not late:
        return []
    items = "".join(
        f"<li class='{'unexplained' if r['reason'] == 'decided' else ''}'>"
        f"<b>{escape(r['reason'].replace('_', ' '))}</b>: {escape(r['sentence'])}</li>"
        for r in late)
    more = (f" ({len(late)} of {ex['late_request_count']} shown)"
            if ex["late_request_count"] > len(late) else "")
    return ["<h2>Late transaction requests</h2>",
            f"<p>{ex['late_request_count']} EndTxn request(s) reached the coordinator while "
            f"a later transaction of their producer was open; "
            f"{ex['late_requests_decided']} ended it (Jepsen 2024; KIP-890's transaction "
            f"version 2 fences them).</p>",
            f"<ol id='late-requests'>{items}</ol>{escape(more)}"]


def _truncations(report: dict[str, Any]) -> list[str]:
    """The truncations in records: cut, of which acknowledged, and what became of those
    (each lost record counted at the first truncation that cut it, so that the column adds
    up), with a totals row and what no truncation explains."""
    ex, lost = report["explained"], report["counts"]["lost"]
    cuts = ex["truncations"]
    if not cuts:
        return ["<p class='muted truncations'>No replica truncated its log.</p>"]
    rows = [[f"{c['t_s']:.1f}", c["broker"], f"{c['topic']}-{c['partition']}",
             f"{c['to_offset']}-{c['from_offset'] - 1}", c["reason"],
             c["from_offset"] - c["to_offset"], c["acked"], c["lost"], c["lost_before"],
             c["kept"]] for c in cuts]
    totals = ["total", "", "", "", "", sum(r[5] for r in rows), sum(r[6] for r in rows),
              ex["truncations_lost"], sum(r[8] for r in rows), sum(r[9] for r in rows)]
    table = _table(["at (s)", "broker", "partition", "offsets", "reason", "records cut",
                    "acknowledged", "lost for good", "lost, counted above", "kept elsewhere"],
                   [*rows, totals], "truncations",
                   ["bad" if c["lost"] else "" for c in cuts] + ["total"])
    if not ex["truncations_cut_acked"]:
        said = ("None of the records they cut had been acknowledged: each offset they "
                "dropped now holds a record a later leader wrote.")
    else:
        said = (f"{ex['truncations_cut_acked']} of them cut acknowledged records: "
                f"{ex['truncations_lost']:,} are lost for good; {totals[9]:,} survive at "
                f"other offsets.")
    if lost > ex["truncations_lost"]:
        said += (f" {lost - ex['truncations_lost']:,} of the {lost:,} lost records were "
                 f"lost without a truncation the table counts (a lost disk, a log no "
                 f"replica ever held again, a deposed leader's acknowledgements, or records "
                 f"behind a hanging transaction): see the incidents.")
    sentences = "".join(f"<li>{escape(c['sentence'])}</li>" for c in cuts)
    return [f"<p class='muted'>{len(cuts)} truncation(s). {escape(said)}</p>", table,
            f"<details><summary>each truncation in words</summary><ol>{sentences}</ol>"
            f"</details>"]


RECORD_HEADERS = ["kind", "value", "partition", "offset", "sent (s)", "fault at send",
                  "detail"]
UNGROUPED_LOST = 20
"""Lost records listed one by one when no incident groups them (a history without events)."""


def _consumption(report: dict[str, Any]) -> list[str]:
    """The consumer group's section (`consumption.summary`): per partition, then the
    unconsumed stretches; nothing for a run without a group."""
    consumed = report.get("consumption")
    if not consumed:
        return []
    protocol = consumed["group_protocol"]
    rows = consumed["partitions"]
    t = consumed["total"]
    total = ["all", _s(t["unconsumed_s"]), t["stretches"], _s(t["longest_s"]),
             t["returned_again"], t["handovers"], t["overlapping_handovers"],
             _s(t["longest_pause_s"])]
    return [
        f"<h2>Consumer group ({escape(protocol)} protocol)</h2>",
        f"<p class='muted'>{escape(consumed['definition'])}</p>",
        _table(["partition", "unconsumed (s)", "stretches", "longest (s)", "returned again",
                "handovers", "while still held", "longest pause (s)"],
               [[f"{r['topic']}-{r['partition']}", _s(r["unconsumed_s"]), r["stretches"],
                 _s(r["longest_s"]), r["returned_again"], r["handovers"],
                 r["overlapping_handovers"], _s(r["longest_pause_s"])] for r in rows]
               + [total], "consumption"),
        "<h3>Unconsumed stretches</h3>",
        _table(["partition", "start (s)", "end (s)", "length (s)"],
               [[f"{s['topic']}-{s['partition']}", _s(s["start_s"]), _s(s["end_s"]),
                 _s(s["length_s"])] for s in consumed["stretches"]], "unconsumed",
               none="No partition went unconsumed for "
                    f"{consumed['min_window_s']:g} s or more while a record waited."),
    ]


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
    name = str(report.get("experiment") or "history")
    exp = (f" &mdash; expected {escape(expect)}"
           f"{'' if report['as_expected'] else ', NOT as expected'}" if expect else "")
    clock = report.get("clock") or {}
    zero = (f"Times are seconds since {escape(clock['zero_is'])} (t = 0 at "
            f"{escape(clock['zero_utc'])}), as in the progress lines of undertow run. "
            if clock else "")
    if clock.get("virtual"):
        zero = ("A deterministic simulation (<code>undertow run --platform sim</code>): every "
                "time is virtual. " + zero)
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{escape(name)}: "
        f"{escape(verdict)} &mdash; Undertow</title><style>{CSS}</style></head><body>",
        f'<div class="verdict" id="verdict" style="background:{VERDICT_COLOURS[verdict]}">'
        f"{escape(name)}: {escape(verdict.upper())}{exp}"
        f" <small>{escape(headline(report))}</small></div>",
        _incomplete(report),
        f"<p class='muted'>{zero}History {escape(report['history'])}; idempotent producer: "
        f"{_word(report['idempotent'])}; workload and healing {report['run']['duration_s']:.1f}"
        f" s.</p>",
        *_explained(report, lost),
        "<h2>Counts</h2>",
        _table(["count", "value", "meaning"], [[k, c[k], COUNT_HELP[k]] for k in COUNT_HELP],
               "counts", ["bad" if k in ANOMALY_COUNTS and c[k] else "" for k in COUNT_HELP]),
        "<h2>Timeline</h2>",
        f'<img id="timeline" alt="timeline: sends per second by completion (acknowledged, '
        f'failed, indeterminate) with the no-acks windows and their lengths and lost records; '
        f'every send\'s latency at its completion with p50 and p99; each node\'s faults '
        f'(injected, healed, recovered), elections by kind (KIP-966\'s from the ELR and of '
        f'the last known leader included), fences and truncations; ISR size per partition '
        f'(and ELR size, dashed)" src="data:image/png;base64,{_b64(timeline_png)}">',
    ]
    if lost and not report["explained"]["incidents"]:
        # Without incidents to group them under, the earliest-sent few stand for them all.
        parts += ["<h2>Lost records</h2>",
                  f"<p class='muted'>{min(len(lost), UNGROUPED_LOST):,} of {c['lost']:,} "
                  f"shown, earliest sent first; all are in "
                  f"{escape(report['outputs']['anomalies'])}.</p>",
                  _table(RECORD_HEADERS, _records(lost[:UNGROUPED_LOST], t0), "lost")]
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
    labels = {f["id"]: f"#{f['id']} {f['fault']} {f['target']}" for f in report["faults"]}
    fraction = "-" if av["fraction"] is None else f"{av['fraction']:.1%}"
    ack_fraction = "-" if av["ack_fraction"] is None else f"{av['ack_fraction']:.1%}"
    parts += [
        "<h2>Availability</h2>",
        f"<p class='muted'>{escape(av['definition'])}</p>",
        _table(["available", "sends in flight (s)", "without acks (s)", "no-acks windows",
                "longest (s)", "attempts", "acknowledged", "ack fraction",
                "partition offline (s)"],
               [[fraction, _s(av["in_flight_s"]), _s(av["unavailable_s"]),
                 av["no_ack_windows"], _s(av["longest_s"]), av["attempts"],
                 av["acked_attempts"], ack_fraction, _s(av["partition_offline_s"])]],
               "availability"),
        _table(["kind", "partition", "start (s)", "end (s)", "length (s)", "failed",
                "indeterminate", "faults active"],
               [[w["kind"], f"{w['topic']}-{w['partition']}" if "topic" in w else "all",
                 _s(w["start_s"]), _s(w["start_s"] + w["duration_s"]), _s(w["duration_s"]),
                 w.get("failed"), w.get("indeterminate"),
                 ", ".join(labels.get(i, f"#{i}") for i in w.get("faults", [])) or "none"]
                for w in report["unavailable_windows"]],
               "windows", none="No unavailable window: no acknowledgement was missing for "
                               f"{av['min_window_s']:g} s or more while sends were in flight, "
                               "and every partition always had a leader."),
        *_consumption(report),
        "<h2>Faults</h2>",
        "<p class='muted'>injected: the fault took effect; healed: its duration ran out (or "
        "the run stopped) and undoing it began; recovered: undoing it finished (a killed "
        "broker restarted and serving, a link passing again). Times in seconds since "
        f"{escape(_zero_is(report))}.</p>",
        _table(["#", "fault", "target", "role", "injected (s)", "healed (s)", "recovered (s)",
                "in effect (s)", "recovering (s)"],
               [[f["id"], f["fault"], f["target"], f["role"], _s(f["start_s"]),
                 _s(f.get("healed_s")),
                 _s(f["end_s"]) if f["recovered"] else f"not recovered (run ended {f['end_s']})",
                 _s(_minus(f.get("healed_s"), f["start_s"])),
                 _s(_minus(f["end_s"], f.get("healed_s"))) if f["recovered"] else None]
                for f in report["faults"]], "faults",
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
