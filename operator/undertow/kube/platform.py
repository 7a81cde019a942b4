"""The Kubernetes platform: the runner's faults on a BrokerCluster the operator deployed.

- kill: the fault agent in the pod SIGKILLs the broker in place, as the local platform
  does (Kafka's hard bounce): no clean shutdown, and its container restarts under the
  pod's restart policy with the same IP and the same volumes, held down until ``restart``
  releases it (or the fault's deadline passes); ``restart`` then waits for it to be ready
  and serving again;
- pause and partition: the fault agent in the pod (SIGSTOP/SIGCONT; iptables DROP in the
  pod's network namespace, peers addressed by pod IP, the clients by the runner pod's IP);
- disk stall and power loss: the broker's failpoint endpoint, with the token from the
  cluster's Secret (the runner Job gets it as an environment variable);
- ``state``: the pod's ``/v1/state`` through its stable DNS name.

Every fault the agent applies carries a deadline (``fault_deadline_s``: the experiment's
longest fault plus a margin), so it heals even if this process dies. Each injection and
recovery is also a Kubernetes Event on the ChaosExperiment (``kubectl describe uce``).

The platform never creates or deletes the cluster: ``start`` waits for it to be ready,
``stop`` heals every fault and leaves it running.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from undertow.kube.agent import AgentClient
from undertow.kube.api import ApiError, KubeApi
from undertow.kube.pods import PodView, pod_view
from undertow.kube.resources import (
    ADMIN_PORT,
    AGENT_PORT,
    AGENT_TOKEN_ENV,
    AGENT_TOKEN_KEY,
    FAILPOINT_TOKEN_ENV,
    FAILPOINT_TOKEN_KEY,
    KAFKA_PORT,
    ClusterNames,
)
from undertow.platform.admin import AdminClient
from undertow.platform.base import (
    CLIENT,
    Link,
    Platform,
    PlatformError,
    wait_for,
)
from undertow.platform.control import EndpointError, EndpointRefused, EndpointUnreachable
from undertow.spec import LoadedExperiment
from undertow.spec.meta import API_VERSION

log = logging.getLogger("undertow.kube.platform")

DEADLINE_MARGIN_S = 15.0


@dataclass(frozen=True)
class Endpoints:
    """How the runner reaches a pod: ``host_template`` gets ``pod``, ``service`` and
    ``namespace`` (a test points it at loopback)."""

    host_template: str = "{pod}.{service}.{namespace}.svc"
    kafka_port: int = KAFKA_PORT
    admin_port: int = ADMIN_PORT
    agent_port: int = AGENT_PORT


@dataclass(frozen=True)
class KubernetesPlatformConfig:
    namespace: str
    cluster: str
    brokers: int
    failpoint_token: str
    agent_token: str
    fault_deadline_s: float = 300.0
    """How long any agent-applied fault may last if nobody recovers it."""
    client_ip: str | None = None
    """The runner pod's IP: where the workload's clients connect from."""
    experiment: str | None = None
    experiment_uid: str | None = None
    """The ChaosExperiment the fault Events are about (none posted without it)."""
    reporter: str = "undertow-runner"
    endpoints: Endpoints = Endpoints()
    start_timeout_s: float = 300.0
    poll_s: float = 0.25

    def __post_init__(self) -> None:
        if self.brokers < 1:
            raise PlatformError(f"brokers: must be positive, got {self.brokers}")
        if self.fault_deadline_s <= 0:
            raise PlatformError(f"fault_deadline_s: must be positive, got "
                                f"{self.fault_deadline_s}")


def longest_fault_s(loaded: LoadedExperiment) -> float:
    """The longest duration any planned fault of the experiment can have."""
    longest = 0.0
    for entry in loaded.experiment.spec.faults:
        if entry.duration is not None:
            longest = max(longest, entry.duration)
        for step in entry.sequence.steps if entry.sequence else ():
            longest = max(longest, step.duration or 0.0)
        if entry.random is not None:
            longest = max(longest, entry.random.duration.max)
    return longest


class KubernetesPlatform(Platform):
    """A running BrokerCluster's pods, driven through the API server, agents and failpoints."""

    def __init__(self, config: KubernetesPlatformConfig, api: KubeApi) -> None:
        super().__init__()
        self.config = config
        self.api = api
        self.names = ClusterNames(config.cluster, config.namespace)
        self._broker_ids = tuple(range(config.brokers))
        self._lock = threading.RLock()
        self._link_rules: dict[Link, tuple[str, str, str]] = {}
        self._down: dict[str, str] = {}
        self._paused: set[str] = set()
        self._stalled: set[str] = set()

    @classmethod
    def for_experiment(cls, loaded: LoadedExperiment, namespace: str, *,
                       api: KubeApi | None = None,
                       env: Mapping[str, str] = os.environ) -> KubernetesPlatform:
        """The platform of ``loaded``'s BrokerCluster in ``namespace``, as the runner Job
        (or ``undertow run --platform kubernetes``) uses it.

        Tokens come from ``$MINIBROKER_FAILPOINT_TOKEN`` and ``$UNDERTOW_AGENT_TOKEN`` when
        set (the runner Job's environment, from the cluster's Secret), else from the Secret.
        """
        api = api or KubeApi.from_environment()
        cluster = loaded.cluster.metadata.name
        failpoint, agent = env.get(FAILPOINT_TOKEN_ENV), env.get(AGENT_TOKEN_ENV)
        if not failpoint or not agent:
            failpoint, agent = read_tokens(api, ClusterNames(cluster, namespace))
        config = KubernetesPlatformConfig(
            namespace=namespace, cluster=cluster, brokers=loaded.cluster.spec.brokers,
            failpoint_token=failpoint, agent_token=agent,
            fault_deadline_s=longest_fault_s(loaded) + DEADLINE_MARGIN_S,
            client_ip=env.get("POD_IP") or None,
            experiment=loaded.experiment.metadata.name,
            experiment_uid=env.get("UNDERTOW_EXPERIMENT_UID") or None,
            reporter=env.get("POD_NAME") or "undertow-runner")
        return cls(config, api)

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Clear whatever an earlier run left, then wait until every pod is ready and every
        broker is registered with the controller, unfenced."""
        for node in self.nodes:
            self._wait_ready(node, self.config.start_timeout_s)
        for node in self.nodes:
            self._agent(node).heal()
        wait_for(self.all_brokers_unfenced, self.config.start_timeout_s,
                 "every broker to register with the controller, unfenced",
                 interval=0.5, ignore=(EndpointError,))

    def stop(self) -> None:
        """Heal every fault (the cluster keeps running: the operator owns it)."""
        errors: list[BaseException] = []
        try:
            self.heal()
        except Exception as exc:
            errors.append(exc)
        for node in self.nodes:
            try:
                self._agent(node).heal()
            except EndpointRefused as exc:
                errors.append(exc)
            except EndpointUnreachable:
                pass  # the pod, its rules and its processes are gone
        with self._links_lock:
            self._blocks.clear()
            self._link_rules.clear()
        if errors:
            raise PlatformError(f"healing the Kubernetes platform: {errors[0]}") from errors[0]

    # ---- names and addresses ----------------------------------------------------------------

    @property
    def broker_ids(self) -> tuple[int, ...]:
        return self._broker_ids

    def host(self, node: str) -> str:
        self.check_node(node)
        return self.config.endpoints.host_template.format(
            pod=self.names.pod(node), service=self.names.service(node),
            namespace=self.config.namespace)

    @property
    def bootstrap(self) -> str:
        port = self.config.endpoints.kafka_port
        return ",".join(f"{self.host(node)}:{port}" for node in self.brokers)

    def admin_url(self, node: str) -> str:
        return f"http://{self.host(node)}:{self.config.endpoints.admin_port}"

    def state(self, node: str) -> dict[str, Any]:
        return self._admin(node).state()

    def events(self, node: str, log_id: str | None, offset: int) -> dict[str, Any]:
        return self._admin(node).events(log_id, offset)

    def pod(self, node: str) -> PodView | None:
        """The node's pod now (None while it does not exist)."""
        body = self.api.get("Pod", self.config.namespace, self.names.pod(self.check_node(node)))
        return None if body is None else pod_view(body, self.names)

    # ---- processes --------------------------------------------------------------------------

    def kill(self, node: str) -> None:
        """SIGKILL the broker in its pod; return once it is dead. Its container restarts
        but the broker stays down until ``restart`` (at most ``fault_deadline_s``)."""
        try:
            self._agent(node).kill(self.config.fault_deadline_s)
        except EndpointError as exc:
            raise PlatformError(f"cannot kill {node}: {exc}") from exc
        with self._lock:
            self._down[node] = "kill"
        self._event("FaultInjected", f"kill {node}: SIGKILL in pod {self.names.pod(node)} "
                                     f"(held down for {self.config.fault_deadline_s:g}s at "
                                     "the latest)")

    def restart(self, node: str) -> None:
        """Release a killed broker (its container starts it again), then wait until the
        node serves again; a power loss or a pod restart needs only the waiting."""
        with contextlib.suppress(EndpointUnreachable):  # the pod is gone, its hold with it
            self._agent(node).release()
        self._wait_ready(node, self.config.start_timeout_s)
        wait_for(lambda: self.state(node), self.config.start_timeout_s,
                 f"{node} to serve {self.admin_url(node)}/v1/state",
                 interval=self.config.poll_s, ignore=(EndpointError,))
        self._recovered(node, "back and serving")

    def pause(self, node: str) -> None:
        self._agent(node).pause(self.config.fault_deadline_s)
        with self._lock:
            self._paused.add(node)
        self._event("FaultInjected", f"pause {node}: SIGSTOP (agent resumes it after "
                                     f"{self.config.fault_deadline_s:g}s at the latest)")

    def resume(self, node: str) -> None:
        # Unreachable: the pod is gone, and its paused process with it.
        with contextlib.suppress(EndpointUnreachable):
            self._agent(node).resume()
        with self._lock:
            was_paused = node in self._paused
            self._paused.discard(node)
        if was_paused:
            self._event("FaultRecovered", f"pause {node}: SIGCONT")

    def is_running(self, node: str) -> bool:
        """Whether the broker process runs in its pod (a killed one held down does not,
        although its container does)."""
        pod = self.pod(node)
        if pod is None or not pod.running:
            return False
        try:
            return bool(self._agent(node).faults().get("running"))
        except EndpointUnreachable:
            return False

    def is_paused(self, node: str) -> bool:
        try:
            return bool(self._agent(node).faults().get("paused"))
        except EndpointUnreachable:
            return False  # no agent answering: no pod, no paused process

    # ---- disks ------------------------------------------------------------------------------

    def stall_disk(self, node: str, duration_s: float) -> None:
        self.check_broker(node)
        if duration_s <= 0:
            raise PlatformError(f"disk stall of {node}: duration must be positive")
        self._admin(node).set_failpoint("disk-stall", {"duration_ms": round(duration_s * 1000)})
        with self._lock:
            self._stalled.add(node)
        self._event("FaultInjected", f"disk-stall {node}: appends and fsyncs block for at "
                                     f"most {duration_s:g}s")

    def clear_disk_stall(self, node: str) -> None:
        self.check_broker(node)
        if not self.is_running(node):
            return  # the stall died with the process
        if self.is_paused(node):
            raise PlatformError(f"cannot clear the disk stall of {node} while it is paused")
        try:
            self._admin(node).clear_failpoint("disk-stall")
        except EndpointUnreachable as exc:
            # Unreachable (restarting, or its DNS name not back yet): the broker lifts the
            # stall itself when its duration is up, and the operator clears it again.
            log.warning("could not clear the disk stall of %s: %s", node, exc)
            return
        with self._lock:
            was_stalled = node in self._stalled
            self._stalled.discard(node)
        if was_stalled:
            self._event("FaultRecovered", f"disk-stall {node}: cleared")

    def fill_disk(self, node: str, duration_s: float) -> None:
        """The broker's restart is held first (its agent), then its disk fills: when its
        log directory fails it halts, its container restarts and waits, as locally."""
        self.check_broker(node)
        if duration_s <= 0:
            raise PlatformError(f"disk-full of {node}: duration must be positive")
        try:
            self._agent(node).hold_restart(duration_s)
        except EndpointError as exc:
            raise PlatformError(f"cannot hold the restart of {node}: {exc}") from exc
        self._admin(node).set_failpoint("disk-full", {"duration_ms": round(duration_s * 1000)})
        with self._lock:
            self._down[node] = "disk-full"
        self._event("FaultInjected", f"disk-full {node}: log writes fail with ENOSPC for at "
                                     f"most {duration_s:g}s; the broker halts on its failed "
                                     "log directory and stays down until then")

    def clear_disk_full(self, node: str) -> None:
        """Free the disk of a broker still serving, release a halted one's restart and wait
        until it serves again."""
        self.check_broker(node)
        with contextlib.suppress(EndpointUnreachable):  # halted, or halting right now
            self._admin(node).clear_failpoint("disk-full")
        with self._lock:
            held = self._down.get(node) == "disk-full"
        if held:
            self.restart(node)

    def power_loss(self, node: str) -> None:
        """The failpoint drops every unsynced write and exits the broker; return once the
        kubelet saw the container die (it restarts it at once, in the same pod)."""
        pod = self.pod(self.check_broker(node))
        if pod is None or not pod.running:
            raise PlatformError(f"cannot cut the power of {node}: it is not running")
        # A cut connection is the broker dying; a refusal is raised.
        with contextlib.suppress(EndpointUnreachable):
            self._admin(node).set_failpoint("power-loss")

        def died() -> bool:
            now = self.pod(node)
            return now is None or now.uid != pod.uid or now.restarts > pod.restarts \
                or not now.running

        wait_for(died, self.config.start_timeout_s, f"{node}'s container to exit",
                 interval=self.config.poll_s)
        with self._lock:
            self._down[node] = "power-loss"
        self._event("FaultInjected", f"power-loss {node}: unsynced writes dropped, "
                                     "process exited")

    # ---- pods -------------------------------------------------------------------------------

    def delete_pod(self, node: str, grace_period_s: float) -> None:
        """Delete the broker's pod with this grace period (the kubelet sends SIGTERM, then
        SIGKILL); its StatefulSet creates the replacement. Return once the old pod is gone
        (replaced by a pod of another uid, or absent)."""
        pod = self.pod(self.check_broker(node))
        if pod is None:
            raise PlatformError(f"cannot delete the pod of {node}: it does not exist")
        self.api.delete("Pod", self.config.namespace, self.names.pod(node),
                        grace_period_s=round(grace_period_s))

        def gone() -> bool:
            now = self.pod(node)
            return now is None or now.uid != pod.uid

        wait_for(gone, grace_period_s + self.config.start_timeout_s,
                 f"pod {self.names.pod(node)} (uid {pod.uid}) to be deleted",
                 interval=self.config.poll_s, ignore=(ApiError,))
        with self._lock:
            self._down[node] = "pod-delete"
        self._event("FaultInjected", f"pod-delete {node}: pod {self.names.pod(node)} deleted "
                                     f"(grace {grace_period_s:g}s); the StatefulSet replaces it")

    def await_replacement(self, node: str) -> None:
        self._wait_ready(node, self.config.start_timeout_s)
        wait_for(lambda: self.registered_and_unfenced(node), self.config.start_timeout_s,
                 f"the replacement of {node} to register with the controller, unfenced",
                 interval=self.config.poll_s, ignore=(EndpointError,))
        self._recovered(node, "replaced, registered and unfenced")

    def _recovered(self, node: str, how: str) -> None:
        """The FaultRecovered Event of whatever fault held ``node`` down, once."""
        with self._lock:
            kind = self._down.pop(node, None)
        if kind is not None:
            self._event("FaultRecovered", f"{kind} {node}: {how}")

    # ---- network ----------------------------------------------------------------------------

    def block(self, links: Iterable[Link], owner: str) -> None:
        wanted = frozenset(links)
        super().block(wanted, owner)
        self._event("FaultInjected", f"partition {owner}: dropping "
                                     f"{', '.join(map(str, sorted(wanted)))}")

    def unblock(self, owner: str) -> None:
        with self._links_lock:
            had = owner in self._blocks
            super().unblock(owner)
        if had:
            self._event("FaultRecovered", f"partition {owner}: links pass again")

    def _set_link_blocked(self, link: Link, blocked: bool) -> None:
        """Drop ``src -> dst`` at ``dst``'s INPUT (from src's IP), or, for the clients' side,
        at ``src``'s OUTPUT (to the runner pod's IP), as the netns platform does."""
        if blocked:
            if link.dst != CLIENT:
                rule = (link.dst, "input", self._ip(link.src))
            else:
                rule = (link.src, "output", self._ip(CLIENT))
            node, direction, peer = rule
            self._agent(node).drop(direction, peer, self.config.fault_deadline_s)
            self._link_rules[link] = rule
            return
        rule = self._link_rules.pop(link, None)
        if rule is None:
            return
        node, direction, peer = rule
        try:
            self._agent(node).undrop(direction, peer)
        except EndpointRefused:
            self._link_rules[link] = rule
            raise
        except EndpointUnreachable:
            pass  # the pod is gone, and its rules with it

    def _ip(self, endpoint: str) -> str:
        if endpoint == CLIENT:
            if not self.config.client_ip:
                raise PlatformError("partitions involving the clients need the runner pod's "
                                    "IP ($POD_IP)")
            return self.config.client_ip
        pod = self.pod(endpoint)
        if pod is None or not pod.ip:
            raise PlatformError(f"{endpoint} has no pod IP: its pod is not running")
        return pod.ip

    # ---- helpers ----------------------------------------------------------------------------

    def _agent(self, node: str) -> AgentClient:
        url = f"http://{self.host(node)}:{self.config.endpoints.agent_port}"
        return AgentClient(url, self.config.agent_token)

    def _admin(self, node: str) -> AdminClient:
        return AdminClient(self.admin_url(node), self.config.failpoint_token)

    def _wait_ready(self, node: str, timeout: float) -> None:
        def ready() -> bool:
            pod = self.pod(node)
            return pod is not None and pod.ready

        wait_for(ready, timeout, f"pod {self.names.pod(node)} to be ready",
                 interval=self.config.poll_s, ignore=(ApiError,))

    def _event(self, reason: str, message: str) -> None:
        """A Kubernetes Event on the experiment; never fails the fault it reports."""
        if not self.config.experiment:
            return
        now = datetime.now(UTC)
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{self.config.experiment}.{time.time_ns():x}",
                         "namespace": self.config.namespace},
            "involvedObject": {"apiVersion": API_VERSION, "kind": "ChaosExperiment",
                               "name": self.config.experiment,
                               "namespace": self.config.namespace,
                               **({"uid": self.config.experiment_uid}
                                  if self.config.experiment_uid else {})},
            "reason": reason, "message": message[:1024], "type": "Normal",
            "source": {"component": "undertow-runner"},
            "reportingComponent": "undertow.dev/runner",
            "reportingInstance": self.config.reporter,
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        }
        try:
            self.api.create(event)
        except ApiError as exc:
            log.warning("could not post event %s %r: %s", reason, message, exc)


def read_tokens(api: KubeApi, names: ClusterNames) -> tuple[str, str]:
    """The failpoint and agent tokens from the cluster's Secret."""
    secret = api.get("Secret", names.namespace, names.secret)
    if secret is None:
        raise PlatformError(f"Secret {names.namespace}/{names.secret} not found: is the "
                            f"BrokerCluster {names.cluster} deployed by the operator?")
    data = secret.get("data") or {}
    try:
        return tuple(base64.b64decode(data[key]).decode()  # type: ignore[return-value]
                     for key in (FAILPOINT_TOKEN_KEY, AGENT_TOKEN_KEY))
    except KeyError as exc:
        raise PlatformError(f"Secret {names.namespace}/{names.secret} has no key "
                            f"{exc.args[0]!r}") from None
