"""The fault agent: a sidecar in every broker and controller pod that pauses the broker and
cuts its links, and heals both on its own when their deadline passes.

It shares the pod's process namespace (``shareProcessNamespace: true``), so it finds the
broker by its command line and stops it with SIGSTOP (SIGCONT resumes it); it shares the
pod's network namespace, so its iptables rules drop exactly this pod's packets whatever
the CNI. Rules live in chains of its own (``UNDERTOW-INPUT``, ``UNDERTOW-OUTPUT``) jumped
to from INPUT and OUTPUT, so healing is a flush and nothing else in the pod is touched.

Every fault carries a deadline: when it passes, the agent removes the rule or resumes the
process itself, even if the runner and the operator are gone. A restarted agent has
forgotten its deadlines, so it heals everything as it starts.

HTTP API (JSON; bearer token from ``$UNDERTOW_AGENT_TOKEN`` on everything but /healthz)::

    GET    /healthz
    GET    /v1/faults                           -> {"faults": [...], "paused": bool}
    POST   /v1/pause   {"deadline_s": 10}       SIGSTOP the target; returns once stopped
    POST   /v1/resume                           SIGCONT the target
    PUT    /v1/drops/{input|output}/{ip}  {"deadline_s": 10}
    DELETE /v1/drops/{input|output}/{ip}
    POST   /v1/heal                             remove every rule, resume every target

``input`` drops packets from the peer (INPUT -s), ``output`` packets to it (OUTPUT -d).
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from undertow.platform.base import PlatformError

log = logging.getLogger("undertow.agent")

TOKEN_ENV = "UNDERTOW_AGENT_TOKEN"
MAX_DEADLINE_S = 3600.0
STOP_TIMEOUT_S = 5.0
DIRECTIONS = {"input": ("INPUT", "UNDERTOW-INPUT", "-s"),
              "output": ("OUTPUT", "UNDERTOW-OUTPUT", "-d")}


class AgentError(PlatformError):
    """A fault could not be applied or removed; ``status`` is the HTTP status to answer."""

    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.status = status


# ---- the two mechanisms ---------------------------------------------------------------------


class Netfilter:
    """iptables DROP rules in the agent's network namespace, in the agent's own chains.

    ``command`` is how iptables is called; a test prefixes it with ``ip netns exec NS``.
    """

    def __init__(self, command: Sequence[str] = ("iptables", "-w")) -> None:
        self.command = tuple(command)

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([*self.command, *args], capture_output=True, text=True,
                                check=False)
        if check and result.returncode != 0:
            raise AgentError(f"{' '.join([*self.command, *args])}: {result.stderr.strip()}")
        return result

    def setup(self) -> None:
        """Create the chains and their jumps (idempotent), then empty them."""
        for parent, chain, _ in DIRECTIONS.values():
            if self._run("-n", "-L", chain, check=False).returncode != 0:
                self._run("-N", chain)
            if self._run("-C", parent, "-j", chain, check=False).returncode != 0:
                self._run("-I", parent, "1", "-j", chain)
        self.flush()

    def flush(self) -> None:
        for _, chain, _ in DIRECTIONS.values():
            self._run("-F", chain)

    def _rule(self, direction: str, peer: str) -> tuple[str, ...]:
        _, chain, flag = DIRECTIONS[direction]
        return (chain, flag, f"{peer}/32", "-j", "DROP")

    def drop(self, direction: str, peer: str) -> None:
        chain, *rule = self._rule(direction, peer)
        if self._run("-C", chain, *rule, check=False).returncode != 0:
            self._run("-A", chain, *rule)

    def undrop(self, direction: str, peer: str) -> None:
        chain, *rule = self._rule(direction, peer)
        while self._run("-C", chain, *rule, check=False).returncode == 0:
            self._run("-D", chain, *rule)

    def rules(self) -> list[str]:
        """``iptables -S`` of the agent's chains."""
        lines: list[str] = []
        for _, chain, _ in DIRECTIONS.values():
            lines += self._run("-S", chain).stdout.splitlines()
        return lines


