"""`undertow run` with its analysis started with the run (real brokers, real Spark): the
analysis process and its JVM never outlive the run, whether it is interrupted or killed;
--no-analysis starts none; the analysis waits as long as the run may last. (That a finished
run's report and summary are those `undertow analyze` gives for its history is held on the
acks=1 demo's run: tests/analysis/test_demo_explained.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import analysis_processes, living_with_mark
from small_experiment import small_experiment

from undertow.runner.analysis_process import (
    DEADLINE_MARGIN_S,
    PRESTART_ENV,
    WARM_UP_GATE_S,
    history_deadline,
)
from undertow.runner.run import max_run_duration_s
from undertow.spec import LoadedExperiment, load_experiment

REPO = Path(__file__).resolve().parents[2]

def start_run(tmp_path: Path, duration: str, *extra: str) -> tuple[subprocess.Popen, Path, str]:
    """`undertow run` of a small experiment with one leader kill, its processes marked."""
    experiment, out = tmp_path / "experiment.yaml", tmp_path / "out"
    experiment.write_text(small_experiment("prestart", duration))
    mark = f"prestart-{os.getpid()}-{time.monotonic_ns()}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "undertow", "run", str(experiment), "--out", str(out),
         "--seed", "7", "--no-progress", *extra],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
        env={**os.environ, "UNDERTOW_TEST_MARK": mark, PRESTART_ENV: "1"})
    return proc, out, mark


def wait_until(condition, timeout: float, what: str) -> float:
    """Seconds until `condition()` held; fails the test after `timeout`."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            pytest.fail(f"not within {timeout:g} s: {what}")
        time.sleep(0.1)
    return time.monotonic() - started


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_the_analysis_never_outlives_a_stopped_run(tmp_path: Path, sig: signal.Signals) -> None:
    proc, out, mark = start_run(tmp_path, "120s")
    try:
        # Stop the run once the analysis's JVM is up: it is what must not be left behind.
        wait_until(lambda: (out / "analysis.log").exists()
                   and "Spark session ready" in (out / "analysis.log").read_text(),
                   240, "the analysis's Spark session to start")
        assert proc.poll() is None, proc.communicate()
        assert len(analysis_processes(mark)) >= 2  # Python and its JVM
        proc.send_signal(sig)
        if sig == signal.SIGINT:
            _, stderr = proc.communicate(timeout=120)
            assert proc.returncode == 2, stderr
            assert analysis_processes(mark) == [], "the analysis outlived the interrupted run"
        else:
            proc.wait(10)
            gone = wait_until(lambda: analysis_processes(mark) == [], 15,
                              "the analysis and its JVM to exit after the runner was killed")
            print(f"analysis gone {gone:.1f} s after the runner's SIGKILL")
        assert "the run is gone (its lifeline closed)" in (out / "analysis.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wait_until(lambda: living_with_mark(mark) == [], 60, "every process of the run to exit")
    meta = json.loads((out / "history" / "meta.json").read_text())
    assert not (out / "report.json").exists()
    assert (meta["end"] is None) == (sig == signal.SIGKILL)


def test_no_analysis_starts_no_analysis_process(tmp_path: Path) -> None:
    proc, out, mark = start_run(tmp_path, "4s", "--no-analysis")
    seen: set[int] = set()

    def ended() -> bool:
        seen.update(analysis_processes(mark))
        return proc.poll() is not None

    wait_until(ended, 120, "the run to end")
    stdout, stderr = proc.communicate()
    assert proc.returncode == 0, stdout + stderr
    assert "analysis skipped" in stdout
    assert seen == set() and not (out / "analysis.log").exists()


def test_the_analysis_waits_as_long_as_the_longest_run_and_a_margin(tmp_path: Path) -> None:
    """--wait is the run's own bound, which counts the workload and the producers' wait for
    their last outcomes (every attempt's request timeout, and 5 s), plus the workload's wait
    for the warm-up and the margin."""
    def loaded(name: str, duration: str, **workload: object) -> LoadedExperiment:
        path = tmp_path / f"{name}.yaml"
        path.write_text(small_experiment(name, duration, workload=workload))
        return load_experiment(path)

    short = loaded("short", "10s")  # retries 0, requestTimeout 5s: at most 10 s of outcomes
    longer = loaded("longer", "70s")
    patient = loaded("patient", "10s", retries=9, requestTimeout="30s")  # at most 305 s
    assert history_deadline(short) == (max_run_duration_s(short) + WARM_UP_GATE_S
                                       + DEADLINE_MARGIN_S)
    assert max_run_duration_s(longer) - max_run_duration_s(short) == 60
    assert max_run_duration_s(patient) - max_run_duration_s(short) == 305 - 10
