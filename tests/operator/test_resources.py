"""The objects the operator builds: valid Kubernetes (kubernetes-validate --strict), least
privilege, non-root, and only the fault agent with NET_ADMIN."""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from small_experiment import small_experiment

from undertow.kube.cluster_objects import (
    OPERATOR_POD_LABELS,
    cluster_objects,
    config_hash,
    controller_secret,
    fault_secret,
    storage_change,
)
from undertow.kube.config import ConfigError, OperatorConfig
from undertow.kube.experiment_objects import (
    analysis_job,
    driver_memory,
    experiment_file,
    experiment_setup,
    inline_cluster,
    parse_quantity,
    runner_job,
)
from undertow.kube.objects import Images, JobSettings, check_name
from undertow.spec import BrokerCluster, load_documents

REPO = Path(__file__).resolve().parents[2]
KUBERNETES = "1.30.0"


def stored(path: str, kind: str) -> dict[str, Any]:
    for document in yaml.safe_load_all((REPO / path).read_text()):
        if document["kind"] == kind:
            document["metadata"].update(namespace="chaos", uid=f"uid-{kind}")
            return document
    raise AssertionError(kind)


def everything(storage: str = "ephemeral") -> list[dict[str, Any]]:
    cluster = stored("experiments/acks1-leader-kill.yaml", "BrokerCluster")
    cluster["spec"]["storage"] = {"type": storage, "size": "2Gi"}
    experiment = stored("experiments/acks1-leader-kill.yaml", "ChaosExperiment")
    spec = BrokerCluster.model_validate(cluster).spec
    settings = JobSettings(storage_class="standard")
    return [*cluster_objects(cluster, spec, Images()),
            fault_secret(cluster, "a", "b"), controller_secret(cluster, "c" * 64),
            *experiment_setup(experiment, cluster, "acks1-leader-kill", 3, settings),
            runner_job(experiment, "acks1-leader-kill", 7, 30.0, Images(), settings),
            analysis_job(experiment, Images(), settings)]


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec", {}).get("template", {}).get("spec", {})
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


@pytest.mark.parametrize("storage", ["ephemeral", "persistent"])
def test_every_object_validates_strictly(storage: str) -> None:
    for obj in everything(storage):
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)


def test_only_the_fault_agent_may_change_the_network_and_nothing_is_privileged() -> None:
    for obj in everything():
        for container in containers(obj):
            security = container["securityContext"]
            assert security.get("privileged") is not True
            assert security["allowPrivilegeEscalation"] is False
            assert security["capabilities"]["drop"] == ["ALL"]
            assert security["readOnlyRootFilesystem"] is True
            if container["name"] == "fault-agent":
                assert security["capabilities"]["add"] == ["NET_ADMIN", "KILL"]
            else:
                assert "add" not in security["capabilities"]
                assert security["runAsNonRoot"] is True and security["runAsUser"] == 10001


