"""The fault agent where it used to give way: a heal failing with an error nobody foresaw,
an iptables call that never returns, and processes in the pod that are not the broker but
mention it (a debugging ``grep minibroker``), or took the pid of a broker that died. Real
threads, real processes, a real (fake) iptables executable on PATH."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kube_helpers import Target, UnprivilegedNetfilter, record_pid

from undertow.kube.agent import AgentError, FaultAgent, Netfilter, Processes
from undertow.kube.cluster_objects import _LAUNCHER
from undertow.platform.base import wait_for
from undertow.platform.procfs import proc_stat


class FailingOnce(UnprivilegedNetfilter):
    """Rules kept in a set (no root needed); the first removal fails with ``error``, as a
    heal can fail with anything: an OSError from a missing binary, a bug."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error: Exception | None = error
        self.undrops = 0

    def undrop(self, direction: str, peer: str) -> None:
        self.undrops += 1
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        super().undrop(direction, peer)


@pytest.mark.parametrize("error", [RuntimeError("a bug"), FileNotFoundError("iptables")])
def test_a_heal_that_fails_with_any_error_is_retried_and_the_deadlines_go_on(
        target: Target, error: Exception) -> None:
    netfilter = FailingOnce(error)
    agent = FaultAgent(netfilter, target.processes())
    agent.start()
    try:
        agent.drop("input", "10.0.0.7", deadline_s=0.05)
        wait_for(lambda: not netfilter.dropped, 5, "the drop to heal after its failed heal")
        assert netfilter.undrops == 2 and agent.faults()["faults"] == []
        # The deadline thread is still there for the next fault.
        assert agent.pause(0.05) == [target.process.pid]
        wait_for(lambda: target.state() != "T", 5, "the pause to end at its deadline")
        assert agent.faults()["faults"] == []
    finally:
        agent.close()


# ---- iptables that never returns -------------------------------------------------------------


@pytest.fixture
def hanging_iptables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An ``iptables`` first on PATH that never answers (it sleeps; a unique duration tells
    its process apart); yields that duration."""
    duration = f"30.{uuid.uuid4().int % 10**9:09d}"
    binary = tmp_path / "bin" / "iptables"
    binary.parent.mkdir()
    binary.write_text(f"#!/bin/sh\nexec sleep {duration}\n")
    binary.chmod(0o755)
    monkeypatch.setenv("PATH", f"{binary.parent}{os.pathsep}{os.environ['PATH']}")
    yield duration


def sleeping(duration: str) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if cmdline.read_bytes().split(b"\0")[:2] == [b"sleep", duration.encode()]:
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


def test_an_iptables_call_that_never_returns_is_killed_and_named(
        hanging_iptables: str, target: Target) -> None:
    netfilter = Netfilter(timeout_s=0.5)  # ("iptables", "-w", "5") from PATH
    assert netfilter.command == ("iptables", "-w", "5")
    agent = FaultAgent(netfilter, target.processes())
    started = time.monotonic()
    with pytest.raises(AgentError) as refused:
        agent.drop("input", "10.0.0.7", deadline_s=10)
    assert time.monotonic() - started < 3
    assert refused.value.status == 503
    assert str(refused.value) == ("iptables -w 5 -C UNDERTOW-INPUT -s 10.0.0.7/32 -j DROP: no "
                                  "answer within 0.5s (killed); is the xtables lock held?")
    assert sleeping(hanging_iptables) == []  # killed, not left behind
    # The agent's lock is free again: requests and deadlines go on.
    assert agent.faults()["faults"] == [] and agent.pause(0.05) == [target.process.pid]
    agent.resume()


def test_an_iptables_that_cannot_run_is_an_agent_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-iptables"
    with pytest.raises(AgentError, match=f"^{missing} -w 5 -F UNDERTOW-INPUT: cannot run: "):
        Netfilter((str(missing), "-w", "5")).flush()


# ---- the broker, and only the broker ---------------------------------------------------------


@pytest.fixture
def debugging_grep(target: Target) -> Iterator[subprocess.Popen[bytes]]:
    """What someone runs in the pod while debugging: a process whose command line holds
    the broker's marker, waiting on its input."""
    grep = subprocess.Popen(["grep", target.marker], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL)
    wait_for(lambda: target.marker.encode() in Path(f"/proc/{grep.pid}/cmdline").read_bytes(),
             10, "grep to start")
    yield grep
    grep.kill()
    grep.wait()


