"""Where the time after the workload goes: the phases between the workload's end and the
verdict, each measured as the run goes through it.

A user waits for the verdict from the moment the workload stops; what that wait is made of
(healing the faults, the producers' last outcomes, the cluster's recovery, the drain, the
history's close, the analysis) differs from one experiment and one machine to the next, and
a single total says nothing about which part to blame. The runner marks the end of each
phase on the monotonic clock (wall-clock steps would make a phase negative); the record is
printed under the verdict and written to the run directory (TIMINGS_NAME), where
`benchmarks/time_to_verdict.py` reads it.

The phases follow one another, so their durations add up to the total; the cluster's stop
runs beside the Spark analysis (which starts as soon as the history closes) and is shown
apart from the sum.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

TIMINGS_NAME = "timings.json"
"""The record's file in the run directory (beside the history, not in it: the history is
closed before the analysis, the last phase, ends)."""
PHASES: Mapping[str, str] = {
    "healing": "the workload loop ends and every fault is recovered (Nemesis.stop)",
    "last sends": "the producers wait for their outstanding sends' outcomes",
    "recovery": "every partition has a leader and a full ISR again, then every high "
                "watermark reaches its leader's log end offset",
    "drain": "the run's consumers stop (a pipeline's members end their transactions, which "
             "then end on the output topic); a fresh consumer reads every partition to its "
             "end, and then the pipeline's output topic's",
    "history": "the sampler and the event collector stop; the history is closed",
    "verdict": "the history checker's verdict on the closed history, printed "
               "(`undertow.runner.verdict`)",
    "report": "the Spark analysis's report, from the verdict to its summary printed",
}
"""Each phase after the workload, in order, and what it covers."""
BESIDE = {"cluster stop": "the cluster stops, while the Spark analysis runs (without an "
                           "analysis, after the history's close)"}
"""Measured too, but concurrent with the phases above: not part of their sum."""


class PhaseClock:
    """Marks the end of each phase after the workload; each phase lasts from the previous
    mark (the first: from the workload's end) to its own."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: float | None = None
        self.phases: dict[str, float] = {}
        self.beside: dict[str, float] = {}

    @property
    def started(self) -> bool:
        return self._last is not None

    def start(self, at: float) -> None:
        """The workload's end, as `clock` reads (it may lie ahead of now: the loop ends on
        its next beat)."""
        self._last = at

    def mark(self, phase: str) -> None:
        """`phase` ends now. Ignored before `start` (a run that stopped before its workload
        ended has no phases after it) and for a phase already marked (the history is closed
        on every way out, once)."""
        assert phase in PHASES, phase
        if self._last is None or phase in self.phases:
            return
        now = self._clock()
        self.phases[phase] = max(0.0, now - self._last)
        self._last = now

    def time_beside(self, what: str, started: float) -> None:
        """`what`, begun at `started` (clock's reading), ends now."""
        assert what in BESIDE, what
        if self._last is not None:
            self.beside[what] = max(0.0, self._clock() - started)

    def now(self) -> float:
        return self._clock()

    def record(self) -> dict[str, Any]:
        """The phases in seconds (rounded to 0.01 s) in their order, their total, and what
        ran beside them."""
        phases = {p: round(self.phases[p], 2) for p in PHASES if p in self.phases}
        return {"phases": phases, "total": round(sum(self.phases.values()), 2),
                "beside": {k: round(v, 2) for k, v in self.beside.items()}}


def summary_line(record: Mapping[str, Any]) -> str:
    """One line under the report, e.g. `time after the workload: healing 0.1 s, ...,
    verdict 0.9 s, report 8.2 s = 11.7 s (the verdict at 3.5 s; cluster stop 1.2 s, during
    the report)`."""
    phases = record["phases"]
    parts = ", ".join(f"{p} {s:.1f} s" for p, s in phases.items())
    notes = []
    if "verdict" in phases:
        notes.append(f"the verdict at {to_verdict(record):.1f} s")
    beside = ", ".join(f"{k} {s:.1f} s" for k, s in record.get("beside", {}).items())
    if beside:
        notes.append(f"{beside}, " + ("during the report" if "report" in phases
                                      else "after the history"))
    return (f"time after the workload: {parts} = {record['total']:.1f} s"
            + (f" ({'; '.join(notes)})" if notes else ""))


def to_verdict(record: Mapping[str, Any]) -> float:
    """Seconds from the workload's end to the verdict printed: the phases up to `verdict`,
    else (no checker's verdict) all of them."""
    phases = list(record["phases"].items())
    upto = next((i for i, (p, _s) in enumerate(phases) if p == "verdict"), len(phases) - 1)
    return round(sum(s for _p, s in phases[:upto + 1]), 2)


def write(out: Path, record: Mapping[str, Any]) -> Path:
    """The record as `out`/TIMINGS_NAME."""
    path = out / TIMINGS_NAME
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return path


def read(out: Path) -> dict[str, Any] | None:
    """The record a run left in `out`, None if it left none (an older run, or one without
    an analysis)."""
    path = out / TIMINGS_NAME
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
