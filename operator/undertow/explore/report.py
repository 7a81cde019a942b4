"""The exploration's summary: ``explore.json`` for machines, ``explore.html`` for people."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 10px;
text-align:left;vertical-align:top}th{background:#f3f3f3}td.n{text-align:right}
.loss{color:#b00020;font-weight:600}.clean{color:#1b5e20;font-weight:600}
code{background:#f6f6f6;padding:1px 4px}
"""


def write_report(summary: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """Write ``explore.json`` and ``explore.html`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    json_path, html_path = out / "explore.json", out / "explore.html"
    json_path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    html_path.write_text(render(summary), encoding="utf-8")
    return json_path, html_path


def _e(value: object) -> str:
    return html.escape(str(value))


def render(summary: dict[str, Any]) -> str:
    runs = summary["runs"]
    verdicts = summary["verdicts"]
    lossy = verdicts.get("loss", 0)
    rows = "".join(
        f"<tr><td>{_e(mechanism)}</td><td class=n>{count:,}</td>"
        f"<td class=n>{100 * count / runs:.1f} %</td></tr>"
        for mechanism, count in summary["losses_by_mechanism"].items())
    minimal = "".join(_minimal_row(m) for m in summary["minimal"])
    verdict_line = ", ".join(f"{_e(v)}: {n:,}" for v, n in sorted(verdicts.items()))
    return f"""<!doctype html><html><head><meta charset="utf-8">
<title>undertow explore: {_e(summary['experiment'])}</title><style>{_STYLE}</style></head><body>
<h1>undertow explore: {_e(summary['experiment'])}</h1>
<p><b>{runs:,}</b> schedules simulated in {summary['seconds']:.0f} s on
<code>{_e(summary['master'])}</code> (<b>{summary['schedules_per_second']:.2f}</b>
schedules per second).
Verdicts: {verdict_line}.
<span class="{'loss' if lossy else 'clean'}">{lossy:,} of {runs:,} schedules
({100 * lossy / runs if runs else 0:.1f} %) lost acknowledged records.</span>
{_e(skipped_line(summary["faults_skipped"])) if summary.get("faults_skipped") else ""}</p>
<h2>Losses by mechanism</h2>
{'<table><tr><th>mechanism</th><th>schedules</th><th>share of all</th></tr>' + rows + '</table>'
 if rows else '<p>No schedule lost an acknowledged record.</p>'}
<h2>Minimal experiments</h2>
{'<table><tr><th>mechanism</th><th>file</th><th>faults (found &rarr; shrunk)</th>'
 '<th>confirmed on real processes</th><th>what the analysis said</th></tr>' + minimal + '</table>'
 if minimal else '<p>None: nothing to shrink.</p>'}
</body></html>
"""


def skipped_line(seeds: list[int]) -> str:
    """The schedules whose nemesis did not inject every planned fault: their verdicts cover
    only the faults that ran."""
    shown = ", ".join(str(seed) for seed in seeds[:10]) + (", ..." if len(seeds) > 10 else "")
    return (f"{len(seeds):,} schedule(s) had a planned fault not injected, so their verdicts "
            f"cover only the faults that ran (seeds {shown}).")


def _minimal_row(m: dict[str, Any]) -> str:
    if m["confirm_runs"]:
        confirmed = (f"{m['confirmed']} of {m['confirm_runs']}"
                     f" <small>({_e(', '.join(m['confirm_outcomes']))})</small>")
    else:
        confirmed = "not run (<code>--confirm K</code>)"
    sentences = "".join(f"<li>{_e(s)}</li>" for s in m["sentences"][:3])
    # A shrink stopped by Ctrl-C: the best schedule it had found.
    partial = "" if m.get("shrunk", True) else " <small>(not fully shrunk)</small>"
    return (f"<tr><td>{_e(m['mechanism'])}</td><td><code>{_e(Path(m['file']).name)}</code></td>"
            f"<td class=n>{m['found_faults']} &rarr; {m['faults']}{partial}</td>"
            f"<td>{confirmed}</td>"
            f"<td><ul>{sentences}</ul></td></tr>")
