"""The local platform: a minibroker controller and brokers as child processes.

Two network modes. ``proxy`` (no root): every node listens on loopback and every
connection between nodes, and from clients to brokers, goes through a per-link proxy in
the runner (``--controller``, ``--broker-address`` and ``--advertised-listener`` point at
the proxies). ``netns`` (root): every node in its own network namespace, partitions are
iptables rules. Kills, pauses and restarts are signals to the node's process group; disk
stalls, full disks and power loss are the broker's failpoints.

Nothing outlives the run: children die with the runner (PR_SET_PDEATHSIG), the proxies
are threads of the runner, and the guardian cleans up after a runner killed outright.

The controller serves only processes holding the run's controller secret (Kafka's
controller listener with SASL, KIP-631; ``minibroker.rpc_auth``): a fresh one per start in
``workdir/controller.secret`` (``--out DIR``: ``DIR/cluster/controller.secret``), mode 0600,
which the controller and the brokers find through ``$MINIBROKER_CONTROLLER_SECRET_FILE``,
never on a command line.

Long (about 510 lines): the ``Platform`` primitives over processes, one short method each;
the proxies, the namespaces and the guardian live in modules of their own.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import sys
import threading
import time
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minibroker.rpc_auth import SECRET_FILE_ENV, write_secret_file
from undertow.platform.admin import AdminClient
from undertow.platform.base import (
    CLIENT,
    CONTROLLER,
    Link,
    Platform,
    PlatformError,
    broker_node,
    client_endpoint,
    wait_for,
)
from undertow.platform.control import EndpointError
from undertow.platform.guardian import Guardian
from undertow.platform.link_delay import LinkDelay
from undertow.platform.netns import NetnsNetwork
from undertow.platform.ports import reserve_ports
from undertow.platform.process import ChildProcess, Spawner
from undertow.platform.proxy import ProxyNetwork

NETWORK_MODES = ("proxy", "netns")
FAILPOINT_TOKEN_ENV = "MINIBROKER_FAILPOINT_TOKEN"
CONTROLLER_SECRET_FILE = "controller.secret"
_NETNS_PORTS = {"broker": 9092, "controller": 9093, "metrics": 9100}

HALT_TIMEOUT_S = 10.0
"""How long a broker with a failed log directory may take to halt (it waits 0.1 s)."""


def default_command() -> tuple[str, ...]:
    """The ``minibroker`` console script of this environment."""
    beside = Path(sys.executable).with_name("minibroker")
    found = str(beside) if beside.exists() else shutil.which("minibroker")
    if found is None:
        raise PlatformError("minibroker console script not found; install the project "
                            "(pip install -e .)")
    return (found,)


@dataclass
class LocalPlatformConfig:
    """How to run the cluster; ``workdir`` receives ``data/NODE`` and ``logs/NODE.log``.

    Broker ids start at 0 like the StatefulSet ordinals the experiment spec counts with.
    """

    workdir: Path
    brokers: int = 3
    first_broker_id: int = 0
    network: str = "proxy"
    broker_config: Mapping[str, str] = field(default_factory=dict)
    controller_config: Mapping[str, str] = field(default_factory=dict)
    command: tuple[str, ...] = ()
    start_timeout_s: float = 30.0
    stop_grace_s: float = 2.0
    ephemeral_storage: bool = False
    """A pod-delete wipes the broker's data directory (an emptyDir dies with its pod)."""
    clients: tuple[str, ...] = ()
    """Workload clients (consumer ``c1``, producer ``p0``) that get links of their own,
    which a partition or a delay can act on apart from the other clients': a listener of
    their own on every broker (Kafka's listener names, KIP-103), behind proxies of their
    own. Proxy network only."""

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        if not isinstance(self.brokers, int) or self.brokers < 1:
            raise PlatformError(f"brokers: must be a positive integer, got {self.brokers!r}")
        if not isinstance(self.first_broker_id, int) or self.first_broker_id < 0:
            raise PlatformError(f"first_broker_id: must be a non-negative integer, got "
                                f"{self.first_broker_id!r}")
        if self.network not in NETWORK_MODES:
            raise PlatformError(f"network: must be one of {', '.join(NETWORK_MODES)}, "
                                f"got {self.network!r}")
        if self.start_timeout_s <= 0:
            raise PlatformError(f"start_timeout_s: must be positive, got {self.start_timeout_s}")
        if self.clients and self.network != "proxy":
            raise PlatformError(f"clients: links of their own for {', '.join(self.clients)} "
                                "(a partition or delay aimed at a client) need the proxy "
                                "network, not --network netns")


