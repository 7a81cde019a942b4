"""The real kopf operator loop against kmock's Kubernetes emulator.

The emulator stores objects and serves watches but runs no controllers: the tests play
the kubelet (pods becoming ready) and the in-cluster runner and analysis (their Jobs
completing, the report ConfigMap), and assert what the operator created and wrote.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_helpers import (
    AGENT_TOKEN,
    NAMESPACE,
    RunningAgent,
    Target,
    eventually,
    running_operator,
    serve_undertow_kinds,
    stored,
)

from undertow.kube.agent import AgentClient
from undertow.kube.api import KubeApi
from undertow.kube.cluster_objects import ANNOTATION_LOCK, fault_secret
from undertow.kube.jobs import publish_report
from undertow.spec import load_documents

pytestmark = pytest.mark.asyncio

REPO = Path(__file__).resolve().parents[2]


def documents(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The BrokerCluster and ChaosExperiment of experiments/NAME.yaml."""
    cluster, experiment = yaml.safe_load_all((REPO / "experiments" / f"{name}.yaml").read_text())
    return cluster, experiment


def as_stored(body: dict[str, Any], name: str, uid: str) -> dict[str, Any]:
    """What the API server would hold after `kubectl apply` (the emulator sets no uid)."""
    body = copy.deepcopy(body)
    body["metadata"].update(name=name, namespace=NAMESPACE, uid=uid, generation=1,
                            resourceVersion="1")
    return body


def play_pods(api: KubeApi, cluster: str, brokers: int, ready: int | None = None) -> None:
    """The StatefulSet controller and the kubelet: pods exist, ``ready`` brokers ready."""
    ready = brokers if ready is None else ready
    pods = [("controller", f"{cluster}-controller-0", True)] + [
        ("broker", f"{cluster}-broker-{i}", i < ready) for i in range(brokers)]
    for index, (component, name, is_ready) in enumerate(pods):
        labels = {"undertow.dev/cluster": cluster, "app.kubernetes.io/component": component}
        status = {"podIP": f"10.244.0.{index + 10}",
                  "conditions": [{"type": "Ready", "status": "True" if is_ready else "False"}],
                  "containerStatuses": [{"name": "minibroker", "restartCount": 0,
                                         "state": {"running": {}}}]}
        if api.get("Pod", NAMESPACE, name) is None:
            api.create({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels,
                                     "uid": f"uid-{name}", "resourceVersion": "1"}})
        api.patch("Pod", NAMESPACE, name, {"status": status}, subresource="status")


