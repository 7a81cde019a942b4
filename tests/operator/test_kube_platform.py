"""KubernetesPlatform's fault primitives, and the fault units over them: the API calls
against kmock's emulator, pause, kill and partition through a real fault agent, disk stall,
disk full and power loss through a real broker's failpoint endpoint (the test plays the
kubelet that restarts the broker's container); every unit's injection and recovery is a
Kubernetes Event on the experiment."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kmock
import pytest
import yaml
from kube_helpers import (
    AGENT_TOKEN,
    NAMESPACE,
    RunningAgent,
    Target,
    add_pods,
    free_port,
    pod_ip,
    running_status,
    stored,
)
from planned_faults import planned
from processes import ON_SIGTERM, sigterm_lines

from undertow.faults import Nodes, build_fault
from undertow.kube.api import KubeApi
from undertow.kube.cluster_objects import fault_secret
from undertow.kube.platform import (
    Endpoints,
    KubernetesPlatform,
    KubernetesPlatformConfig,
    longest_fault_s,
)
from undertow.platform.base import CLIENT, Link, PlatformError, wait_for
from undertow.platform.link_delay import LinkDelay
from undertow.platform.local import LocalPlatform, LocalPlatformConfig
from undertow.spec import load_experiment

pytestmark = pytest.mark.asyncio

REPO = Path(__file__).resolve().parents[2]
CLIENT_IP = "10.244.9.9"


def make_platform(api: KubeApi, *, agent_port: int, admin_port: int | None = None,
                  failpoint_token: str = "failpoint-secret",
                  client_ip: str | None = CLIENT_IP) -> KubernetesPlatform:
    config = KubernetesPlatformConfig(
        namespace=NAMESPACE, cluster="c", brokers=3, failpoint_token=failpoint_token,
        agent_token=AGENT_TOKEN, fault_deadline_s=30, client_ip=client_ip, experiment="e",
        experiment_uid="uid-e", start_timeout_s=10, poll_s=0.05,
        endpoints=Endpoints(host_template="127.0.0.1", agent_port=agent_port,
                            admin_port=admin_port or free_port()))
    return KubernetesPlatform(config, api)


def events(emulator: Any) -> list[tuple[str, str]]:
    found = []
    for (resource, _, name), obj in emulator.objects.items():
        if resource == kmock.resource("v1/events") and not obj.deleted:
            event = stored(emulator, "Event", name)
            involved = event["involvedObject"]
            assert (involved["kind"], involved["name"], involved["uid"]) == (
                "ChaosExperiment", "e", "uid-e")
            found.append((event["reason"], event["message"]))
    return found


async def test_kill_sigkills_the_broker_in_its_pod_through_the_agent(
        emulator: Any, api: KubeApi, agent: RunningAgent, target: Target) -> None:
    """In place, as locally: no pod is deleted, the process dies, and it is not running
    while held down (its container may be)."""
    await asyncio.to_thread(add_pods, api)
    platform = make_platform(api, agent_port=agent.port)
    assert await asyncio.to_thread(platform.is_running, "broker-1")
    kill = build_fault(planned({"kind": "kill", "target": {"broker": 1}}), platform,
                       Nodes("broker-1"), time_limit_s=600)
    await asyncio.to_thread(kill.inject)

    assert target.process.wait(5) == -signal.SIGKILL
    assert not [r for r in emulator[kmock.resource("v1/pods")] if r.method == "DELETE"]
    assert stored(emulator, "Pod", "c-broker-1") is not None
    assert [f["kind"] for f in agent.agent.faults()["faults"]] == ["kill"]
    assert agent.agent.faults()["faults"][0]["expires_in_s"] > 29  # the platform's deadline
    assert events(emulator) == [("FaultInjected",
                                 "kill broker-1: SIGKILL in place; held down until recovered")]
    assert not await asyncio.to_thread(platform.is_running, "broker-1")
    assert await asyncio.to_thread(platform.incarnation, "broker-1") == ("uid-c-broker-1", 0)
    with pytest.raises(PlatformError, match=r"cannot kill broker-1: .*no process matches"):
        await asyncio.to_thread(platform.kill, "broker-1")
    await asyncio.to_thread(platform.release, "broker-1")
    assert agent.agent.faults()["faults"] == []


async def test_kill_with_a_grace_period_is_a_clean_shutdown_in_the_pod(
        emulator: Any, api: KubeApi, agent: RunningAgent, tmp_path: Path) -> None:
    """The fault's gracePeriod reaches the agent: SIGTERM, and the broker exits on its own
    (status 0) well within the grace; it is then held down as after any kill."""
    record = tmp_path / "sigterm"
    clean = Target(ON_SIGTERM, str(record), "exit")
    try:
        await asyncio.to_thread(wait_for, lambda: sigterm_lines(record) == ["ready"], 10,
                                "the SIGTERM handler")
        agent.agent.processes = clean.processes()
        await asyncio.to_thread(add_pods, api)
        platform = make_platform(api, agent_port=agent.port)
        kill = build_fault(planned({"kind": "kill", "target": {"broker": 1},
                                    "gracePeriod": "20s"}),
                           platform, Nodes("broker-1"), time_limit_s=600)
        await asyncio.to_thread(kill.inject)

        assert clean.process.wait(5) == 0
        assert sigterm_lines(record) == ["ready", "sigterm"]
        assert [f["kind"] for f in agent.agent.faults()["faults"]] == ["kill"]
        assert events(emulator) == [
            ("FaultInjected", "kill broker-1: SIGTERM, SIGKILL after 20s (a clean shutdown) "
                              "in place; held down until recovered")]
        assert not await asyncio.to_thread(platform.is_running, "broker-1")
        await asyncio.to_thread(platform.release, "broker-1")
        assert agent.agent.faults()["faults"] == []
    finally:
        clean.close()


async def test_pause_goes_through_the_pod_agent(emulator: Any, api: KubeApi,
                                                agent: RunningAgent, target: Target) -> None:
    await asyncio.to_thread(add_pods, api)
    platform = make_platform(api, agent_port=agent.port)
    pause = build_fault(planned({"kind": "pause", "target": {"broker": 2}}), platform,
                        Nodes("broker-2"), time_limit_s=600)
    await asyncio.to_thread(pause.inject)
    assert target.state() == "T"
    assert await asyncio.to_thread(platform.is_paused, "broker-2")
    assert agent.agent.faults()["faults"][0]["expires_in_s"] > 29  # the platform's deadline
    await asyncio.to_thread(pause.recover)
    assert target.state() != "T"
    assert not await asyncio.to_thread(platform.is_paused, "broker-2")
    assert events(emulator) == [("FaultInjected", "pause broker-2: SIGSTOP"),
                                ("FaultRecovered", "pause broker-2: SIGCONT")]


async def test_partition_drops_by_pod_ip_at_the_receiving_agent(
        emulator: Any, api: KubeApi, agent: RunningAgent) -> None:
    await asyncio.to_thread(add_pods, api)
    platform = make_platform(api, agent_port=agent.port)
    links = [Link("broker-1", "broker-0"), Link("broker-0", CLIENT), Link(CLIENT, "broker-0")]
    await asyncio.to_thread(platform.block, links, "isolate broker-0")
    keys = sorted(f["key"] for f in agent.agent.faults()["faults"])
    # broker-1 -> broker-0: at broker-0's INPUT from broker-1's pod IP; broker-0 -> clients:
    # at broker-0's OUTPUT to the runner's IP; clients -> broker-0: INPUT from that IP.
    assert keys == sorted([f"input/{pod_ip(2)}", f"input/{CLIENT_IP}", f"output/{CLIENT_IP}"])
    rules = agent.agent.netfilter.rules()
    assert any(pod_ip(2) in rule for rule in rules), rules
    await asyncio.to_thread(platform.unblock, "isolate broker-0")
    assert agent.agent.faults()["faults"] == []
    assert not any(pod_ip(2) in rule for rule in agent.agent.netfilter.rules())
    assert events(emulator) == []  # the units announce, not the primitives

    # A unit's links, then every drop rule of the node's agent, whoever asked for it.
    isolate = build_fault(planned({"kind": "partition", "target": {"broker": 0}}), platform,
                          Nodes("broker-0"), time_limit_s=600)
    await asyncio.to_thread(isolate.inject)
    await asyncio.to_thread(agent.agent.drop, "input", "10.9.9.9", 60)
    await asyncio.to_thread(platform.clear_blocks, "broker-0")
    assert agent.agent.faults()["faults"] == []
    assert not any("DROP" in rule for rule in agent.agent.netfilter.rules())
    assert not platform.blocked_links
    assert await asyncio.to_thread(isolate.recover)
    assert [reason for reason, _ in events(emulator)] == ["FaultInjected", "FaultRecovered"]
    assert events(emulator)[0][1].startswith(
        "partition broker-0: dropping broker-0->broker-1, broker-0->broker-2, ")

    no_client_ip = make_platform(api, agent_port=agent.port, client_ip=None)
    with pytest.raises(PlatformError, match=r"runner pod's IP \(\$POD_IP\)"):
        await asyncio.to_thread(no_client_ip.block, [Link("broker-0", CLIENT)], "cut")


async def test_pod_delete_deletes_the_pod_with_its_grace_period(
        emulator: Any, api: KubeApi, agent: RunningAgent) -> None:
    """Chaos Mesh's pod-kill: one DELETE of the broker's pod with the fault's grace period,
    and the platform returns once that pod (that uid) is gone; no agent is involved."""
    await asyncio.to_thread(add_pods, api)
    platform = make_platform(api, agent_port=agent.port)
    await asyncio.to_thread(platform.delete_pod, "broker-1", 4.0)

    deletes = [r for r in emulator[kmock.resource("v1/pods")] if r.method == "DELETE"]
    assert [(r.name, r.data["gracePeriodSeconds"]) for r in deletes] == [("c-broker-1", 4)]
    assert stored(emulator, "Pod", "c-broker-1") is None
    assert stored(emulator, "Pod", "c-broker-0") is not None
    assert agent.agent.faults()["faults"] == []
    with pytest.raises(PlatformError, match="cannot delete the pod of broker-1: it does not"):
        await asyncio.to_thread(platform.delete_pod, "broker-1", 0.0)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[LocalPlatform]:
    """A real minibroker controller and broker 0, as child processes."""
    local = LocalPlatform(LocalPlatformConfig(workdir=tmp_path, brokers=1))
    local.start()
    try:
        yield local
    finally:
        local.stop()


async def test_disk_stall_and_power_loss_use_the_broker_failpoint(
        emulator: Any, api: KubeApi, agent: RunningAgent, broker: LocalPlatform) -> None:
    await asyncio.to_thread(add_pods, api)
    admin_port = int(broker.admin_url("broker-0").rsplit(":", 1)[1])
    platform = make_platform(api, agent_port=agent.port, admin_port=admin_port,
                             failpoint_token=broker.failpoint_token)
    assert (await asyncio.to_thread(platform.state, "broker-0"))["broker_id"] == 0
    # The agent's target stands in for the broker's process (running, not paused).
    stall = build_fault(planned({"kind": "disk-stall", "target": {"broker": 0}}), platform,
                        Nodes("broker-0"), time_limit_s=5)
    await asyncio.to_thread(stall.inject)
    assert broker.state("broker-0")["disk_stalled"] is True
    await asyncio.to_thread(stall.recover)
    assert broker.state("broker-0")["disk_stalled"] is False

    def kubelet() -> None:
        """Sees the container exit and counts the restart, as the kubelet reports it."""
        wait_for(lambda: not broker.is_running("broker-0"), 10, "broker-0 to exit")
        api.patch("Pod", NAMESPACE, "c-broker-0", {"status": running_status(1, restarts=1)},
                  subresource="status")

    watcher = threading.Thread(target=kubelet)
    watcher.start()
    power = build_fault(planned({"kind": "power-loss", "target": {"broker": 0}}), platform,
                        Nodes("broker-0"), time_limit_s=60)
    await asyncio.to_thread(power.inject)  # returns once the restart count went up
    await asyncio.to_thread(watcher.join)
    assert not broker.is_running("broker-0")
    assert await asyncio.to_thread(platform.incarnation, "broker-0") == ("uid-c-broker-0", 1)

    await asyncio.to_thread(broker.restart, "broker-0")  # the kubelet restarts it
    await asyncio.to_thread(power.recover)
    assert events(emulator) == [
        ("FaultInjected", "disk-stall broker-0: appends and fsyncs block for at most 5s"),
        ("FaultRecovered", "disk-stall broker-0: cleared"),
        ("FaultInjected", "power-loss broker-0: unsynced writes dropped, process exited"),
        ("FaultRecovered", "power-loss broker-0: back and serving")]


async def test_disk_full_holds_the_restart_then_fills_the_disk_and_frees_both(
        emulator: Any, api: KubeApi, agent: RunningAgent, broker: LocalPlatform) -> None:
    """The agent holds the broker's next start first, so that a broker that halts on its
    failed log directory stays down for the fault, as locally; freeing the disk clears the
    failpoint and the hold, and waits until the broker serves."""
    await asyncio.to_thread(add_pods, api)
    admin_port = int(broker.admin_url("broker-0").rsplit(":", 1)[1])
    platform = make_platform(api, agent_port=agent.port, admin_port=admin_port,
                             failpoint_token=broker.failpoint_token)
    full = build_fault(planned({"kind": "disk-full", "target": {"broker": 0}}), platform,
                       Nodes("broker-0"), time_limit_s=5)
    await asyncio.to_thread(full.inject)
    assert broker.state("broker-0")["disk_full"] is True
    assert [f["kind"] for f in agent.agent.faults()["faults"]] == ["hold"]
    await asyncio.to_thread(full.recover)
    assert broker.state("broker-0")["disk_full"] is False
    assert agent.agent.faults()["faults"] == []
    assert [m.split(":")[0] for _, m in events(emulator)] == [
        "disk-full broker-0", "disk-full broker-0"]
    assert events(emulator)[-1] == ("FaultRecovered", "disk-full broker-0: back and serving")


async def test_for_experiment_takes_tokens_from_env_or_the_secret(emulator: Any,
                                                                   api: KubeApi) -> None:
    loaded = load_experiment(REPO / "experiments" / "acks1-leader-kill.yaml")
    env = {"MINIBROKER_FAILPOINT_TOKEN": "fp", "UNDERTOW_AGENT_TOKEN": "ag",
           "POD_IP": CLIENT_IP, "UNDERTOW_EXPERIMENT_UID": "u1", "POD_NAME": "runner-x"}
    platform = KubernetesPlatform.for_experiment(loaded, NAMESPACE, api=api, env=env)
    config = platform.config
    assert (config.cluster, config.brokers, config.failpoint_token, config.agent_token,
            config.client_ip, config.experiment) == (
        "acks1-leader-kill", 3, "fp", "ag", CLIENT_IP, "acks1-leader-kill")
    assert config.fault_deadline_s == longest_fault_s(loaded) + 15 == 19
    assert platform.bootstrap == ",".join(
        f"acks1-leader-kill-broker-{i}.acks1-leader-kill-broker.{NAMESPACE}.svc:9092"
        for i in range(3))

    with pytest.raises(PlatformError, match="Secret chaos/acks1-leader-kill-faults not found"):
        await asyncio.to_thread(KubernetesPlatform.for_experiment, loaded, NAMESPACE,
                                api=api, env={})
    owner = {"apiVersion": "undertow.dev/v1alpha1", "kind": "BrokerCluster",
             "metadata": {"name": "acks1-leader-kill", "namespace": NAMESPACE, "uid": "u"}}
    await asyncio.to_thread(api.create, fault_secret(owner, "fp2", "ag2"))
    from_secret = await asyncio.to_thread(KubernetesPlatform.for_experiment, loaded,
                                          NAMESPACE, api=api, env={})
    assert (from_secret.config.failpoint_token, from_secret.config.agent_token) == ("fp2",
                                                                                     "ag2")


async def test_undertow_run_on_kube_finds_the_cluster_through_the_kubeconfig(
        emulator: Any, api: KubeApi, tmp_path: Path) -> None:
    """``undertow run --platform kube`` is the runner Job's platform from the command line:
    it reads the current kubeconfig context, and a BrokerCluster the operator never deployed
    (no fault Secret) is a clear error before anything starts."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": str(emulator.url).rstrip("/")}}],
        "users": [{"name": "kmock", "user": {"token": "t"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock"}}]}))
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "undertow", "run", str(REPO / "experiments" /
         "acks1-leader-kill.yaml"), "--platform", "kube", "--namespace", NAMESPACE,
         "--out", str(tmp_path / "out"), "--no-progress"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "KUBECONFIG": str(kubeconfig)})
    assert done.returncode == 2, done.stderr
    assert ("Secret chaos/acks1-leader-kill-faults not found: is the BrokerCluster "
            "acks1-leader-kill deployed by the operator?") in done.stderr
    assert not (tmp_path / "out" / "history").exists()


async def test_a_delay_goes_to_the_agent_that_catches_the_links_packets(
        emulator: Any, api: KubeApi, agent: RunningAgent) -> None:
    """As a partition's drops: broker-1 -> broker-0 at broker-0's agent (input from
    broker-1's pod IP), broker-0 -> clients at its output to the runner's IP; undelayed,
    the agent holds none; its deadline is the platform's fault deadline."""
    await asyncio.to_thread(add_pods, api)
    platform = make_platform(api, agent_port=agent.port)
    links = [Link("broker-1", "broker-0"), Link("broker-0", CLIENT)]
    await asyncio.to_thread(platform.delay, links, LinkDelay(0.2, 0.05, 0.25), "slow broker-0")
    faults = agent.agent.faults()["faults"]
    assert sorted(f["key"] for f in faults) == sorted(
        [f"delay/input/{pod_ip(2)}", f"delay/output/{CLIENT_IP}"])
    assert all(25 < f["expires_in_s"] <= 30 for f in faults)
    assert platform.delay_unsupported() is None
    await asyncio.to_thread(platform.undelay, "slow broker-0")
    assert agent.agent.faults()["faults"] == []
    assert not any("NFQUEUE" in rule for rule in agent.agent.netfilter.rules())