class Processes:
    """The processes a pause targets: those whose command line contains ``marker``."""

    def __init__(self, marker: str, proc: Path = Path("/proc")) -> None:
        if not marker:
            raise ValueError("the target marker must not be empty")
        self.marker = marker
        self.proc = proc

    def pids(self) -> list[int]:
        found = []
        for entry in self.proc.iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                    errors="replace")
            except OSError:
                continue  # exited meanwhile
            if self.marker in cmdline and self.state(int(entry.name)) not in ("Z", "X", None):
                found.append(int(entry.name))
        return sorted(found)

    def state(self, pid: int) -> str | None:
        """The one-letter state of /proc/PID/stat (T: stopped), None when gone."""
        try:
            stat = (self.proc / str(pid) / "stat").read_text()
        except OSError:
            return None
        return stat.rsplit(")", 1)[1].split()[0]

    def stop(self) -> list[int]:
        pids = self.pids()
        if not pids:
            raise AgentError(f"no process matches {self.marker!r}", 409)
        for pid in pids:
            self._signal(pid, signal.SIGSTOP)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while any(self.state(pid) not in ("T", "t", None) for pid in pids):
            if time.monotonic() > deadline:
                raise AgentError(f"processes {pids} did not stop within {STOP_TIMEOUT_S:g}s")
            time.sleep(0.01)
        return pids

    def resume(self) -> list[int]:
        pids = self.pids()
        for pid in pids:
            self._signal(pid, signal.SIGCONT)
        return pids

    def paused(self) -> bool:
        return any(self.state(pid) in ("T", "t") for pid in self.pids())

    @staticmethod
    def _signal(pid: int, sig: signal.Signals) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError as exc:
            raise AgentError(f"cannot send {sig.name} to {pid}: {exc} (the agent needs "
                             "CAP_KILL to signal another user's process)") from exc


# ---- the agent ------------------------------------------------------------------------------


@dataclass
class Fault:
    kind: str
    """``pause`` or ``drop``."""
    key: str
    """``pause`` or ``input/10.0.0.5``: one fault per key, a new one replaces the old."""
    deadline: float
    """``time.monotonic()`` at which the agent heals it."""

    def to_json(self, now: float) -> dict[str, Any]:
        return {"kind": self.kind, "key": self.key,
                "expires_in_s": round(max(0.0, self.deadline - now), 3)}