def condition(body: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for c in ((body or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return c
    return None


def phase(api: KubeApi, name: str) -> str | None:
    body = api.get("ChaosExperiment", NAMESPACE, name)
    return ((body or {}).get("status") or {}).get("phase")


def complete_job(api: KubeApi, name: str) -> None:
    api.patch("Job", NAMESPACE, name, {"status": {
        "succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}},
        subresource="status")


async def ready_cluster(api: KubeApi, name: str) -> dict[str, Any]:
    """A BrokerCluster whose pods all report ready, its fault agents answering with the
    test agent's token (the operator keeps a Secret that already exists)."""
    cluster, _ = documents("acks1-leader-kill")
    body = as_stored(cluster, name, f"uid-{name}")
    await asyncio.to_thread(api.create, fault_secret(body, "failpoint-secret", AGENT_TOKEN))
    await asyncio.to_thread(api.create, body)
    await eventually(lambda: api.get("StatefulSet", NAMESPACE, f"{name}-broker"),
                     what="the broker StatefulSet")
    await asyncio.to_thread(play_pods, api, name, 3)
    return await eventually(
        lambda: (b := api.get("BrokerCluster", NAMESPACE, name))
        and (condition(b, "Ready") or {}).get("status") == "True" and b,
        what=f"BrokerCluster {name} Ready")


async def test_broker_cluster_objects_and_readiness(operator: Any, api: KubeApi,
                                                    emulator: Any) -> None:
    cluster, _ = documents("acks1-leader-kill")
    await asyncio.to_thread(api.create, as_stored(cluster, "c1", "uid-c1"))
    objects = await eventually(lambda: all(
        stored(emulator, kind, name) for kind, name in (
            ("StatefulSet", "c1-controller"), ("StatefulSet", "c1-broker"),
            ("Service", "c1-controller"), ("Service", "c1-broker"),
            ("Service", "c1-bootstrap"), ("ConfigMap", "c1-config"),
            ("Secret", "c1-faults"), ("Secret", "c1-controller-auth"),
            ("NetworkPolicy", "c1-network"))), what="the cluster's objects")
    assert objects
    owner = {"apiVersion": "undertow.dev/v1alpha1", "kind": "BrokerCluster", "name": "c1",
             "uid": "uid-c1", "controller": True, "blockOwnerDeletion": True}
    for kind, name in (("StatefulSet", "c1-controller"), ("StatefulSet", "c1-broker"),
                       ("Service", "c1-broker"), ("Service", "c1-bootstrap"),
                       ("ConfigMap", "c1-config"), ("Secret", "c1-faults"),
                       ("Secret", "c1-controller-auth"), ("NetworkPolicy", "c1-network")):
        assert stored(emulator, kind, name)["metadata"]["ownerReferences"] == [owner], name

    # The controller secret: 256 random bits, made once, given to the controller and the
    # brokers from the Secret (never on their command lines).
    auth = stored(emulator, "Secret", "c1-controller-auth")["data"]["controller-secret"]
    assert re.fullmatch(r"[0-9a-f]{64}", base64.b64decode(auth).decode())
    for sts in ("c1-controller", "c1-broker"):
        main = stored(emulator, "StatefulSet", sts)["spec"]["template"]["spec"]["containers"][0]
        assert {"name": "MINIBROKER_CONTROLLER_SECRET", "valueFrom": {"secretKeyRef": {
            "name": "c1-controller-auth", "key": "controller-secret"}}} in main["env"]
        assert base64.b64decode(auth).decode() not in json.dumps(main)
    policy = stored(emulator, "NetworkPolicy", "c1-network")["spec"]
    assert policy["podSelector"] == {"matchLabels": {"undertow.dev/cluster": "c1"}}
    assert [sorted(p["port"] for p in rule["ports"]) for rule in policy["ingress"]] == [
        [9092], [9093, 9100, 9200]]
    assert "from" not in policy["ingress"][0]

    brokers = stored(emulator, "StatefulSet", "c1-broker")["spec"]
    assert brokers["replicas"] == 3 and brokers["serviceName"] == "c1-broker"
    assert brokers["updateStrategy"] == {"type": "OnDelete"}
    assert stored(emulator, "StatefulSet", "c1-controller")["spec"]["replicas"] == 1
    pod = brokers["template"]["spec"]
    assert pod["shareProcessNamespace"] is True
    main, sidecar = pod["containers"]
    assert "--id ${HOSTNAME##*-}" in main["command"][-1]  # broker id = pod ordinal
    assert "NET_ADMIN" not in json.dumps(main)
    assert sidecar["securityContext"]["capabilities"] == {"drop": ["ALL"],
                                                          "add": ["NET_ADMIN", "KILL"]}
    assert {"name": "data", "emptyDir": {"sizeLimit": "1Gi"}} in pod["volumes"]
    assert stored(emulator, "Service", "c1-broker")["spec"]["publishNotReadyAddresses"]
    properties = stored(emulator, "ConfigMap", "c1-config")["data"]["server.properties"]
    assert properties.splitlines() == ["broker.session.timeout.ms=3000",
                                       "min.insync.replicas=1",
                                       "replica.fetch.min.bytes=1048576",
                                       "replica.fetch.wait.max.ms=500",
                                       "replica.lag.time.max.ms=6000"]

    await asyncio.to_thread(play_pods, api, "c1", 3, 2)
    status = await eventually(
        lambda: (b := stored(emulator, "BrokerCluster", "c1"))
        and (b.get("status") or {}).get("readyBrokers") == 2 and b["status"],
        what="2 ready brokers")
    assert status["readyBrokers"] == 2 and status["observedGeneration"] == 1
    not_ready = condition({"status": status}, "Ready")
    assert (not_ready["status"], not_ready["reason"], not_ready["message"]) == (
        "False", "BrokersNotReady", "2/3 brokers ready")

    await asyncio.to_thread(play_pods, api, "c1", 3)
    ready = await eventually(
        lambda: (condition(stored(emulator, "BrokerCluster", "c1"), "Ready") or {})
        .get("status") == "True" and stored(emulator, "BrokerCluster", "c1"),
        what="Ready True")
    assert ready["status"]["readyBrokers"] == 3
    assert condition(ready, "Ready")["reason"] == "AllBrokersReady"

    # A config change reaches the ConfigMap and the pod template (which the rollout follows).
    old_hash = brokers["template"]["metadata"]["annotations"]["undertow.dev/config-hash"]
    await asyncio.to_thread(api.patch, "BrokerCluster", NAMESPACE, "c1",
                            {"spec": {"config": {"min.insync.replicas": 2}}})
    await eventually(lambda: "min.insync.replicas=2" in stored(
        emulator, "ConfigMap", "c1-config")["data"]["server.properties"], what="new config")
    template = (await eventually(
        lambda: (t := stored(emulator, "StatefulSet", "c1-broker")["spec"]["template"])
        ["metadata"]["annotations"]["undertow.dev/config-hash"] != old_hash and t,
        what="a new pod template"))
    assert template["spec"]["containers"][0]["name"] == "minibroker"


async def test_a_storage_type_change_is_refused_as_invalid_spec(operator: Any, api: KubeApi,
                                                              emulator: Any) -> None:
    await ready_cluster(api, "c3")
    before = stored(emulator, "StatefulSet", "c3-broker")
    await asyncio.to_thread(api.patch, "BrokerCluster", NAMESPACE, "c3",
                            {"spec": {"storage": {"type": "persistent"},
                                      "config": {"min.insync.replicas": 2}}})
    invalid = await eventually(
        lambda: (c := condition(stored(emulator, "BrokerCluster", "c3"), "Ready"))
        and c["reason"] == "InvalidSpec" and c, what="Ready False with InvalidSpec")
    assert invalid["status"] == "False"
    assert invalid["message"].startswith(
        "spec.storage.type: cannot change from ephemeral to persistent")
    # Nothing of the refused spec was applied, the config change in it neither.
    assert stored(emulator, "StatefulSet", "c3-broker")["spec"] == before["spec"]
    assert "min.insync.replicas=2" not in stored(
        emulator, "ConfigMap", "c3-config")["data"]["server.properties"]

    # Reverting the storage type applies the rest.
    await asyncio.to_thread(api.patch, "BrokerCluster", NAMESPACE, "c3",
                            {"spec": {"storage": {"type": "ephemeral"}}})
    await eventually(lambda: "min.insync.replicas=2" in stored(
        emulator, "ConfigMap", "c3-config")["data"]["server.properties"], what="new config")


async def test_crds_installed_after_the_operator_started_are_served(
        bare_emulator: Any, api: KubeApi, operator_config: Any) -> None:
    """kopf watches CustomResourceDefinitions: the operator need not restart when the CRDs
    come after it (``kubectl apply`` of the chart's CRDs and the operator in any order)."""
    async with running_operator(str(bare_emulator.url), api, operator_config):
        # kopf has scanned the API and now watches the CRDs, the Undertow kinds unknown.
        await eventually(lambda: len(bare_emulator[
            "get /apis/apiextensions.k8s.io/v1/customresourcedefinitions"]) > 0,
            what="kopf's watch of CustomResourceDefinitions")
        serve_undertow_kinds(bare_emulator)
        for path in sorted((REPO / "manifests" / "crds").glob("*.yaml")):
            crd = yaml.safe_load(path.read_text())
            await asyncio.to_thread(post, str(bare_emulator.url),
                                    "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                                    crd)
        await ready_cluster(api, "late")


def post(server: str, path: str, body: dict[str, Any]) -> None:
    request = urllib.request.Request(server.rstrip("/") + path, method="POST",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10):
        pass


async def create_experiment(api: KubeApi, name: str, cluster: str,
                            **spec: Any) -> None:
    _, experiment = documents("acks1-leader-kill")
    experiment["spec"]["cluster"]["ref"] = cluster
    experiment["spec"].update(spec)
    await asyncio.to_thread(api.create, as_stored(experiment, name, f"uid-{name}"))


def in_phase(emulator: Any, name: str, wanted: str) -> dict[str, Any] | None:
    body = stored(emulator, "ChaosExperiment", name)
    return body if ((body or {}).get("status") or {}).get("phase") == wanted else None


async def test_experiment_runs_heals_analyses_and_writes_the_verdict(
        operator: Any, api: KubeApi, emulator: Any, agent: RunningAgent, target: Target,
        tmp_path: Path) -> None:
    await ready_cluster(api, "c2")
    await create_experiment(api, "e1", "c2")
    running = await eventually(lambda: in_phase(emulator, "e1", "Running"), what="Running")
    seed = running["status"]["seed"]

    job = stored(emulator, "Job", "e1-runner")
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "e1-runner"
    assert pod["containers"][0]["command"][-2:] == ["--seed", str(seed)]
    assert job["metadata"]["ownerReferences"][0]["uid"] == "uid-e1"
    # c2's NetworkPolicy admits its runner to the control ports by this label.
    assert job["spec"]["template"]["metadata"]["labels"]["undertow.dev/target-cluster"] == "c2"
    assert stored(emulator, "Role", "e1-runner")["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "delete"],
         "resourceNames": ["c2-controller-0", "c2-broker-0", "c2-broker-1", "c2-broker-2"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    assert stored(emulator, "RoleBinding", "e1-runner")["subjects"] == [
        {"kind": "ServiceAccount", "name": "e1-runner", "namespace": NAMESPACE}]
    assert stored(emulator, "PersistentVolumeClaim", "e1-history")
    spec_file = tmp_path / "experiment.yaml"
    spec_file.write_text(stored(emulator, "ConfigMap", "e1-spec")["data"]["experiment.yaml"])
    kinds = [(d.resource.kind, d.resource.metadata.name) for d in load_documents([spec_file])]
    assert kinds == [("BrokerCluster", "c2"), ("ChaosExperiment", "e1")]
    annotations = stored(emulator, "BrokerCluster", "c2")["metadata"]["annotations"]
    assert annotations[ANNOTATION_LOCK] == "e1"

    # A fault the runner left behind (it died before recovering it): the operator heals it.
    await asyncio.to_thread(AgentClient(agent.url, AGENT_TOKEN).pause, 60)
    assert target.state() == "T"
    await asyncio.to_thread(complete_job, api, "e1-runner")
    analyzing = await eventually(lambda: in_phase(emulator, "e1", "Analyzing"),
                                 what="Analyzing")
    assert target.state() != "T"
    assert condition(analyzing, "Healing")["reason"] == "Healed"
    assert stored(emulator, "Job", "e1-analysis")["spec"]["template"]["spec"][
        "serviceAccountName"] == "e1-analysis"

    # The analysis Job publishes its report, as jobs.analyze does, and completes.
    report = {"verdict": "loss", "expect": "loss",
              "counts": {"acked": 7000, "lost": 12, "duplicates": 3},
              "faults": [{"id": 1, "fault": "kill", "target": "broker-1",
                          "role": "leader of acks1-0", "start": 1763830003.0,
                          "end": 1763830007.5}]}
    (tmp_path / "report.json").write_text(json.dumps(report))
    (tmp_path / "report.html").write_text("<html>report</html>")
    keys = await asyncio.to_thread(publish_report, api, NAMESPACE, "e1-report", tmp_path)
    assert keys == ["report.html", "report.json"]
    await asyncio.to_thread(complete_job, api, "e1-analysis")
    done = await eventually(lambda: in_phase(emulator, "e1", "Completed"), what="Completed")

    status = done["status"]
    assert status["verdict"] == "loss"
    assert status["counts"] == {"acked": 7000, "lost": 12, "duplicates": 3}
    assert status["faults"] == [{"fault": "kill", "target": "broker-1",
                                 "role": "leader of acks1-0",
                                 "injectedAt": "2025-11-22T16:46:43Z",
                                 "recoveredAt": "2025-11-22T16:46:47Z"}]
    assert status["reportRef"] == {"kind": "ConfigMap", "name": "e1-report",
                                   "key": "report.json"}
    assert status["seed"] == seed
    succeeded = condition(done, "Succeeded")
    assert (succeeded["status"], succeeded["reason"]) == ("True", "AsExpected")
    released = stored(emulator, "BrokerCluster", "c2")["metadata"].get("annotations") or {}
    assert ANNOTATION_LOCK not in released


async def test_deleting_a_running_experiment_heals_first_and_never_sticks(
        operator: Any, api: KubeApi, emulator: Any, agent: RunningAgent,
        target: Target) -> None:
    await ready_cluster(api, "c3")
    await create_experiment(api, "e2", "c3")
    running = await eventually(lambda: in_phase(emulator, "e2", "Running"), what="Running")
    client = AgentClient(agent.url, AGENT_TOKEN)
    await asyncio.to_thread(client.pause, 60)
    await asyncio.to_thread(client.drop, "input", "10.244.0.11", 60)
    assert target.state() == "T"
    assert running["metadata"]["finalizers"] == ["undertow.dev/finalizer"]

    await asyncio.to_thread(api.delete, "ChaosExperiment", NAMESPACE, "e2")
    await eventually(lambda: stored(emulator, "ChaosExperiment", "e2") is None,
                     what="the finalizer to come off")
    assert target.state() != "T"
    assert (await asyncio.to_thread(client.faults))["faults"] == []
    assert stored(emulator, "Job", "e2-runner") is None
    cluster = stored(emulator, "BrokerCluster", "c3")
    assert ANNOTATION_LOCK not in (cluster["metadata"].get("annotations") or {})

    # Cleanup again, everything already gone: no error, nothing left to report.
    assert await asyncio.to_thread(operator.experiments.cleanup_experiment, running) == []


async def test_an_experiment_the_cluster_cannot_run_fails_with_the_field(
        operator: Any, api: KubeApi, emulator: Any) -> None:
    await ready_cluster(api, "c4")
    await create_experiment(api, "e3", "c4",
                            topic={"name": "t", "partitions": 1, "replicationFactor": 5})
    failed = await eventually(lambda: in_phase(emulator, "e3", "Failed"), what="Failed")
    reason = condition(failed, "Succeeded")
    assert reason["reason"] == "InvalidSpec"
    assert reason["message"] == ("spec.topic.replicationFactor: 5 exceeds the 3 brokers of "
                                 "BrokerCluster/c4")
    assert stored(emulator, "Job", "e3-runner") is None


async def test_a_transaction_version_2_experiment_fails_before_its_runner_starts(
        operator: Any, api: KubeApi, emulator: Any) -> None:
    """The operator runs stock clients, none of which speaks transaction version 2."""
    await ready_cluster(api, "c5")
    _, transactional = documents("txn-partition-leader-kill")
    workload = transactional["spec"]["workload"]
    workload["transactions"]["transactionVersion"] = 2
    await create_experiment(api, "e4", "c5", workload=workload)
    failed = await eventually(lambda: in_phase(emulator, "e4", "Failed"), what="Failed")
    reason = condition(failed, "Succeeded")
    assert reason["reason"] == "InvalidSpec"
    assert reason["message"].startswith(
        "spec.workload.transactions.transactionVersion: 2 needs a producer that speaks "
        "transaction version 2"), reason
    assert stored(emulator, "Job", "e4-runner") is None


def fail_job(api: KubeApi, name: str, message: str) -> None:
    """The Job controller giving up: the pod failed past ``backoffLimit``."""
    api.patch("Job", NAMESPACE, name, {"status": {
        "failed": 1, "conditions": [{"type": "Failed", "status": "True",
                                     "reason": "BackoffLimitExceeded", "message": message}]}},
        subresource="status")


def experiment_events(emulator: Any, name: str) -> list[tuple[str, str, str]]:
    """(type, reason, message) of every Event the operator posted about ChaosExperiment NAME,
    read from the requests: kopf names its Events by ``generateName``, which the emulator
    does not expand, so it stores only the first one."""
    found = []
    for request in emulator[f"post /api/v1/namespaces/{NAMESPACE}/events"]:
        event = request.data or {}
        involved = event.get("involvedObject") or {}
        if (involved.get("kind"), involved.get("name")) == ("ChaosExperiment", name):
            found.append((event["type"], event["reason"], event["message"]))
    return found


async def test_a_failed_runner_job_is_healed_and_ends_failed_with_its_condition_and_event(
        operator: Any, api: KubeApi, emulator: Any, agent: RunningAgent,
        target: Target) -> None:
    await ready_cluster(api, "c5")
    await create_experiment(api, "e4", "c5")
    await eventually(lambda: in_phase(emulator, "e4", "Running"), what="Running")

    # The runner dies with a fault still injected (a paused broker), and its Job fails.
    await asyncio.to_thread(AgentClient(agent.url, AGENT_TOKEN).pause, 60)
    assert target.state() == "T"
    await asyncio.to_thread(fail_job, api, "e4-runner",
                            "Job has reached the specified backoff limit")
    failed = await eventually(lambda: in_phase(emulator, "e4", "Failed"), what="Failed")

    assert target.state() != "T"  # healed before the experiment ended
    healing = condition(failed, "Healing")
    assert (healing["status"], healing["reason"]) == ("False", "Healed")
    succeeded = condition(failed, "Succeeded")
    assert (succeeded["status"], succeeded["reason"], succeeded["message"]) == (
        "False", "RunnerFailed",
        "the runner Job failed: Job has reached the specified backoff limit")
    assert "verdict" not in failed["status"]
    assert stored(emulator, "Job", "e4-analysis") is None
    released = stored(emulator, "BrokerCluster", "c5")["metadata"].get("annotations") or {}
    assert ANNOTATION_LOCK not in released
    warning = await eventually(
        lambda: [e for e in experiment_events(emulator, "e4") if e[0] == "Warning"],
        what="a Warning event on e4")
    assert warning == [("Warning", "RunnerFailed",
                        "Failed: the runner Job failed: Job has reached the specified "
                        "backoff limit")]
    # Each phase change is an Event: it went through Healing before it failed. A handler
    # kopf retries (a status patch that timed out on a loaded machine) posts its Event
    # again, as Kubernetes' event recorders do (at least once): one phase, one entry.
    phases = [(kind, message.split(":")[0]) for kind, _, message in
              experiment_events(emulator, "e4")]
    assert [phase for i, phase in enumerate(phases) if i == 0 or phases[i - 1] != phase] == [
        ("Normal", "Running"), ("Normal", "Healing"), ("Warning", "Failed")]
