"""Issue 22's done-when, end to end: `undertow run` on a disk that fills up while a fault is
in effect ends within 10 s of the first failed write, with exit 2 and one line naming the
file and the error, no traceback, meta.json marked incomplete, and nothing left running.

The preflight refuses a run that cannot fit, so the run starts on a tmpfs with room for it and
the test then fills the rest (tests/runner/small_disk.py) once a follower is killed and the
workload flows again without it. The filler stays: the disk is still full when the runner
stops, so the last meta.json is written into the room the history set aside for it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import processes_mentioning
from small_disk import fill, mounted_tmpfs
from small_experiment import SMALL_CONFIG, small_experiment

from undertow_history import schema as history_schema

REPO = Path(__file__).resolve().parents[2]

# acksall-leader-kill's shape (acks=all, min.insync.replicas=2, kills) with 512-byte records:
# about 21 MB by the preflight's estimate, on a 32 MB tmpfs.
EXPERIMENT = small_experiment(
    "disk-fills", "40s", """\
    - kind: kill
      target: {role: follower}
      at: 1s
      duration: 30s""",
    config={**SMALL_CONFIG, "replica.lag.time.max.ms": 6000}, partitions=1,
    workload={"producers": 2, "retries": 3, "recordSize": 512})
STOPPED_WITHIN_S = 10.0


def wait_until(condition, proc: subprocess.Popen, what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"the run ended before {what}: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def test_a_disk_that_fills_up_stops_the_run_at_once_with_one_line(tmp_path: Path) -> None:
    experiment = tmp_path / "disk-fills.yaml"
    experiment.write_text(EXPERIMENT)
    with mounted_tmpfs(tmp_path / "disk", "32m") as disk:
        out = disk / "run"
        history = out / "history"
        proc = subprocess.Popen(
            [sys.executable, "-m", "undertow", "run", str(experiment), "--out", str(out),
             "--no-analysis", "--seed", "1"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
        try:
            wait_until(lambda: size(history / "faults.jsonl") > 0, proc, "the kill")
            flowing = size(history / "sends.jsonl") + 16_384
            wait_until(lambda: size(history / "sends.jsonl") > flowing, proc,
                       "sends without the killed follower")
            full = fill(disk / "filler")
            stdout, stderr = proc.communicate(timeout=60)
            stopped_after = time.monotonic() - full
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()

        assert proc.returncode == 2, (stdout, stderr)
        assert stopped_after < STOPPED_WITHIN_S, (stopped_after, stderr)
        assert "Traceback" not in stdout + stderr, stderr
        files = "|".join(re.escape(f.filename) for f in history_schema.FILES)
        (line,) = stderr.splitlines()
        reason = re.fullmatch(
            rf"undertow: (history: could not write {re.escape(str(history))}/(?:{files}): "
            rf"\[Errno 28\] No space left on device); the run was stopped, every fault healed",
            line)
        assert reason, line
        assert processes_mentioning(str(out)) == [], "processes outlived the run"

        meta = json.loads((history / "meta.json").read_text())
        assert (meta["incomplete"], meta["incomplete_reason"]) == (True, reason[1])
        assert meta["end"] is not None and "drain" not in meta
        for file in history_schema.FILES:  # cut back to whole lines, each as the schema says
            if file.json_lines:
                for text in (history / file.filename).read_text().splitlines():
                    assert not file.problems(json.loads(text)), (file.filename, text)
        assert sorted(p.name for p in history.iterdir()) == sorted(
            f.filename for f in history_schema.FILES)
