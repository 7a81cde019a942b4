"""The Kubernetes objects behind a BrokerCluster and a ChaosExperiment, as pure functions.

A BrokerCluster ``C`` in namespace ``NS`` becomes:

- ``C-controller``: StatefulSet (1 replica) and headless Service; pod ``C-controller-0``;
- ``C-broker``: StatefulSet (N replicas, ``OnDelete`` updates so that the operator restarts
  brokers itself, one at a time, see ``rollout.py``) and headless Service; pod
  ``C-broker-I`` is broker id I (its ordinal), reachable at ``C-broker-I.C-broker.NS.svc``;
- ``C-bootstrap``: the client Service (Kafka port of every broker);
- ``C-config``: ConfigMap with ``server.properties`` (Kafka-style ``key=value`` lines);
- ``C-faults``: Secret with the failpoint and fault agent tokens (created once).

Every broker and controller pod also runs the fault agent (``agent/``): the pod shares
its process namespace so the agent can signal the broker, and only the agent container has
NET_ADMIN (iptables in the pod's network namespace) and KILL.

A ChaosExperiment ``E`` becomes a runner Job and an analysis Job, each with its own
ServiceAccount, Role and RoleBinding (least privilege: the runner may get and delete the
cluster's pods by name and create Events; the analysis may patch the report ConfigMap),
a ConfigMap with the experiment file, a PersistentVolumeClaim for the history and the
report ConfigMap ``E-report``. Everything carries an owner reference, so deleting the
owner deletes it all.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from undertow.platform.base import CONTROLLER, broker_id_of, broker_node
from undertow.spec.cluster import BrokerClusterSpec
from undertow.spec.meta import API_VERSION

KAFKA_PORT = 9092
CONTROLLER_PORT = 9093
ADMIN_PORT = 9100
AGENT_PORT = 9200
BROKER_UID = 10001
"""The minibroker image's user; the operator image uses the same id."""

LABEL_CLUSTER = "undertow.dev/cluster"
LABEL_EXPERIMENT = "undertow.dev/experiment"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_REVISION = "controller-revision-hash"
"""Set by the StatefulSet controller on each pod: the revision the pod was created from."""
ANNOTATION_CONFIG_HASH = "undertow.dev/config-hash"
ANNOTATION_LOCK = "undertow.dev/locked-by"
"""On a BrokerCluster: the experiment running against it (no rolling restart meanwhile)."""
MANAGED_BY = {"app.kubernetes.io/managed-by": "undertow-operator"}

FAILPOINT_TOKEN_KEY = "failpoint-token"
AGENT_TOKEN_KEY = "agent-token"
FAILPOINT_TOKEN_ENV = "MINIBROKER_FAILPOINT_TOKEN"
AGENT_TOKEN_ENV = "UNDERTOW_AGENT_TOKEN"
EXPERIMENT_FILE = "experiment.yaml"
REPORT_KEY = "report.json"
MAX_DERIVED_NAME = 40
"""Longest cluster or experiment name: derived names (``-controller-0``, the StatefulSet
revision label ``<sts>-<hash>``) must stay within Kubernetes' 63-character limit."""

DATA_DIR = "/var/lib/minibroker"
HOLD_DIR = "/run/undertow"
HOLD_FILE = f"{HOLD_DIR}/hold"
"""Shared by the broker and its fault agent: how long a killed broker stays down."""
CONTROLLER_STORAGE = "256Mi"
"""The controller's metadata volume (a few KB of fsynced JSON per cluster)."""
CONFIG_DIR = "/etc/minibroker"
HISTORY_DIR = "/data"
REPORT_DIR = f"{HISTORY_DIR}/report"
EXPERIMENT_DIR = "/etc/undertow"

