"""``minibroker cluster``: a controller and N brokers as child processes, for demos and tests.

Ports: the controller listens on BASE, broker i on BASE+i; metrics/control endpoints on
BASE+100 (controller) and BASE+100+i (broker i). Children die with this process
(PR_SET_PDEATHSIG), and Ctrl-C or SIGTERM stops them all. The controller secret is
``DATA_DIR/controller.secret`` (mode 0600, made on the first start), which the children
find through ``$MINIBROKER_CONTROLLER_SECRET_FILE``.

A node that exits (a crash, ``kill -9``) leaves the others serving, as a Kafka broker's
death leaves its cluster running: the launcher prints which node it was, its pid and how
it exited, and starts it again after ``--restart-after`` seconds, or when
``minibroker cluster restart NODE`` asks (through the control socket, ``cluster_control``).
The restarted node has the same id, ports and data dir, so it recovers its log and rejoins
as a Kafka broker restarted on its old disk does.
"""

from __future__ import annotations

import ctypes
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from minibroker import cluster_control
from minibroker.rpc_auth import SECRET_FILE_ENV, write_secret_file

PR_SET_PDEATHSIG = 1
SECRET_FILE = "controller.secret"
STOP_TIMEOUT_S = 10
CHECK_INTERVAL_S = 0.2
CONTROLLER = "controller"


