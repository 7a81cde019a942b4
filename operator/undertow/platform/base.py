"""The platform interface: what the runner and the fault units may do to a cluster.

A platform runs one controller and brokers ``broker-1`` .. ``broker-N`` and offers the
primitive operations fault units are built from. Everything is addressed by node name;
``CLIENT`` stands for every workload client when links are blocked. The local platform
implements this with child processes, a Kubernetes platform with pods and a fault agent.

It is long because it is the one contract every platform implements (processes, pods, Kubernetes,
the simulation): the primitives, their documented guarantees and the shared waits stay together so
that a platform author reads one file.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from undertow.cluster_view import ClusterView, broker_report, view_from_states
from undertow.platform.admin import AdminClient
from undertow.platform.control import EndpointError
from undertow.platform.errors import PlatformError
from undertow.platform.link_delay import LinkDelay

if TYPE_CHECKING:
    from undertow.platform.guardian import Guardian
    from undertow.platform.process import ChildProcess, Spawner
    from undertow.runner.world import World

log = logging.getLogger("undertow.platform")

CLIENT = "client"
CONTROLLER = "controller"
_BROKER_PREFIX = "broker-"

T = TypeVar("T")


class Cancellable(Protocol):
    def cancel(self) -> None: ...


def client_endpoint(client: str) -> str:
    """The endpoint of workload client ``c1``'s (or ``p0``'s) own links: ``client-c1``."""
    return f"{CLIENT}-{client}"


def client_of(endpoint: str) -> str | None:
    """``client-p0`` -> ``p0``: the workload client an endpoint names, else None."""
    client = endpoint.removeprefix(f"{CLIENT}-")
    return None if client == endpoint else client


def broker_node(broker_id: int) -> str:
    return f"{_BROKER_PREFIX}{broker_id}"


def broker_id_of(node: str) -> int:
    """``broker-3`` -> 3; anything else is an error naming the node."""
    suffix = node.removeprefix(_BROKER_PREFIX)
    if suffix == node or not suffix.isdigit():
        raise PlatformError(f"{node!r} is not a broker node (expected broker-N)")
    return int(suffix)


@dataclass(frozen=True, order=True)
class Link:
    """One direction of traffic: the packets ``src`` sends to ``dst``."""

    src: str
    dst: str

    def __str__(self) -> str:
        return f"{self.src}->{self.dst}"


def wait_for(probe: Callable[[], T], timeout: float, what: str, *, interval: float = 0.05,
             ignore: tuple[type[BaseException], ...] = ()) -> T:
    """Poll ``probe`` until it returns something truthy and return that.

    Exceptions of the ``ignore`` types count as "not yet". After ``timeout`` seconds raise
    ``PlatformError`` saying what was awaited and the last exception seen.
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            result = probe()
            if result:
                return result
        except ignore as exc:
            last = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last})" if last else ""
            raise PlatformError(f"timed out after {timeout:g}s waiting for {what}{detail}")
        time.sleep(interval)


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Raise ``KeyboardInterrupt`` on SIGTERM and SIGHUP, as Ctrl-C does.

    A runner wraps its work in this and in ``with platform:`` so that a terminated run heals
    and stops its cluster on the way out. Main thread only (a Python signal rule).
    """
    def interrupt(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class Platform(ABC):
    """A running cluster and the primitive operations fault units call.

    Blocked and delayed links are kept per owner (one owner per fault), so two overlapping
    partitions heal independently: a link carries traffic again only when no owner blocks
    it. A link two delays hold takes the later one's, and the earlier one's again when the
    later one heals.
    """

    def __init__(self) -> None:
        self._links_lock = threading.RLock()
        self._blocks: dict[str, frozenset[Link]] = {}
        self._delays: dict[str, tuple[frozenset[Link], LinkDelay]] = {}
        self._clients_lock = threading.Lock()
        self._client_processes: dict[str, ChildProcess] = {}
        self._client_spawner: Spawner | None = None

    # ---- lifecycle --------------------------------------------------------------------------

    @abstractmethod
    def start(self) -> None:
        """Start the cluster; return once every broker is registered and unfenced."""

    @abstractmethod
    def stop(self) -> None:
        """Stop every process and remove every fault; idempotent, safe after a failed start."""

    def __enter__(self) -> Platform:
        self.start()
        return self

    def world(self) -> World:
        """What a run needs on this platform besides its primitives
        (`undertow.runner.world`): the wall clock, threads and stock Kafka clients, unless
        the platform is simulated."""
        from undertow.runner.world import RealWorld

        return RealWorld(self)

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # ---- names and addresses ----------------------------------------------------------------

    @property
    @abstractmethod
    def broker_ids(self) -> tuple[int, ...]:
        """Broker ids, ascending."""

    @property
    def brokers(self) -> tuple[str, ...]:
        return tuple(broker_node(i) for i in self.broker_ids)

    @property
    def nodes(self) -> tuple[str, ...]:
        """Every process of the cluster: the controller, then the brokers."""
        return (CONTROLLER, *self.brokers)

    @property
    def client_endpoints(self) -> tuple[str, ...]:
        """The workload clients with links of their own to every broker
        (``client_endpoint``), which a partition or a delay can act on apart from the other
        clients'; none on most platforms."""
        return ()

    @property
    def endpoints(self) -> tuple[str, ...]:
        """Everything a link can connect: the nodes and the clients."""
        return (*self.nodes, CLIENT, *self.client_endpoints)

    def bootstrap_for(self, client: str) -> str:
        """Where workload client ``client`` (``c1``, ``p0``) connects: its own links where
        it has them, else the clients' (``bootstrap``)."""
        del client
        return self.bootstrap

    @property
    @abstractmethod
    def bootstrap(self) -> str:
        """``host:port[,host:port...]`` for Kafka clients; their traffic takes the client links."""

    @abstractmethod
    def admin_url(self, node: str) -> str:
        """Base URL of the node's HTTP endpoint (``/metrics``, ``/v1/state``, failpoints)."""

    def check_node(self, node: str) -> str:
        if node not in self.nodes:
            raise PlatformError(f"unknown node {node!r}; nodes are {', '.join(self.nodes)}")
        return node

    def check_endpoint(self, endpoint: str) -> str:
        if endpoint not in self.endpoints:
            raise PlatformError(f"unknown endpoint {endpoint!r}; endpoints are "
                                f"{', '.join(self.endpoints)}")
        return endpoint

    def check_broker(self, node: str) -> str:
        if node not in self.brokers:
            raise PlatformError(f"{node!r} is not a broker; brokers are {', '.join(self.brokers)}")
        return node

    @abstractmethod
    def state(self, node: str) -> dict[str, Any]:
        """The node's own view of the cluster (its ``/v1/state`` document)."""

    @abstractmethod
    def events(self, node: str, log_id: str | None, offset: int) -> dict[str, Any]:
        """The node's replication events from ``offset`` of its events log ``log_id`` on
        (``AdminClient.events``)."""

    # ---- processes --------------------------------------------------------------------------
    # The process primitives fault units compose. "Down" is a node whose process is not
    # running; what brings it back differs (the runner starts a local process, a pod's
    # container restarts on its own unless its agent holds it), so units say only when it
    # may come back (``release``) and wait until it serves (``await_serving``).

    @property
    @abstractmethod
    def timeout_s(self) -> float:
        """How long the platform waits for a node to start, stop or register."""

    @abstractmethod
    def kill(self, node: str, grace_period_s: float = 0.0) -> None:
        """SIGKILL the node, no clean shutdown; return once its process is gone. It stays
        down until ``release``. With ``grace_period_s`` above 0, SIGTERM first (a clean
        shutdown: the broker flushes its logs), and SIGKILL only if the process has not
        exited that many seconds later."""

    @abstractmethod
    def hold_restart(self, node: str, duration_s: float) -> None:
        """When the node's process exits on its own (a broker halting on a failed log
        directory), keep it down until ``release``, for at most ``duration_s``."""

    @abstractmethod
    def release(self, node: str) -> None:
        """Let a node that is down start again, and start it where nothing else does;
        a no-op for a running node. Returns at once: ``await_serving`` waits."""

    @abstractmethod
    def await_serving(self, node: str) -> None:
        """Return once the node serves its admin endpoint."""

    def restart(self, node: str) -> None:
        """Bring a node that is down back and return once it serves."""
        self.release(node)
        self.await_serving(node)

    def await_registered(self, node: str) -> None:
        """Return once the broker now serving ``node`` is registered with the controller
        under its current broker epoch, unfenced (``registered_and_unfenced``)."""
        wait_for(lambda: self.registered_and_unfenced(node), self.timeout_s,
                 f"{node} to register with the controller, unfenced",
                 interval=0.1, ignore=(EndpointError,))

    @abstractmethod
    def pause(self, node: str) -> None:
        """Freeze the node (SIGSTOP); return once it is stopped."""

    @abstractmethod
    def resume(self, node: str) -> None:
        """Let a paused node run again; a no-op for a running or absent one."""

    @abstractmethod
    def is_running(self, node: str) -> bool:
        """The node's process exists (paused counts as running)."""

    @abstractmethod
    def is_paused(self, node: str) -> bool:
        """The node's process is stopped by a pause."""

    @abstractmethod
    def incarnation(self, node: str) -> Hashable | None:
        """What tells the node's running process from the next one (None: not running)."""

    def await_exit(self, node: str, incarnation: Hashable) -> None:
        """Return once the process of ``incarnation`` is gone (exited, or replaced)."""
        wait_for(lambda: self.incarnation(node) != incarnation, self.timeout_s,
                 f"{node}'s process to exit", interval=0.05)

    def require_responsive(self, node: str, action: str) -> None:
        """Failpoints are HTTP calls: a dead or paused broker cannot answer them."""
        if not self.is_running(node):
            raise PlatformError(f"cannot {action} {node}: it is not running")
        if self.is_paused(node):
            raise PlatformError(f"cannot {action} {node}: it is paused")

    # ---- failpoints -------------------------------------------------------------------------

    @property
    @abstractmethod
    def failpoint_token(self) -> str:
        """The bearer token of the brokers' failpoints."""

    def set_failpoint(self, node: str, name: str, duration_s: float | None = None) -> None:
        """Arm the broker's failpoint ``name`` (``/v1/failpoints/NAME``); with a duration
        the broker lifts it on its own when that is up."""
        body = None if duration_s is None else {"duration_ms": round(duration_s * 1000)}
        self._failpoints(node).set_failpoint(name, body)

    def clear_failpoint(self, node: str, name: str) -> None:
        self._failpoints(node).clear_failpoint(name)

    def _failpoints(self, node: str) -> AdminClient:
        return AdminClient(self.admin_url(self.check_broker(node)), self.failpoint_token)

    # ---- the workload's client processes ------------------------------------------------------
    # A workload client that a schedule pauses (a producer) runs as a process of its own, a
    # child of the runner wherever the runner runs (its pod on Kubernetes), since a thread
    # cannot be SIGSTOPped alone. The platform starts it, so that it cannot outlive the
    # runner (PR_SET_PDEATHSIG from a long-lived spawner thread; locally the guardian too)
    # and so that the pause unit and every heal path reach it by its endpoint's name
    # (``client-p0``), as they reach a node by its own.

    def client_pause_unsupported(self) -> str | None:
        """Why this platform cannot pause a workload client, or None when it can; asked
        before a run starts."""
        return None

    def start_client(self, client: str, argv: Sequence[str], *, env: Mapping[str, str],
                     log_path: Path) -> ChildProcess:
        """Start workload client ``client``'s own process (stdin and stdout piped to the
        caller, stderr to ``log_path``) and return it once it runs; it is known by
        ``client_endpoint(client)`` from then on."""
        from undertow.platform.process import ChildProcess

        spawner, guardian = self._client_spawning()
        process = ChildProcess(client_endpoint(client), argv, log_path=log_path,
                               spawner=spawner, guardian=guardian, env=env, pipes=True)
        with self._clients_lock:
            if process.name in self._client_processes \
                    and self._client_processes[process.name].running:
                raise PlatformError(f"{client} already runs as a process of its own")
            self._client_processes[process.name] = process
        process.start()
        return process

    def _client_spawning(self) -> tuple[Spawner, Guardian | None]:
        """The spawner of the clients' processes (the parent-death signal follows the thread
        that forked a child, so one thread that lives as long as the runner forks them all)
        and the guardian that ends them if the runner dies (none here: the signal alone)."""
        from undertow.platform.process import Spawner

        with self._clients_lock:
            if self._client_spawner is None:
                self._client_spawner = Spawner()
            return self._client_spawner, None

    @property
    def client_processes(self) -> tuple[str, ...]:
        """The endpoints (``client-p0``) of the workload clients running as processes of
        their own, which a pause can act on."""
        with self._clients_lock:
            return tuple(self._client_processes)

    def pause_client(self, endpoint: str) -> None:
        """Freeze the client's process (SIGSTOP); return once it is stopped."""
        self._client(endpoint).pause()

    def resume_client(self, endpoint: str) -> None:
        """Let a paused client's process run again; a no-op for a running or exited one."""
        with self._clients_lock:
            process = self._client_processes.get(endpoint)
        if process is not None:
            process.resume()

    def is_client_running(self, endpoint: str) -> bool:
        """The client's own process exists (paused counts as running)."""
        with self._clients_lock:
            process = self._client_processes.get(endpoint)
        return process is not None and process.running

    def is_client_paused(self, endpoint: str) -> bool:
        with self._clients_lock:
            process = self._client_processes.get(endpoint)
        return process is not None and process.paused

    def kill_clients(self) -> None:
        """SIGKILL every client process still running (a stopped one too) and reap it: a
        platform's stop, after the workload had its chance to stop them."""
        with self._clients_lock:
            processes = list(self._client_processes.values())
        for process in processes:
            process.kill()

    def _client(self, endpoint: str) -> ChildProcess:
        with self._clients_lock:
            process = self._client_processes.get(endpoint)
        if process is None:
            raise PlatformError(f"{endpoint} has no process of its own; client processes are "
                                f"{', '.join(self.client_processes) or 'none'}")
        return process

    # ---- pods -------------------------------------------------------------------------------

    @abstractmethod
    def delete_pod(self, node: str, grace_period_s: float) -> None:
        """Chaos Mesh's pod-kill: delete the broker's pod (SIGTERM, SIGKILL after the grace
        period); its StatefulSet replaces it at once, with a new address and, when storage
        is ephemeral, an empty disk. Return once the old process is gone."""

    # ---- users ------------------------------------------------------------------------------

    def start_timer(self, delay_s: float, callback: Callable[[], None], name: str
                    ) -> Cancellable:
        """Call ``callback`` once after ``delay_s`` seconds on the platform's clock (a fault's
        time limit), unless cancelled first: a daemon thread on the wall clock here, the
        virtual clock in simulation."""
        timer = threading.Timer(delay_s, callback)
        timer.name = name
        timer.daemon = True
        timer.start()
        return timer

    def announce(self, reason: str, message: str) -> None:
        """Tell the experiment's watchers that a fault took effect or ended (``reason``:
        ``FaultInjected``, ``FaultRecovered``); on Kubernetes an Event on the
        ChaosExperiment. Never raises: a fault does not fail on its report."""
        log.info("%s: %s", reason, message)

    def cluster_view(self, *, replicas: bool = False) -> ClusterView:
        """The controller's view of the cluster; with ``replicas``, also every answering
        broker's own report (high watermarks, log end offsets). Raises when the controller
        does not answer; a broker that does not answer is left out."""
        controller = self.state(CONTROLLER)
        states = {}
        if replicas:
            for node in self.brokers:
                try:
                    states[broker_id_of(node)] = self.state(node)
                except PlatformError:
                    continue  # killed, paused or partitioned: missing from this view
        return view_from_states(controller, states)

    def all_brokers_unfenced(self) -> bool:
        """Every broker of the cluster is registered with the controller and unfenced."""
        return self.cluster_view().live_brokers >= set(self.broker_ids)

    def registered_and_unfenced(self, node: str) -> bool:
        """The broker now serving ``node`` is the one the controller has registered (same
        broker epoch), and unfenced: a replacement counts as back only then."""
        own = broker_report(self.state(self.check_broker(node)))
        registration = self.cluster_view().brokers.get(own.broker_id)
        return (registration is not None and not registration.fenced
                and registration.broker_epoch == own.broker_epoch)

    # ---- network ----------------------------------------------------------------------------

    @abstractmethod
    def _set_link_blocked(self, link: Link, blocked: bool) -> None:
        """Drop (or pass again) the packets of one link; return once that took effect."""

    @property
    def blocked_links(self) -> frozenset[Link]:
        with self._links_lock:
            return frozenset().union(*self._blocks.values())

    def _known_links(self, links: Iterable[Link]) -> frozenset[Link]:
        wanted = frozenset(links)
        for link in wanted:
            for end in (link.src, link.dst):
                if end not in self.endpoints:
                    raise PlatformError(f"link {link}: unknown endpoint {end!r}; "
                                        f"endpoints are {', '.join(self.endpoints)}")
            if link.src == link.dst:
                raise PlatformError(f"link {link} connects a node to itself")
        return wanted

    def block(self, links: Iterable[Link], owner: str) -> None:
        """Drop the packets of ``links`` on behalf of ``owner`` until ``unblock(owner)``."""
        wanted = self._known_links(links)
        with self._links_lock:
            if owner in self._blocks:
                raise PlatformError(f"{owner!r} already blocks links; unblock it first")
            already = self.blocked_links
            self._blocks[owner] = wanted
            for link in sorted(wanted - already):
                self._set_link_blocked(link, True)

    def unblock(self, owner: str) -> None:
        """Pass again the links ``owner`` blocked that no other owner still blocks."""
        with self._links_lock:
            released = self._blocks.pop(owner, frozenset())
            for link in sorted(released - self.blocked_links):
                self._set_link_blocked(link, False)

    def clear_blocks(self, node: str) -> None:
        """Pass again every link to or from ``node``, whoever blocked it."""
        with self._links_lock:
            for owner, links in list(self._blocks.items()):
                if any(node in (link.src, link.dst) for link in links):
                    self.unblock(owner)

    def delay_unsupported(self) -> str | None:
        """Why this platform cannot take `delay` faults, or None when it can (it then
        implements ``_set_link_delay``); asked before a run starts."""
        return f"{type(self).__name__} has no delay fault yet"

    def _set_link_delay(self, link: Link, delay: LinkDelay | None) -> None:
        """Delay the packets of one link from now on (None: no more)."""
        raise PlatformError(self.delay_unsupported() or "delay is not implemented")

    @property
    def delayed_links(self) -> dict[Link, LinkDelay]:
        """Each delayed link with the delay it takes (the latest owner's)."""
        with self._links_lock:
            return {link: delay for links, delay in self._delays.values() for link in links}

    def delay(self, links: Iterable[Link], delay: LinkDelay, owner: str) -> None:
        """Delay the packets of ``links`` on behalf of ``owner`` until ``undelay(owner)``."""
        wanted = self._known_links(links)
        with self._links_lock:
            if owner in self._delays:
                raise PlatformError(f"{owner!r} already delays links; undelay it first")
            self._delays[owner] = (wanted, delay)
            for link in sorted(wanted):
                self._set_link_delay(link, delay)

    def undelay(self, owner: str) -> None:
        """Take ``owner``'s delay off its links: each takes the delay another owner still
        holds it with, or none."""
        with self._links_lock:
            released, _ = self._delays.pop(owner, (frozenset(), None))
            remaining = self.delayed_links
            for link in sorted(released):
                self._set_link_delay(link, remaining.get(link))

    def clear_delays(self, node: str) -> None:
        """Take every delay off the links to and from ``node``, whoever set it."""
        with self._links_lock:
            for owner, (links, _) in list(self._delays.items()):
                if any(node in (link.src, link.dst) for link in links):
                    self.undelay(owner)
