"""The Kubernetes objects behind a ChaosExperiment, as pure functions.

A ChaosExperiment ``E`` becomes a runner Job and an analysis Job, each with its own
ServiceAccount, Role and RoleBinding (least privilege: the runner may get and delete the
cluster's pods by name and create Events; the analysis may patch the report ConfigMap),
a ConfigMap with the experiment file, a PersistentVolumeClaim for the history and the
report ConfigMap ``E-report``; an experiment with ``cluster.inline`` also gets its own
BrokerCluster. Everything carries an owner reference to the experiment, so deleting the
experiment deletes it all. The cluster's names and token keys, which the runner's Role and
environment refer to, come from ``cluster_objects``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from undertow.kube.cluster_objects import (
    AGENT_TOKEN_ENV,
    AGENT_TOKEN_KEY,
    FAILPOINT_TOKEN_ENV,
    FAILPOINT_TOKEN_KEY,
    LABEL_TARGET_CLUSTER,
    ClusterNames,
)
from undertow.kube.objects import (
    LABEL_COMPONENT,
    MANAGED_BY,
    Images,
    JobSettings,
    object_meta,
    pod_security,
    restricted,
    secret_env,
)
from undertow.platform.base import CONTROLLER, broker_node
from undertow.spec.meta import API_VERSION

LABEL_EXPERIMENT = "undertow.dev/experiment"
EXPERIMENT_FILE = "experiment.yaml"
REPORT_KEY = "report.json"
HISTORY_DIR = "/data"
REPORT_DIR = f"{HISTORY_DIR}/report"
EXPERIMENT_DIR = "/etc/undertow"


@dataclass(frozen=True)
class ExperimentNames:
    experiment: str
    namespace: str

    @property
    def runner(self) -> str:
        """The runner's Job, ServiceAccount, Role and RoleBinding."""
        return f"{self.experiment}-runner"

    @property
    def analysis(self) -> str:
        """The analysis' Job, ServiceAccount, Role and RoleBinding."""
        return f"{self.experiment}-analysis"

    @property
    def history(self) -> str:
        return f"{self.experiment}-history"

    @property
    def spec(self) -> str:
        """The ConfigMap holding the experiment file the runner loads."""
        return f"{self.experiment}-spec"

    @property
    def report(self) -> str:
        return f"{self.experiment}-report"


def experiment_names(experiment: Mapping[str, Any]) -> ExperimentNames:
    """The names of the ChaosExperiment object ``experiment``."""
    return ExperimentNames(experiment["metadata"]["name"], experiment["metadata"]["namespace"])


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def inline_cluster(experiment: Mapping[str, Any]) -> dict[str, Any]:
    """The BrokerCluster of an experiment with ``cluster.inline``, named after it."""
    meta = experiment["metadata"]
    return {"apiVersion": API_VERSION, "kind": "BrokerCluster",
            "metadata": object_meta(meta["name"], meta["namespace"], experiment,
                                    {LABEL_EXPERIMENT: meta["name"]}),
            "spec": experiment["spec"]["cluster"]["inline"]}


def experiment_file(experiment: Mapping[str, Any], cluster: Mapping[str, Any] | None) -> str:
    """The multi-document file the runner loads: the cluster (for a ref) and the experiment,
    stripped to what a user would have applied."""
    documents = []
    for body in ([cluster] if cluster is not None else []) + [experiment]:
        documents.append({"apiVersion": body["apiVersion"], "kind": body["kind"],
                          "metadata": {"name": body["metadata"]["name"],
                                       "namespace": body["metadata"]["namespace"]},
                          "spec": body["spec"]})
    return yaml.safe_dump_all(documents, sort_keys=False)


