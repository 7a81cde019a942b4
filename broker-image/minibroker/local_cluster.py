"""``minibroker cluster``: a controller and N brokers as child processes, for demos and tests.

Ports: the controller listens on BASE, broker i on BASE+i; metrics/control endpoints on
BASE+100 (controller) and BASE+100+i (broker i). Children die with this process
(PR_SET_PDEATHSIG), and Ctrl-C or SIGTERM stops them all. The controller secret is
``DATA_DIR/controller.secret`` (mode 0600, made on the first start), which the children
find through ``$MINIBROKER_CONTROLLER_SECRET_FILE``.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from minibroker.rpc_auth import SECRET_FILE_ENV, write_secret_file

PR_SET_PDEATHSIG = 1
SECRET_FILE = "controller.secret"
STOP_TIMEOUT_S = 10


def die_with_parent() -> None:
    """preexec_fn: SIGKILL this child when its parent dies, whatever the parent's fate."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def cluster_commands(brokers: int, host: str, base_port: int, data_dir: Path,
                     config: list[str]) -> list[tuple[str, list[str]]]:
    overrides = [arg for pair in config for arg in ("--config", pair)]
    exe = [sys.executable, "-m", "minibroker"]
    commands = [("controller", [*exe, "controller", "--listen", f"{host}:{base_port}",
                                "--data-dir", str(data_dir / "controller"),
                                "--metrics-port", str(base_port + 100), *overrides])]
    for i in range(1, brokers + 1):
        commands.append((f"broker-{i}", [
            *exe, "broker", "--id", str(i), "--listen", f"{host}:{base_port + i}",
            "--controller", f"{host}:{base_port}", "--data-dir", str(data_dir / f"broker-{i}"),
            "--metrics-port", str(base_port + 100 + i), *overrides]))
    return commands


def run_local_cluster(brokers: int, host: str, base_port: int, data_dir: Path,
                      config: list[str]) -> int:
    data_dir.mkdir(parents=True, exist_ok=True)
    children: dict[str, subprocess.Popen] = {}
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    secret = data_dir / SECRET_FILE
    if not secret.exists():
        write_secret_file(secret)
    env = {**os.environ, SECRET_FILE_ENV: str(secret.resolve())}
    for name, command in cluster_commands(brokers, host, base_port, data_dir, config):
        children[name] = subprocess.Popen(command, preexec_fn=die_with_parent, env=env)
    bootstrap = ",".join(f"{host}:{base_port + i}" for i in range(1, brokers + 1))
    print(f"minibroker cluster: controller {host}:{base_port}, bootstrap {bootstrap}, "
          f"metrics on ports {base_port + 100}-{base_port + 100 + brokers}, controller "
          f"secret in {secret}; Ctrl-C stops it", flush=True)
    exit_code = 0
    while not stopping:
        for name, child in children.items():
            if child.poll() is not None:
                print(f"minibroker cluster: {name} exited with {child.returncode}",
                      file=sys.stderr, flush=True)
                stopping, exit_code = True, 1
        time.sleep(0.2)
    # The brokers first, then the controller, as Kafka's KafkaRaftServer.shutdown orders
    # them: a broker's controlled shutdown needs the controller's answer.
    for group in ([c for name, c in children.items() if name != "controller"],
                  [children["controller"]]):
        for child in group:
            if child.poll() is None:
                child.send_signal(signal.SIGCONT)
                child.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for child in group:
            try:
                child.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    return exit_code


