"""The operator's pods on podman: what ``make e2e-pods`` runs below a Kubernetes API server.

``ClusterOnPods`` renders a BrokerCluster and a ChaosExperiment with the operator's own
builders (``cluster_objects.py``, ``experiment_objects.py``), turns the StatefulSets' pod
templates and the Jobs' pod templates into Pods, and runs them with ``podman kube play`` on
an ``--internal`` podman network. No container spec is written here: when the operator's
templates change, this runs the new ones. What ``kube play`` lacks is bridged, and only
that:

- ordinal pod names, ``hostname``, and every Service name the pods use, through fixed
  addresses (one ``--ip`` per pod) and ``hostAliases`` (aardvark-dns resolves only
  ``NAME.dns.podman``);
- environment variables from fieldRefs (``metadata.name``, ``status.podIP``, ...), resolved
  to the pod's values; Secret keys through a podman secret holding the Secret's data;
- emptyDirs become what Kubernetes makes of them: a fresh world-writable directory per pod
  (here on the host), which outlives container restarts and goes with the pod (``kube
  play``'s own volumes are shared by name between pods, and owned by the first container
  that mounts them); the controller's volume claim becomes a named volume; the history
  volume is a directory on the host;
- container ports are dropped (``kube play`` publishes each on the host) and probes get
  numeric ports.

``podman_api.PodmanApi`` answers the few API-server requests the runner and the analysis
Job make (the pods as the kubelet would report them, Events, the report ConfigMap) from
podman's state, on the network's gateway address, where a kubeconfig in each Job pod
points. A DELETE of a cluster pod (the ``pod-delete`` fault) is what the StatefulSet
controller makes of it: the pod is removed with its grace period, its emptyDirs with it,
and a new pod (a new uid) is played from the same template. It keeps its address, since
every pod's ``hostAliases`` name the old one (Kubernetes' DNS would follow the new IP).
"""

from __future__ import annotations

import base64
import copy
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from interrupted_runs import OWNER_LABEL, reap_interrupted_runs, this_owner
from podman_api import NAMESPACE, PodmanApi, podman

from undertow.kube.cluster_objects import ClusterNames, cluster_objects, fault_secret
from undertow.kube.experiment_objects import (
    ExperimentNames,
    analysis_job,
    experiment_setup,
    runner_job,
)
from undertow.kube.objects import Images, JobSettings
from undertow.spec import BrokerCluster

KUBECONFIG_DIR = "/etc/undertow-kube"


# ---- pods from the operator's templates ------------------------------------------------------


def pod_from_template(name: str, template: Mapping[str, Any], *, ip: str,
                      hosts: Mapping[str, list[str]], empty_dirs: Path,
                      claims: Sequence[str] = (),
                      host_paths: Mapping[str, Path] | None = None) -> dict[str, Any]:
    """A Pod from a pod template, as the StatefulSet or Job controller would create it,
    with what ``kube play`` needs (see the module docstring); its emptyDirs go under
    ``empty_dirs``."""
    spec = copy.deepcopy(dict(template["spec"]))
    values = {"metadata.name": name, "metadata.namespace": NAMESPACE, "status.podIP": ip,
              "spec.nodeName": "podman"}
    volumes = []
    for volume in spec.get("volumes", []):
        volume = dict(volume)
        if "emptyDir" in volume:
            directory = empty_dirs / name / volume["name"]
            directory.mkdir(parents=True, exist_ok=True)
            directory.chmod(0o777)  # as the kubelet makes an emptyDir
            volume = {"name": volume["name"],
                      "hostPath": {"path": str(directory), "type": "Directory"}}
        elif volume["name"] in (host_paths or {}):
            volume = {"name": volume["name"], "hostPath": {
                "path": str((host_paths or {})[volume["name"]]), "type": "Directory"}}
        volumes.append(volume)
    for claim in claims:  # a StatefulSet's volumeClaimTemplates: one claim per pod
        volumes.append({"name": claim,
                        "persistentVolumeClaim": {"claimName": f"{claim}-{name}"}})
    spec["volumes"] = volumes
    for key in ("containers", "initContainers"):
        for container in spec.get(key, []):
            ports = {p["name"]: p["containerPort"] for p in container.pop("ports", [])
                     if "name" in p}
            for probe in ("readinessProbe", "livenessProbe"):
                http = (container.get(probe) or {}).get("httpGet")
                if http and isinstance(http.get("port"), str):
                    http["port"] = ports[http["port"]]
            for env in container.get("env", []):
                path = ((env.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
                if path is not None:
                    if path not in values:
                        raise AssertionError(f"{name}: no value for fieldRef {path}")
                    env.pop("valueFrom")
                    env["value"] = values[path]
    spec["hostname"] = name
    spec.pop("subdomain", None)
    spec.pop("serviceAccountName", None)
    spec["hostAliases"] = [{"ip": address, "hostnames": names}
                           for address, names in sorted(hosts.items())]
    labels = dict((template.get("metadata") or {}).get("labels") or {})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels}, "spec": spec}


