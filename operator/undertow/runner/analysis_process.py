"""`undertow run`'s analysis in a process of its own, started when the run starts.

The analysis's fixed costs (the JVM's start, the first job's class loading, JIT and code
generation) are paid before the verdict is awaited (`undertow_analysis.prestart`): the
process starts Spark at once and warms it up while the cluster starts, and the run holds its
workload back until the warm-up is done (`wait_until_warm`, bounded by WARM_UP_GATE_S), so
that the warm-up neither competes with the experiment for the CPU nor is still going when
the history closes; then the process waits for the run to close its history and analyses it.
The runner waits for it once the history is closed, reads its report.json and prints the
summary `run_analysis` prints, from it.

It cannot outlive the run. Its stdin is a lifeline the runner holds and never writes to: the
runner closes it when the run will not be analysed (it failed, was interrupted), and the
kernel closes it when the runner dies, even by SIGKILL; either way the analysis exits at
once, and its JVM with it. Its wait for the history is bounded by how long the run can take
(`history_deadline`). Its output (Spark's log, the summary) goes to DIR/analysis.log, not to
the run's live display.

UNDERTOW_ANALYSIS_PRESTART=0 analyses in the runner's own process after the run instead, as
before (`undertow run`'s fallback, and the benchmark's comparison).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from undertow.runner.run import max_run_duration_s
from undertow.spec import LoadedExperiment
from undertow.spec.experiment import ChaosExperimentSpec
from undertow_analysis.report import summary_text

PRESTART_ENV = "UNDERTOW_ANALYSIS_PRESTART"
DEADLINE_MARGIN_S = 300.0
"""Added to the run's own bounds: the platform's start and stop, and a loaded machine."""
EXIT_WAIT_S = 10.0
"""How long a stopped analysis (and then its JVM) may take to exit before it is killed."""
NICENESS = 10
"""The analysis process's niceness (its JVM inherits it): below the brokers', which start
beside the warm-up. The process sets itself back to 0 once the history is closed, where it
may (`undertow_analysis.prestart.full_priority`)."""
WARM_UP_GATE_S = 90.0
"""The longest the workload waits for the warm-up; past it, it starts all the same (a very
slow machine: the verdict then comes later, as it did without the gate)."""
WARM_POLL_S = 0.1


def prestart_enabled() -> bool:
    return os.environ.get(PRESTART_ENV, "1") != "0"


def planned_sends(spec: ChaosExperimentSpec) -> int:
    """What the producers send if every send is answered at once: the analysis sets up its
    JVM for the history's size before the history exists."""
    w = spec.workload
    return int(w.producers * w.rate * w.duration)


def history_deadline(loaded: LoadedExperiment) -> float:
    """How long, in seconds, the analysis waits for a run of `loaded` to close its history:
    the longest the run can take (`undertow.runner.run.max_run_duration_s`) and its wait for
    the warm-up, plus DEADLINE_MARGIN_S."""
    return max_run_duration_s(loaded) + WARM_UP_GATE_S + DEADLINE_MARGIN_S


class AnalysisFailed(RuntimeError):
    """The analysis process exited without a report."""


class AnalysisProcess:
    """`python -m undertow_analysis HISTORY --out DIR --wait S --planned-sends N --lifeline`,
    and its lifeline.

    A context manager: leaving it stops the process if it is still running."""

    def __init__(self, popen: subprocess.Popen, log_path: Path, warm_file: Path) -> None:
        self._popen = popen
        self.log_path = log_path
        self._warm_file = warm_file

    @classmethod
    def start(cls, history: Path, out: Path, loaded: LoadedExperiment) -> AnalysisProcess:
        """Start it for a run of `loaded` into `history`, which need not exist yet."""
        log_path, warm_file = out / "analysis.log", out / ".analysis-warm"
        warm_file.unlink(missing_ok=True)
        # Importable even when the runner found the package through its own sys.path.
        package = importlib.util.find_spec("undertow_analysis")
        root = str(Path(next(iter(package.submodule_search_locations))).parent)
        pythonpath = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(
                [sys.executable, "-m", "undertow_analysis", str(history.resolve()),
                 "--out", str(out.resolve()), "--wait", f"{history_deadline(loaded):.0f}",
                 "--planned-sends", str(planned_sends(loaded.experiment.spec)),
                 "--warm-file", str(warm_file.resolve()), "--lifeline"],
                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": pythonpath},
                start_new_session=True)  # a Ctrl-C reaches the runner, which stops it
        # Below the brokers' priority (the JVM it starts inherits it): the warm-up must not
        # take the CPU the experiment's timings rely on. Once the history is closed the
        # analysis takes niceness 0 back where it may: beside a busy neighbour, niceness 10
        # would leave it a tenth of the CPU while the user waits for the verdict.
        os.setpriority(os.PRIO_PROCESS, popen.pid, NICENESS)
        return cls(popen, log_path, warm_file)

    def __enter__(self) -> AnalysisProcess:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def wait_until_warm(self, timeout: float = WARM_UP_GATE_S) -> float | None:
        """Before the workload starts: wait until the analysis has warmed up (or given up
        warming up, or exited), at most `timeout` seconds. Returns the seconds waited, None
        when the time ran out (the workload starts all the same)."""
        started = time.monotonic()
        while not self._warm_file.exists() and self._popen.poll() is None:
            if time.monotonic() - started >= timeout:
                return None
            time.sleep(WARM_POLL_S)
        return time.monotonic() - started

    def result(self, history: Path, out: Path) -> dict[str, Any]:
        """Once the run closed `history`: wait for the analysis, print its summary and return
        report.json's content (`run_experiment`'s `analyze`)."""
        code = self._popen.wait()
        self._close()
        if code != 0:
            raise AnalysisFailed(f"the analysis of {history} failed (exit {code}): "
                                 f"{self._last_log_line()} (see {self.log_path})")
        report = json.loads((out / "report.json").read_text(encoding="utf-8"))
        print(summary_text(report), flush=True)
        return report

    def stop(self) -> None:
        """Close the lifeline: the analysis exits; kill it (and its JVM) if it has not within
        EXIT_WAIT_S."""
        try:
            self._popen.wait(EXIT_WAIT_S if self._close() else 0)
        except subprocess.TimeoutExpired:
            self._popen.kill()
            self._popen.wait()
        self._reap_group()

    def _close(self) -> bool:
        """Close the lifeline; True the first time."""
        self._warm_file.unlink(missing_ok=True)
        if self._popen.stdin.closed:
            return False
        self._popen.stdin.close()
        return True

    def _reap_group(self) -> None:
        """Wait for the rest of its process group (its JVM, which exits once the analysis
        did), killing what is left after EXIT_WAIT_S."""
        deadline = time.monotonic() + EXIT_WAIT_S
        with contextlib.suppress(ProcessLookupError):
            while time.monotonic() < deadline:
                os.killpg(self._popen.pid, 0)
                time.sleep(0.1)
            os.killpg(self._popen.pid, signal.SIGKILL)

    def _last_log_line(self) -> str:
        """The analysis's own last word (an error it reports, or why it stopped), else the
        log's last line."""
        lines = [line for line in self.log_path.read_text(encoding="utf-8", errors="replace")
                 .splitlines() if line.strip()]
        own = [line for line in lines if line.startswith("undertow analyze:")]
        return (own or lines or ["no output"])[-1]
