"""The Kubernetes objects behind a BrokerCluster, as pure functions.

A BrokerCluster ``C`` in namespace ``NS`` becomes:

- ``C-controller``: StatefulSet (1 replica) and headless Service; pod ``C-controller-0``;
- ``C-broker``: StatefulSet (N replicas, ``OnDelete`` updates so that the operator restarts
  brokers itself, one at a time, see ``rollout.py``) and headless Service; pod
  ``C-broker-I`` is broker id I (its ordinal), reachable at ``C-broker-I.C-broker.NS.svc``;
- ``C-bootstrap``: the client Service (Kafka port of every broker);
- ``C-config``: ConfigMap with ``server.properties`` (Kafka-style ``key=value`` lines);
- ``C-faults``: Secret with the failpoint and fault agent tokens (created once);
- ``C-controller-auth``: Secret with the controller secret (created once), which the
  controller and every broker get as ``$MINIBROKER_CONTROLLER_SECRET``: the controller
  serves only peers that prove they hold it (minibroker's ``rpc_auth``, as Kafka's
  controller listener takes SASL, KIP-631); the runner never needs it;
- ``C-network``: NetworkPolicy: anyone reaches the Kafka port; only the cluster's own pods,
  the runner Job of an experiment on the cluster and the operator reach the controller,
  admin (failpoints) and fault agent ports.

Every broker and controller pod also runs the fault agent (``agent/``): the pod shares
its process namespace so the agent can signal the broker, and only the agent container has
NET_ADMIN (iptables in the pod's network namespace) and KILL. The names, ports and token
variables defined here are also how the runner's platform (``platform.py``) finds and
reaches the cluster's pods. Everything carries an owner reference to the cluster, so
deleting the cluster deletes it all.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from undertow.kube.objects import (
    BROKER_UID,
    LABEL_COMPONENT,
    MANAGED_BY,
    Images,
    JobSettings,
    object_meta,
    restricted,
    secret_env,
)
from undertow.platform.base import CONTROLLER, broker_id_of, broker_node
from undertow.spec.cluster import DEFAULT_IMAGE, BrokerClusterSpec

KAFKA_PORT = 9092
CONTROLLER_PORT = 9093
ADMIN_PORT = 9100
AGENT_PORT = 9200

LABEL_CLUSTER = "undertow.dev/cluster"
LABEL_REVISION = "controller-revision-hash"
"""Set by the StatefulSet controller on each pod: the revision the pod was created from."""
ANNOTATION_CONFIG_HASH = "undertow.dev/config-hash"
ANNOTATION_LOCK = "undertow.dev/locked-by"
"""On a BrokerCluster: the experiment running against it (no rolling restart meanwhile)."""

FAILPOINT_TOKEN_KEY = "failpoint-token"
AGENT_TOKEN_KEY = "agent-token"
FAILPOINT_TOKEN_ENV = "MINIBROKER_FAILPOINT_TOKEN"
AGENT_TOKEN_ENV = "UNDERTOW_AGENT_TOKEN"
CONTROLLER_SECRET_KEY = "controller-secret"
CONTROLLER_SECRET_ENV = "MINIBROKER_CONTROLLER_SECRET"
"""Where minibroker reads the controller secret (``minibroker.rpc_auth.SECRET_ENV``)."""

LABEL_TARGET_CLUSTER = "undertow.dev/target-cluster"
"""On a runner Job's pod: the cluster it runs against, whose NetworkPolicy admits it. Not
``LABEL_CLUSTER``, which names the cluster's own pods."""
OPERATOR_POD_LABELS = {"app.kubernetes.io/name": "undertow-operator"}
"""The operator's pods, as manifests/ and the Helm chart label them."""
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
"""Set by the API server on every namespace (Kubernetes 1.22+)."""

DATA_DIR = "/var/lib/minibroker"
HOLD_DIR = "/run/undertow"
HOLD_FILE = f"{HOLD_DIR}/hold"
"""Shared by the broker and its fault agent: how long a killed broker stays down."""
PID_DIR = "/run/minibroker"
PID_FILE = f"{PID_DIR}/broker.pid"
"""Written by the broker's launcher, read by its fault agent: the one process the agent
may stop or kill (``agent/processes.py``)."""
CONTROLLER_STORAGE = "256Mi"
"""The controller's metadata volume (a few KB of fsynced JSON per cluster)."""
CONFIG_DIR = "/etc/minibroker"

