"""The platform interface: what the runner and the fault units may do to a cluster.

A platform runs one controller and brokers ``broker-1`` .. ``broker-N`` and offers the
primitive operations fault units are built from. Everything is addressed by node name;
``CLIENT`` stands for every workload client when links are blocked. The local platform
implements this with child processes, a Kubernetes platform with pods and a fault agent.
"""

from __future__ import annotations

import signal
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from undertow.cluster_view import ClusterView, broker_report, view_from_states

CLIENT = "client"
CONTROLLER = "controller"
_BROKER_PREFIX = "broker-"

T = TypeVar("T")


class PlatformError(RuntimeError):
    """A platform operation failed or did not take effect in time."""


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

    Blocked links are kept per owner (one owner per fault), so two overlapping partitions
    heal independently: a link carries traffic again only when no owner blocks it.
    """

    def __init__(self) -> None:
        self._links_lock = threading.RLock()
        self._blocks: dict[str, frozenset[Link]] = {}

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
    def endpoints(self) -> tuple[str, ...]:
        """Everything a link can connect: the nodes and the clients."""
        return (*self.nodes, CLIENT)

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

    @abstractmethod
    def kill(self, node: str) -> None:
        """Kill the node without warning; return once its process is gone."""

    @abstractmethod
    def restart(self, node: str) -> None:
        """Start the node if it is not running; return once it serves its admin endpoint."""

    @abstractmethod
    def pause(self, node: str) -> None:
        """Freeze the node (SIGSTOP); return once it is stopped."""

    @abstractmethod
    def resume(self, node: str) -> None:
        """Let a paused node run again; a no-op for a running one."""

    @abstractmethod
    def is_running(self, node: str) -> bool:
        """The node's process exists (paused counts as running)."""

    @abstractmethod
    def is_paused(self, node: str) -> bool:
        """The node's process is stopped by a pause."""

    # ---- disks ------------------------------------------------------------------------------

    @abstractmethod
    def stall_disk(self, node: str, duration_s: float) -> None:
        """Make the broker's appends and fsyncs block; the broker lifts it after ``duration_s``."""

    @abstractmethod
    def clear_disk_stall(self, node: str) -> None:
        """Lift a disk stall; a no-op when there is none or the broker is not running."""

    @abstractmethod
    def fill_disk(self, node: str, duration_s: float) -> None:
        """Make the broker's disk full for at most ``duration_s``: its next log write fails
        with ENOSPC, its log directory goes offline and it halts, as Kafka's does; it
        stays down until ``clear_disk_full``."""

    @abstractmethod
    def clear_disk_full(self, node: str) -> None:
        """Free the disk; a broker that halted comes back only by a restart (this one),
        as Kafka's does. Return once it serves."""

    @abstractmethod
    def power_loss(self, node: str) -> None:
        """The broker loses every write it has not fsynced and dies; ``restart`` brings it back."""

    # ---- pods -------------------------------------------------------------------------------

    @abstractmethod
    def delete_pod(self, node: str, grace_period_s: float) -> None:
        """Chaos Mesh's pod-kill: delete the broker's pod (SIGTERM, SIGKILL after the grace
        period); its StatefulSet replaces it at once, with a new address and, when storage
        is ephemeral, an empty disk. Return once the old process is gone."""

    @abstractmethod
    def await_replacement(self, node: str) -> None:
        """Return once the replacement of a deleted pod serves, registered with the
        controller under its new incarnation and unfenced."""

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

    def block(self, links: Iterable[Link], owner: str) -> None:
        """Drop the packets of ``links`` on behalf of ``owner`` until ``unblock(owner)``."""
        wanted = frozenset(links)
        for link in wanted:
            for end in (link.src, link.dst):
                if end not in self.endpoints:
                    raise PlatformError(f"link {link}: unknown endpoint {end!r}; "
                                        f"endpoints are {', '.join(self.endpoints)}")
            if link.src == link.dst:
                raise PlatformError(f"link {link} connects a node to itself")
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

    # ---- healing ----------------------------------------------------------------------------

    def heal(self) -> None:
        """Undo every fault: pass every link, resume, restart, lift disk stalls."""
        with self._links_lock:
            for owner in list(self._blocks):
                self.unblock(owner)
        for node in self.nodes:
            if self.is_paused(node):
                self.resume(node)
            if not self.is_running(node):
                self.restart(node)
        for node in self.brokers:
            self.clear_disk_stall(node)
            self.clear_disk_full(node)
