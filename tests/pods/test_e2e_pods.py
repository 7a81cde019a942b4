"""The two demo experiments, the two pod-delete experiments, a disk-full one and a consumer
group's (its coordinator killed while it rebalances) end to end on the operator's own pods,
under podman: the BrokerCluster's StatefulSets as pods with their fault agents,
the runner Job driving the workload and the faults through the agents, failpoints and pod
deletions as on Kubernetes, the analysis Job's two containers. The verdicts must be the ones
the experiments give locally, and a delay must add, inside the containers, the latency it
asks for."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from container_helpers import REPO, Engine
from podman_api import podman
from pods_helpers import ClusterOnPods
from small_experiment import SMALL_CONFIG, small_experiment

from undertow.kube.agent.client import AgentClient
from undertow.kube.cluster_objects import AGENT_PORT
from undertow.kube.objects import Images

LOGS = Path(os.environ.get("E2E_PODS_LOGS", REPO / "e2e-logs" / "pods"))


@pytest.mark.parametrize(("experiment", "kind", "expected", "mechanism"), [
    ("acks1-leader-kill", "kill", "loss", "acks1_before_replication"),
    ("acksall-leader-kill", "kill", "clean", None),
    ("pod-delete-ephemeral", "pod-delete", "loss", "disk_lost"),
    ("pod-delete-persistent", "pod-delete", "clean", None),
    ("disk-full-leader-acksall", "disk-full", "clean", None),
    ("group-coordinator-kill", "kill", "clean", None),
    ("txn-partition-leader-kill", "kill", "clean", None),
])
def test_the_experiment_gives_the_local_verdict_on_pods(experiment: str, kind: str,
                                                        expected: str, mechanism: str | None,
                                                        pod_images: Engine,
                                                        tmp_path: Path) -> None:
    documents = yaml.safe_load_all((REPO / "experiments" / f"{experiment}.yaml").read_text())
    with on_pods(*documents, pod_images, tmp_path) as pods:
        assert pods.run_experiment(seed=7) == {"runner": 0}
        assert pods.run_analysis() == {"analysis": 0, "publish": 0}
        published = pods.api.objects["ConfigMap"][f"{experiment}-report"]["data"]
        report = json.loads(published["report.json"])
        on_volume = json.loads((pods.history_dir / "report" / "report.json").read_text())
        assert report == on_volume
        faults = [f["fault"] for f in report["faults"]]
        assert faults and set(faults) == {kind}, report["faults"]
        assert report["verdict"] == expected, report["counts"]
        # The runner collected the brokers' and the controller's replication events through
        # the pods' control endpoints, and they explain every loss as the experiment says.
        explained = report["explained"]
        assert explained["events"] and explained["unexplained"] == 0, explained["incidents"]
        assert {i["mechanism"] for i in explained["incidents"]} == (
            {mechanism} if mechanism else set()), explained["incidents"]
        events = [e["reason"] for e in pods.api.objects["Event"].values()]
        assert events.count("FaultInjected") == events.count("FaultRecovered") == len(faults)


@contextlib.contextmanager
def on_pods(cluster: dict[str, Any], chaos: dict[str, Any], pod_images: Engine,
            work: Path) -> Iterator[ClusterOnPods]:
    """The cluster's pods, started with the images just built; on a failure every
    container's log is saved (and where is printed); removed in any case."""
    images = Images(operator=pod_images.image("operator"),
                    analysis=pod_images.image("analysis"), pull_policy="Never")
    cluster["spec"]["image"] = pod_images.image("minibroker")
    pods = ClusterOnPods(cluster, chaos, images, work)
    try:
        pods.start_cluster()
        yield pods
    except BaseException:
        where = LOGS / chaos["metadata"]["name"]
        where.mkdir(parents=True, exist_ok=True)
        for name, text in pods.logs():
            (where / f"{name}.log").write_text(text)
        print(f"e2e-pods: the logs of every container are in {where}/")
        raise
    finally:
        pods.stop()


MIXED_FAULTS = small_experiment(
    "pods-faults", "30s", """\
    - {kind: pause, target: {role: leader}, at: 3s, duration: 4s}
    - {kind: partition, target: {role: leader}, network: {mode: isolate}, at: 11s,
       duration: 5s}
    - {kind: disk-stall, target: {role: follower}, at: 20s, duration: 4s}""",
    cluster="pods-faults", topic="mixed", partitions=1, workload={"retries": 3, "rate": 150},
    config={**SMALL_CONFIG, "replica.lag.time.max.ms": 6000, "broker.session.timeout.ms": 3000})


def test_pause_partition_and_disk_stall_go_through_the_pods_agents_and_failpoints(
        pod_images: Engine, tmp_path: Path) -> None:
    """The other fault kinds on pods: SIGSTOP by the agent through the shared process
    namespace, iptables in the pod's network namespace, the broker's failpoint; acks=all
    with min.insync.replicas=2 loses nothing under them."""
    with on_pods(*yaml.safe_load_all(MIXED_FAULTS), pod_images, tmp_path) as pods:
        assert pods.run_experiment(seed=3) == {"runner": 0}
        assert pods.run_analysis() == {"analysis": 0, "publish": 0}
        report = json.loads((pods.history_dir / "report" / "report.json").read_text())
        assert sorted(f["fault"] for f in report["faults"]) == [
            "disk-stall", "partition", "pause"], report["faults"]
        assert report["verdict"] == "clean", report["counts"]
        messages = [e["message"] for e in pods.api.objects["Event"].values()]
        assert any(m.startswith("pause ") and "SIGSTOP" in m for m in messages), messages
        assert any(m.startswith("partition ") for m in messages), messages
        assert any(m.startswith("disk-stall ") for m in messages), messages