def experiment_setup(experiment: Mapping[str, Any], cluster: Mapping[str, Any] | None,
                     cluster_name: str, brokers: int,
                     settings: JobSettings) -> list[dict[str, Any]]:
    """Everything an experiment needs before its runner starts: accounts, roles, the spec
    ConfigMap, the history volume and the (empty) report ConfigMap."""
    names = experiment_names(experiment)
    cluster_names = ClusterNames(cluster_name, names.namespace)
    pods = [cluster_names.pod(CONTROLLER)] + [cluster_names.pod(broker_node(i))
                                               for i in range(brokers)]
    runner_rules = [
        {"apiGroups": [""], "resources": ["pods"], "resourceNames": pods,
         "verbs": ["get", "delete"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ]
    analysis_rules = [
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [names.report],
         "verbs": ["patch"]},
    ]
    labels = {LABEL_EXPERIMENT: names.experiment}
    pvc: dict[str, Any] = {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": object_meta(names.history, names.namespace, experiment, labels),
        "spec": {"accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": settings.history_size}}},
    }
    if settings.storage_class:
        pvc["spec"]["storageClassName"] = settings.storage_class
    return [
        *_account(experiment, names.runner, runner_rules),
        *_account(experiment, names.analysis, analysis_rules),
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": object_meta(names.spec, names.namespace, experiment, labels),
         "data": {EXPERIMENT_FILE: experiment_file(experiment, cluster)}},
        pvc,
        report_config_map(experiment),
    ]


def report_config_map(experiment: Mapping[str, Any]) -> dict[str, Any]:
    names = experiment_names(experiment)
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": object_meta(names.report, names.namespace, experiment,
                                    {LABEL_EXPERIMENT: names.experiment}),
            "data": {}}