class ClusterOnPods:
    """A BrokerCluster's pods and an experiment's Jobs on one internal podman network."""

    def __init__(self, cluster: Mapping[str, Any], experiment: Mapping[str, Any],
                 images: Images, work: Path) -> None:
        self.run_id = uuid.uuid4().hex[:6]
        self.cluster = self._stored(cluster)
        self.experiment = self._stored(experiment)
        self.images = images
        self.settings = JobSettings()
        self.work = work
        self.names = ClusterNames(self.cluster["metadata"]["name"], NAMESPACE)
        self.experiment_names = ExperimentNames(self.experiment["metadata"]["name"], NAMESPACE)
        self.spec = BrokerCluster.model_validate(
            {k: self.cluster[k] for k in ("apiVersion", "kind", "metadata", "spec")}).spec
        self.network = f"undertow-e2e-{self.run_id}"
        self.owner = this_owner()
        self.subnet = ""
        self.gateway = ""
        self.tokens = {"failpoint-token": uuid.uuid4().hex, "agent-token": uuid.uuid4().hex}
        self.secret = fault_secret(self.cluster, self.tokens["failpoint-token"],
                                   self.tokens["agent-token"])
        self.pods: dict[str, str] = {}
        """Pod name -> IP, for everything played so far."""
        self.labels: dict[str, dict[str, str]] = {}
        self.api: PodmanApi | None = None
        self._played: list[Path] = []
        self._templates: dict[str, tuple[dict[str, Any], list[str]]] = {}
        """Cluster pod name -> (its StatefulSet's pod template, its claims)."""
        self._companions: list[dict[str, Any]] = []

    def _stored(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """What the API server would hold after ``kubectl apply``."""
        stored = copy.deepcopy(dict(body))
        stored["metadata"].update(namespace=NAMESPACE, uid=str(uuid.uuid4()))
        return stored

    # ---- addresses ----------------------------------------------------------------------

    def cluster_pod_names(self) -> list[str]:
        return [f"{self.names.controller}-0"] + [f"{self.names.brokers}-{i}"
                                                 for i in range(self.spec.brokers)]

    def hosts(self) -> dict[str, list[str]]:
        """Every cluster pod's address with the names Kubernetes' DNS would give it."""
        addresses = {name: f"{self.subnet}.{10 + i}"
                     for i, name in enumerate(self.cluster_pod_names())}
        hosts = {}
        for name, address in addresses.items():
            service = self.names.controller if "-controller-" in name else self.names.brokers
            fqdn = f"{name}.{service}.{NAMESPACE}.svc"
            hosts[address] = [fqdn, f"{fqdn}.cluster.local", name]
        return hosts

    # ---- lifecycle ----------------------------------------------------------------------

    def start_cluster(self) -> None:
        for removed in reap_interrupted_runs(self.cluster_pod_names()):
            print(f"e2e-pods: removed {removed}, left by an interrupted run")
        self.subnet = _free_subnet()
        self.gateway = f"{self.subnet}.1"
        podman("network", "create", "--internal", "--subnet", f"{self.subnet}.0/24",
               "--label", f"{OWNER_LABEL}={self.owner}", self.network)
        data = {key: base64.b64encode(value.encode()).decode()
                for key, value in self.tokens.items()}
        podman("secret", "rm", self.names.secret, check=False)  # left by an interrupted run
        podman("secret", "create", self.names.secret, "-", input=json.dumps(data))
        # The controller secret: a Secret of its own, which the runner never gets.
        podman("secret", "rm", self.names.controller_secret, check=False)
        podman("secret", "create", self.names.controller_secret, "-", input=json.dumps(
            {"controller-secret": base64.b64encode(uuid.uuid4().hex.encode() * 2).decode()}))
        objects = cluster_objects(self.cluster, self.spec, self.images, self.settings)
        config_map = next(o for o in objects if o["kind"] == "ConfigMap")
        hosts = self.hosts()
        ips = {name: address for address, names in hosts.items() for name in names[-1:]}
        self._companions = [self._companion(config_map)]
        documents: list[dict[str, Any]] = list(self._companions)
        for sts in (o for o in objects if o["kind"] == "StatefulSet"):
            claims = [c["metadata"]["name"] for c in sts["spec"].get("volumeClaimTemplates", [])]
            for ordinal in range(sts["spec"]["replicas"]):
                name = f"{sts['metadata']['name']}-{ordinal}"
                self._templates[name] = (sts["spec"]["template"], claims)
                documents.append(pod_from_template(name, sts["spec"]["template"],
                                                   ip=ips[name], hosts=hosts, claims=claims,
                                                   empty_dirs=self.work / "emptydir"))
                self.pods[name] = ips[name]
                self.labels[name] = documents[-1]["metadata"]["labels"]
        self._play("cluster", documents, [ips[d["metadata"]["name"]]
                                          for d in documents if d["kind"] == "Pod"])
        # On the gateway address, which exists once a pod is on the network.
        self.api = PodmanApi(self, self.gateway)
        self.api.start()

    def delete_pod(self, name: str, grace_period_s: int) -> bool:
        """The API server's DELETE and then the StatefulSet controller's answer to it: the
        pod stops (SIGTERM, SIGKILL after the grace period) and goes with its emptyDirs; a
        new pod from the same template replaces it, in the background, as on Kubernetes.
        False for a pod that is not the cluster's."""
        if name not in self._templates:
            return False
        podman("pod", "rm", "-f", "-t", str(grace_period_s), name, check=False)
        shutil.rmtree(self.work / "emptydir" / name, ignore_errors=True)
        threading.Thread(target=self._replace_pod, args=(name,), daemon=True).start()
        return True

    def _replace_pod(self, name: str) -> None:
        template, claims = self._templates[name]
        pod = pod_from_template(name, template, ip=self.pods[name], hosts=self.hosts(),
                                claims=claims, empty_dirs=self.work / "emptydir")
        self._play(f"{name}-replaced-{uuid.uuid4().hex[:4]}", [*self._companions, pod],
                   [self.pods[name]])

    def run_job(self, job: Mapping[str, Any], ip_suffix: int,
                companions: Sequence[dict[str, Any]] = (),
                timeout_s: float = 900) -> dict[str, int]:
        """Play a Job's pod (the history volume a host directory, a kubeconfig naming the
        API stand-in) and wait until it ends; the exit code of each of its containers."""
        name = f"{job['metadata']['name']}-{self.run_id}"
        ip = f"{self.subnet}.{ip_suffix}"
        template = copy.deepcopy(job["spec"]["template"])
        for key in ("containers", "initContainers"):
            for container in template["spec"].get(key, []):
                container.setdefault("env", []).append(
                    {"name": "KUBECONFIG", "value": f"{KUBECONFIG_DIR}/config"})
                container.setdefault("volumeMounts", []).append(
                    {"name": "kubeconfig", "mountPath": KUBECONFIG_DIR, "readOnly": True})
        template["spec"]["volumes"].append({"name": "kubeconfig"})
        pod = pod_from_template(name, template, ip=ip, hosts=self.hosts(),
                                empty_dirs=self.work / "emptydir",
                                host_paths={"history": self.history_dir,
                                            "kubeconfig": self.kubeconfig_dir})
        self.pods[name] = ip
        self.labels[name] = pod["metadata"]["labels"]
        self._play(name, [*map(self._companion, companions), pod], [ip])
        deadline = time.monotonic() + timeout_s
        init = [c["name"] for c in pod["spec"].get("initContainers", [])]
        main = [c["name"] for c in pod["spec"]["containers"]]
        while True:
            states = {c: self.container_state(name, c) for c in init + main}
            if any(states[c]["Status"] != "absent" for c in main):
                # podman removes init containers once they succeeded and the pod went on.
                for c in init:
                    if states[c]["Status"] == "absent":
                        states[c] = {"Status": "exited", "ExitCode": 0}
            if all(s["Status"] == "exited" for s in states.values()) or any(
                    s["Status"] == "exited" and s["ExitCode"] != 0 for s in states.values()):
                return {c: s["ExitCode"] for c, s in states.items() if s["Status"] == "exited"}
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} still running after {timeout_s}s: {states}")
            time.sleep(1)

    def run_experiment(self, seed: int) -> dict[str, int]:
        """The runner Job, exactly as the operator renders it."""
        setup = experiment_setup(self.experiment, self.cluster, self.names.cluster,
                                 self.spec.brokers, self.settings)
        spec_map = next(o for o in setup if o["kind"] == "ConfigMap"
                        and o["metadata"]["name"] == self.experiment_names.spec)
        self.api.objects["ConfigMap"].update(
            {o["metadata"]["name"]: o for o in setup if o["kind"] == "ConfigMap"})
        duration = float(self.experiment["spec"]["workload"]["duration"].rstrip("s"))
        job = runner_job(self.experiment, self.names.cluster, seed, duration, self.images,
                         self.settings)
        return self.run_job(job, 50, [spec_map])

    def run_analysis(self) -> dict[str, int]:
        job = analysis_job(self.experiment, self.images, self.settings)
        return self.run_job(job, 51)

    @property
    def history_dir(self) -> Path:
        path = self.work / "volume"
        if not path.exists():
            path.mkdir(parents=True)
            os.chown(path, 10001, 10001)
        return path

    @property
    def kubeconfig_dir(self) -> Path:
        path = self.work / "kube"
        if not path.exists():
            path.mkdir(parents=True)
            path.chmod(0o755)
            (path / "config").write_text(json.dumps({
                "apiVersion": "v1", "kind": "Config", "current-context": "podman",
                "clusters": [{"name": "podman", "cluster": {
                    "server": f"http://{self.gateway}:{self.api.port}"}}],
                "users": [{"name": "runner", "user": {}}],
                "contexts": [{"name": "podman",
                              "context": {"cluster": "podman", "user": "runner"}}]}))
            (path / "config").chmod(0o644)
        return path

    def _companion(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": obj["kind"],
                "metadata": {"name": obj["metadata"]["name"]}, "data": dict(obj["data"])}

    def _play(self, label: str, documents: Sequence[dict[str, Any]],
              ips: Sequence[str]) -> None:
        for document in documents:
            if document["kind"] == "Pod":
                document["metadata"]["labels"] = {**document["metadata"]["labels"],
                                                  OWNER_LABEL: self.owner}
        path = self.work / f"{label}.yaml"
        path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
        self._played.append(path)
        args = ["kube", "play", "--network", self.network]
        for ip in ips:
            args += ["--ip", ip]
        podman(*args, str(path))

    def stop(self) -> None:
        """Remove every pod, the volumes they used, the secrets and the network; never
        raises."""
        volumes: set[str] = set()
        for container in self._containers():
            mounts = podman("inspect", "--format", "{{range .Mounts}}{{.Name}} {{end}}",
                            container, check=False).stdout.split()
            volumes.update(mounts)
        for path in reversed(self._played):
            podman("kube", "down", str(path), check=False, timeout=120)
        for pod in self.pods:
            podman("pod", "rm", "-f", pod, check=False)
        if volumes:
            podman("volume", "rm", "-f", *sorted(volumes), check=False)
        podman("secret", "rm", self.names.secret, check=False)
        podman("secret", "rm", self.names.controller_secret, check=False)
        podman("network", "rm", "-f", self.network, check=False)
        if self.api is not None:
            self.api.stop()

    # ---- what the kubelet knows -----------------------------------------------------------

    def container_state(self, pod: str, container: str) -> dict[str, Any]:
        found = podman("inspect", "--format", "{{json .State}}|{{.RestartCount}}",
                       f"{pod}-{container}", check=False)
        if found.returncode != 0:
            return {"Status": "absent", "ExitCode": None, "RestartCount": 0}
        state, restarts = found.stdout.strip().rsplit("|", 1)
        return {**json.loads(state), "RestartCount": int(restarts or 0)}

    def _containers(self) -> list[str]:
        listing = podman("ps", "-a", "--format", "{{.Names}}", check=False).stdout.split()
        return [name for name in listing if any(name.startswith(f"{pod}-")
                                                for pod in self.pods)]

    def logs(self) -> Iterator[tuple[str, str]]:
        """(container, log) of every container played, for a failure's report."""
        for name in self._containers():
            result = podman("logs", name, check=False)
            yield name, result.stdout + result.stderr


def _free_subnet() -> str:
    """A 10.213.N.0/24 no podman network uses yet."""
    used = podman("network", "ls", "--format", "{{range .Subnets}}{{.Subnet}} {{end}}",
                  check=False).stdout
    for n in range(20, 250):
        if f"10.213.{n}.0/24" not in used:
            return f"10.213.{n}"
    raise AssertionError("no free 10.213.N.0/24 subnet for the pods' network")
