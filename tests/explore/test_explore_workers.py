"""A Spark task's Python worker dies with the daemon that forked it (`die_with_parent`), so
an exploration that exits leaves no worker simulating schedules behind, even when its
daemon was killed without telling its workers (it tells them with a SIGHUP only when Spark
closes it)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="PR_SET_PDEATHSIG is Linux's")

DAEMON = """
import os, signal, sys, time
from undertow.explore.spark import die_with_parent
read, write = os.pipe()
pid = os.fork()
if pid == 0:  # the worker: ignores SIGHUP, as a run's own handlers do not let it end it
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    quiet = os.open(os.devnull, os.O_WRONLY)  # the daemon's output ends with the daemon
    os.dup2(quiet, 1)
    os.dup2(quiet, 2)
    if sys.argv[1] == "dies-with-parent":
        die_with_parent()
    os.write(write, b"ready")
    time.sleep(120)
    os._exit(0)
os.read(read, 5)
print(pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # the daemon killed outright
"""


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for a reaper."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _worker_after_its_daemon_is_killed(mode: str, within_s: float) -> bool:
    """Whether the worker still runs ``within_s`` after its daemon was SIGKILLed (it is
    killed in any case afterwards)."""
    daemon = subprocess.run([sys.executable, "-c", DAEMON, mode], capture_output=True,
                            text=True, timeout=60)
    worker = int(daemon.stdout.split()[0])
    try:
        deadline = time.monotonic() + within_s
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        return _alive(worker)
    finally:
        subprocess.run(["kill", "-9", str(worker)], capture_output=True)


def test_a_worker_dies_with_its_daemon() -> None:
    assert not _worker_after_its_daemon_is_killed("dies-with-parent", 10)


def test_without_it_the_worker_outlives_its_daemon() -> None:
    """The control: the same worker without `die_with_parent` runs on, orphaned."""
    assert _worker_after_its_daemon_is_killed("plain", 1)
