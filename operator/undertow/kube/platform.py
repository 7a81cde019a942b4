"""The Kubernetes platform: the runner's faults on a BrokerCluster the operator deployed.

Its primitives, which the fault units compose (``undertow.faults``):

- ``kill``: the fault agent in the pod SIGKILLs the broker in place, as the local platform
  does (Kafka's hard bounce): no clean shutdown (with a grace period, SIGTERM first: a
  clean one, SIGKILL after it), and its container restarts under the
  pod's restart policy with the same IP and the same volumes, held down (``hold_restart``
  too) until ``release`` (or the deadline passes); ``await_serving`` waits until the pod
  is ready and the broker serves again;
- ``pause``/``resume`` and links: the fault agent in the pod (SIGSTOP/SIGCONT; iptables
  DROP in the pod's network namespace, peers addressed by pod IP, the clients by the
  runner pod's IP);
- failpoints (disk stall, disk full, power loss): the broker's failpoint endpoint, with
  the token from the cluster's Secret (the runner Job gets it as an environment variable);
- ``delete_pod``: the API server; ``incarnation``: the pod's uid and restart count;
- ``state``: the pod's ``/v1/state`` through its stable DNS name.

Every fault the agent applies carries a deadline (``fault_deadline_s``: the experiment's
longest fault plus a margin), so it heals even if this process dies. Each injection and
recovery is also a Kubernetes Event on the ChaosExperiment (``announce``; ``kubectl
describe uce``).

The platform never creates or deletes the cluster: ``start`` clears what an earlier run
may have left and waits for it to be ready, ``stop`` heals every fault and leaves it
running.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from undertow import faults
from undertow.kube.agent import AgentClient
from undertow.kube.api import ApiError, KubeApi
from undertow.kube.cluster_objects import (
    ADMIN_PORT,
    AGENT_PORT,
    AGENT_TOKEN_ENV,
    AGENT_TOKEN_KEY,
    FAILPOINT_TOKEN_ENV,
    FAILPOINT_TOKEN_KEY,
    KAFKA_PORT,
    ClusterNames,
)
from undertow.kube.pods import PodView, pod_view
from undertow.platform.admin import AdminClient
from undertow.platform.base import (
    CLIENT,
    Link,
    Platform,
    PlatformError,
    wait_for,
)
from undertow.platform.control import EndpointError, EndpointRefused, EndpointUnreachable
from undertow.platform.link_delay import LinkDelay
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
    control_timeout_s: float | None = None
    """Timeout of each call to a pod's agent or admin endpoint (None: each client's own)."""

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
        self._link_rules: dict[Link, tuple[str, str, str]] = {}

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
        problems = faults.clear(self)
        if problems:
            raise PlatformError(f"clearing what an earlier run left: {'; '.join(problems)}")
        wait_for(self.all_brokers_unfenced, self.config.start_timeout_s,
                 "every broker to register with the controller, unfenced",
                 interval=0.5, ignore=(EndpointError,))

    def stop(self) -> None:
        """Heal every fault (the cluster keeps running: the operator owns it)."""
        try:
            faults.heal(self)
        finally:
            with self._links_lock:
                self._blocks.clear()
                self._link_rules.clear()

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

    @property
    def timeout_s(self) -> float:
        return self.config.start_timeout_s

    @property
    def failpoint_token(self) -> str:
        return self.config.failpoint_token

    def kill(self, node: str, grace_period_s: float = 0.0) -> None:
        """SIGKILL the broker in its pod (with a grace period, SIGTERM first and SIGKILL
        after it, as the kubelet stops a container); return once it is dead. Its container
        restarts but the broker stays down until ``release`` (at most ``fault_deadline_s``)."""
        try:
            self.agent(node).kill(self.config.fault_deadline_s, grace_period_s)
        except EndpointError as exc:
            raise PlatformError(f"cannot kill {node}: {exc}") from exc

    def hold_restart(self, node: str, duration_s: float) -> None:
        """The agent holds the broker's next start (its launcher waits on the hold file)."""
        try:
            self.agent(node).hold_restart(duration_s)
        except EndpointError as exc:
            raise PlatformError(f"cannot hold the restart of {node}: {exc}") from exc

    def release(self, node: str) -> None:
        """Let the container start the broker again (the kubelet restarts it)."""
        with contextlib.suppress(EndpointUnreachable):  # the pod is gone, its hold with it
            self.agent(node).release()

    def await_serving(self, node: str) -> None:
        self._wait_ready(node, self.config.start_timeout_s)
        wait_for(lambda: self.state(node), self.config.start_timeout_s,
                 f"{node} to serve {self.admin_url(node)}/v1/state",
                 interval=self.config.poll_s, ignore=(EndpointError,))

    def pause(self, node: str) -> None:
        """SIGSTOP through the agent, which resumes it after ``fault_deadline_s`` at the
        latest."""
        self.agent(node).pause(self.config.fault_deadline_s)

    def resume(self, node: str) -> None:
        # Unreachable: the pod is gone, and its paused process with it.
        with contextlib.suppress(EndpointUnreachable):
            self.agent(node).resume()

    def is_running(self, node: str) -> bool:
        """Whether the broker process runs in its pod (a killed one held down does not,
        although its container does)."""
        pod = self.pod(node)
        if pod is None or not pod.running:
            return False
        try:
            return bool(self.agent(node).faults().get("running"))
        except EndpointUnreachable:
            return False

    def is_paused(self, node: str) -> bool:
        try:
            return bool(self.agent(node).faults().get("paused"))
        except EndpointUnreachable:
            return False  # no agent answering: no pod, no paused process

    def incarnation(self, node: str) -> tuple[str, int] | None:
        """The pod's uid and its container's restart count, as the kubelet reports them."""
        pod = self.pod(node)
        return (pod.uid, pod.restarts) if pod is not None and pod.running else None

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

    # ---- network ----------------------------------------------------------------------------

    def clear_blocks(self, node: str) -> None:
        """Also every drop rule the node's agent holds, whoever asked for it (a runner
        that died mid-partition)."""
        super().clear_blocks(node)
        self.agent(node).undrop_all()

    def _catch(self, link: Link) -> tuple[str, str, str]:
        """Where ``src -> dst``'s packets are caught: at ``dst``'s INPUT (from src's IP),
        or, for the clients' side, at ``src``'s OUTPUT (to the runner pod's IP), as the
        netns platform does: the node whose agent acts, the direction and the peer."""
        if link.dst != CLIENT:
            return link.dst, "input", self._ip(link.src)
        return link.src, "output", self._ip(CLIENT)

    def delay_unsupported(self) -> str | None:
        return None  # each node's agent runs an NFQUEUE delayer (kube.agent.delays)

    def clear_delays(self, node: str) -> None:
        """Also every delay the node's agent holds, whoever asked for it (a runner that
        died mid-delay)."""
        super().clear_delays(node)
        self.agent(node).undelay_all()

    def _set_link_delay(self, link: Link, delay: LinkDelay | None) -> None:
        node, direction, peer = self._catch(link)
        try:
            if delay is None:
                self.agent(node).undelay(direction, peer)
            else:
                self.agent(node).delay(direction, peer, delay, self.config.fault_deadline_s)
        except EndpointUnreachable:
            if delay is not None:
                raise
            # the pod is gone, and its rules and delayers with it

    def _set_link_blocked(self, link: Link, blocked: bool) -> None:
        """Drop ``src -> dst`` where ``_catch`` says."""
        if blocked:
            rule = self._catch(link)
            node, direction, peer = rule
            self.agent(node).drop(direction, peer, self.config.fault_deadline_s)
            self._link_rules[link] = rule
            return
        rule = self._link_rules.pop(link, None)
        if rule is None:
            return
        node, direction, peer = rule
        try:
            self.agent(node).undrop(direction, peer)
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

    def agent(self, node: str) -> AgentClient:
        """The fault agent of the node's pod."""
        url = f"http://{self.host(node)}:{self.config.endpoints.agent_port}"
        return AgentClient(url, self.config.agent_token, **self._timeout())

    def _admin(self, node: str) -> AdminClient:
        return AdminClient(self.admin_url(node), **self._timeout())

    def _failpoints(self, node: str) -> AdminClient:
        return AdminClient(self.admin_url(self.check_broker(node)), self.failpoint_token,
                           **self._timeout())

    def _timeout(self) -> dict[str, float]:
        timeout = self.config.control_timeout_s
        return {} if timeout is None else {"timeout_s": timeout}

    def _wait_ready(self, node: str, timeout: float) -> None:
        def ready() -> bool:
            pod = self.pod(node)
            return pod is not None and pod.ready

        wait_for(ready, timeout, f"pod {self.names.pod(node)} to be ready",
                 interval=self.config.poll_s, ignore=(ApiError,))

    def announce(self, reason: str, message: str) -> None:
        """A Kubernetes Event on the experiment (``kubectl describe uce``)."""
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