class FaultAgent:
    """Applies faults, remembers their deadlines and heals each one when its time is up."""

    def __init__(self, netfilter: Netfilter, processes: Processes,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.netfilter = netfilter
        self.processes = processes
        self._clock = clock
        self._faults: dict[str, Fault] = {}
        self._lock = threading.Condition()
        self._closed = False
        self._reaper = threading.Thread(target=self._reap, name="fault-deadlines", daemon=True)

    def start(self) -> None:
        """Heal what a previous agent may have left (its deadlines died with it), then run."""
        self.netfilter.setup()
        self.processes.resume()
        self._reaper.start()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        if self._reaper.is_alive():
            self._reaper.join()

    # ---- faults ---------------------------------------------------------------------------

    def pause(self, deadline_s: float) -> list[int]:
        with self._lock:
            pids = self.processes.stop()
            self._remember(Fault("pause", "pause", self._clock() + deadline_s))
            log.info("paused %s for at most %.1fs", pids, deadline_s)
            return pids

    def resume(self) -> list[int]:
        with self._lock:
            self._faults.pop("pause", None)
            return self.processes.resume()

    def drop(self, direction: str, peer: str, deadline_s: float) -> None:
        with self._lock:
            self.netfilter.drop(direction, peer)
            self._remember(Fault("drop", f"{direction}/{peer}", self._clock() + deadline_s))
            log.info("dropping %s %s for at most %.1fs", direction, peer, deadline_s)

    def undrop(self, direction: str, peer: str) -> None:
        with self._lock:
            self.netfilter.undrop(direction, peer)
            self._faults.pop(f"{direction}/{peer}", None)

    def heal(self) -> None:
        """Remove every rule and resume every target, whatever the agent remembers."""
        with self._lock:
            self.netfilter.flush()
            self.processes.resume()
            self._faults.clear()

    def faults(self) -> dict[str, Any]:
        with self._lock:
            now = self._clock()
            return {"faults": [f.to_json(now) for f in self._faults.values()],
                    "paused": self.processes.paused()}

    # ---- deadlines ------------------------------------------------------------------------

    def _remember(self, fault: Fault) -> None:
        self._faults[fault.key] = fault
        self._lock.notify_all()

    def _reap(self) -> None:
        with self._lock:
            while not self._closed:
                now = self._clock()
                for fault in [f for f in self._faults.values() if f.deadline <= now]:
                    self._expire(fault)
                upcoming = [f.deadline for f in self._faults.values()]
                self._lock.wait(timeout=min(upcoming) - now if upcoming else None)

    def _expire(self, fault: Fault) -> None:
        try:
            if fault.kind == "pause":
                self.processes.resume()
            else:
                direction, peer = fault.key.split("/", 1)
                self.netfilter.undrop(direction, peer)
        except AgentError:
            # Try again shortly rather than leave the fault in place.
            log.exception("healing %s at its deadline failed; retrying", fault.key)
            fault.deadline = self._clock() + 1.0
            return
        del self._faults[fault.key]
        log.info("%s healed at its deadline", fault.key)


# ---- HTTP -----------------------------------------------------------------------------------


def _deadline(body: dict[str, Any]) -> float:
    value = body.get("deadline_s")
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not 0 < value <= MAX_DEADLINE_S:
        raise AgentError(f"deadline_s must be a number in (0, {MAX_DEADLINE_S:g}], "
                         f"got {value!r}", 400)
    return float(value)


def _drop_target(path: str) -> tuple[str, str]:
    parts = path.removeprefix("/v1/drops/").split("/")
    if len(parts) != 2 or parts[0] not in DIRECTIONS:
        raise AgentError(f"expected /v1/drops/{{input|output}}/IP, got {path}", 404)
    try:
        address = ipaddress.ip_address(parts[1])
    except ValueError:
        raise AgentError(f"{parts[1]!r} is not an IP address", 400) from None
    if address.version != 4:
        raise AgentError(f"{address} is IPv6; the agent drops IPv4 peers only", 400)
    return parts[0], str(address)


def make_server(agent: FaultAgent, host: str, port: int, token: str) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

        def _reply(self, status: int, payload: Any) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _handle(self, method: str) -> None:
            if method == "GET" and self.path == "/healthz":
                self._reply(200, {"ok": True})
                return
            supplied = self.headers.get("Authorization", "").removeprefix("Bearer ")
            if not hmac.compare_digest(supplied.encode(), token.encode()):
                self._reply(401, {"error": "missing or wrong bearer token"})
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if not isinstance(body, dict):
                    raise AgentError("the body must be a JSON object", 400)
                self._reply(200, self._route(method, body))
            except json.JSONDecodeError as exc:
                self._reply(400, {"error": f"the body is not JSON: {exc}"})
            except AgentError as exc:
                self._reply(exc.status, {"error": str(exc)})

        def _route(self, method: str, body: dict[str, Any]) -> dict[str, Any]:
            path = self.path
            if (method, path) == ("GET", "/v1/faults"):
                return agent.faults()
            if (method, path) == ("POST", "/v1/pause"):
                return {"paused": agent.pause(_deadline(body))}
            if (method, path) == ("POST", "/v1/resume"):
                return {"resumed": agent.resume()}
            if (method, path) == ("POST", "/v1/heal"):
                agent.heal()
                return {"healed": True}
            if path.startswith("/v1/drops/") and method in ("PUT", "DELETE"):
                direction, peer = _drop_target(path)
                if method == "PUT":
                    agent.drop(direction, peer, _deadline(body))
                else:
                    agent.undrop(direction, peer)
                return {"direction": direction, "peer": peer}
            raise AgentError(f"no such endpoint {method} {path}", 404)

        def do_GET(self) -> None:
            self._handle("GET")

        def do_POST(self) -> None:
            self._handle("POST")

        def do_PUT(self) -> None:
            self._handle("PUT")

        def do_DELETE(self) -> None:
            self._handle("DELETE")

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


# ---- client ---------------------------------------------------------------------------------


class AgentClient:
    """What the platform and the operator call; errors are ``AgentError`` (status 0:
    the agent could not be reached)."""

    def __init__(self, base_url: str, token: str, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def pause(self, deadline_s: float) -> None:
        self._call("POST", "/v1/pause", {"deadline_s": deadline_s})

    def resume(self) -> None:
        self._call("POST", "/v1/resume", {})

    def drop(self, direction: str, peer: str, deadline_s: float) -> None:
        self._call("PUT", f"/v1/drops/{direction}/{peer}", {"deadline_s": deadline_s})

    def undrop(self, direction: str, peer: str) -> None:
        self._call("DELETE", f"/v1/drops/{direction}/{peer}", {})

    def heal(self) -> None:
        self._call("POST", "/v1/heal", {})

    def faults(self) -> dict[str, Any]:
        return self._call("GET", "/v1/faults", None)

    def _call(self, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        url = f"{self.base_url}{path}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace").strip()
            raise AgentError(f"{method} {url}: HTTP {exc.code} {detail}", exc.code) from exc
        except (OSError, ValueError) as exc:
            raise AgentError(f"{method} {url}: {exc}", 0) from exc


# ---- command line ---------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m undertow.kube.agent",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", default="0.0.0.0:9200", help="HOST:PORT")
    parser.add_argument("--target", default="minibroker",
                        help="pause the processes whose command line contains this")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="[%(asctime)s] %(levelname)s %(message)s (%(name)s)")
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        print(f"fault agent: ${TOKEN_ENV} is not set", file=sys.stderr)
        return 2
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        print(f"fault agent: --listen expects HOST:PORT, got {args.listen!r}", file=sys.stderr)
        return 2
    agent = FaultAgent(Netfilter(), Processes(args.target))
    agent.start()
    server = make_server(agent, host, int(port), token)

    def stop(signum: int, _frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    log.info("fault agent on %s, target %r", args.listen, args.target)
    try:
        server.serve_forever()
    finally:
        agent.heal()  # a terminating pod keeps nothing of ours
        agent.close()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
