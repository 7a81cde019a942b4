"""The two demo experiments, the two pod-delete experiments, a disk-full one and a consumer
group's (its coordinator killed while it rebalances) end to end on the operator's own pods,
under podman: the BrokerCluster's StatefulSets as pods with their fault agents,
the runner Job driving the workload and the faults through the agents, failpoints and pod
deletions as on Kubernetes, the analysis Job's two containers. The verdicts must be the ones
the experiments give locally."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from container_helpers import REPO, Engine
from pods_helpers import ClusterOnPods
from small_experiment import SMALL_CONFIG, small_experiment

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
