"""Install artefacts: every file in manifests/ and everything Helm renders validates with
kubernetes-validate --strict; ``helm lint`` is clean; kustomize and Helm grant the same
least-privilege Role; the kind end-to-end script runs only where a cluster is reachable."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
CHART = REPO / "helm" / "undertow"
KUBERNETES = "1.30.0"
E2E = REPO / "scripts" / "kind-e2e.sh"

# The operator's permissions, verb by verb (see manifests/operator/role.yaml for why each).
EXPECTED_RULES = {
    ("undertow.dev", "brokerclusters"): ["get", "list", "watch", "create", "patch"],
    ("undertow.dev", "chaosexperiments"): ["list", "watch", "patch"],
    ("undertow.dev", "brokerclusters/status"): ["patch"],
    ("undertow.dev", "chaosexperiments/status"): ["patch"],
    ("undertow.dev", "brokerclusters/finalizers"): ["update"],
    ("undertow.dev", "chaosexperiments/finalizers"): ["update"],
    ("", "pods"): ["get", "list", "delete"],
    ("", "configmaps"): ["get", "create", "patch"],
    ("", "services"): ["get", "create", "patch"],
    ("", "secrets"): ["get", "create"],
    ("", "serviceaccounts"): ["create"],
    ("", "persistentvolumeclaims"): ["create"],
    ("", "events"): ["create"],
    ("apps", "statefulsets"): ["get", "create", "patch"],
    ("batch", "jobs"): ["get", "create", "delete"],
    ("rbac.authorization.k8s.io", "roles"): ["create"],
    ("rbac.authorization.k8s.io", "rolebindings"): ["create"],
    ("networking.k8s.io", "networkpolicies"): ["get", "create", "patch"],
}


# Cluster-wide, read-only (see manifests/operator/clusterrole.yaml).
EXPECTED_CLUSTER_RULES = {
    ("apiextensions.k8s.io", "customresourcedefinitions"): ["list", "watch"],
    ("", "namespaces"): ["list", "watch"],
}


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def flatten(role: dict[str, Any]) -> dict[tuple[str, str], list[str]]:
    rules: dict[tuple[str, str], list[str]] = {}
    for rule in role["rules"]:
        assert "resourceNames" not in rule and "*" not in rule["verbs"]
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                rules[(group, resource)] = rule["verbs"]
    return rules


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    chart = helm.Chart.load(CHART)
    rendered = chart.render(values, name="undertow", namespace="chaos", is_install=True)
    docs = [d for name, text in rendered.items() if name.endswith(".yaml")
            for d in documents(text)]
    return docs + [d for crd in chart.crds for d in documents(crd["data"])]


@pytest.mark.parametrize("path", sorted(p.relative_to(REPO) for p in MANIFESTS.rglob("*.yaml")
                                        if p.name != "kustomization.yaml"), ids=str)
def test_every_manifest_validates_strictly(path: Path) -> None:
    docs = documents((REPO / path).read_text())
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_kustomization_lists_every_manifest() -> None:
    listed = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["resources"]
    present = sorted(str(p.relative_to(MANIFESTS)) for p in MANIFESTS.rglob("*.yaml")
                     if p.name != "kustomization.yaml")
    assert sorted(listed) == present


@pytest.mark.skipif(shutil.which("kubectl") is None,
                    reason="kubectl (with its built-in kustomize) is not installed")
def test_kubectl_kustomize_builds_the_install() -> None:
    built = subprocess.run(["kubectl", "kustomize", str(MANIFESTS)], capture_output=True,
                           text=True, check=True).stdout
    docs = documents(built)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(["CustomResourceDefinition", "CustomResourceDefinition",
                            "Namespace", "ServiceAccount", "Role", "RoleBinding",
                            "ClusterRole", "ClusterRoleBinding", "Deployment",
                            "NetworkPolicy"])
    cluster_scoped = ("CustomResourceDefinition", "Namespace", "ClusterRole",
                      "ClusterRoleBinding")
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
        if doc["kind"] not in cluster_scoped:
            assert doc["metadata"]["namespace"] == "undertow"


def test_helm_lint_is_clean() -> None:
    report = helm.lint(CHART, strict=True)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("values", [None, {"watchNamespaces": ["team-a", "team-b"],
                                           "images": {"operator": {"tag": "dev"}},
                                           "history": {"storageClass": "fast"}}])
def test_everything_helm_renders_validates_strictly(values: dict[str, Any] | None) -> None:
    docs = render(values)
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    roles = [d for d in docs if d["kind"] == "Role"]
    namespaces = (values or {}).get("watchNamespaces") or ["chaos"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(namespaces)
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["UNDERTOW_NAMESPACES"] == ",".join(namespaces)
    tag = "dev" if values else "0.1.0"
    assert container["image"] == env["UNDERTOW_OPERATOR_IMAGE"] == f"undertow/operator:{tag}"
    assert yaml.safe_load(env["UNDERTOW_RUNNER_RESOURCES"])["limits"] == {"memory": "1Gi"}
    assert ("UNDERTOW_STORAGE_CLASS" in env) == bool(values)


def test_helm_and_kustomize_grant_the_same_least_privilege() -> None:
    manifest_role = documents((MANIFESTS / "operator" / "role.yaml").read_text())[0]
    helm_role = next(d for d in render() if d["kind"] == "Role")
    assert flatten(manifest_role) == flatten(helm_role) == EXPECTED_RULES
    manifest_cluster_role = documents(
        (MANIFESTS / "operator" / "clusterrole.yaml").read_text())[0]
    helm_cluster_role = next(d for d in render() if d["kind"] == "ClusterRole")
    assert flatten(manifest_cluster_role) == flatten(helm_cluster_role) == \
        EXPECTED_CLUSTER_RULES
    binding = next(d for d in render() if d["kind"] == "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "undertow-operator",
                                    "namespace": "chaos"}]


def test_the_crds_helm_installs_are_the_committed_ones() -> None:
    for crd in helm.Chart.load(CHART).crds:
        committed = (MANIFESTS / "crds" / Path(crd["filename"]).name).read_text()
        assert documents(crd["data"]) == documents(committed)


def test_the_e2e_script_and_workflow_hang_together() -> None:
    assert subprocess.run(["bash", "-n", str(E2E)], check=False).returncode == 0
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "e2e-kind.yml").read_text())
    steps = [s.get("run", "") for job in workflow["jobs"].values() for s in job["steps"]]
    assert any("scripts/kind-e2e.sh" in run for run in steps)
    script = E2E.read_text()
    for needle in ("scripts/images.sh", "helm upgrade --install",
                   "pod-security.kubernetes.io/enforce=privileged"):
        assert needle in script, needle
    assert 'EXPERIMENTS=(acks1-leader-kill acksall-leader-kill)' in script
    images = (REPO / "scripts" / "images.sh").read_text()
    for dockerfile in ("broker-image/Dockerfile", "operator/Dockerfile", "analysis/Dockerfile"):
        assert dockerfile in images and (REPO / dockerfile).is_file()
    # On failure the script saves the logs where the workflow uploads them from.
    (job,) = workflow["jobs"].values()
    run = next(s for s in job["steps"] if "scripts/kind-e2e.sh" in s.get("run", ""))
    upload = next(s for s in job["steps"] if "upload-artifact" in s.get("uses", ""))
    assert upload["if"] == "failure()"
    assert upload["with"]["path"].rstrip("/") == run["env"]["E2E_LOGS"]
    assert "E2E_LOGS" in script


def e2e_unavailable() -> str | None:
    missing = [tool for tool in ("docker", "kind", "kubectl", "helm") if not shutil.which(tool)]
    if missing:
        return (f"the kind end-to-end test needs {', '.join(missing)}, not installed here: "
                "the e2e-kind workflow (.github/workflows) runs scripts/kind-e2e.sh with them")
    probe = subprocess.run(["kubectl", "version", "--request-timeout=5s"], capture_output=True,
                           text=True, check=False)
    if probe.returncode != 0:
        return f"no Kubernetes cluster is reachable: {probe.stderr.strip()[:200]}"
    return None


E2E_UNAVAILABLE = e2e_unavailable()


@pytest.mark.skipif(E2E_UNAVAILABLE is not None, reason=str(E2E_UNAVAILABLE))
def test_kind_end_to_end() -> None:  # pragma: no cover - needs Docker, kind and a cluster
    result = subprocess.run(["bash", str(E2E)], capture_output=True, text=True, check=False,
                            timeout=3600)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    assert "acks1-leader-kill: verdict loss" in result.stdout
    assert "acksall-leader-kill: verdict clean" in result.stdout


def test_every_pod_the_operator_makes_pulls_as_the_chart_says() -> None:
    """images.pullPolicy reaches the operator, and through it every container it renders:
    brokers, fault agents, runner and analysis (kind loads images it cannot pull)."""
    from undertow.kube.cluster_objects import cluster_objects
    from undertow.kube.config import OperatorConfig
    from undertow.kube.experiment_objects import analysis_job, runner_job
    from undertow.spec import BrokerCluster

    deployment = next(d for d in render({"images": {"pullPolicy": "Never"}})
                      if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["imagePullPolicy"] == "Never"
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    config = OperatorConfig.from_env(env)
    cluster, experiment = (d for d in yaml.safe_load_all(
        (REPO / "experiments" / "acks1-leader-kill.yaml").read_text()))
    for body in (cluster, experiment):
        body["metadata"].update(namespace="chaos", uid="uid")
    spec = BrokerCluster.model_validate(cluster).spec
    objects = [*cluster_objects(cluster, spec, config.images, config.jobs),
               runner_job(experiment, "c", 1, 30.0, config.images, config.jobs),
               analysis_job(experiment, config.images, config.jobs)]
    pulls = {(c["name"], c["imagePullPolicy"]) for o in objects
             for key in ("initContainers", "containers")
             for c in o.get("spec", {}).get("template", {}).get("spec", {}).get(key, [])}
    assert pulls == {(name, "Never") for name in ("minibroker", "fault-agent", "runner",
                                                   "analysis", "publish")}


@pytest.mark.parametrize("values", [None, {"watchNamespaces": ["team-a"]}])
def test_both_installs_put_the_operator_where_the_clusters_network_policies_admit_it(
        values: dict[str, Any] | None) -> None:
    """Each BrokerCluster's NetworkPolicy admits pods labelled OPERATOR_POD_LABELS from
    $POD_NAMESPACE (the operator's own namespace, wherever the clusters are); both installs
    label the operator so, give it that variable, and close its own pod to every peer."""
    from undertow.kube.cluster_objects import OPERATOR_POD_LABELS

    manifests = [d for p in sorted(MANIFESTS.rglob("*.yaml"))
                 if p.name != "kustomization.yaml" for d in documents(p.read_text())]
    for docs in (manifests, render(values)):
        deployment = next(d for d in docs if d["kind"] == "Deployment")
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert OPERATOR_POD_LABELS.items() <= labels.items()
        env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]
               ["env"]}
        assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {
            "fieldPath": "metadata.namespace"}}
        (policy,) = (d for d in docs if d["kind"] == "NetworkPolicy")
        kubernetes_validate.validate(policy, KUBERNETES, strict=True)
        assert policy["metadata"]["namespace"] == deployment["metadata"]["namespace"]
        selector = policy["spec"]["podSelector"]["matchLabels"]
        assert selector.items() <= labels.items()
        assert policy["spec"]["policyTypes"] == ["Ingress"] and policy["spec"]["ingress"] == []
    assert not [d for d in render({"networkPolicy": {"enabled": False}})
                if d["kind"] == "NetworkPolicy"]
