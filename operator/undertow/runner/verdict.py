"""The verdict the moment the history closes, and the Spark report's agreement with it.

A user, and a CI pipeline, waits for the verdict from the workload's end. The Spark job pays
fixed costs per stage even on a warm JVM (4-12 s for an 18,000-send history on two cores,
depending on the day), while the same verdict in plain Python (`undertow_history.checker`,
which mirrors the job definition by definition and is held to its answers by
tests/analysis/test_checker.py) takes about a second. So the runner prints the checker's
verdict as soon as the history is closed (`first_verdict`), and the Spark report, when it
comes, must give the same verdict, anomaly counts, send totals and loss mechanisms
(`disagreement`): two implementations of one definition that differ on a real history is a
bug in one of them, which the run reports as an error instead of choosing between them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from undertow_history.checker import (
    COUNTS,
    MECHANISMS,
    SKIPPED_NOTE,
    Summary,
    as_expected,
    check_history,
    skipped_text,
)

log = logging.getLogger(__name__)


def first_verdict(history: Path, expect: str) -> Summary | None:
    """Check the closed history with the Spark-free checker and print its verdict; None (and
    a warning: the Spark report still gives one) when the checker cannot read it."""
    started = time.monotonic()
    try:
        summary = check_history(history)
    except (OSError, ValueError) as exc:
        log.warning("no verdict before the Spark report: the history checker could not read "
                    "%s (%s)", history, exc)
        return None
    print(verdict_text(summary, expect, time.monotonic() - started) + "\n", flush=True)
    return summary


def verdict_text(summary: Summary, expect: str, seconds: float) -> str:
    """The verdict, what it rests on, and where it comes from, e.g.

        VERDICT: LOSS   (expected loss: as expected)
          724 of 18,002 acknowledged records lost: 724 by acks=1 before replication
          (the history checker, in 0.9 s; the Spark analysis writes the report and must agree)
    """
    outcome = "as expected" if as_expected(summary.verdict, expect, summary.faults_skipped) \
        else "UNEXPECTED"
    lost = (f"{summary.counts['lost']:,} of {summary.acked:,} acknowledged records lost"
            if summary.counts["lost"] else f"none of {summary.acked:,} acknowledged records lost")
    why = ", ".join(f"{n:,} by {MECHANISMS[m]}" for m, n in
                    sorted(summary.mechanisms.items(), key=lambda kv: (-kv[1], kv[0])))
    others = [f"{summary.counts[c]:,} {c.replace('_', ' ')}" for c in COUNTS
              if c != "lost" and summary.counts[c]]
    skipped = [f"  FAULTS SKIPPED: {SKIPPED_NOTE} ({skipped_text(summary.faults_skipped)})"] \
        if summary.faults_skipped else []
    return "\n".join([
        f"VERDICT: {summary.verdict.upper()}   (expected {expect}: {outcome})",
        *skipped,
        f"  {lost}" + (f": {why}" if why else "") + (f"; {', '.join(others)}" if others else ""),
        f"  (the history checker, in {seconds:.1f} s; the Spark analysis writes the report "
        f"and must agree)"])


def report_summary(report: dict[str, Any]) -> dict[str, Any]:
    """What of report.json the checker gives (`Summary`'s fields): the verdict, the anomaly
    counts, the send totals, the lost records per mechanism (the record incidents'
    `lost`; None when the report lists only the first of its incidents) and the faults
    skipped."""
    explained = report["explained"]
    mechanisms: dict[str, int] | None = {}
    if explained["incident_count"] != len(explained["incidents"]):
        mechanisms = None
    else:
        for incident in explained["incidents"]:
            if incident["kind"] == "records" and incident["lost"]:
                mechanisms[incident["mechanism"]] = (mechanisms.get(incident["mechanism"], 0)
                                                     + incident["lost"])
    c = report["counts"]
    return {"verdict": report["verdict"], "counts": {k: c[k] for k in COUNTS},
            "attempted": c["attempted"], "acked": c["acked"], "failed": c["failed"],
            "indeterminate": c["indeterminate"], "mechanisms": mechanisms,
            "faults_skipped": report.get("faults_skipped", [])}


def disagreement(summary: Summary, report: dict[str, Any]) -> str | None:
    """Where the Spark report differs from the checker's summary of the same history, e.g.
    `lost: report 720, checker 724`; None when they agree (the mechanisms are compared only
    when the report lists all its incidents)."""
    theirs, mine = report_summary(report), asdict(summary)
    if theirs["mechanisms"] is None:
        del theirs["mechanisms"], mine["mechanisms"]
    differences = [f"{k}: report {theirs['counts'][k]}, checker {mine['counts'][k]}"
                   for k in COUNTS if theirs["counts"][k] != mine["counts"][k]]
    differences += [f"{k}: report {theirs[k]}, checker {mine[k]}" for k in theirs
                    if k != "counts" and theirs[k] != mine[k]]
    return "; ".join(differences) or None


def agreement_text(difference: str | None) -> str:
    """The line under the Spark summary."""
    if difference is None:
        return ("\nThe Spark report agrees with the history checker (verdict, anomaly counts, "
                "send totals, loss mechanisms).")
    return (f"\nundertow: the Spark report and the history checker disagree on this history "
            f"({difference}): a bug in one of them; the report's verdict is the one above")