@dataclass
class _Wiring:
    """Where each node listens and how it reaches the others."""

    argv: dict[str, list[str]]
    admin_urls: dict[str, str]
    bootstrap: str
    netns: dict[str, str | None]
    client_bootstraps: dict[str, str] = field(default_factory=dict)


class LocalPlatform(Platform):
    """Controller and brokers as supervised child processes of the runner."""

    def __init__(self, config: LocalPlatformConfig) -> None:
        super().__init__()
        self.config = config
        self._failpoint_token = secrets.token_hex(16)
        first = config.first_broker_id
        self._broker_ids = tuple(range(first, first + config.brokers))
        self._lock = threading.RLock()
        self._node_locks = {node: threading.RLock() for node in self.nodes}
        self._state = "new"
        self._guardian: Guardian | None = None
        self._spawner: Spawner | None = None
        self._proxies: ProxyNetwork | None = None
        self._netns: NetnsNetwork | None = None
        self._wiring: _Wiring | None = None
        self._processes: dict[str, ChildProcess] = {}

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            if self._state != "new":
                raise PlatformError(f"platform already {self._state}; create a new one")
            self._state = "starting"
            try:
                self._start()
            except BaseException:
                self.stop()
                raise
            self._state = "running"

    def _start(self) -> None:
        command = self.config.command or default_command()
        logs = self.config.workdir / "logs"
        self._guardian = Guardian.start(logs / "guardian.log")
        self._spawner = Spawner()
        self._wiring = self._wire_netns() if self.config.network == "netns" else self._wire_proxy()
        secret = self.controller_secret_file
        secret.unlink(missing_ok=True)  # a fresh secret for every cluster the runner starts
        write_secret_file(secret)
        env = {**os.environ, FAILPOINT_TOKEN_ENV: self._failpoint_token,
               SECRET_FILE_ENV: str(secret.resolve()), "PYTHONUNBUFFERED": "1"}
        for node in self.nodes:
            (self.config.workdir / "data" / node).mkdir(parents=True, exist_ok=True)
            self._processes[node] = ChildProcess(
                node, [*command, *self._wiring.argv[node]], log_path=logs / f"{node}.log",
                spawner=self._spawner, guardian=self._guardian, env=env,
                netns=self._wiring.netns[node])
        self._start_nodes([CONTROLLER])
        self._start_nodes(self.brokers)
        wait_for(self.all_brokers_unfenced, self.config.start_timeout_s,
                 "every broker to register with the controller, unfenced",
                 interval=0.1, ignore=(EndpointError,))

    def stop(self) -> None:
        """Kill every process, close proxies, delete namespaces, release the guardian."""
        with self._lock:
            if self._state == "stopped":
                return
            self._state = "stopping"
            errors: list[BaseException] = []
            self._attempt(errors, self.kill_clients)  # what the workload did not stop itself
            # The brokers first, all at once so that they share one grace period, then the
            # controller, as Kafka's KafkaRaftServer.shutdown orders them: a broker's
            # controlled shutdown needs the controller's answer.
            for group in ([p for node, p in self._processes.items() if node != CONTROLLER],
                          [p for node, p in self._processes.items() if node == CONTROLLER]):
                for process in group:
                    process.send(signal.SIGCONT)
                    process.send(signal.SIGTERM)
                deadline = time.monotonic() + self.config.stop_grace_s
                for process in group:
                    self._attempt(errors, process.terminate,
                                  max(0.0, deadline - time.monotonic()))
            for closer in (self._proxies and self._proxies.close,
                           self._netns and self._netns.teardown,
                           self._spawner and self._spawner.close,
                           self._guardian and self._guardian.close):
                if closer:
                    self._attempt(errors, closer)
            with self._links_lock:
                self._blocks.clear()
            self._state = "stopped"
            if errors:
                raise PlatformError(f"stopping the local platform: {errors[0]}") from errors[0]

    @staticmethod
    def _attempt(errors: list[BaseException], action: Any, *args: Any) -> None:
        try:
            action(*args)
        except Exception as exc:
            errors.append(exc)

    def _client_spawning(self) -> tuple[Spawner, Guardian | None]:
        """The nodes' spawner and guardian: a client process dies with the runner as they do."""
        if self._spawner is None or self._state not in ("starting", "running"):
            raise PlatformError(f"cannot start a client process: the platform is {self._state}")
        return self._spawner, self._guardian

    # ---- wiring -----------------------------------------------------------------------------

    def _wire_proxy(self) -> _Wiring:
        host = "127.0.0.1"
        ports = iter(reserve_ports(2 * len(self.nodes), host))
        listen = {node: (host, next(ports)) for node in self.nodes}
        metrics = {node: next(ports) for node in self.nodes}
        self._proxies = ProxyNetwork(host)

        def via(src: str, dst: str) -> str:
            proxy_host, proxy_port = self._proxies.add_link(Link(src, dst), listen[dst])
            return f"{proxy_host}:{proxy_port}"

        argv = {CONTROLLER: self._controller_argv(listen[CONTROLLER], metrics[CONTROLLER])}
        client_addresses = []
        own_addresses: dict[str, list[str]] = {c: [] for c in self.config.clients}
        for broker_id, node in zip(self._broker_ids, self.brokers, strict=True):
            advertised = via(CLIENT, node)
            client_addresses.append(advertised)
            peers = [f"{peer_id}={via(node, broker_node(peer_id))}"
                     for peer_id in self._broker_ids if peer_id != broker_id]
            argv[node] = self._broker_argv(broker_id, listen[node], metrics[node],
                                           controller=via(node, CONTROLLER),
                                           advertised=advertised, peers=peers)
            for client in self.config.clients:
                # The client's own listener: Metadata answers it with these addresses
                # only, so every connection of the client takes its own links.
                (port,) = reserve_ports(1, host, taken={
                    *(p for _, p in listen.values()), *metrics.values(),
                    *_ports_of(argv.values())})
                own_host, own_port = self._proxies.add_link(
                    Link(client_endpoint(client), node), (host, port))
                own_addresses[client].append(f"{own_host}:{own_port}")
                name = listener_name(client)
                argv[node] += ["--listener", f"{name}={host}:{port}",
                               "--advertised-listener", f"{name}={own_host}:{own_port}"]
        return _Wiring(argv=argv,
                       admin_urls={node: f"http://{host}:{metrics[node]}" for node in self.nodes},
                       bootstrap=",".join(client_addresses),
                       netns=dict.fromkeys(self.nodes),
                       client_bootstraps={c: ",".join(addresses)
                                          for c, addresses in own_addresses.items()})

    def _wire_netns(self) -> _Wiring:
        self._netns = NetnsNetwork(self.nodes, self._guardian)
        self._netns.setup()
        address = self._netns.address
        metrics = _NETNS_PORTS["metrics"]
        controller = (address(CONTROLLER), _NETNS_PORTS["controller"])
        argv = {CONTROLLER: self._controller_argv(controller, metrics)}
        for broker_id, node in zip(self._broker_ids, self.brokers, strict=True):
            listen = (address(node), _NETNS_PORTS["broker"])
            argv[node] = self._broker_argv(broker_id, listen, metrics,
                                           controller="{}:{}".format(*controller),
                                           advertised="{}:{}".format(*listen), peers=[])
        return _Wiring(
            argv=argv,
            admin_urls={node: f"http://{address(node)}:{metrics}" for node in self.nodes},
            bootstrap=",".join(f"{address(node)}:{_NETNS_PORTS['broker']}"
                               for node in self.brokers),
            netns={node: self._netns.namespace(node) for node in self.nodes})

    def _controller_argv(self, listen: tuple[str, int], metrics: int) -> list[str]:
        return ["controller", "--listen", "{}:{}".format(*listen),
                "--data-dir", str(self.config.workdir / "data" / CONTROLLER),
                "--metrics-port", str(metrics),
                *_config_args(self.config.controller_config)]

    def _broker_argv(self, broker_id: int, listen: tuple[str, int], metrics: int, *,
                     controller: str, advertised: str, peers: list[str]) -> list[str]:
        argv = ["broker", "--id", str(broker_id), "--listen", "{}:{}".format(*listen),
                "--controller", controller,
                "--data-dir", str(self.config.workdir / "data" / broker_node(broker_id)),
                "--metrics-port", str(metrics), "--advertised-listener", advertised]
        for peer in peers:
            argv += ["--broker-address", peer]
        return argv + _config_args(self.config.broker_config)

    # ---- names and addresses ----------------------------------------------------------------

    @property
    def broker_ids(self) -> tuple[int, ...]:
        return self._broker_ids

    @property
    def bootstrap(self) -> str:
        return self._wired().bootstrap

    @property
    def client_endpoints(self) -> tuple[str, ...]:
        return tuple(client_endpoint(c) for c in self.config.clients)

    def bootstrap_for(self, client: str) -> str:
        return self._wired().client_bootstraps.get(client, self.bootstrap)

    def admin_url(self, node: str) -> str:
        return self._wired().admin_urls[self.check_node(node)]

    def state(self, node: str) -> dict[str, Any]:
        return self._admin(node).state()

    def events(self, node: str, log_id: str | None, offset: int) -> dict[str, Any]:
        return self._admin(node).events(log_id, offset)

    def log_path(self, node: str) -> Path:
        return self.config.workdir / "logs" / f"{self.check_node(node)}.log"

    def pid(self, node: str) -> int | None:
        """The node's current process id (None before it was first started)."""
        return self._process(node).pid

    @property
    def guardian_pid(self) -> int | None:
        return self._guardian.pid if self._guardian is not None else None

    @property
    def proxies(self) -> ProxyNetwork | None:
        return self._proxies

    @property
    def namespaces(self) -> NetnsNetwork | None:
        return self._netns

    # ---- processes --------------------------------------------------------------------------

    @property
    def timeout_s(self) -> float:
        return self.config.start_timeout_s

    @property
    def failpoint_token(self) -> str:
        return self._failpoint_token

    @property
    def controller_secret_file(self) -> Path:
        """Where the controller secret of the run is (read it to talk to the controller)."""
        return self.config.workdir / CONTROLLER_SECRET_FILE

    def kill(self, node: str, grace_period_s: float = 0.0) -> None:
        with self._node_locks[self.check_node(node)]:
            process = self._process(node)
            if not process.running:
                raise PlatformError(f"cannot kill {node}: it is not running")
            if grace_period_s > 0:
                process.terminate(grace_period_s)
            else:
                process.kill()

    def hold_restart(self, node: str, duration_s: float) -> None:
        """Nothing restarts a local process but ``release``: it is held already."""
        self.check_node(node)

    def release(self, node: str) -> None:
        """Start the node if it is not running (the runner is its kubelet)."""
        with self._node_locks[self.check_node(node)]:
            if self._state not in ("starting", "running"):
                raise PlatformError(f"cannot restart {node}: the platform is {self._state}")
            process = self._process(node)
            if process.running and self._halting(node):
                # Its log directory failed (disk-full): it halts a moment later whatever
                # is freed now (LogManager.handleLogDirFailure), so it is restarted after.
                wait_for(lambda: not process.running, HALT_TIMEOUT_S,
                         f"{node} to halt on its failed log directory")
            if process.running:
                return
            process.kill()  # reap whatever exited on its own
            process.start()

    def _halting(self, node: str) -> bool:
        """The broker reports a failed log directory: it is about to halt."""
        try:
            return bool(AdminClient(self.admin_url(node), timeout_s=1.0).state().get(
                "log_dir_offline"))
        except EndpointError:  # gone already, or not answering: nothing to wait for
            return False

    def await_serving(self, node: str) -> None:
        process, url = self._process(node), self.admin_url(node)

        def serving() -> bool:
            if not process.running:
                raise PlatformError(f"{node} exited with status {process.returncode} while "
                                    f"starting:\n{self._log_tail(node)}")
            AdminClient(url, timeout_s=1.0).state()
            return True

        wait_for(serving, self.config.start_timeout_s, f"{node} to serve {url}/v1/state",
                 ignore=(EndpointError,))

    def pause(self, node: str) -> None:
        with self._node_locks[self.check_node(node)]:
            self._process(node).pause()

    def resume(self, node: str) -> None:
        with self._node_locks[self.check_node(node)]:
            self._process(node).resume()

    def is_running(self, node: str) -> bool:
        return self._process(node).running

    def is_paused(self, node: str) -> bool:
        return self._process(node).paused

    def incarnation(self, node: str) -> int | None:
        process = self._process(node)
        return process.pid if process.running else None

    def await_exit(self, node: str, incarnation: Hashable) -> None:
        process = self._process(node)
        if process.pid == incarnation:
            process.wait_exit(self.config.start_timeout_s)

    def _start_nodes(self, nodes: Sequence[str]) -> None:
        """Start the processes together, then wait until each serves its admin endpoint."""
        for node in nodes:
            self._process(node).start()
        for node in nodes:
            self.await_serving(node)

    # ---- pods -------------------------------------------------------------------------------

    def delete_pod(self, node: str, grace_period_s: float) -> None:
        """What deleting the broker's pod does, which its StatefulSet replaces at once:
        SIGTERM, then SIGKILL after the grace period; the data directory wiped when storage
        is ephemeral; the replacement listens on a new port behind the same proxies (a new
        pod IP behind the same Service name; in netns mode the address stays); it starts at
        once, a new incarnation."""
        with self._node_locks[self.check_broker(node)]:
            process = self._process(node)
            if not process.running:
                raise PlatformError(f"cannot delete the pod of {node}: it is not running")
            if grace_period_s > 0:
                process.terminate(grace_period_s)
            else:
                process.kill()
            if self.config.ephemeral_storage:
                data = self.config.workdir / "data" / node
                shutil.rmtree(data, ignore_errors=True)
                data.mkdir(parents=True)
            if self._proxies is not None:
                self._move_listeners(process)
            process.start()

    def _move_listeners(self, process: ChildProcess) -> None:
        """A replaced pod listens at a new IP: each of its listeners on a new port, and the
        proxies of its links forward there, as its Service names resolve to the new IP."""
        assert self._proxies is not None
        argv, node = process.argv, process.name
        own = {listener_name(c): client_endpoint(c) for c in self.config.clients}
        for index in [i + 1 for i, arg in enumerate(argv) if arg in ("--listen", "--listener")]:
            name, _, address = argv[index].rpartition("=")
            host = address.rsplit(":", 1)[0]
            # Not a port of another node: a killed broker binds its own again on restart.
            (port,) = reserve_ports(1, host, taken=_ports_of(
                p.argv for p in self._processes.values()))
            argv[index] = f"{name}={host}:{port}" if name else f"{host}:{port}"
            if name:
                self._proxies.move_link(Link(own[name], node), (host, port))
            else:  # the default listener: every other link to the node
                self._proxies.move_upstream(node, (host, port), but=frozenset(own.values()))

    # ---- network ----------------------------------------------------------------------------

    def _set_link_blocked(self, link: Link, blocked: bool) -> None:
        if self._proxies is not None:
            self._proxies.set_blocked(link, blocked)
        elif self._netns is not None:
            self._netns.set_blocked(link, blocked)
        else:
            raise PlatformError("the platform is not started")

    def delay_unsupported(self) -> str | None:
        return None  # the proxies queue a delayed link's bytes; netns, its packets

    def _set_link_delay(self, link: Link, delay: LinkDelay | None) -> None:
        if self._proxies is not None:
            self._proxies.set_delay(link, delay)
        elif self._netns is not None:
            self._netns.set_delay(link, delay)
        else:
            raise PlatformError("the platform is not started")

    # ---- helpers ----------------------------------------------------------------------------

    def _wired(self) -> _Wiring:
        if self._wiring is None:
            raise PlatformError("the platform is not started")
        return self._wiring

    def _process(self, node: str) -> ChildProcess:
        try:
            return self._processes[self.check_node(node)]
        except KeyError:
            raise PlatformError(f"{node} has no process: the platform is not started") from None

    def _admin(self, node: str) -> AdminClient:
        return AdminClient(self.admin_url(node))

    def _log_tail(self, node: str, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path(node).read_text(errors="replace")
                             .splitlines()[-lines:])
        except OSError:
            return "(no log)"


def _ports_of(argvs: Iterable[list[str]]) -> set[int]:
    """The ports named in the nodes' command lines (``HOST:PORT``, ``NAME=HOST:PORT``, the
    number after ``--metrics-port``)."""
    ports = set()
    for argv in argvs:
        for before, arg in zip(["", *argv], argv, strict=False):
            if before == "--metrics-port":
                ports.add(int(arg))
            elif re.fullmatch(r"(\w+=)?[\w.\-]+:\d+", arg):
                ports.add(int(arg.rsplit(":", 1)[1]))
    return ports


def listener_name(client: str) -> str:
    """The Kafka listener name of a client's own links (``c1`` -> ``CLIENT_C1``)."""
    return f"CLIENT_{client.upper()}"


def _config_args(config: Mapping[str, str]) -> list[str]:
    args = []
    for key, value in config.items():
        args += ["--config", f"{key}={value}"]
    return args
