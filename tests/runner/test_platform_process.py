"""Supervised child processes with plain Python children: signals, groups, death with the runner."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from undertow.platform.base import PlatformError, wait_for
from undertow.platform.process import ChildProcess, Spawner
from undertow.platform.procfs import alive, proc_stat

# Each prints a computed marker: the log's header line holds the command, not its output.
SLEEPER = [sys.executable, "-c", "import time; print(6 * 7, flush=True); time.sleep(600)"]


@pytest.fixture
def spawner() -> Iterator[Spawner]:
    spawner = Spawner()
    yield spawner
    spawner.close()


@pytest.fixture
def child(spawner: Spawner, tmp_path: Path) -> Iterator[ChildProcess]:
    process = ChildProcess("sleeper", SLEEPER, log_path=tmp_path / "sleeper.log", spawner=spawner)
    yield process
    process.kill()


def test_start_runs_in_its_own_process_group_and_session(child: ChildProcess,
                                                         tmp_path: Path) -> None:
    child.start()
    assert child.running
    assert os.getpgid(child.pid) == child.pid
    assert os.getsid(child.pid) == child.pid
    # The launcher exec'd the command in place: same pid, the command's output in the log.
    wait_for(lambda: b"\n42\n" in (tmp_path / "sleeper.log").read_bytes(), 10, "its output")
    assert Path(f"/proc/{child.pid}/cmdline").read_bytes().split(b"\0")[1] == b"-c"
    with pytest.raises(PlatformError, match="already running"):
        child.start()


def test_pause_stops_and_resume_continues(child: ChildProcess) -> None:
    child.start()
    child.pause()
    assert proc_stat(child.pid)[0] == "T"
    assert child.paused
    child.resume()
    assert proc_stat(child.pid)[0] != "T"
    child.resume()  # a no-op on a running process


def test_kill_reaps_even_a_paused_process_and_restart_gets_a_new_pid(child: ChildProcess) -> None:
    child.start()
    first = child.pid
    child.pause()
    child.kill()
    assert not child.running
    assert child.returncode == -signal.SIGKILL
    assert proc_stat(first) is None
    child.start()
    assert child.running and child.pid != first
    with pytest.raises(PlatformError, match="not running"):
        child.kill()
        child.pause()


def test_terminate_escalates_to_sigkill_after_the_grace(spawner: Spawner, tmp_path: Path) -> None:
    stubborn = ChildProcess(
        "stubborn",
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
         "signal.SIG_IGN); print(6 * 7, flush=True); time.sleep(600)"],
        log_path=tmp_path / "stubborn.log", spawner=spawner)
    stubborn.start()
    wait_for(lambda: b"\n42\n" in stubborn.log_path.read_bytes(), 10, "the SIGTERM handler")
    stubborn.terminate(grace_s=0.2)
    assert stubborn.returncode == -signal.SIGKILL


def test_wait_exit_reports_the_status(spawner: Spawner, tmp_path: Path) -> None:
    quick = ChildProcess("quick", [sys.executable, "-c", "raise SystemExit(3)"],
                         log_path=tmp_path / "quick.log", spawner=spawner)
    quick.start()
    assert quick.wait_exit(10) == 3
    assert not quick.running


def test_a_missing_command_is_a_clear_error(spawner: Spawner, tmp_path: Path) -> None:
    missing = ChildProcess("missing", ["/nonexistent/minibroker", "broker"],
                           log_path=tmp_path / "missing.log", spawner=spawner)
    with pytest.raises(PlatformError, match="missing: cannot start /nonexistent/minibroker"):
        missing.start()
    assert not missing.running


def test_child_started_from_a_short_lived_thread_outlives_that_thread(
        child: ChildProcess) -> None:
    """PR_SET_PDEATHSIG fires when the forking *thread* ends; the spawner thread must fork.
    The kernel sends that signal as the thread exits, before the thread leaves
    /proc/self/task, so once it has left, a SIGKILL would already be on its way; and a
    process being killed never stops, so the child stopping on SIGSTOP proves it survived."""
    starter = threading.Thread(target=child.start)
    starter.start()
    starter.join()  # returns once Python is done with the thread, maybe before the kernel
    task = Path(f"/proc/self/task/{starter.native_id}")
    wait_for(lambda: not task.exists(), 10, "the starter thread to exit")
    child.pause()
    assert child.running and child.paused


RUNNER = """
import json, sys, time
from pathlib import Path
from undertow.platform.process import ChildProcess, Spawner
child = ChildProcess("sleeper", sys.argv[2:], log_path=Path(sys.argv[1]), spawner=Spawner())
child.start()
child.pause()
print(json.dumps({"pid": child.pid}), flush=True)
time.sleep(600)
"""


def test_children_die_with_a_sigkilled_runner_without_any_guardian(tmp_path: Path) -> None:
    runner = subprocess.Popen([sys.executable, "-c", RUNNER, str(tmp_path / "c.log"), *SLEEPER],
                              stdout=subprocess.PIPE, text=True)
    try:
        pid = json.loads(runner.stdout.readline())["pid"]
        assert proc_stat(pid)[0] == "T"
    finally:
        runner.kill()
        runner.wait()
    wait_for(lambda: not alive(pid), 10, f"paused child {pid} to die with its runner")
