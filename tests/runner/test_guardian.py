"""The guardian heals what a dead runner leaves: process groups (even stopped), namespaces."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from procs import living_with_mark, netns_names

from undertow.platform import netns
from undertow.platform.base import wait_for
from undertow.platform.guardian import Guardian
from undertow.platform.procfs import alive, proc_stat

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]
# A group leader with a grandchild in its group: killpg must take both.
FAMILY = [sys.executable, "-c",
          "import subprocess, sys, time; "
          "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
          "print(c.pid, flush=True); time.sleep(600)"]


@pytest.fixture
def guardian(tmp_path: Path) -> Iterator[Guardian]:
    g = Guardian.start(tmp_path / "guardian.log")
    yield g
    g.close()


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen]]:
    """Plain children without PR_SET_PDEATHSIG, as if a runner had lost track of them."""
    children: list[subprocess.Popen] = []
    yield children
    for child in children:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def start(children: list[subprocess.Popen], argv: list[str]) -> subprocess.Popen:
    child = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.PIPE, text=True)
    children.append(child)
    return child


def test_eof_kills_recorded_groups_even_stopped_ones(guardian: Guardian,
                                                     spawned: list[subprocess.Popen]) -> None:
    family = start(spawned, FAMILY)
    grandchild = int(family.stdout.readline())
    os.killpg(family.pid, signal.SIGSTOP)
    wait_for(lambda: proc_stat(family.pid)[0] == "T", 5, "the group to stop")
    guardian.track("process", family.pid, proc_stat(family.pid)[1])
    guardian.close()
    assert family.wait(5) == -signal.SIGKILL
    wait_for(lambda: not alive(grandchild), 5, "the grandchild in the same group to die")


def test_forgotten_and_reused_pids_are_left_alone(guardian: Guardian,
                                                  spawned: list[subprocess.Popen]) -> None:
    forgotten, reused = start(spawned, SLEEP), start(spawned, SLEEP)
    guardian.track("process", forgotten.pid, proc_stat(forgotten.pid)[1])
    guardian.forget("process", forgotten.pid)
    # A different start time means the recorded process is gone and its pid was reused.
    guardian.track("process", reused.pid, proc_stat(reused.pid)[1] + 1)
    guardian.close()
    assert forgotten.poll() is None and reused.poll() is None


RUNNER = """
import json, os, signal, subprocess, sys, time
from pathlib import Path
from undertow.platform.guardian import Guardian
from undertow.platform.process import ChildProcess, Spawner
from undertow.platform.procfs import proc_stat
work = Path(sys.argv[1])
guardian = Guardian.start(work / "guardian.log")
# Escaped children (no parent-death signal), one of them stopped: only the guardian helps.
escaped = [subprocess.Popen(sys.argv[2:], start_new_session=True) for _ in range(2)]
for p in escaped:
    guardian.track("process", p.pid, proc_stat(p.pid)[1])
os.kill(escaped[0].pid, signal.SIGSTOP)
supervised = ChildProcess("node", sys.argv[2:], log_path=work / "node.log", spawner=Spawner(),
                          guardian=guardian)
supervised.start()
supervised.pause()
print(json.dumps({"guardian": guardian.pid, "pids": [p.pid for p in escaped]
                  + [supervised.pid]}), flush=True)
time.sleep(600)
"""


def test_sigkilled_runner_leaves_no_process_behind(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    runner = subprocess.Popen([sys.executable, "-c", RUNNER, str(tmp_path), *SLEEP],
                              stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "UNDERTOW_TEST_MARK": mark})
    try:
        report = json.loads(runner.stdout.readline())
        assert len(living_with_mark(mark)) == 5  # runner, guardian and three children
        assert proc_stat(report["pids"][0])[0] == "T"
    finally:
        runner.kill()
        runner.wait()
    wait_for(lambda: not living_with_mark(mark), 10, "every process of the run to exit")
    guardian_log = (tmp_path / "guardian.log").read_text()
    assert "the runner is gone; healing process groups" in guardian_log


NETNS_RUNNER = """
import json, sys, time
from pathlib import Path
from undertow.platform.guardian import Guardian
from undertow.platform.netns import NetnsNetwork
guardian = Guardian.start(Path(sys.argv[1]) / "guardian.log")
network = NetnsNetwork(["controller", "broker-1"], guardian)
network.setup()
print(json.dumps({"namespaces": [network.namespace(n) for n in network.nodes],
                  "links": "ut" + network.run_id}), flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(netns.unavailable_reason() is not None,
                    reason=str(netns.unavailable_reason()))
def test_sigkilled_runner_leaves_no_namespace_or_bridge(tmp_path: Path) -> None:
    runner = subprocess.Popen([sys.executable, "-c", NETNS_RUNNER, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        report = json.loads(runner.stdout.readline())
        assert set(report["namespaces"]) <= set(netns_names())
    finally:
        runner.kill()
        runner.wait()

    def cleaned() -> bool:
        return (not set(report["namespaces"]) & set(netns_names())
                and not [link for link in _link_names() if link.startswith(report["links"])])

    wait_for(cleaned, 10, "the guardian to delete the namespaces, veths and bridge")


def _link_names() -> list[str]:
    out = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True,
                         check=True).stdout
    return [line.split()[0].split("@")[0] for line in out.splitlines() if line.strip()]
