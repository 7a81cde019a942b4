"""An interrupted or crashed run leaves no child process, stopped process or namespace behind.

A runner subprocess starts a real cluster and injects one fault of every kind of the
registry, each on a broker of its own, and is then interrupted (Ctrl-C, SIGTERM: it
recovers each fault and stops on the way out) or killed outright (SIGKILL: the
parent-death signal and the guardian clean up). Every process of the run carries a mark
in its environment, so /proc shows whatever survived.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from processes import needs_local_minibroker
from procs import living_with_mark, netns_names

from undertow.faults import FAULT_UNITS
from undertow.platform import netns
from undertow.platform.base import wait_for

pytestmark = needs_local_minibroker()

RUNNER = """
import json, sys, time
from pathlib import Path
from undertow.faults import FAULT_UNITS, Nodes, build_fault
from undertow.platform.base import sigterm_as_interrupt
from undertow.platform.local import LocalPlatform, LocalPlatformConfig
from undertow.spec import plan
from undertow.spec.experiment import ChaosExperimentSpec

brokers = len(FAULT_UNITS)
config = LocalPlatformConfig(workdir=Path(sys.argv[1]), brokers=brokers, network=sys.argv[2])
experiment = ChaosExperimentSpec.model_validate({
    "cluster": {"inline": {"brokers": brokers}},
    "topic": {"name": "t", "replicationFactor": 3},
    "workload": {"duration": "1h"}, "expect": "clean",
    "faults": [{"kind": kind, "target": {"broker": index}, "duration": "10m",
                **({"delay": {"latency": "200ms"}} if kind == "delay" else {})}
               for index, kind in enumerate(FAULT_UNITS)]})
faults = []
with sigterm_as_interrupt(), LocalPlatform(config) as platform:
    try:
        for spec in plan(experiment, 0):
            node = platform.brokers[spec.target.broker]
            fault = build_fault(spec, platform, Nodes(node), time_limit_s=600)
            fault.inject()
            faults.append(fault)
        print(json.dumps({"pids": [platform.pid(n) for n in platform.nodes],
                          "blocked": len(platform.blocked_links),
                          "namespaces": [platform.namespaces.namespace(n) for n in platform.nodes]
                          if platform.namespaces else []}), flush=True)
        time.sleep(600)
    finally:
        for fault in reversed(faults):
            if fault.recover():
                print(json.dumps({"recovered": str(fault)}), flush=True)
"""


@pytest.mark.parametrize(("sig", "network"), [
    pytest.param(signal.SIGINT, "proxy", id="ctrl-c"),
    pytest.param(signal.SIGTERM, "proxy", id="sigterm"),
    pytest.param(signal.SIGKILL, "proxy", id="sigkill"),
    pytest.param(signal.SIGKILL, "netns", id="sigkill-netns", marks=pytest.mark.skipif(
        netns.unavailable_reason() is not None, reason=str(netns.unavailable_reason()))),
])
def test_interrupted_or_killed_run_leaves_nothing_behind(tmp_path: Path, sig: signal.Signals,
                                                         network: str) -> None:
    mark = uuid.uuid4().hex
    # Its own process group, like a shell job: SIGINT goes to the group, as Ctrl-C does.
    runner = subprocess.Popen([sys.executable, "-c", RUNNER, str(tmp_path), network],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "UNDERTOW_TEST_MARK": mark},
                              start_new_session=True)
    try:
        line = runner.stdout.readline()
        assert line, f"the runner failed: {runner.stderr.read()}"
        report = json.loads(line)
        states = dict(living_with_mark(mark))
        assert len(states) >= 2 + 1 + len(FAULT_UNITS) - 2  # runner, guardian, controller,
        # the brokers but the killed and the power-lost ones (a full disk halts one later)
        assert sorted(state for pid, state in states.items() if pid in report["pids"]) \
            .count("T") == 1
        assert report["blocked"] > 0
        assert set(report["namespaces"]) <= netns_names()
        os.killpg(runner.pid, sig)
        runner.wait(60)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    wait_for(lambda: not living_with_mark(mark), 20, "every process of the run to exit")
    assert not set(report["namespaces"]) & netns_names()
    if sig != signal.SIGKILL:
        recovered = [json.loads(line)["recovered"] for line in runner.stdout]
        assert recovered == [f"{kind} broker-{index}" for index, kind
                             in reversed(list(enumerate(FAULT_UNITS)))], runner.stderr.read()
    else:
        guardian_log = (tmp_path / "logs" / "guardian.log").read_text()
        assert "the runner is gone; healing process groups" in guardian_log
