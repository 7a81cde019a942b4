"""Every kind of the fault registry, healed on the Kubernetes platform by the two paths that
hold no fault unit: the operator's cluster heal (``faults.clear``, as after a runner Job
failed) and the pods' own deadlines (the runner cut off for good: the agents' deadlines and
the brokers' failpoint limits). Neither may leave a drop rule, a hold, a stopped process or
an armed failpoint behind.

The platform is a test double of the cluster: kmock's API server holds the pods, each pod
has a real fault agent of its own on a loopback port, and the pods' brokers are real
minibroker processes of a ``LocalPlatform``, which plays the kubelet (it starts a broker
again once no hold keeps it down) and the StatefulSet (it replaces a deleted pod).
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kube_helpers import (
    AGENT_TOKEN,
    NAMESPACE,
    RunningAgent,
    UnprivilegedDelays,
    UnprivilegedNetfilter,
    add_pods,
)
from planned_faults import planned

from undertow import faults
from undertow.faults import FAULT_UNITS, Fault, Nodes, build_fault
from undertow.kube.agent import AgentClient, FaultAgent, Hold, Processes, make_server
from undertow.kube.api import KubeApi
from undertow.kube.cluster_objects import RECORD_PID
from undertow.kube.platform import KubernetesPlatform, KubernetesPlatformConfig
from undertow.platform.base import wait_for
from undertow.platform.control import EndpointError
from undertow.platform.local import LocalPlatform, LocalPlatformConfig, default_command
from undertow.platform.procfs import proc_stat

pytestmark = pytest.mark.asyncio

KINDS = list(FAULT_UNITS)
"""Every kind the pods take."""

FAST = {"replica.lag.time.max.ms": "1000", "broker.session.timeout.ms": "1500",
        "broker.heartbeat.interval.ms": "200"}
DEADLINE_S = 1.5
"""The deadline path: the units' time limits and the agents' deadlines."""
LAUNCHER = ("sh", "-c", RECORD_PID + """for arg; do
  [ "${previous:-}" = --data-dir ] && record_pid "$arg.pid"
  previous=$arg