DELAY_S = 0.2
LEADER_DELAY = small_experiment(
    "pods-delay", "24s", """\
    - kind: delay
      target: {role: leader}
      delay: {latency: 200ms, jitter: 20ms, correlation: 25}
      at: 5s
      duration: 12s""",
    cluster="pods-delay", topic="slow", partitions=1,
    workload={"retries": 3, "idempotent": "true", "requestTimeout": "5s"},
    config={**SMALL_CONFIG, "replica.lag.time.max.ms": 6000, "broker.session.timeout.ms": 3000})


def test_a_delay_goes_through_the_pods_agents_and_slows_the_leaders_links_by_its_latency(
        pod_images: Engine, tmp_path: Path) -> None:
    """A delay (Chaos Mesh's NetworkChaos delay) of the leader's links on pods: each end's
    agent queues the other's packets to its NFQUEUE delayer, inside the containers. A TCP
    handshake from the controller's pod to the leader's crosses the link both ways (the SYN
    held at the leader's INPUT, the SYN-ACK at the controller's), so while the fault holds
    it takes twice the latency more than once healed, within 20 %. Five brokers: the
    leader's agent runs a delayer for each of its five peers within its memory limit.
    acks=all with min.insync.replicas=2 loses nothing: the ISR and the leadership hold
    through 400 ms round trips."""
    cluster, chaos = yaml.safe_load_all(LEADER_DELAY)
    cluster["spec"]["brokers"] = 5
    with on_pods(cluster, chaos, pod_images, tmp_path) as pods:
        controller = pods.cluster_pod_names()[0]
        with ThreadPoolExecutor(1) as executor:
            during = executor.submit(handshake_while_delayed, pods, controller)
            assert pods.run_experiment(seed=5) == {"runner": 0}
            delayed_s, leader = during.result(timeout=60)
        healed_s = handshake_s(pods, controller, leader)
        added_s = delayed_s - healed_s
        print(f"e2e-pods: {controller} -> {leader}: handshake {delayed_s * 1000:.0f} ms "
              f"delayed, {healed_s * 1000:.0f} ms healed: {added_s * 1000:.0f} ms added, "
              f"{2 * DELAY_S * 1000:.0f} ms asked (twice {DELAY_S * 1000:.0f} ms)")
        assert abs(added_s - 2 * DELAY_S) <= 0.2 * 2 * DELAY_S, (delayed_s, healed_s)
        assert pods.run_analysis() == {"analysis": 0, "publish": 0}
        report = json.loads((pods.history_dir / "report" / "report.json").read_text())
        assert [f["fault"] for f in report["faults"]] == ["delay"], report["faults"]
        assert report["verdict"] == "clean", report["counts"]
        events = [(e["reason"], e["message"]) for e in pods.api.objects["Event"].values()]
        injected = [m for r, m in events if r == "FaultInjected"]
        assert len(injected) == 1 and injected[0].startswith("delay "), events
        assert [r for r, _ in events].count("FaultRecovered") == 1, events


def handshake_while_delayed(pods: ClusterOnPods, source: str,
                            timeout_s: float = 180) -> tuple[float, str]:
    """Once ``source``'s agent delays a peer's packets and the peer's agent ``source``'s
    (the link delayed both ways): the handshake time from ``source`` to that peer (the
    median of five), and the peer's pod. Asserts that both delays still held when the last
    handshake was done, so that every one crossed the delayed link both ways."""
    agent = pods_agent(pods, source)
    deadline = time.monotonic() + timeout_s
    while not (delays := delayed_peers(agent)):
        assert time.monotonic() < deadline, f"no delay at {source}'s agent within {timeout_s}s"
        time.sleep(0.1)
    (peer,) = delays
    pod = next(name for name, ip in pods.pods.items() if ip == peer)
    # The runner delays the link's two directions one after the other.
    peer_agent = pods_agent(pods, pod)
    while pods.pods[source] not in delayed_peers(peer_agent):
        assert time.monotonic() < deadline, f"{pod}'s agent never delayed {source}"
        time.sleep(0.1)
    measured = handshake_s(pods, source, pod)
    assert delayed_peers(agent) == delays, "the delay healed while it was measured"
    assert pods.pods[source] in delayed_peers(peer_agent), "the delay healed while measured"
    return measured, pod


def pods_agent(pods: ClusterOnPods, pod: str) -> AgentClient:
    """The pod's fault agent, reached from this host over the pods' network."""
    return AgentClient(f"http://{pods.pods[pod]}:{AGENT_PORT}", pods.tokens["agent-token"])


def delayed_peers(agent: AgentClient) -> set[str]:
    """The peers whose packets the agent delays on their way in."""
    return {f["key"].split("/", 2)[2] for f in agent.faults()["faults"]
            if f["kind"] == "delay" and f["key"].startswith("delay/input/")}


def handshake_s(pods: ClusterOnPods, source: str, target: str) -> float:
    """Seconds a TCP handshake from ``source``'s pod to ``target``'s agent port takes
    (the median of five), timed inside the source pod's network namespace."""
    probe = ("import socket,sys,time\nfor _ in range(5):\n t=time.monotonic()\n"
             " socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()\n"
             " print(time.monotonic()-t)")
    out = podman("exec", f"{source}-fault-agent", "python", "-c", probe, pods.pods[target],
                 str(AGENT_PORT)).stdout
    return statistics.median(float(line) for line in out.split())