# Defines record_pid FILE: writes "PID START" into FILE, atomically, for this shell (its pid
# and its start time, field 22 of /proc/PID/stat, after the command name in parentheses).
# A subshell function: $$ is still the launcher's pid, and its "set --" changes nothing
# outside. The launcher then execs the broker, which keeps both, and the fault agent
# signals that process and no other (agent/processes.py).
RECORD_PID = """record_pid() (
  file=$1
  set -- $(sed 's/.*) //' /proc/$$/stat)
  shift 19
  printf '%s %s\\n' "$$" "$1" > "$file.tmp"
  mv -f "$file.tmp" "$file"
)
"""

# Waits while a kill holds the broker down (the fault agent's hold file: a deadline in
# seconds since the epoch; see agent/hold.py), records its pid for the agent, reads
# server.properties into repeated --config flags, then execs minibroker so that the broker
# is the container's main process (signals reach it) with the recorded pid.
_LAUNCHER = """set -eu
while [ -f {hold_file} ] && [ "$(date +%s)" -lt "$(cat {hold_file} 2>/dev/null || echo 0)" ]; do
  sleep 0.2
done
""" + RECORD_PID + """record_pid {pid_file}
set --
while IFS= read -r line || [ -n "$line" ]; do
  case "$line" in ''|'#'*) continue ;; esac
  set -- "$@" --config "$line"
done < {config_dir}/server.properties
exec minibroker {role} "$@"
"""


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

    @property
    def controller_secret(self) -> str:
        """The Secret holding the controller secret (not the runner's to read)."""
        return f"{self.cluster}-controller-auth"

    @property
    def network_policy(self) -> str:
        return f"{self.cluster}-network"

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


def cluster_names(cluster: Mapping[str, Any]) -> ClusterNames:
    """The names of the BrokerCluster object ``cluster``."""
    return ClusterNames(cluster["metadata"]["name"], cluster["metadata"]["namespace"])


def cluster_labels(cluster: str, component: str) -> dict[str, str]:
    """The selector labels of one component (``controller`` or ``broker``) of a cluster."""
    return {"app.kubernetes.io/name": "minibroker", "app.kubernetes.io/instance": cluster,
            LABEL_CLUSTER: cluster, LABEL_COMPONENT: component}



def server_properties(spec: BrokerClusterSpec) -> str:
    """The cluster's config as Kafka's ``server.properties`` lines (keys sorted)."""
    overrides = spec.config.as_overrides()
    return "".join(f"{key}={value}\n" for key, value in sorted(overrides.items()))


def config_hash(spec: BrokerClusterSpec) -> str:
    """Changes when the brokers must restart to pick up a new configuration."""
    return hashlib.sha256(server_properties(spec).encode()).hexdigest()[:16]


def fault_secret(cluster: Mapping[str, Any], failpoint_token: str,
                 agent_token: str) -> dict[str, Any]:
    names = cluster_names(cluster)
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": object_meta(names.secret, names.namespace, cluster,
                                    {LABEL_CLUSTER: names.cluster}),
            "data": {FAILPOINT_TOKEN_KEY: _b64(failpoint_token),
                     AGENT_TOKEN_KEY: _b64(agent_token)}}


def controller_secret(cluster: Mapping[str, Any], secret: str) -> dict[str, Any]:
    """The Secret with the cluster's controller secret (Kafka keeps its controller
    listener's SASL credentials apart from anything clients use)."""
    names = cluster_names(cluster)
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": object_meta(names.controller_secret, names.namespace, cluster,
                                    {LABEL_CLUSTER: names.cluster}),
            "data": {CONTROLLER_SECRET_KEY: _b64(secret)}}


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


_DEFAULT_SETTINGS = JobSettings()