done
exec "$@"
""", "sh", *default_command())
"""What each pod's container runs, as the broker pods' launcher does: record the pid
(``data/NODE.pid``, beside the node's data directory) for the agent, then exec the
broker."""
UNREACHABLE = "http://127.0.0.1:9"
"""Where a runner cut off from the pods sends its requests (the discard port: refused)."""


class Pods:
    """The brokers' processes and one fault agent per pod, shared by the module's tests."""

    def __init__(self, workdir: Path) -> None:
        self.local = LocalPlatform(LocalPlatformConfig(
            workdir=workdir, brokers=3, broker_config=FAST, controller_config=FAST,
            command=LAUNCHER))
        self.agents: dict[str, RunningAgent] = {}
        self._servers: list[Any] = []
        self.local.start()
        for node in self.local.nodes:
            # The node's data directory is in its command line and in no other's.
            data = workdir / "data" / node
            agent = FaultAgent(UnprivilegedNetfilter(),
                               Processes(f"{data} ", data.with_name(f"{node}.pid")),
                               Hold(workdir / f"{node}.hold"), delays=UnprivilegedDelays())
            agent.start()
            server = make_server(agent, "127.0.0.1", 0, AGENT_TOKEN)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            self._servers.append(server)
            self.agents[node] = RunningAgent(agent, server.server_address[1])

    def close(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
        for running in self.agents.values():
            running.agent.heal()
            running.agent.close()
        self.local.stop()

    def leftovers(self) -> list[str]:
        """Whatever a fault may leave in a pod: the agent's faults and rules, a hold, a
        stopped process, an armed failpoint of its broker."""
        left = []
        for node, running in self.agents.items():
            agent = running.agent
            left += [f"{node}: agent fault {f['key']}" for f in agent.faults()["faults"]]
            left += [f"{node}: rule {rule}" for rule in agent.netfilter.rules()]
            left += [f"{node}: held"] if agent.hold.active() else []
            left += [f"{node}: paused"] if agent.processes.paused() else []
            if node in self.local.brokers and self.local.is_running(node) \
                    and not self.local.is_paused(node):
                state = self.local.state(node)
                left += [f"{node}: {flag}" for flag in ("disk_stalled", "disk_full")
                         if state[flag]]
        return left


class LoopbackPods(KubernetesPlatform):
    """The Kubernetes platform with each pod's agent and broker on loopback ports of their
    own; ``severed`` cuts the runner off from every pod, as if it had died."""

    def __init__(self, api: KubeApi, pods: Pods) -> None:
        super().__init__(KubernetesPlatformConfig(
            namespace=NAMESPACE, cluster="c", brokers=3,
            failpoint_token=pods.local.failpoint_token, agent_token=AGENT_TOKEN,
            fault_deadline_s=DEADLINE_S, client_ip="10.244.9.9", start_timeout_s=10,
            poll_s=0.05), api)
        self.pods = pods
        self.severed = False

    def admin_url(self, node: str) -> str:
        return UNREACHABLE if self.severed else self.pods.local.admin_url(node)

    def agent(self, node: str) -> AgentClient:
        url = UNREACHABLE if self.severed else self.pods.agents[node].url
        return AgentClient(url, AGENT_TOKEN, timeout_s=5)

    def release(self, node: str) -> None:
        super().release(node)
        if not self.severed and not self.pods.agents[node].agent.hold.active():
            self.pods.local.release(node)  # the kubelet restarts the container

    def delete_pod(self, node: str, grace_period_s: float) -> None:
        self.pods.local.delete_pod(node, grace_period_s)
        super().delete_pod(node, grace_period_s)
        add_pods(self.api, only=self.names.pod(node))  # the StatefulSet's replacement

    def incarnation(self, node: str) -> int | None:
        return self.pods.local.incarnation(node)  # what the kubelet's restart count counts


@pytest.fixture(scope="module")
def pods(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pods]:
    running = Pods(tmp_path_factory.mktemp("pods"))
    try:
        yield running
    finally:
        running.close()


@pytest.fixture
def healthy(pods: Pods) -> Pods:
    faults.heal(pods.local)
    for running in pods.agents.values():
        running.agent.heal()
    wait_for(lambda: pods.local.all_brokers_unfenced(), 20, "every broker unfenced")
    assert pods.leftovers() == []
    return pods


async def injected(api: KubeApi, pods: Pods, kind: str,
                   time_limit_s: float) -> tuple[LoopbackPods, Fault]:
    """A fault of ``kind`` on broker-1's pod, injected through the double."""
    await asyncio.to_thread(add_pods, api)
    platform = LoopbackPods(api, pods)
    fault = build_fault(planned({"kind": kind, "target": {"broker": 1}}), platform,
                        Nodes("broker-1"), time_limit_s=time_limit_s)
    await asyncio.to_thread(fault.inject)
    return platform, fault


@pytest.mark.parametrize("kind", KINDS)
async def test_the_operators_heal_clears_every_kind_in_every_pod(
        api: KubeApi, healthy: Pods, kind: str) -> None:
    platform, fault = await injected(api, healthy, kind, 600)
    problems = await asyncio.to_thread(faults.clear, platform)
    assert problems == []
    for node in healthy.local.nodes:  # a broker the kubelet started again
        await asyncio.to_thread(healthy.local.await_serving, node)
    assert healthy.leftovers() == []
    await asyncio.to_thread(fault.recover)  # the unit's own recovery finds nothing to undo
    assert healthy.leftovers() == []


@pytest.mark.parametrize("kind", KINDS)
async def test_every_kind_heals_at_its_deadline_in_the_pods_when_the_runner_is_gone(
        api: KubeApi, healthy: Pods, kind: str) -> None:
    platform, fault = await injected(api, healthy, kind, DEADLINE_S)
    platform.severed = True  # the unit's own recovery reaches no pod from now on
    await asyncio.to_thread(
        wait_for, lambda: healthy.leftovers() == [], DEADLINE_S + 10,
        f"{kind}'s traces to go at their deadline", ignore=(EndpointError,))
    # The runner back: its recovery (which waits for its time limit's failed attempt)
    # brings the broker back if it is down, and leaves nothing either.
    platform.severed = False
    await asyncio.to_thread(fault.recover)
    assert healthy.leftovers() == []


async def test_the_runner_pods_stop_resumes_a_paused_producer_process(
        api: KubeApi, healthy: Pods, tmp_path: Path) -> None:
    """A producer the schedule pauses is a process of the runner's pod (the base platform's
    `start_client`, with no guardian: PR_SET_PDEATHSIG alone ties it to the runner); the
    runner's stop heals the cluster (`faults.heal`), which resumes it as it clears the pods."""
    await asyncio.to_thread(add_pods, api)
    platform = LoopbackPods(api, healthy)
    process = platform.start_client("p0", [sys.executable, "-c", "import sys; sys.stdin.read()"],
                                    env=os.environ, log_path=tmp_path / "p0.log")
    try:
        fault = build_fault(planned({"kind": "pause", "target": {"producer": 0}}), platform,
                            Nodes("client-p0"), time_limit_s=600)
        await asyncio.to_thread(fault.inject)
        assert proc_stat(process.pid)[0] == "T"
        await asyncio.to_thread(platform.stop)
        assert proc_stat(process.pid)[0] != "T" and healthy.leftovers() == []
        await asyncio.to_thread(fault.recover)
    finally:
        process.kill()
