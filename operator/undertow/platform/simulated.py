"""``SimulatedPlatform``: the ``Platform`` primitives over ``sim/cluster.py``'s cluster, whose
nodes run minibroker's own servers on one virtual-time loop.

A thin adapter: a kill is the node's SIGKILL on the loop (its callbacks dropped, its
connections reset), a graceful kill runs the broker's own ``stop`` first; a restart is a
new incarnation on the same data directory ``Timing.start_delay_ms`` later; a pause holds the
node's callbacks; a partition blocks links of the virtual network; the failpoints are the
broker's own (``DiskStall``, ``DiskFull``, ``power_loss``, which halts the node); a
producer's pause holds its client model's callbacks as a node's (its host a node of the loop);
``state`` and ``events`` read what the node's admin endpoint would serve. A primitive that
waits runs the loop until its condition holds (``VirtualTimeLoop.wait_until``), so the
fault units of ``undertow.faults`` run on it unchanged, called from the loop's timers.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import random
import shutil
from collections.abc import Callable, Coroutine, Hashable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from minibroker.broker import BrokerServer
from minibroker.environment import Environment, entered
from undertow.platform.base import (
    CONTROLLER,
    Cancellable,
    Link,
    Platform,
    broker_id_of,
    client_endpoint,
)
from undertow.platform.control import EndpointUnreachable
from undertow.platform.errors import PlatformError
from undertow.platform.link_delay import LinkDelay
from undertow.sim.cluster import EPOCH, SimulatedCluster, broker_host
from undertow.sim.files import broker_logs
from undertow.sim.timing import NOMINAL, Timing
from undertow.sim.virtual_loop import NodeState, VirtualTimeLoop

if TYPE_CHECKING:
    from undertow.runner.world import World

T = TypeVar("T")

TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
"""A graceful stop's bound, as a pod's termination grace period bounds a SIGTERM."""
FAILPOINTS = ("disk-stall", "disk-full", "power-loss")


class SimulatedPlatform(Platform):
    def __init__(self, root: Path, brokers: int, config: dict[str, str], *,
                 ephemeral_storage: bool, clients: tuple[str, ...] = (),
                 processes: tuple[str, ...] = (), seed: int = 0,
                 loop: VirtualTimeLoop | None = None, timing: Timing = NOMINAL) -> None:
        """``clients``: the workload clients (``c1``, ``p0``) with links of their own, which
        a partition or a delay can act on (``client_endpoints``); ``processes``: the
        producers a pause can act on (``client_processes``), each on a host of its own too,
        since a SIGSTOP freezes one process, not the runner's other clients; ``timing``: how
        long a restart and a link take (``sim.timing``)."""
        super().__init__()
        self.loop = loop or VirtualTimeLoop()
        self.timing = timing
        self.cluster = SimulatedCluster(self.loop, root, config, tuple(range(brokers)),
                                        latency_s=timing.latency_ms / 1000, seed=seed)
        self._root = root
        self._logs: contextlib.ExitStack | None = None
        self.ephemeral_storage = ephemeral_storage
        self._clients = tuple(sorted({*clients, *processes}))
        self._client_environments: dict[str, Environment] = {}
        """Each client host's network and clock, made once, so that every callback of its
        code carries the same environment (the loop knows a node by it)."""
        self._processes = tuple(client_endpoint(c) for c in sorted(set(processes)))
        for endpoint in self._processes:  # a node of the loop: paused as a process is
            self.loop.add_node(self.client_environment(endpoint))
        self._serving: dict[str, int] = {}
        """The incarnation of each node that finished starting."""
        self._starting: set[str] = set()
        self._stopped = False
        self._delays_set = 0

    def __enter__(self) -> SimulatedPlatform:
        """The nodes' log lines go to ``nodes.log`` under the root, stamped with virtual
        time, until the platform stops."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(broker_logs(self._root / "nodes.log", self.loop.time))
            self.start()
            self._logs = stack.pop_all()
        return self

    def __exit__(self, *_exc: object) -> None:
        try:
            self.stop()
        finally:
            if self._logs is not None:
                self._logs.close()

    def world(self) -> World:
        """Virtual time on this platform's loop, the client models over the Kafka protocol
        (`sim.simulated_world`)."""
        from undertow.sim.simulated_world import SimulatedWorld

        return SimulatedWorld(self)

    def _run(self, coroutine: Coroutine[Any, Any, T], what: str,
             timeout_s: float = TIMEOUT_S) -> T:
        """Run ``coroutine`` as a task of its own (in no node's context) until it ends."""
        task = self.loop.create_task(coroutine, context=contextvars.Context())
        self.loop.wait_until(task.done, timeout_s, what)
        return task.result()

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self._run(self.cluster.start(), "the cluster to start")
        for node in (CONTROLLER, *self.brokers):
            self._serving[node] = self.cluster.incarnation(node)
        self.loop.wait_until(self._all_unfenced, TIMEOUT_S,
                             "every broker to register, unfenced")

    def _all_unfenced(self) -> bool:
        try:
            return self.all_brokers_unfenced()
        except PlatformError:
            return False

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._serving.clear()
        try:
            self.loop.wind_down()
        finally:
            self.loop.close()
            self.cluster.close_files()

    # ---- names and addresses ----------------------------------------------------------------

    @property
    def broker_ids(self) -> tuple[int, ...]:
        return self.cluster.broker_ids

    @property
    def client_endpoints(self) -> tuple[str, ...]:
        return tuple(client_endpoint(c) for c in self._clients)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{host}:{port}" for host, port in self.cluster.bootstrap)

    def admin_url(self, node: str) -> str:
        return f"sim://{self.check_node(node)}"

    def _server(self, node: str) -> Any:
        """The node's server, when it answers (running, not paused)."""
        self.check_node(node)
        if not self.is_running(node):
            raise EndpointUnreachable(f"{node} is not running")
        if self.is_paused(node):
            raise EndpointUnreachable(f"{node} is paused")
        if node == CONTROLLER:
            return self.cluster.controller
        return self.cluster.brokers[broker_id_of(node)]

    def state(self, node: str) -> dict[str, Any]:
        return self._server(node).state()

    def events(self, node: str, log_id: str | None, offset: int) -> dict[str, Any]:
        return self._server(node).events.read(log_id, offset)

    # ---- processes --------------------------------------------------------------------------

    @property
    def timeout_s(self) -> float:
        return TIMEOUT_S

    def _node_state(self, node: str) -> NodeState | None:
        environment = self.cluster.nodes.get(node)
        return None if environment is None else self.loop.node_state(environment)

    def kill(self, node: str, grace_period_s: float = 0.0) -> None:
        if not self.is_running(node):
            raise PlatformError(f"cannot kill {node}: it is not running")
        if grace_period_s > 0 and node != CONTROLLER and not self.is_paused(node):
            server: BrokerServer = self.cluster.brokers[broker_id_of(node)]
            with entered(self.cluster.nodes[node]):
                stopping = self.loop.create_task(server.stop())
            self.loop.wait_until(stopping.done, min(grace_period_s, STOP_TIMEOUT_S),
                                 f"{node} to stop")
        self.cluster.kill(node)

    def hold_restart(self, node: str, duration_s: float) -> None:
        """Nothing restarts a simulated process but ``release``."""
        self.check_node(node)

    def release(self, node: str) -> None:
        """Start the node if it is not running; a broker whose log directory failed is
        about to halt whatever is freed now (as ``LocalPlatform.release``), so it is
        restarted once it has."""
        if self.is_running(node) and node != CONTROLLER and not self.is_paused(node) \
                and self.state(node).get("log_dir_offline"):
            self.loop.wait_until(lambda: not self.is_running(node), TIMEOUT_S,
                                 f"{node} to halt on its failed log directory")
        if self.is_running(node) or node in self._starting:
            return
        self._starting.add(node)

        def start() -> None:
            starting = (self.cluster.start_controller() if node == CONTROLLER
                        else self.cluster.start_broker(broker_id_of(node)))
            task = self.loop.create_task(starting)

            def started(done: asyncio.Task[None]) -> None:
                self._starting.discard(node)
                if not done.cancelled() and done.exception() is None:
                    self._serving[node] = self.cluster.incarnation(node)

            task.add_done_callback(started)

        self.loop.call_later(self.timing.start_delay_ms / 1000, start,
                             context=contextvars.Context())

    def await_serving(self, node: str) -> None:
        self.loop.wait_until(lambda: self.is_running(node), TIMEOUT_S, f"{node} to serve")

    def await_registered(self, node: str) -> None:
        def registered() -> bool:
            try:
                return self.registered_and_unfenced(node)
            except PlatformError:
                return False

        self.loop.wait_until(registered, TIMEOUT_S,
                             f"{node} to register with the controller, unfenced")

    def await_exit(self, node: str, incarnation: Hashable) -> None:
        self.loop.wait_until(lambda: self.incarnation(node) != incarnation, TIMEOUT_S,
                             f"{node}'s process to exit")

    def pause(self, node: str) -> None:
        if not self.is_running(node):
            raise PlatformError(f"cannot pause {node}: it is not running")
        self.cluster.pause(node)

    def resume(self, node: str) -> None:
        if self.is_paused(node):
            self.cluster.resume(node)

    def is_running(self, node: str) -> bool:
        """Serving, or paused while serving; not killed, halted or still starting."""
        state = self._node_state(self.check_node(node))
        return self._serving.get(node) == self.cluster.incarnation(node) and \
            state not in (None, NodeState.DEAD)

    def is_paused(self, node: str) -> bool:
        return self._node_state(self.check_node(node)) is NodeState.PAUSED

    def incarnation(self, node: str) -> Hashable | None:
        return self.cluster.incarnation(node) if self.is_running(node) else None

    # ---- the workload's client processes ------------------------------------------------------
    # A paused producer's host is a node of the loop, its client model's code (its
    # librdkafka timers: linger, request and message timeouts, the timeout scan; its reads of
    # what the brokers answer) all scheduled in that host's environment: SIGSTOP holds them,
    # SIGCONT runs them late and in order, while what it had written before is on the wire
    # already (`VirtualNetwork.deliver` runs in no node's context) and what arrives
    # meanwhile waits in its connections, unread, as in a stopped process's socket buffers.

    def client_environment(self, host: str) -> Environment:
        """The network and virtual wall clock of the workload's client host ``host``
        (``client``, or a client's own ``client-p0``): one environment per host, so that a
        host the loop pauses is known by it in every context its code runs in; its random
        source is seeded with the cluster's seed and the host."""
        if host not in self._client_environments:
            self._client_environments[host] = self.cluster.net.environment(
                host, wall_clock=lambda: EPOCH + self.loop.time(),
                rng=random.Random(f"{self.cluster.seed}/{host}"))
        return self._client_environments[host]

    @property
    def client_processes(self) -> tuple[str, ...]:
        return self._processes

    def _client_host(self, endpoint: str) -> Environment:
        if endpoint not in self._processes:
            raise PlatformError(f"{endpoint} has no process of its own; client processes are "
                                f"{', '.join(self._processes) or 'none'}")
        return self.client_environment(endpoint)

    def pause_client(self, endpoint: str) -> None:
        self.loop.pause(self._client_host(endpoint))

    def resume_client(self, endpoint: str) -> None:
        if endpoint in self._processes:
            self.loop.resume(self.client_environment(endpoint))

    def is_client_running(self, endpoint: str) -> bool:
        return endpoint in self._processes and \
            self.loop.node_state(self.client_environment(endpoint)) is not NodeState.DEAD

    def is_client_paused(self, endpoint: str) -> bool:
        return endpoint in self._processes and \
            self.loop.node_state(self.client_environment(endpoint)) is NodeState.PAUSED

    # ---- failpoints -------------------------------------------------------------------------

    @property
    def failpoint_token(self) -> str:
        return "simulation"

    def _broker(self, node: str, name: str) -> BrokerServer:
        if name not in FAILPOINTS:
            raise PlatformError(f"unknown failpoint {name!r}; known: {', '.join(FAILPOINTS)}")
        server = self._server(self.check_broker(node))
        assert isinstance(server, BrokerServer)
        return server

    def set_failpoint(self, node: str, name: str, duration_s: float | None = None) -> None:
        broker = self._broker(node, name)
        if name == "power-loss":
            self.cluster.power_loss(broker.broker_id)
            return
        if duration_s is None:
            raise PlatformError(f"failpoint {name} needs a duration")
        with entered(self.cluster.nodes[node]):  # its time limit is the node's own timer
            if name == "disk-stall":
                broker.disk_stall.stall(int(duration_s * 1000))
            else:
                broker.disk_full.fill(int(duration_s * 1000))

    def clear_failpoint(self, node: str, name: str) -> None:
        broker = self._broker(node, name)
        if name == "disk-stall":
            broker.disk_stall.clear()
        elif name == "disk-full":
            broker.disk_full.clear()

    def delete_pod(self, node: str, grace_period_s: float) -> None:
        """The StatefulSet's replacement: the process ends (gracefully within the grace
        period), its data goes with an ephemeral volume, a new one starts."""
        self.kill(self.check_broker(node), grace_period_s)
        if self.ephemeral_storage:
            shutil.rmtree(self.cluster.workdir / broker_host(broker_id_of(node)),
                          ignore_errors=True)
        self.release(node)

    # ---- clock and network ---------------------------------------------------------------------

    def start_timer(self, delay_s: float, callback: Callable[[], None], name: str
                    ) -> Cancellable:
        del name
        return self.loop.call_later(delay_s, callback, context=contextvars.Context())

    def _set_link_blocked(self, link: Link, blocked: bool) -> None:
        if blocked:
            self.cluster.net.block(link.src, link.dst)
        else:
            self.cluster.net.heal(link.src, link.dst)

    def delay_unsupported(self) -> str | None:
        return None

    def _set_link_delay(self, link: Link, delay: LinkDelay | None) -> None:
        # Its jitter from the seed, the link and how many delays it took before: the same
        # schedule draws the same delays under every PYTHONHASHSEED.
        self._delays_set += 1
        self.cluster.net.set_delay(link.src, link.dst, delay, random.Random(
            f"{self.cluster.seed}/delay/{link}/{self._delays_set}"))