def cluster_objects(cluster: Mapping[str, Any], spec: BrokerClusterSpec, images: Images,
                    settings: JobSettings = _DEFAULT_SETTINGS,
                    broker_replicas: int | None = None,
                    operator_namespace: str | None = None) -> list[dict[str, Any]]:
    """NetworkPolicy, ConfigMap, Services and StatefulSets of a BrokerCluster (not its
    Secrets, which are made once).

    ``broker_replicas`` overrides ``spec.brokers`` while a scale-down waits to be safe;
    ``operator_namespace`` is where the operator's pods are (None: the cluster's).
    """
    names = cluster_names(cluster)
    return [
        network_policy(cluster, operator_namespace),
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


def network_policy(cluster: Mapping[str, Any],
                   operator_namespace: str | None = None) -> dict[str, Any]:
    """Who may reach the cluster's pods, and on which ports.

    Kafka's listeners split the same way: clients reach the Kafka port (brokers replicate
    over it too), while the controller listener (KIP-631), the admin endpoint (its
    failpoints) and the fault agent are the control plane's. Those admit only the cluster's
    own pods, the runner Job of an experiment on the cluster (its fault primitives and
    ``/v1/state``) and the operator (readiness, rolling restarts, healing); the secret and
    tokens still guard each of them. The kubelet's probes come from the node, which a
    NetworkPolicy always admits; partitions are the agents' iptables rules inside the pods,
    which a policy does not touch. Egress stays open: DNS, the peers, the API server.
    """
    names = cluster_names(cluster)
    own = {LABEL_CLUSTER: names.cluster}
    operator: dict[str, Any] = {"podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)}}
    if operator_namespace is not None:
        operator["namespaceSelector"] = {
            "matchLabels": {NAMESPACE_NAME_LABEL: operator_namespace}}
    runner = {LABEL_COMPONENT: "runner", LABEL_TARGET_CLUSTER: names.cluster}
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": object_meta(names.network_policy, names.namespace, cluster, own),
        "spec": {
            "podSelector": {"matchLabels": own},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"ports": [{"protocol": "TCP", "port": KAFKA_PORT}]},
                {"from": [{"podSelector": {"matchLabels": own}},
                          {"podSelector": {"matchLabels": runner}},
                          operator],
                 "ports": [{"protocol": "TCP", "port": port}
                           for port in (CONTROLLER_PORT, ADMIN_PORT, AGENT_PORT)]},
            ],
        },
    }


def _config_map(cluster: Mapping[str, Any], names: ClusterNames,
                spec: BrokerClusterSpec) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": object_meta(names.config, names.namespace, cluster,
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
        "metadata": object_meta(name, names.namespace, cluster, labels),
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
            "metadata": object_meta(names.bootstrap, names.namespace, cluster, labels),
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
    launcher = _LAUNCHER.format(config_dir=CONFIG_DIR, hold_file=HOLD_FILE, pid_file=PID_FILE,
                                role=_minibroker_args(names, component))
    minibroker = {
        "name": "minibroker",
        "image": images.broker if spec.image == DEFAULT_IMAGE else spec.image,
        "imagePullPolicy": images.pull_policy,
        "command": ["sh", "-c", launcher],
        "env": [secret_env(FAILPOINT_TOKEN_ENV, names.secret, FAILPOINT_TOKEN_KEY),
                secret_env(CONTROLLER_SECRET_ENV, names.controller_secret,
                           CONTROLLER_SECRET_KEY),
                {"name": "PYTHONUNBUFFERED", "value": "1"}],
        "ports": [{"name": port_name, "containerPort": port}
                  for port_name, port in _ports(component)[:2]],
        # Readiness only: a liveness probe would restart a broker the experiment paused.
        "readinessProbe": {"httpGet": {"path": "/v1/state", "port": "admin"},
                           "periodSeconds": 2, "timeoutSeconds": 1, "failureThreshold": 2},
        "securityContext": restricted(),
        "volumeMounts": [{"name": "data", "mountPath": DATA_DIR},
                         {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"},
                         {"name": "fault-hold", "mountPath": HOLD_DIR, "readOnly": True},
                         {"name": "broker-pid", "mountPath": PID_DIR}],
    }
    if spec.resources is not None:
        minibroker["resources"] = spec.resources.model_dump(exclude_none=True)
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": names.config}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "agent-run", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        {"name": "fault-hold", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        {"name": "broker-pid", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
    ]
    body: dict[str, Any] = {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": object_meta(name, names.namespace, cluster, labels),
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
                    "--pid-file", PID_FILE, "--hold-file", HOLD_FILE],
        "env": [secret_env(AGENT_TOKEN_ENV, names.secret, AGENT_TOKEN_KEY)],
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
        # iptables takes its lock in /run; a kill holds the broker down through fault-hold;
        # broker-pid says which process the broker is (its launcher writes it).
        "volumeMounts": [{"name": "agent-run", "mountPath": "/run"},
                         {"name": "fault-hold", "mountPath": HOLD_DIR},
                         {"name": "broker-pid", "mountPath": PID_DIR, "readOnly": True}],
    }

