"""The guardian: a watchdog process that heals whatever a dead runner leaves behind.

The runner starts it first and tells it, over a pipe, every process group, network
namespace and network link it creates, and forgets each one it cleans up itself. When the
pipe reaches EOF (the runner exited: cleanly, on an exception, or by SIGKILL) the guardian
resumes and kills every process group still recorded, deletes the namespaces (their
iptables rules vanish with them) and links, and exits. The guardian runs in its own
session, so a Ctrl-C at the terminal does not reach it before the runner is gone.

Run as ``python -m undertow.platform.guardian``; protocol: one JSON object per line,
``{"op": "track"|"forget", "kind": "process"|"netns"|"link", "id": ..., "start": ...}``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from undertow.platform.base import PlatformError
from undertow.platform.procfs import alive, proc_stat

_KINDS = ("process", "netns", "link")
_EXIT_WAIT_S = 5.0


class Guardian:
    """The runner's end of the pipe to the guardian process."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self._popen = popen
        self._lock = threading.Lock()

    @classmethod
    def start(cls, log_path: Path) -> Guardian:
        """Start the guardian and return once it listens."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # Importable even when the runner found ``undertow`` through its own sys.path.
        source_root = str(Path(__file__).resolve().parents[2])
        pythonpath = os.pathsep.join(filter(None, [source_root, os.environ.get("PYTHONPATH")]))
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(
                [sys.executable, "-m", "undertow.platform.guardian"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                env={**os.environ, "PYTHONPATH": pythonpath}, start_new_session=True)
        ready = popen.stdout.readline()
        popen.stdout.close()
        if ready.strip() != b"ready":
            popen.kill()
            popen.wait()
            raise PlatformError(f"guardian failed to start; see {log_path}")
        return cls(popen)

    @property
    def pid(self) -> int:
        return self._popen.pid

    def track(self, kind: str, ident: int | str, start_ticks: int | None = None) -> None:
        """Record a process group (by its leader's pid and start time), netns or link."""
        if kind not in _KINDS:
            raise PlatformError(f"guardian cannot track {kind!r}; kinds are {_KINDS}")
        self._send({"op": "track", "kind": kind, "id": ident, "start": start_ticks})

    def forget(self, kind: str, ident: int | str) -> None:
        """The runner cleaned this up itself."""
        self._send({"op": "forget", "kind": kind, "id": ident})

    def close(self, timeout: float = 15.0) -> None:
        """Close the pipe; the guardian heals what is still recorded and exits."""
        with self._lock:
            if not self._popen.stdin.closed:
                self._popen.stdin.close()
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            self._popen.kill()
            self._popen.wait()
            raise PlatformError(f"guardian (pid {self.pid}) did not finish in {timeout:g}s") \
                from exc

    def _send(self, message: dict[str, Any]) -> None:
        with self._lock:
            try:
                self._popen.stdin.write(json.dumps(message).encode() + b"\n")
                self._popen.stdin.flush()
            except (BrokenPipeError, ValueError) as exc:
                raise PlatformError(f"guardian (pid {self.pid}) is gone: cannot record "
                                    f"{message['kind']} {message['id']}") from exc


class _Records:
    """What the guardian will clean up, in insertion order."""

    def __init__(self) -> None:
        self.items: dict[str, dict[Any, Any]] = {kind: {} for kind in _KINDS}

    def apply(self, line: str) -> None:
        message = json.loads(line)
        kind, op = message["kind"], message["op"]
        if kind not in _KINDS or op not in ("track", "forget"):
            raise ValueError(f"unknown guardian message {line!r}")
        if op == "track":
            self.items[kind][message["id"]] = message.get("start")
        else:
            self.items[kind].pop(message["id"], None)


def _log(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} guardian[{os.getpid()}]: {text}", file=sys.stderr,
          flush=True)


def _kill_group(pgid: int, start_ticks: int | None) -> bool:
    stat = proc_stat(pgid)
    if stat is not None and start_ticks is not None and stat[1] != start_ticks:
        return False  # the pid was reused, so the group we recorded is gone
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return False
    return True


def _run(argv: list[str]) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        _log(f"{' '.join(argv)}: {result.stderr.strip()}")


def heal(records: _Records) -> None:
    processes = records.items["process"]
    if any(records.items.values()):
        _log(f"the runner is gone; healing process groups {list(processes)}, namespaces "
             f"{list(records.items['netns'])}, links {list(records.items['link'])}")
    killed = [pgid for pgid, start in processes.items() if _kill_group(pgid, start)]
    for name in records.items["link"]:  # veths first: a deleted netns may linger a while
        _run(["ip", "link", "delete", name])
    for name in records.items["netns"]:
        pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True,
                              check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        _run(["ip", "netns", "delete", name])
    deadline = time.monotonic() + _EXIT_WAIT_S
    while time.monotonic() < deadline and any(alive(pid) for pid in killed):
        time.sleep(0.02)
    if any(records.items.values()):
        _log(f"healed; process groups still present and killed: {killed}")


def _serve(stdin: IO[str]) -> _Records:
    records = _Records()
    for line in stdin:
        if line.strip():
            try:
                records.apply(line)
            except (ValueError, KeyError) as exc:
                _log(f"ignoring bad message: {exc}")
    return records


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    heal(_serve(sys.stdin))


if __name__ == "__main__":
    main()