def die_with_parent() -> None:
    """preexec_fn: SIGKILL this child when its parent dies, whatever the parent's fate."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def how_it_exited(returncode: int) -> str:
    """``was killed by SIGKILL`` for a signal (Popen's negative return code), else
    ``exited with code N``."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        return f"was killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"was killed by signal {-returncode}"


@dataclass
class Node:
    """One child of the launcher: its command, and the process running it now (a restart
    replaces it)."""

    key: str  # what `minibroker cluster restart` names it by: "controller" or the broker id
    address: str
    command: list[str]
    process: subprocess.Popen
    exit: str | None = None  # how the process exited, once the launcher has seen it
    exited_at: float = 0.0
    restart_at: float | None = None  # time.monotonic() of a restart --restart-after set

    @property
    def name(self) -> str:
        return CONTROLLER if self.key == CONTROLLER else f"broker {self.key}"

    def state(self, now: float) -> str:
        if self.exit is None:
            return "running"
        restart = "" if self.restart_at is None else \
            f"; restarting in {max(self.restart_at - now, 0):.0f} s"
        return f"{self.exit} {now - self.exited_at:.0f} s ago{restart}"


def cluster_commands(brokers: int, host: str, base_port: int, data_dir: Path,
                     config: list[str]) -> list[tuple[str, str, list[str]]]:
    """(key, address, command) of the controller and each broker."""
    overrides = [arg for pair in config for arg in ("--config", pair)]
    exe = [sys.executable, "-m", "minibroker"]
    commands = [(CONTROLLER, f"{host}:{base_port}", [
        *exe, "controller", "--listen", f"{host}:{base_port}",
        "--data-dir", str(data_dir / "controller"),
        "--metrics-port", str(base_port + 100), *overrides])]
    for i in range(1, brokers + 1):
        commands.append((str(i), f"{host}:{base_port + i}", [
            *exe, "broker", "--id", str(i), "--listen", f"{host}:{base_port + i}",
            "--controller", f"{host}:{base_port}", "--data-dir", str(data_dir / f"broker-{i}"),
            "--metrics-port", str(base_port + 100 + i), *overrides]))
    return commands


def invocation() -> str:
    """How the user ran minibroker (``.venv/bin/minibroker``, or ``python -m``), for the
    commands the launcher prints to be pasted as they are."""
    if Path(sys.argv[0]).name == "minibroker":
        return sys.argv[0]
    return f"{sys.executable} -m minibroker"


def say(line: str) -> None:
    print(f"minibroker cluster: {line}", flush=True)


class Launcher:
    """The children, their exits and restarts, and the control socket's requests."""

    def __init__(self, data_dir: Path, restart_after: float | None, env: dict[str, str]
                 ) -> None:
        self.data_dir = data_dir
        self.restart_after = restart_after
        self.env = env
        self.nodes: dict[str, Node] = {}

    def spawn(self, command: list[str]) -> subprocess.Popen:
        return subprocess.Popen(command, preexec_fn=die_with_parent, env=self.env)

    def row(self, node: Node) -> str:
        """``broker 2    127.0.0.1:9092  pid 1234   ``: a node's line of the start banner and
        of ``status``, aligned with the others'."""
        width = max(len(n.address) for n in self.nodes.values())
        return f"{node.name:<10}  {node.address:<{width}}  pid {node.process.pid:<7}"

    def restart_hint(self, node: Node) -> str:
        if node.restart_at is not None:
            return f"restarting it in {self.restart_after:g} s"
        return (f"restart it: {invocation()} cluster restart {node.key} "
                f"--data-dir {self.data_dir}")

    def check(self) -> None:
        """Report each node that has exited since the last check; start those whose
        --restart-after delay is over."""
        now = time.monotonic()
        for node in self.nodes.values():
            if node.exit is None and node.process.poll() is not None:
                node.exit, node.exited_at = how_it_exited(node.process.returncode), now
                if self.restart_after is not None:
                    node.restart_at = now + self.restart_after
                others = ("the brokers keep serving, but no leader can be elected and no "
                          "broker fenced until it is back" if node.key == CONTROLLER
                          else "the other nodes keep serving")
                say(f"{node.name} (pid {node.process.pid}) {node.exit}; {others}; "
                    f"{self.restart_hint(node)}")
            elif node.restart_at is not None and now >= node.restart_at:
                say(self.restart(node, "after --restart-after"))

    def restart(self, node: Node, why: str) -> str:
        node.process = self.spawn(node.command)
        node.exit, node.restart_at = None, None
        return f"{node.name} restarted {why} (pid {node.process.pid})"

    def handle(self, request: str) -> tuple[bool, str]:
        """A control socket request: ``status``, or ``restart NODE`` of an exited node."""
        self.check()  # an exit since the last check: status shows it, restart may start it
        verb, _, key = request.partition(" ")
        if verb == "status":
            now = time.monotonic()
            return True, "\n".join(f"{self.row(node)}  {node.state(now)}"
                                    for node in self.nodes.values())
        if verb != "restart":
            return False, f"unknown request {request!r}: expected status or restart NODE"
        node = self.nodes.get(key)
        if node is None:
            return False, (f"no node {key!r}: the nodes are "
                           f"{', '.join(self.nodes)} (a broker by its id)")
        if node.exit is None:
            return False, (f"{node.name} is running (pid {node.process.pid}); restart starts "
                           f"a node that has exited (kill -9 {node.process.pid} crashes it)")
        line = self.restart(node, "as asked")
        say(line)
        return True, line

    def serve_one(self, server: socket.socket) -> None:
        try:
            conn, _ = server.accept()
        except BlockingIOError:
            return
        with conn:
            try:
                ok, text = self.handle(cluster_control.read_request(conn))
            except cluster_control.ControlError as exc:
                ok, text = False, str(exc)
            except OSError:
                return
            cluster_control.answer(conn, ok, text)

    def stop_all(self) -> None:
        """The brokers first, then the controller, as Kafka's ``KafkaRaftServer.shutdown``
        orders them: a broker's controlled shutdown needs the controller's answer."""
        brokers = [n for n in self.nodes.values() if n.key != CONTROLLER]
        controller = [n for n in self.nodes.values() if n.key == CONTROLLER]
        for group in (brokers, controller):
            for node in group:
                if node.process.poll() is None:
                    node.process.send_signal(signal.SIGCONT)
                    node.process.terminate()
            deadline = time.monotonic() + STOP_TIMEOUT_S
            for node in group:
                try:
                    node.process.wait(max(deadline - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    node.process.kill()
                    node.process.wait()


def run_local_cluster(brokers: int, host: str, base_port: int, data_dir: Path,
                      config: list[str], restart_after: float | None = None) -> int:
    data_dir.mkdir(parents=True, exist_ok=True)
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        server: socket.socket | None = cluster_control.listen(data_dir)
    except cluster_control.AlreadyRunning as exc:
        print(f"minibroker cluster: {exc}", file=sys.stderr)
        return 2
    except cluster_control.ControlError as exc:
        server = None
        say(f"no control socket ({exc}): `minibroker cluster restart` cannot reach this "
            f"launcher; --restart-after still restarts exited nodes")
    secret = data_dir / SECRET_FILE
    if not secret.exists():
        write_secret_file(secret)
    launcher = Launcher(data_dir, restart_after,
                        {**os.environ, SECRET_FILE_ENV: str(secret.resolve())})
    for key, address, command in cluster_commands(brokers, host, base_port, data_dir, config):
        launcher.nodes[key] = Node(key, address, command, launcher.spawn(command))
    for node in launcher.nodes.values():
        say(launcher.row(node).rstrip())
    bootstrap = ",".join(f"{host}:{base_port + i}" for i in range(1, brokers + 1))
    say(f"bootstrap {bootstrap}; HTTP endpoints (--metrics-port) on ports "
        f"{base_port + 100}-{base_port + 100 + brokers}; controller secret in {secret}")
    again = ("" if restart_after is None
             else f"; an exited node starts again after {restart_after:g} s")
    say(f"`kill -9 PID` crashes a node, the others keep serving{again}; "
        f"`{invocation()} cluster restart N --data-dir {data_dir}` starts broker N "
        f"(or `restart controller`: the controller) again")
    say(f"`{invocation()} cluster status --data-dir {data_dir}` lists the nodes; "
        f"Ctrl-C stops them all")
    selector = selectors.DefaultSelector()
    if server is not None:
        selector.register(server, selectors.EVENT_READ)
    try:
        while not stopping:
            launcher.check()
            if selector.select(CHECK_INTERVAL_S) and server is not None and not stopping:
                launcher.serve_one(server)
    finally:
        say("stopping every node")
        selector.close()
        if server is not None:
            server.close()
            cluster_control.socket_path(data_dir).unlink(missing_ok=True)
        launcher.stop_all()
    return 0
