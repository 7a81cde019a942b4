"""The three images, built by ``scripts/images.sh`` and run as the operator renders them:
the broker image serves a cluster a stock client uses, the operator image runs the
operator against an API server and the fault agent in a network namespace of its own, and
the analysis Job's two containers turn a real history into a published report."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import tools
import yaml
from container_helpers import REPO, Engine, kubeconfig, run_args, wait_for_log
from kube_helpers import NAMESPACE, eventually, stored
from ports import free_port, ports_free
from small_experiment import small_experiment

from undertow.kube.agent import AgentClient
from undertow.kube.api import KubeApi
from undertow.kube.cluster_objects import ClusterNames, fault_agent_container
from undertow.kube.experiment_objects import analysis_job, report_config_map
from undertow.kube.objects import Images, JobSettings
from undertow.platform.control import EndpointUnreachable


def unique(prefix: str) -> str:
    return f"ut-{prefix}-{uuid.uuid4().hex[:8]}"


def free_cluster_ports(brokers: int) -> int:
    """A base port for ``minibroker cluster``: BASE..BASE+N and their HTTP endpoints at
    BASE+100.. all free on loopback."""
    for _ in range(50):
        base = free_port()
        ports = [*range(base, base + brokers + 1), *range(base + 100, base + brokers + 101)]
        if ports[-1] < 65536 and ports_free(ports):
            return base
    raise AssertionError("no free port range")


def test_the_broker_image_serves_a_cluster_that_kcat_uses(images: Engine,
                                                          containers: list[str]) -> None:
    kcat = tools.kcat()
    base = free_cluster_ports(3)
    name = unique("broker")
    containers.append(name)
    images.run("run", "-d", "--name", name, "--network", "host", "--entrypoint", "minibroker",
               images.image("minibroker"), "cluster", "--brokers", "3", "--base-port",
               str(base), "--data-dir", "/tmp/mb")
    bootstrap = f"127.0.0.1:{base + 1}"
    deadline = time.monotonic() + 60
    while True:
        listing = subprocess.run([kcat, "-b", bootstrap, "-L", "-m", "2"], capture_output=True,
                                 text=True, check=False)
        if listing.stdout.count("127.0.0.1:") >= 3 and " 3 brokers:" in listing.stdout:
            break
        state = images.run("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
        assert state == "running" and time.monotonic() < deadline, (
            state, listing.stdout, listing.stderr, images.run("logs", name, check=False).stderr)
        time.sleep(0.5)
    images.run("exec", name, "minibroker", "topics", "create", "--bootstrap", bootstrap,
               "--topic", "smoke", "--partitions", "1", "--replication-factor", "3",
               "--config", "min.insync.replicas=2")
    records = "".join(f"record-{i}\n" for i in range(100))
    subprocess.run([kcat, "-b", bootstrap, "-P", "-t", "smoke", "-X", "acks=all"],
                   input=records, text=True, check=True, timeout=60)
    consumed = subprocess.run([kcat, "-b", bootstrap, "-C", "-t", "smoke", "-o", "beginning",
                               "-e", "-q"], capture_output=True, text=True, check=True,
                              timeout=60)
    assert consumed.stdout.splitlines() == [f"record-{i}" for i in range(100)]


@pytest.mark.asyncio
async def test_the_operator_image_reconciles_a_broker_cluster(images: Engine, emulator: Any,
                                                             api: KubeApi,
                                                             containers: list[str],
                                                             tmp_path: Path) -> None:
    """The Deployment's own container (manifests/operator/deployment.yaml), against the
    emulator: it starts its CLI, logs in, and creates a BrokerCluster's StatefulSets.
    (``containers`` after ``emulator``: the operator goes first at teardown, or the emulator
    waits a minute for its watch streams to close.)"""
    deployment = yaml.safe_load((REPO / "manifests/operator/deployment.yaml").read_text())
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    container["image"] = images.image("operator")
    config = kubeconfig(tmp_path / "kube", str(emulator.url))
    name = unique("operator")
    containers.append(name)
    await asyncio.to_thread(images.run, "run", "-d", "--name", name, *run_args(
        container, pod_security=pod["securityContext"], binds={},
        env={"POD_NAMESPACE": NAMESPACE, "KUBECONFIG": "/kube/config"},
        extra=["-v", f"{config.parent}:/kube:ro"]))
    cluster = yaml.safe_load_all((REPO / "experiments/acks1-leader-kill.yaml").read_text())
    body = next(d for d in cluster if d["kind"] == "BrokerCluster")
    # What the API server would hold after `kubectl apply` (the emulator sets none of these).
    body["metadata"].update(name="c1", namespace=NAMESPACE, uid="uid-c1", generation=1,
                            resourceVersion="1")
    await asyncio.to_thread(api.create, body)
    try:
        sts = await eventually(lambda: stored(emulator, "StatefulSet", "c1-broker"),
                               timeout=90, what="the operator container's StatefulSet")
    except AssertionError:
        logs = await asyncio.to_thread(images.run, "logs", name, check=False)
        raise AssertionError(f"operator log:\n{(logs.stdout + logs.stderr)[-4000:]}") from None
    assert sts["spec"]["replicas"] == 3
    assert stored(emulator, "StatefulSet", "c1-controller") is not None


def test_the_fault_agent_image_drops_and_heals_in_its_own_network_namespace(
        images: Engine, containers: list[str]) -> None:
    """The sidecar exactly as the StatefulSets render it: root with NET_ADMIN and KILL
    only, read-only root file system; it picks an iptables back end and applies rules in
    its container's network namespace, never the host's."""
    agent = fault_agent_container(ClusterNames("c", NAMESPACE),
                                  Images(operator=images.image("operator")), JobSettings())
    port = free_port()
    name = unique("agent")
    containers.append(name)
    images.run("run", "-d", "--name", name, *run_args(
        agent, pod_security={}, binds={}, env={"UNDERTOW_AGENT_TOKEN": "t0ken"},
        network="bridge", extra=["-p", f"127.0.0.1:{port}:9200"]))
    log = wait_for_log(images, name, "fault agent on 0.0.0.0:9200")
    backend = "iptables-legacy" if "iptables back end: iptables-legacy" in log else "iptables-nft"
    assert f"iptables back end: {backend}" in log
    client = AgentClient(f"http://127.0.0.1:{port}", "t0ken")

    deadline = time.monotonic() + 30
    while True:
        try:
            client.faults()
            break
        except EndpointUnreachable:
            assert time.monotonic() < deadline, "the agent's published port never answered"
            time.sleep(0.2)
    client.drop("input", "192.0.2.7", deadline_s=2)
    rules = images.run("exec", name, backend, "-S", "UNDERTOW-INPUT").stdout
    assert "-A UNDERTOW-INPUT -s 192.0.2.7/32 -j DROP" in rules
    host_rules = subprocess.run(["iptables-save"], capture_output=True, text=True, check=False)
    assert "192.0.2.7" not in host_rules.stdout
    # The deadline heals it with nobody asking.
    deadline = time.monotonic() + 15
    while "192.0.2.7" in images.run("exec", name, backend, "-S", "UNDERTOW-INPUT").stdout:
        assert time.monotonic() < deadline, "the drop outlived its deadline"
        time.sleep(0.2)
    assert client.faults()["faults"] == []


@pytest.fixture(scope="module")
def real_history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A history written by ``undertow run`` on three local brokers (a leader kill with
    acks=all), in the layout of the experiment's volume: ``DIR/history``."""
    work = tmp_path_factory.mktemp("history")
    experiment = work / "experiment.yaml"
    experiment.write_text(small_experiment(
        "small-leader-kill", "6s",
        "    - {kind: kill, target: {role: leader}, at: 2s, duration: 2s}",
        config={"min.insync.replicas": 2}, partitions=1, workload={"retries": 3, "rate": 200}))
    volume = work / "volume"
    run = subprocess.run([sys.executable, "-m", "undertow.cli", "run", str(experiment),
                          "--out", str(volume), "--no-analysis"], capture_output=True,
                         text=True, check=False, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (volume / "history" / "sends.jsonl").stat().st_size > 0
    return volume


@pytest.mark.asyncio
async def test_the_analysis_jobs_rendered_commands_publish_a_report(
        images: Engine, containers: list[str], emulator: Any, api: KubeApi,
        real_history: Path, tmp_path: Path) -> None:
    """The analysis Job as the operator renders it: its first container checks the history
    in the analysis image and writes the report to the volume; its second, in the operator
    image, patches the report into the ConfigMap the operator reads the verdict from."""
    experiment = next(d for d in yaml.safe_load_all(
        (REPO / "experiments/acks1-leader-kill.yaml").read_text())
        if d["kind"] == "ChaosExperiment")
    experiment["metadata"].update(namespace=NAMESPACE, uid="uid-e1")
    rendered = Images(operator=images.image("operator"), analysis=images.image("analysis"))
    job = analysis_job(experiment, rendered, JobSettings())
    pod = job["spec"]["template"]["spec"]
    (analysis,) = pod["initContainers"]
    (publish,) = pod["containers"]
    volume = tmp_path / "volume"
    shutil.copytree(real_history, volume)
    subprocess.run(["chown", "-R", "10001:10001", str(volume)], check=False)
    volume.chmod(0o777)

    first = unique("analysis")
    containers.append(first)
    checked = await asyncio.to_thread(images.run, "run", "--name", first, *run_args(
        analysis, pod_security=pod["securityContext"], binds={"history": volume}),
        timeout=600)
    report = json.loads((volume / "report" / "report.json").read_text())
    assert report["verdict"] == "clean", checked.stderr[-3000:]
    assert report["counts"]["acked"] > 0 and report["counts"]["lost"] == 0

    await asyncio.to_thread(api.create, report_config_map(experiment))
    config = kubeconfig(tmp_path / "kube", str(emulator.url))
    second = unique("publish")
    containers.append(second)
    await asyncio.to_thread(images.run, "run", "--name", second, *run_args(
        publish, pod_security=pod["securityContext"], binds={"history": volume},
        env={"KUBECONFIG": "/kube/config"}, extra=["-v", f"{config.parent}:/kube:ro"]))
    data = stored(emulator, "ConfigMap", "acks1-leader-kill-report")["data"]
    assert json.loads(data["report.json"]) == report
    assert data["report.html"].lstrip().lower().startswith("<!doctype html")