def test_storage_follows_the_spec() -> None:
    for storage in ("ephemeral", "persistent"):
        brokers = next(o for o in everything(storage)
                       if o["kind"] == "StatefulSet" and o["metadata"]["name"].endswith("broker"))
        volumes = {v["name"]: v for v in brokers["spec"]["template"]["spec"]["volumes"]}
        claims = brokers["spec"].get("volumeClaimTemplates", [])
        if storage == "ephemeral":
            assert volumes["data"] == {"name": "data", "emptyDir": {"sizeLimit": "2Gi"}}
            assert claims == []
        else:
            assert "data" not in volumes
            assert claims[0]["spec"]["resources"] == {"requests": {"storage": "2Gi"}}
            assert brokers["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == \
                "Delete"


def test_the_controller_keeps_its_metadata_on_a_claim_whatever_the_brokers_storage() -> None:
    for storage in ("ephemeral", "persistent"):
        controller = next(o for o in everything(storage) if o["kind"] == "StatefulSet"
                          and o["metadata"]["name"].endswith("controller"))
        volumes = {v["name"] for v in controller["spec"]["template"]["spec"]["volumes"]}
        (claim,) = controller["spec"]["volumeClaimTemplates"]
        assert claim["metadata"]["name"] == "data" and "data" not in volumes
        assert claim["spec"]["resources"] == {"requests": {"storage": "256Mi"}}
    # Only the operator restarts pods (rollout.py), the controller included.
    for sts in (o for o in everything() if o["kind"] == "StatefulSet"):
        assert sts["spec"]["updateStrategy"] == {"type": "OnDelete"}


def test_brokers_run_the_operators_broker_image_unless_the_cluster_names_another() -> None:
    """The chart's images.registry reaches the brokers through the operator's broker image
    (UNDERTOW_BROKER_IMAGE); a BrokerCluster's own spec.image wins over it."""
    cluster = stored("experiments/acks1-leader-kill.yaml", "BrokerCluster")
    images = Images(broker="registry.example.com/team/undertow/minibroker:0.1.0")

    def broker_images(body: dict[str, Any]) -> set[str]:
        spec = BrokerCluster.model_validate(body).spec
        return {c["image"] for o in cluster_objects(body, spec, images)
                if o["kind"] == "StatefulSet"
                for c in o["spec"]["template"]["spec"]["containers"]
                if c["name"] == "minibroker"}

    assert broker_images(cluster) == {images.broker}
    named = copy.deepcopy(cluster)
    named["spec"]["image"] = "mine/minibroker:dev"
    assert broker_images(named) == {"mine/minibroker:dev"}
    assert OperatorConfig.from_env({"UNDERTOW_NAMESPACES": "undertow",
                                    "UNDERTOW_BROKER_IMAGE": images.broker}
                                   ).images.broker == images.broker


def test_a_storage_change_is_refused_with_the_field_named() -> None:
    cluster = stored("experiments/acks1-leader-kill.yaml", "BrokerCluster")

    def brokers_sts(storage: dict[str, str]) -> dict[str, Any]:
        body = copy.deepcopy(cluster)
        body["spec"]["storage"] = storage
        spec = spec_of(storage)
        return next(o for o in cluster_objects(body, spec, Images())
                    if o["kind"] == "StatefulSet" and o["metadata"]["name"].endswith("-broker"))

    def spec_of(storage: dict[str, str]) -> Any:
        body = copy.deepcopy(cluster)
        body["spec"]["storage"] = storage
        return BrokerCluster.model_validate(body).spec

    ephemeral = {"type": "ephemeral", "size": "1Gi"}
    persistent = {"type": "persistent", "size": "1Gi"}
    assert storage_change(None, spec_of(persistent)) is None
    assert storage_change(brokers_sts(ephemeral), spec_of(ephemeral)) is None
    assert storage_change(brokers_sts(ephemeral),
                          spec_of({"type": "ephemeral", "size": "5Gi"})) is None
    assert storage_change(brokers_sts(persistent), spec_of(persistent)) is None
    message = storage_change(brokers_sts(ephemeral), spec_of(persistent))
    assert message is not None and message.startswith(
        "spec.storage.type: cannot change from ephemeral to persistent")
    message = storage_change(brokers_sts(persistent), spec_of(ephemeral))
    assert message is not None and "from persistent to ephemeral" in message
    message = storage_change(brokers_sts(persistent),
                             spec_of({"type": "persistent", "size": "2Gi"}))
    assert message is not None and message.startswith(
        "spec.storage.size: cannot change from 1Gi to 2Gi")


def test_the_analysis_job_checks_in_the_analysis_image_and_publishes_from_the_operators() -> None:
    experiment = stored("experiments/acks1-leader-kill.yaml", "ChaosExperiment")
    images = Images(operator="op:1", analysis="an:1")
    job = analysis_job(experiment, images, JobSettings())
    pod = job["spec"]["template"]["spec"]
    (analysis,) = pod["initContainers"]
    (publish,) = pod["containers"]
    assert analysis["image"] == "an:1"
    assert analysis["command"] == ["python", "-m", "undertow_analysis", "/data/history",
                                   "--out", "/data/report",
                                   "--conf", "spark.driver.memory=1536m"]
    assert publish["image"] == "op:1"
    assert publish["command"] == ["python", "-m", "undertow.kube.jobs", "publish",
                                  "--report", "/data/report",
                                  "--configmap", "acks1-leader-kill-report",
                                  "--namespace", "chaos"]
    history = {m["name"]: m for m in publish["volumeMounts"]}["history"]
    assert history["readOnly"] is True


@pytest.mark.parametrize(("limit", "heap"), [
    ("2Gi", "1536m"), ("1Gi", "640m"), ("8Gi", "6144m"), ("4G", "2861m"), ("1073741824", "640m"),
])
def test_the_driver_heap_leaves_room_below_the_memory_limit(limit: str, heap: str) -> None:
    assert driver_memory({"limits": {"memory": limit}}) == heap


def test_no_memory_limit_keeps_sparks_default_and_a_tiny_one_is_refused() -> None:
    assert driver_memory({"requests": {"memory": "1Gi"}}) is None
    with pytest.raises(ValueError, match="analysis memory limit 512Mi leaves 128 MiB"):
        driver_memory({"limits": {"memory": "512Mi"}})
    with pytest.raises(ValueError, match="memory quantity '2Qi'"):
        parse_quantity("2Qi")
    with pytest.raises(ValueError, match="memory quantity 'Gi'"):
        parse_quantity("Gi")


def test_a_config_change_changes_the_pod_template() -> None:
    cluster = stored("experiments/acks1-leader-kill.yaml", "BrokerCluster")
    before = BrokerCluster.model_validate(cluster).spec
    changed = copy.deepcopy(cluster)
    changed["spec"]["config"]["min.insync.replicas"] = 2
    after = BrokerCluster.model_validate(changed).spec
    assert config_hash(before) != config_hash(after)
    assert config_hash(before) == config_hash(BrokerCluster.model_validate(cluster).spec)


def test_the_runner_role_names_only_the_clusters_pods() -> None:
    role = next(o for o in everything()
                if o["kind"] == "Role" and o["metadata"]["name"].endswith("-runner"))
    pods, events = role["rules"]
    assert pods["verbs"] == ["get", "delete"]
    assert pods["resourceNames"] == ["acks1-leader-kill-controller-0"] + [
        f"acks1-leader-kill-broker-{i}" for i in range(3)]
    assert events == {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}


def test_an_inline_cluster_is_owned_by_its_experiment(tmp_path: Path) -> None:
    experiment = stored("experiments/acks1-leader-kill.yaml", "ChaosExperiment")
    experiment["spec"]["cluster"] = {"inline": {"brokers": 3}}
    cluster = inline_cluster(experiment)
    assert cluster["metadata"]["name"] == "acks1-leader-kill"
    assert cluster["metadata"]["ownerReferences"][0]["kind"] == "ChaosExperiment"
    path = tmp_path / "e.yaml"
    path.write_text(experiment_file(experiment, None))
    (document,) = load_documents([path])
    assert document.resource.spec.cluster.inline.brokers == 3


def test_derived_names_must_fit() -> None:
    check_name("a" * 40, "BrokerCluster")
    with pytest.raises(ValueError, match=r"BrokerCluster name 'a{41}' is 41 characters; at "
                                         r"most 40"):
        check_name("a" * 41, "BrokerCluster")


def test_operator_config_from_the_environment() -> None:
    config = OperatorConfig.from_env({
        "UNDERTOW_NAMESPACES": "chaos, other", "UNDERTOW_OPERATOR_IMAGE": "op:1",
        "UNDERTOW_RUNNER_RESOURCES": '{"requests": {"cpu": "1"}}',
        "UNDERTOW_INTERVAL_S": "2.5"})
    assert config.namespaces == ("chaos", "other")
    assert config.images.operator == "op:1" and config.interval_s == 2.5
    assert config.jobs.runner_resources == {"requests": {"cpu": "1"}}
    assert OperatorConfig.from_env({"POD_NAMESPACE": "ns"}).namespaces == ("ns",)
    assert OperatorConfig.from_env({"POD_NAMESPACE": "ns"}).operator_namespace == "ns"
    assert config.operator_namespace is None
    for env, message in (({}, "UNDERTOW_NAMESPACES"),
                         ({"POD_NAMESPACE": "n", "UNDERTOW_INTERVAL_S": "soon"},
                          "UNDERTOW_INTERVAL_S='soon': expected a number"),
                         ({"POD_NAMESPACE": "n", "UNDERTOW_HEAL_TIMEOUT_S": "0"},
                          "must be positive"),
                         ({"POD_NAMESPACE": "n", "UNDERTOW_AGENT_RESOURCES": "[1]"},
                          "UNDERTOW_AGENT_RESOURCES: expected a JSON object")):
        with pytest.raises(ConfigError, match=message):
            OperatorConfig.from_env(env)


def test_the_runner_job_refuses_a_bad_experiment_file(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from undertow.kube.jobs import main

    bad = tmp_path / "experiment.yaml"
    bad.write_text(small_experiment("x", expect="maybe"))
    assert main(["run", "--file", str(bad), "--out", str(tmp_path / "out"),
                 "--namespace", "chaos", "--seed", "1"]) == 2
    assert str(bad) in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# ---- the control plane: the controller secret and the NetworkPolicy ----------------------------

def pod_labels(obj: dict[str, Any]) -> dict[str, str]:
    return obj["spec"]["template"]["metadata"]["labels"]


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector as the API server reads it (the policies use matchLabels only)."""
    assert set(selector) <= {"matchLabels"}, selector
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def admitted(policy: dict[str, Any], port: int, labels: dict[str, str], namespace: str,
             namespace_labels: dict[str, str] | None = None) -> bool:
    """Whether ``policy`` lets a pod with ``labels`` in ``namespace`` reach ``port`` of the
    pods it selects (Kubernetes' NetworkPolicy semantics, for what these policies use)."""
    namespace_labels = namespace_labels or {"kubernetes.io/metadata.name": namespace}
    for rule in policy["spec"]["ingress"]:
        if "ports" in rule and port not in {p["port"] for p in rule["ports"]}:
            continue
        if "from" not in rule:
            return True
        for peer in rule["from"]:
            if "namespaceSelector" in peer:
                in_namespace = selects(peer["namespaceSelector"], namespace_labels)
            else:
                in_namespace = namespace == policy["metadata"]["namespace"]
            if in_namespace and selects(peer.get("podSelector", {}), labels):
                return True
    return False


def test_the_network_policy_keeps_the_control_ports_to_the_cluster_the_runner_and_the_operator(
        ) -> None:
    cluster = stored("experiments/acks1-leader-kill.yaml", "BrokerCluster")
    spec = BrokerCluster.model_validate(cluster).spec
    objects = cluster_objects(cluster, spec, Images(), operator_namespace="undertow")
    (policy,) = (o for o in objects if o["kind"] == "NetworkPolicy")
    kubernetes_validate.validate(policy, KUBERNETES, strict=True)
    assert policy["metadata"]["name"] == "acks1-leader-kill-network"
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress stays open (DNS, API)
    statefulsets = [o for o in objects if o["kind"] == "StatefulSet"]
    # It applies to every pod of the cluster, and names every port they open.
    assert all(selects(policy["spec"]["podSelector"], pod_labels(sts)) for sts in statefulsets)
    opened = {p["containerPort"] for sts in statefulsets
              for c in sts["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
    assert opened == {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    kafka, control = 9092, (9093, 9100, 9200)

    experiment = stored("experiments/acks1-leader-kill.yaml", "ChaosExperiment")
    settings = JobSettings()
    runner = runner_job(experiment, "acks1-leader-kill", 7, 30.0, Images(), settings)
    other_runner = runner_job(experiment, "another-cluster", 7, 30.0, Images(), settings)
    analysis = analysis_job(experiment, Images(), settings)
    operator_pod = pod_labels(yaml.safe_load(
        (REPO / "manifests/operator/deployment.yaml").read_text()))
    assert OPERATOR_POD_LABELS.items() <= operator_pod.items()
    family = [*(pod_labels(sts) for sts in statefulsets), pod_labels(runner)]
    for port in control:
        assert all(admitted(policy, port, labels, "chaos") for labels in family), port
        assert admitted(policy, port, operator_pod, "undertow")
        # Anyone else: another experiment's runner, the analysis, any pod, the operator's
        # labels on a pod of another namespace.
        assert not admitted(policy, port, pod_labels(other_runner), "chaos")
        assert not admitted(policy, port, pod_labels(analysis), "chaos")
        assert not admitted(policy, port, {"app": "kcat"}, "chaos")
        assert not admitted(policy, port, operator_pod, "chaos")
        assert not admitted(policy, port, pod_labels(statefulsets[1]), "elsewhere")
    for labels, namespace in ((pod_labels(runner), "chaos"), ({"app": "kcat"}, "chaos"),
                              ({}, "elsewhere")):
        assert admitted(policy, kafka, labels, namespace)  # clients reach the Kafka port
    # Without the operator's namespace (not in a pod), its pods are looked for beside the
    # cluster's.
    (local,) = (o for o in cluster_objects(cluster, spec, Images())
                if o["kind"] == "NetworkPolicy")
    assert admitted(local, 9093, operator_pod, "chaos")
    assert not admitted(local, 9093, operator_pod, "undertow")


def test_only_the_controller_and_the_brokers_get_the_controller_secret() -> None:
    secret = next(o for o in everything() if o["kind"] == "Secret"
                  and o["metadata"]["name"] == "acks1-leader-kill-controller-auth")
    assert secret["data"] == {"controller-secret": base64.b64encode(b"c" * 64).decode()}
    reference = {"name": "MINIBROKER_CONTROLLER_SECRET", "valueFrom": {"secretKeyRef": {
        "name": "acks1-leader-kill-controller-auth", "key": "controller-secret"}}}
    holders = []
    for obj in everything():
        for container in containers(obj):
            refs = [e for e in container.get("env", []) if "controller-auth" in str(e)]
            assert refs in ([], [reference]), (obj["metadata"]["name"], container["name"])
            if refs:
                holders.append((obj["metadata"]["name"], container["name"]))
            # No secret is ever on a command line.
            assert "controller-secret" not in " ".join(container.get("command", []))
    assert holders == [("acks1-leader-kill-controller", "minibroker"),
                       ("acks1-leader-kill-broker", "minibroker")]
