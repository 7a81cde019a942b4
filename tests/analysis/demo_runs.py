"""The demo's runs for the tests that check them (test_demo_explained, test_demo_clean):
`undertow run` of a library experiment as `make demo` runs it, its processes marked, and
what the tests recount from its history without Spark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from undertow.runner.analysis_process import PRESTART_ENV

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class DemoRun:
    out: Path
    stdout: str
    mark: str
    """UNDERTOW_TEST_MARK of the run's processes (tests/procs.py)."""

    @property
    def report(self) -> dict:
        return json.loads((self.out / "report.json").read_text())


def run(name: str, out: Path) -> DemoRun:
    """`undertow run` of the experiment, as `make demo` runs it, its analysis started with it."""
    mark = f"demo-{os.getpid()}-{time.monotonic_ns()}"
    done = subprocess.run(
        [sys.executable, "-m", "undertow", "run", str(REPO / "experiments" / f"{name}.yaml"),
         "--out", str(out), "--seed", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=400, start_new_session=True,
        env={**os.environ, "UNDERTOW_TEST_MARK": mark, PRESTART_ENV: "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:] + broker_logs(out)
    return DemoRun(out, done.stdout, mark)


def report_summary(out: Path) -> str:
    """The summary `undertow run` printed, as the analysis writes it from report.json."""
    from undertow_analysis.report import summary_text

    return summary_text(json.loads((out / "report.json").read_text()))


def recount_lost(out: Path) -> int:
    """Acknowledged values (some attempt `ok` in sends.jsonl) that no drain read returned:
    the definition of `lost` in docs/design.md, counted without Spark."""
    history = out / "history"
    acked = {send["value"] for send in map(json.loads, (history / "sends.jsonl").open())
             if send["status"] == "ok"}
    drained = {read["value"] for read in map(json.loads, (history / "reads.jsonl").open())
               if read["phase"] == "drain"}
    return len(acked - drained)


def broker_logs(out: Path, lines: int = 40) -> str:
    """The end of every node's log, so that a failed run says what the cluster did."""
    logs = sorted((out / "cluster" / "logs").glob("*.log"))
    return "".join(f"\n--- {log.name} ---\n" + "\n".join(
        log.read_text(errors="replace").splitlines()[-lines:]) for log in logs)