# Waits while a kill holds the broker down (the fault agent's hold file: a deadline in
# seconds since the epoch; see agent/hold.py), reads server.properties into repeated
# --config flags, then execs minibroker so that the broker is the container's main process
# (signals reach it, the agent finds it).
_LAUNCHER = """set -eu
while [ -f {hold_file} ] && [ "$(date +%s)" -lt "$(cat {hold_file} 2>/dev/null || echo 0)" ]; do
  sleep 0.2
done
set --
while IFS= read -r line || [ -n "$line" ]; do
  case "$line" in ''|'#'*) continue ;; esac
  set -- "$@" --config "$line"
done < {config_dir}/server.properties
exec minibroker {role} "$@"
"""


@dataclass(frozen=True)
class Images:
    """Images the operator puts in pods it creates (the brokers' come from the spec)."""

    operator: str = "undertow/operator:0.1.0"
    """Runner and fault agent (the operator's own image)."""
    analysis: str = "undertow/analysis:0.1.0"
    pull_policy: str = "IfNotPresent"


@dataclass(frozen=True)
class JobSettings:
    """Sizes of what an experiment runs; from the operator's configuration."""

    history_size: str = "1Gi"
    storage_class: str | None = None
    runner_resources: Mapping[str, Any] = field(default_factory=lambda: {
        "requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}})
    analysis_resources: Mapping[str, Any] = field(default_factory=lambda: {
        "requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}})
    agent_resources: Mapping[str, Any] = field(default_factory=lambda: {
        "requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}})
    publish_resources: Mapping[str, Any] = field(default_factory=lambda: {
        "requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}})
    """The analysis Job's second container, which patches the report into its ConfigMap."""
    run_margin_s: int = 900
    """Added to the workload's duration for the runner Job's activeDeadlineSeconds."""


# ---- names ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterNames:
    """Every name derived from a BrokerCluster's, in one place."""

    cluster: str
    namespace: str

    @property
    def controller(self) -> str:
        """The controller's StatefulSet and headless Service."""
        return f"{self.cluster}-controller"

    @property
    def brokers(self) -> str:
        """The brokers' StatefulSet and headless Service."""
        return f"{self.cluster}-broker"

    @property
    def bootstrap(self) -> str:
        return f"{self.cluster}-bootstrap"

    @property
    def config(self) -> str:
        return f"{self.cluster}-config"

    @property
    def secret(self) -> str:
        return f"{self.cluster}-faults"

    def pod(self, node: str) -> str:
        """``controller`` -> ``C-controller-0``; ``broker-2`` -> ``C-broker-2``."""
        if node == CONTROLLER:
            return f"{self.controller}-0"
        return f"{self.brokers}-{broker_id_of(node)}"

    def service(self, node: str) -> str:
        return self.controller if node == CONTROLLER else self.brokers

    def host(self, node: str) -> str:
        """The pod's stable DNS name through its headless Service."""
        return f"{self.pod(node)}.{self.service(node)}.{self.namespace}.svc"

    def node_of(self, pod_name: str) -> str | None:
        """The inverse of ``pod``: None for a pod that is not one of this cluster's."""
        if pod_name == f"{self.controller}-0":
            return CONTROLLER
        prefix = f"{self.brokers}-"
        suffix = pod_name.removeprefix(prefix)
        if suffix != pod_name and suffix.isdigit():
            return broker_node(int(suffix))
        return None


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


def check_name(name: str, what: str) -> None:
    """Reject names whose derived names would break Kubernetes' limits."""
    if len(name) > MAX_DERIVED_NAME:
        raise ValueError(f"{what} name {name!r} is {len(name)} characters; at most "
                         f"{MAX_DERIVED_NAME} (pod, Job and revision names derive from it)")


# ---- common pieces --------------------------------------------------------------------------


def owner_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    """A controller reference to ``owner`` (a full object as the API returns it)."""
    meta = owner["metadata"]
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": meta["name"],
            "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}


def _meta(name: str, namespace: str, owner: Mapping[str, Any], labels: Mapping[str, str],
          annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace,
                            "labels": {**MANAGED_BY, **labels},
                            "ownerReferences": [owner_reference(owner)]}
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def cluster_labels(cluster: str, component: str) -> dict[str, str]:
    """The selector labels of one component (``controller`` or ``broker``) of a cluster."""
    return {"app.kubernetes.io/name": "minibroker", "app.kubernetes.io/instance": cluster,
            LABEL_CLUSTER: cluster, LABEL_COMPONENT: component}


def _restricted(uid: int = BROKER_UID, read_only: bool = True) -> dict[str, Any]:
    """A container security context that passes the "restricted" Pod Security Standard."""
    return {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid,
            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": read_only,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def _pod_security(uid: int = BROKER_UID) -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid, "fsGroup": uid,
            "seccompProfile": {"type": "RuntimeDefault"}}


def _secret_env(name: str, secret: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


# ---- BrokerCluster --------------------------------------------------------------------------


def server_properties(spec: BrokerClusterSpec) -> str:
    """The cluster's config as Kafka's ``server.properties`` lines (keys sorted)."""
    overrides = spec.config.as_overrides()
    return "".join(f"{key}={value}\n" for key, value in sorted(overrides.items()))


def config_hash(spec: BrokerClusterSpec) -> str:
    """Changes when the brokers must restart to pick up a new configuration."""
    return hashlib.sha256(server_properties(spec).encode()).hexdigest()[:16]


def fault_secret(cluster: Mapping[str, Any], failpoint_token: str,
                 agent_token: str) -> dict[str, Any]:
    names = _cluster_names(cluster)
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _meta(names.secret, names.namespace, cluster,
                              {LABEL_CLUSTER: names.cluster}),
            "data": {FAILPOINT_TOKEN_KEY: _b64(failpoint_token),
                     AGENT_TOKEN_KEY: _b64(agent_token)}}


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def cluster_objects(cluster: Mapping[str, Any], spec: BrokerClusterSpec, images: Images,
                    settings: JobSettings = JobSettings(),
                    broker_replicas: int | None = None) -> list[dict[str, Any]]:
    """ConfigMap, Services and StatefulSets of a BrokerCluster (not its Secret).

    ``broker_replicas`` overrides ``spec.brokers`` while a scale-down waits to be safe.
    """
    names = _cluster_names(cluster)
    return [
        _config_map(cluster, names, spec),
        _headless_service(cluster, names, "controller", names.controller),
        _headless_service(cluster, names, "broker", names.brokers),
        _bootstrap_service(cluster, names),
        _statefulset(cluster, names, spec, images, settings, "controller", 1),
        _statefulset(cluster, names, spec, images, settings, "broker",
                     spec.brokers if broker_replicas is None else broker_replicas),
    ]


STATEFULSET_IMMUTABLE = (("spec", "volumeClaimTemplates"), ("spec", "selector"),
                         ("spec", "serviceName"), ("spec", "podManagementPolicy"))
"""StatefulSet fields the API server refuses to change: left out of update patches."""


def _cluster_names(cluster: Mapping[str, Any]) -> ClusterNames:
    meta = cluster["metadata"]
    return ClusterNames(meta["name"], meta["namespace"])


def _config_map(cluster: Mapping[str, Any], names: ClusterNames,
                spec: BrokerClusterSpec) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _meta(names.config, names.namespace, cluster,
                              {LABEL_CLUSTER: names.cluster}),
            "data": {"server.properties": server_properties(spec)}}


def _ports(component: str) -> list[tuple[str, int]]:
    main = ("controller", CONTROLLER_PORT) if component == "controller" else ("kafka", KAFKA_PORT)
    return [main, ("admin", ADMIN_PORT), ("agent", AGENT_PORT)]


def _headless_service(cluster: Mapping[str, Any], names: ClusterNames, component: str,
                      name: str) -> dict[str, Any]:
    labels = cluster_labels(names.cluster, component)
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _meta(name, names.namespace, cluster, labels),
        "spec": {
            "clusterIP": "None",
            # DNS names must resolve while a broker is paused, partitioned or restarting.
            "publishNotReadyAddresses": True,
            "selector": labels,
            "ports": [{"name": port_name, "port": port, "targetPort": port_name}
                      for port_name, port in _ports(component)],
        },
    }


def _bootstrap_service(cluster: Mapping[str, Any], names: ClusterNames) -> dict[str, Any]:
    labels = cluster_labels(names.cluster, "broker")
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _meta(names.bootstrap, names.namespace, cluster, labels),
            "spec": {"type": "ClusterIP", "selector": labels,
                     "ports": [{"name": "kafka", "port": KAFKA_PORT, "targetPort": "kafka"}]}}


def _minibroker_args(names: ClusterNames, component: str) -> str:
    controller = f"{names.controller}-0.{names.controller}.{names.namespace}.svc"
    common = f"--data-dir {DATA_DIR} --metrics-port {ADMIN_PORT}"
    if component == "controller":
        return f"controller --listen 0.0.0.0:{CONTROLLER_PORT} {common}"
    advertised = f"$HOSTNAME.{names.brokers}.{names.namespace}.svc:{KAFKA_PORT}"
    return (f"broker --id ${{HOSTNAME##*-}} --listen 0.0.0.0:{KAFKA_PORT} "
            f"--controller {controller}:{CONTROLLER_PORT} {common} "
            f"--advertised-listener {advertised}")


def _statefulset(cluster: Mapping[str, Any], names: ClusterNames, spec: BrokerClusterSpec,
                 images: Images, settings: JobSettings, component: str,
                 replicas: int) -> dict[str, Any]:
    name = names.controller if component == "controller" else names.brokers
    labels = cluster_labels(names.cluster, component)
    launcher = _LAUNCHER.format(config_dir=CONFIG_DIR, hold_file=HOLD_FILE,
                                role=_minibroker_args(names, component))
    minibroker = {
        "name": "minibroker",
        "image": spec.image,
        "imagePullPolicy": images.pull_policy,
        "command": ["sh", "-c", launcher],
        "env": [_secret_env(FAILPOINT_TOKEN_ENV, names.secret, FAILPOINT_TOKEN_KEY),
                {"name": "PYTHONUNBUFFERED", "value": "1"}],
        "ports": [{"name": port_name, "containerPort": port}
                  for port_name, port in _ports(component)[:2]],
        # Readiness only: a liveness probe would restart a broker the experiment paused.
        "readinessProbe": {"httpGet": {"path": "/v1/state", "port": "admin"},
                           "periodSeconds": 2, "timeoutSeconds": 1, "failureThreshold": 2},
        "securityContext": _restricted(),
        "volumeMounts": [{"name": "data", "mountPath": DATA_DIR},
                         {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"},
                         {"name": "fault-hold", "mountPath": HOLD_DIR, "readOnly": True}],
    }
    if spec.resources is not None:
        minibroker["resources"] = spec.resources.model_dump(exclude_none=True)
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": names.config}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "agent-run", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        {"name": "fault-hold", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
    ]
    body: dict[str, Any] = {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": _meta(name, names.namespace, cluster, labels),
        "spec": {
            "serviceName": name,
            "replicas": replicas,
            "podManagementPolicy": "Parallel",
            # The operator restarts every pod itself (rollout.py): the controller while the
            # brokers are ready, brokers never below min.insync.replicas.
            "updateStrategy": {"type": "OnDelete"},
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": {**MANAGED_BY, **labels},
                             "annotations": {ANNOTATION_CONFIG_HASH: config_hash(spec)}},
                "spec": {
                    "shareProcessNamespace": True,
                    "enableServiceLinks": False,
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": 10,
                    "securityContext": {"fsGroup": BROKER_UID,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [minibroker, fault_agent_container(names, images, settings)],
                    "volumes": volumes,
                },
            },
        },
    }
    size = _data_volume_size(spec, component)
    if size is not None:
        body["spec"]["volumeClaimTemplates"] = [{
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data", "labels": {**MANAGED_BY, **labels}},
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": size}}},
        }]
        body["spec"]["persistentVolumeClaimRetentionPolicy"] = {
            "whenDeleted": "Delete", "whenScaled": "Delete"}
    else:
        volumes.append({"name": "data", "emptyDir": {"sizeLimit": str(spec.storage.size)}})
    return body


def _data_volume_size(spec: BrokerClusterSpec, component: str) -> str | None:
    """The PersistentVolumeClaim size of a component's data volume; None: an emptyDir.

    The controller's metadata (registrations, partition leaders, epochs and ISRs) is always
    on a claim: an emptyDir would be wiped by every restart of its pod, an operator upgrade
    included, and every broker would find a controller that knows no topic. Brokers follow
    ``spec.storage``.
    """
    if component == "controller":
        return CONTROLLER_STORAGE
    return str(spec.storage.size) if spec.storage.type == "persistent" else None


def storage_change(current: Mapping[str, Any] | None, spec: BrokerClusterSpec) -> str | None:
    """Why ``spec`` cannot be applied to the brokers' existing StatefulSet, or None.

    A StatefulSet's volumeClaimTemplates are immutable: the API server answers 422 to a
    change of storage type (the pod template would mount a volume the StatefulSet no
    longer has), and a new persistent size would never reach the existing claims.
    """
    if current is None:
        return None
    templates = current.get("spec", {}).get("volumeClaimTemplates") or []
    claim = next((t for t in templates if t.get("metadata", {}).get("name") == "data"), None)
    current_type = "persistent" if claim is not None else "ephemeral"
    if current_type != spec.storage.type:
        return (f"spec.storage.type: cannot change from {current_type} to "
                f"{spec.storage.type} on an existing cluster (StatefulSet volume claims are "
                f"immutable); delete and recreate the BrokerCluster")
    if claim is not None:
        size = claim.get("spec", {}).get("resources", {}).get("requests", {}).get("storage")
        if size is not None and str(size) != str(spec.storage.size):
            return (f"spec.storage.size: cannot change from {size} to {spec.storage.size} "
                    f"on persistent storage (StatefulSet volume claims are immutable); "
                    f"delete and recreate the BrokerCluster")
    return None


def fault_agent_container(names: ClusterNames, images: Images,
                          settings: JobSettings) -> dict[str, Any]:
    """The sidecar that pauses and kills the broker and cuts its links; the only one with
    NET_ADMIN.

    It runs as root because Linux grants added capabilities to root processes only; it
    drops every capability but NET_ADMIN (iptables) and KILL (signals to the broker's
    user), cannot escalate, and its root file system is read-only.
    """
    return {
        "name": "fault-agent",
        "image": images.operator,
        "imagePullPolicy": images.pull_policy,
        "command": ["python", "-m", "undertow.kube.agent", "--listen",
                    f"0.0.0.0:{AGENT_PORT}", "--target", "minibroker",
                    "--hold-file", HOLD_FILE],
        "env": [_secret_env(AGENT_TOKEN_ENV, names.secret, AGENT_TOKEN_KEY)],
        "ports": [{"name": "agent", "containerPort": AGENT_PORT}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "agent"},
                           "periodSeconds": 5},
        "resources": dict(settings.agent_resources),
        "securityContext": {
            "runAsUser": 0, "runAsNonRoot": False, "privileged": False,
            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN", "KILL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        # iptables takes its lock in /run; a kill holds the broker down through fault-hold.
        "volumeMounts": [{"name": "agent-run", "mountPath": "/run"},
                         {"name": "fault-hold", "mountPath": HOLD_DIR}],
    }


# ---- ChaosExperiment ------------------------------------------------------------------------


def inline_cluster(experiment: Mapping[str, Any]) -> dict[str, Any]:
    """The BrokerCluster of an experiment with ``cluster.inline``, named after it."""
    meta = experiment["metadata"]
    return {"apiVersion": API_VERSION, "kind": "BrokerCluster",
            "metadata": _meta(meta["name"], meta["namespace"], experiment,
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
    names = _experiment_names(experiment)
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
        "metadata": _meta(names.history, names.namespace, experiment, labels),
        "spec": {"accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": settings.history_size}}},
    }
    if settings.storage_class:
        pvc["spec"]["storageClassName"] = settings.storage_class
    return [
        *_account(experiment, names.runner, runner_rules),
        *_account(experiment, names.analysis, analysis_rules),
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": _meta(names.spec, names.namespace, experiment, labels),
         "data": {EXPERIMENT_FILE: experiment_file(experiment, cluster)}},
        pvc,
        report_config_map(experiment),
    ]


def report_config_map(experiment: Mapping[str, Any]) -> dict[str, Any]:
    names = _experiment_names(experiment)
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _meta(names.report, names.namespace, experiment,
                              {LABEL_EXPERIMENT: names.experiment}),
            "data": {}}


def _experiment_names(experiment: Mapping[str, Any]) -> ExperimentNames:
    meta = experiment["metadata"]
    return ExperimentNames(meta["name"], meta["namespace"])


def _account(owner: Mapping[str, Any], name: str,
             rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A ServiceAccount bound to a Role with exactly ``rules``."""
    namespace = owner["metadata"]["namespace"]
    labels = {LABEL_EXPERIMENT: owner["metadata"]["name"]}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": _meta(name, namespace, owner, labels)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": _meta(name, namespace, owner, labels), "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": _meta(name, namespace, owner, labels),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]},
    ]


def _job(experiment: Mapping[str, Any], name: str, component: str,
         containers: list[dict[str, Any]], volumes: list[dict[str, Any]],
         deadline_s: int | None,
         init_containers: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    names = _experiment_names(experiment)
    labels = {LABEL_EXPERIMENT: names.experiment, LABEL_COMPONENT: component}
    for container in [*(init_containers or []), *containers]:
        container["securityContext"] = _restricted()
        container["volumeMounts"] = [*container.get("volumeMounts", []),
                                     {"name": "tmp", "mountPath": "/tmp"}]
    pod: dict[str, Any] = {
        "serviceAccountName": name,
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        # Time for the runner to heal every fault when the Job is deleted.
        "terminationGracePeriodSeconds": 60,
        "securityContext": _pod_security(),
        "containers": containers,
        "volumes": [*volumes, {"name": "tmp", "emptyDir": {}}],
    }
    if init_containers:
        pod["initContainers"] = init_containers
    spec: dict[str, Any] = {
        "backoffLimit": 0,
        "template": {"metadata": {"labels": {**MANAGED_BY, **labels}}, "spec": pod},
    }
    if deadline_s is not None:
        spec["activeDeadlineSeconds"] = deadline_s
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": _meta(name, names.namespace, experiment, labels), "spec": spec}


def _history_volume(names: ExperimentNames) -> dict[str, Any]:
    return {"name": "history", "persistentVolumeClaim": {"claimName": names.history}}


def runner_job(experiment: Mapping[str, Any], cluster_name: str, seed: int,
               duration_s: float, images: Images, settings: JobSettings) -> dict[str, Any]:
    """The Job that runs the workload and the nemesis (``python -m undertow.kube.jobs run``)."""
    names = _experiment_names(experiment)
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
            _secret_env(FAILPOINT_TOKEN_ENV, secret, FAILPOINT_TOKEN_KEY),
            _secret_env(AGENT_TOKEN_ENV, secret, AGENT_TOKEN_KEY),
        ],
        "resources": dict(settings.runner_resources),
        "volumeMounts": [{"name": "history", "mountPath": HISTORY_DIR},
                         {"name": "spec", "mountPath": EXPERIMENT_DIR, "readOnly": True}],
    }
    volumes = [_history_volume(names), {"name": "spec", "configMap": {"name": names.spec}}]
    deadline = int(duration_s) + settings.run_margin_s
    return _job(experiment, names.runner, "runner", [container], volumes, deadline)


def analysis_job(experiment: Mapping[str, Any], images: Images,
                 settings: JobSettings) -> dict[str, Any]:
    """The Job that checks the history and publishes the report, in two steps.

    The analysis image holds PySpark and the analysis only, so the check runs there as an
    init container (``python -m undertow_analysis``, exit 2 on a bad history fails the
    Job); the operator image, which has the Kubernetes client, then patches the report into
    the report ConfigMap (``python -m undertow.kube.jobs publish``).
    """
    names = _experiment_names(experiment)
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