def test_pause_and_kill_reach_the_recorded_broker_and_not_a_grep_for_it(
        target: Target, debugging_grep: subprocess.Popen[bytes], tmp_path: Path) -> None:
    agent = FaultAgent(UnprivilegedNetfilter(), target.processes())
    agent.start()
    try:
        assert agent.pause(30) == [target.process.pid]
        # The grep is running or sleeping (S, or D for a moment on a busy disk), not stopped.
        assert target.state() == "T" and state(debugging_grep.pid) in {"R", "S", "D"}
        assert agent.resume() == [target.process.pid]
        assert agent.kill(30) == [target.process.pid]
        assert target.process.wait(5) == -signal.SIGKILL
        assert debugging_grep.poll() is None
        assert agent.faults()["running"] is False  # the grep is not the broker
    finally:
        agent.release()
        agent.close()


def test_a_pid_that_is_not_the_recorded_broker_is_never_signalled(
        target: Target, debugging_grep: subprocess.Popen[bytes]) -> None:
    """The pid file outlives the broker; a process that took its pid (another start time)
    or one that is not the broker (no marker) is refused, and survives."""
    processes = target.processes()
    pid_file = target.pid_file
    grep_start = proc_stat(debugging_grep.pid)[1]

    pid_file.write_text(f"{debugging_grep.pid} {grep_start - 1}\n")  # the pid, reused
    with pytest.raises(AgentError) as refused:
        processes.kill()
    assert refused.value.status == 409
    assert str(refused.value) == (
        f"no process matches {target.marker!r}: pid {debugging_grep.pid} from {pid_file} "
        f"started at tick {grep_start}, not {grep_start - 1}: the broker exited and its pid "
        f"was reused")

    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        wait_for(lambda: b"sleep" in Path(f"/proc/{sleeper.pid}/cmdline").read_bytes(), 10,
                 "sleep to start")
        record_pid(pid_file, sleeper.pid)
        with pytest.raises(AgentError, match=f"pid {sleeper.pid} from .* does not run "):
            processes.stop()
        assert state(sleeper.pid) not in ("T", "t")  # not stopped (S or, just started, R)
    finally:
        sleeper.kill()
        sleeper.wait()

    for content in ("1 1\n", f"{os.getpid()} {proc_stat(os.getpid())[1]}\n"):
        pid_file.write_text(content)
        with pytest.raises(AgentError, match="which is not the broker"):
            processes.kill()
    pid_file.write_text("garbage\n")
    assert processes.pids() == [] and processes.resume() == []
    assert debugging_grep.poll() is None and target.process.poll() is None


def test_the_launcher_records_the_pid_of_the_broker_it_execs(tmp_path: Path) -> None:
    """The broker container's own launcher run by a real sh: the process it records is the
    one it becomes, and the agent kills that one."""
    marker = f"minibroker-{uuid.uuid4().hex}"
    config = tmp_path / "config"
    config.mkdir()
    (config / "server.properties").write_text("")
    pid_file = tmp_path / "broker.pid"
    script = _LAUNCHER.format(hold_file=tmp_path / "hold", config_dir=config,
                              pid_file=pid_file, role=marker)
    script = script.replace("exec minibroker",
                            f"exec {sys.executable} -c 'import time; time.sleep(60)'")
    with subprocess.Popen(["sh", "-c", script]) as broker:
        try:
            processes = Processes(marker, pid_file)
            wait_for(processes.pids, 10, "the launcher to record the broker")
            assert processes.pids() == [broker.pid]
            assert pid_file.read_text() == f"{broker.pid} {proc_stat(broker.pid)[1]}\n"
            assert processes.kill() == [broker.pid]
            assert broker.wait(5) == -signal.SIGKILL
        finally:
            broker.kill()


def state(pid: int) -> str | None:
    stat = proc_stat(pid)
    return None if stat is None else stat[0]
