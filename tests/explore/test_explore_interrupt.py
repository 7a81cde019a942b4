"""`undertow explore` stopped by Ctrl-C while it shrinks: it has shown each kept edit, and
it keeps the best schedule so far as a minimal experiment that says it is not fully shrunk,
names it, and exits 130, soon after the signal."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from explore_experiments import TINY_ACKS1, TINY_CLUSTER

from undertow.cli import EXIT_INTERRUPTED
from undertow.spec import load_experiment

pytestmark = pytest.mark.long  # run first (tests/conftest.py)

STOPS_WITHIN_S = 30
"""From SIGINT to exit: the jobs cancelled, the files written (a loaded machine's JVM is
slow to answer)."""


def three_leader_kills(path: Path) -> Path:
    """`TINY_ACKS1` with three faults a schedule: the shrink has edits to keep for a
    while, the first (a removal) after a few simulations of under a second."""
    experiment = copy.deepcopy(TINY_ACKS1)
    experiment["spec"]["workload"]["duration"] = "8s"
    experiment["spec"]["explore"].update(
        targets=[{"role": "leader"}, {"role": "follower"}], faults={"min": 3, "max": 3},
        duration={"min": "1s", "max": "2s"})
    path.write_text(yaml.safe_dump_all([TINY_CLUSTER, experiment], sort_keys=False))
    return path


def _processes_marked(marker: str) -> list[int]:
    """The running processes (not zombies) whose environment holds ``marker``: what the
    explore started, its JVM and Spark's Python workers, wherever they were reparented."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker.encode() in (proc / "environ").read_bytes() \
                    and (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(proc.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def test_ctrl_c_while_shrinking_keeps_the_best_schedule_so_far(tmp_path: Path) -> None:
    out = tmp_path / "out"
    marker = f"UNDERTOW_TEST_EXPLORE={uuid.uuid4().hex}"
    explore = subprocess.Popen(
        [sys.executable, "-m", "undertow", "explore", str(three_leader_kills(tmp_path / "e.yaml")),
         "--runs", "1", "--master", "local[1]", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, marker.split("=")[0]: marker.split("=")[1]})
    assert explore.stdout is not None
    seen = []
    try:
        for line in explore.stdout:
            seen.append(line)
            if ": try " in line:  # a kept edit: the shrink goes on after it
                break
        else:
            raise AssertionError(f"no shrink step shown:\n{''.join(seen)}")
        explore.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        rest, _ = explore.communicate(timeout=STOPS_WITHIN_S)
        assert time.monotonic() - interrupted < STOPS_WITHIN_S
    finally:
        explore.kill()
        explore.wait()
    output = "".join(seen) + rest
    assert explore.returncode == EXIT_INTERRUPTED, output
    # Nothing of it runs on: a Spark worker in the middle of a shrink simulated on, a core
    # busy for minutes, once its daemon had gone without telling it.
    deadline = time.monotonic() + STOPS_WITHIN_S
    while (left := _processes_marked(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"still running after explore exited: {left}"

    [step] = [line for line in seen if ": try " in line]
    assert step.startswith("  acks1_before_replication: try ") and "fault(s) left: kill" in step
    [kept] = (out / "minimal").glob("*.yaml")
    assert "undertow: explore stopped (Ctrl-C) while shrinking" in rest
    assert f"NOT fully shrunk) in {kept}" in rest, rest
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    # The JVM's console (log4j's start-up lines, its warnings) went to the log, not here.
    assert "log4j" not in output and " WARN " not in output, output
    assert "log4j" in (out / "spark.log").read_text()
    comment = " ".join(line.lstrip("# ") for line in kept.read_text().splitlines()
                       if line.startswith("#"))
    assert "NOT FULLY SHRUNK: explore was stopped (Ctrl-C)" in comment
    replay = load_experiment(kept)
    assert replay.experiment.spec.expect == "loss"
    assert 1 <= len(replay.experiment.spec.faults) < 3, "the kept removal, at least"
    assert (out / "outcomes.jsonl").read_text().count("\n") == 1