def _account(owner: Mapping[str, Any], name: str,
             rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A ServiceAccount bound to a Role with exactly ``rules``."""
    namespace = owner["metadata"]["namespace"]
    labels = {LABEL_EXPERIMENT: owner["metadata"]["name"]}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": object_meta(name, namespace, owner, labels)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": object_meta(name, namespace, owner, labels), "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": object_meta(name, namespace, owner, labels),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]},
    ]


def _job(experiment: Mapping[str, Any], name: str, component: str,
         containers: list[dict[str, Any]], volumes: list[dict[str, Any]],
         deadline_s: int | None,
         init_containers: list[dict[str, Any]] | None = None,
         pod_labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    names = experiment_names(experiment)
    labels = {LABEL_EXPERIMENT: names.experiment, LABEL_COMPONENT: component}
    for container in [*(init_containers or []), *containers]:
        container["securityContext"] = restricted()
        container["volumeMounts"] = [*container.get("volumeMounts", []),
                                     {"name": "tmp", "mountPath": "/tmp"}]
    pod: dict[str, Any] = {
        "serviceAccountName": name,
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        # Time for the runner to heal every fault when the Job is deleted.
        "terminationGracePeriodSeconds": 60,
        "securityContext": pod_security(),
        "containers": containers,
        "volumes": [*volumes, {"name": "tmp", "emptyDir": {}}],
    }
    if init_containers:
        pod["initContainers"] = init_containers
    spec: dict[str, Any] = {
        "backoffLimit": 0,
        "template": {"metadata": {"labels": {**MANAGED_BY, **labels, **(pod_labels or {})}},
                     "spec": pod},
    }
    if deadline_s is not None:
        spec["activeDeadlineSeconds"] = deadline_s
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": object_meta(name, names.namespace, experiment, labels), "spec": spec}


def _history_volume(names: ExperimentNames) -> dict[str, Any]:
    return {"name": "history", "persistentVolumeClaim": {"claimName": names.history}}


def runner_job(experiment: Mapping[str, Any], cluster_name: str, seed: int,
               duration_s: float, images: Images, settings: JobSettings) -> dict[str, Any]:
    """The Job that runs the workload and the nemesis (``python -m undertow.kube.jobs run``)."""
    names = experiment_names(experiment)
    secret = ClusterNames(cluster_name, names.namespace).secret
    container = {
        "name": "runner",
        "image": images.operator,
        "imagePullPolicy": images.pull_policy,
        "command": ["python", "-m", "undertow.kube.jobs", "run",
                    "--file", f"{EXPERIMENT_DIR}/{EXPERIMENT_FILE}", "--out", HISTORY_DIR,
                    "--namespace", names.namespace, "--seed", str(seed)],
        "env": [
            _field_env("POD_IP", "status.podIP"),
            _field_env("POD_NAME", "metadata.name"),
            {"name": "UNDERTOW_EXPERIMENT_UID", "value": experiment["metadata"]["uid"]},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
            secret_env(FAILPOINT_TOKEN_ENV, secret, FAILPOINT_TOKEN_KEY),
            secret_env(AGENT_TOKEN_ENV, secret, AGENT_TOKEN_KEY),
        ],
        "resources": dict(settings.runner_resources),
        "volumeMounts": [{"name": "history", "mountPath": HISTORY_DIR},
                         {"name": "spec", "mountPath": EXPERIMENT_DIR, "readOnly": True}],
    }
    volumes = [_history_volume(names), {"name": "spec", "configMap": {"name": names.spec}}]
    deadline = int(duration_s) + settings.run_margin_s
    # The cluster's NetworkPolicy admits the runner to its control ports by this label.
    return _job(experiment, names.runner, "runner", [container], volumes, deadline,
                pod_labels={LABEL_TARGET_CLUSTER: cluster_name})


def analysis_job(experiment: Mapping[str, Any], images: Images,
                 settings: JobSettings) -> dict[str, Any]:
    """The Job that checks the history and publishes the report, in two steps.

    The analysis image holds PySpark and the analysis only, so the check runs there as an
    init container (``python -m undertow_analysis``, exit 2 on a bad history fails the
    Job); the operator image, which has the Kubernetes client, then patches the report into
    the report ConfigMap (``python -m undertow.kube.jobs publish``).
    """
    names = experiment_names(experiment)
    resources = dict(settings.analysis_resources)
    command = ["python", "-m", "undertow_analysis", f"{HISTORY_DIR}/history",
               "--out", REPORT_DIR]
    heap = driver_memory(resources)
    if heap is not None:
        command += ["--conf", f"spark.driver.memory={heap}"]
    analysis = {
        "name": "analysis",
        "image": images.analysis,
        "imagePullPolicy": images.pull_policy,
        "command": command,
        "env": [{"name": "HOME", "value": "/tmp"}, {"name": "PYTHONUNBUFFERED", "value": "1"}],
        "resources": resources,
        "volumeMounts": [{"name": "history", "mountPath": HISTORY_DIR}],
    }
    publish = {
        "name": "publish",
        "image": images.operator,
        "imagePullPolicy": images.pull_policy,
        "command": ["python", "-m", "undertow.kube.jobs", "publish", "--report", REPORT_DIR,
                    "--configmap", names.report, "--namespace", names.namespace],
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
        "resources": dict(settings.publish_resources),
        "volumeMounts": [{"name": "history", "mountPath": HISTORY_DIR, "readOnly": True}],
    }
    return _job(experiment, names.analysis, "analysis", [publish], [_history_volume(names)],
                None, init_containers=[analysis])


_QUANTITY_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
                   "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_MIB = 2**20
DRIVER_OVERHEAD_MIB = 384
"""Memory left outside the driver's heap: at least this, or a quarter of the limit (the
JVM's metaspace, threads and direct buffers, and the Python process that drives it); the
same floor as Spark's ``spark.driver.memoryOverheadFactor`` minimum on Kubernetes."""


def driver_memory(resources: Mapping[str, Any]) -> str | None:
    """Spark's ``spark.driver.memory`` for a container with these resources.

    In local mode the driver JVM runs every task, so its heap is nearly all the container
    may use: the memory limit less the overhead above. Without a limit Spark's default
    (1g) stands. A limit too small for a 256 MiB heap is refused: the Job could only be
    OOM-killed.
    """
    limit = (resources.get("limits") or {}).get("memory")
    if limit is None:
        return None
    limit_bytes = parse_quantity(str(limit))
    heap_mib = (limit_bytes - max(DRIVER_OVERHEAD_MIB * _MIB, limit_bytes // 4)) // _MIB
    if heap_mib < 256:
        raise ValueError(f"analysis memory limit {limit} leaves {heap_mib} MiB for Spark's "
                         f"driver; give it at least {256 + DRIVER_OVERHEAD_MIB}Mi")
    return f"{heap_mib}m"


def parse_quantity(text: str) -> int:
    """A Kubernetes memory quantity (``2Gi``, ``1500M``, ``512Mi``, ``1e9``) in bytes."""
    number = text.rstrip("kMGTi")
    unit = text[len(number):]
    if unit not in _QUANTITY_UNITS or not number:
        raise ValueError(f"memory quantity {text!r}: expected a number with an optional "
                         f"unit ({', '.join(u for u in _QUANTITY_UNITS if u)})")
    try:
        return int(float(number) * _QUANTITY_UNITS[unit])
    except ValueError:
        raise ValueError(f"memory quantity {text!r} is not a number") from None
