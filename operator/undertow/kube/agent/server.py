"""The agent's HTTP API (see the package docstring), behind a bearer token.

It runs on the control endpoints' server (``minibroker.control_http``): a fixed number of
threads whatever the clients do, every request bounded in time and size, and a 400 that
names what is wrong with a malformed body. The token is checked before the body is read.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from typing import Any

from minibroker.control_http import (
    BodyError,
    ControlHTTPServer,
    ControlRequestHandler,
    ServerLimits,
)
from undertow.kube.agent.errors import AgentError
from undertow.kube.agent.fault_agent import FaultAgent
from undertow.kube.agent.netfilter import DIRECTIONS
from undertow.platform.link_delay import LinkDelay

log = logging.getLogger("undertow.agent")


MAX_DEADLINE_S = 3600.0
MAX_GRACE_S = 300.0
"""The longest a kill waits for its target to exit on SIGTERM (the spec's bound on a kill's
``gracePeriod``, ``spec.faults.MAX_KILL_GRACE_S``)."""


def _deadline(body: dict[str, Any]) -> float:
    value = body.get("deadline_s")
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not 0 < value <= MAX_DEADLINE_S:
        raise AgentError(f"deadline_s must be a number in (0, {MAX_DEADLINE_S:g}], "
                         f"got {value!r}", 400)
    return float(value)


def _grace(body: dict[str, Any]) -> float:
    """A kill's optional ``grace_s`` (default 0: SIGKILL at once)."""
    value = body.get("grace_s", 0)
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not 0 <= value <= MAX_GRACE_S:
        raise AgentError(f"grace_s must be a number in [0, {MAX_GRACE_S:g}], "
                         f"got {value!r}", 400)
    return float(value)


MAX_LATENCY_S = 60.0


def _delay(body: dict[str, Any]) -> LinkDelay:
    """A delay's ``latency_s``, ``jitter_s`` (default 0, at most the latency) and
    ``correlation`` (0-1, default 0)."""
    values = [body.get("latency_s"), body.get("jitter_s", 0), body.get("correlation", 0)]
    if any(isinstance(v, bool) or not isinstance(v, int | float) for v in values):
        raise AgentError(f"latency_s, jitter_s and correlation must be numbers, got {values}",
                         400)
    latency, jitter, correlation = (float(v) for v in values)
    if not 0 < latency <= MAX_LATENCY_S:
        raise AgentError(f"latency_s must be in (0, {MAX_LATENCY_S:g}], got {latency}", 400)
    if not 0 <= jitter <= latency:
        raise AgentError(f"jitter_s must be in [0, latency_s], got {jitter}", 400)
    if not 0 <= correlation <= 1:
        raise AgentError(f"correlation must be in [0, 1], got {correlation}", 400)
    return LinkDelay(latency, jitter, correlation)


def _link_target(path: str, prefix: str) -> tuple[str, str]:
    parts = path.removeprefix(prefix).split("/")
    if len(parts) != 2 or parts[0] not in DIRECTIONS:
        raise AgentError(f"expected {prefix}{{input|output}}/IP, got {path}", 404)
    try:
        address = ipaddress.ip_address(parts[1])
    except ValueError:
        raise AgentError(f"{parts[1]!r} is not an IP address", 400) from None
    if address.version != 4:
        raise AgentError(f"{address} is IPv6; the agent drops IPv4 peers only", 400)
    return parts[0], str(address)


def make_server(agent: FaultAgent, host: str, port: int, token: str,
                limits: ServerLimits | None = None) -> ControlHTTPServer:
    class Handler(ControlRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

        def _handle(self, method: str) -> None:
            if method == "GET" and self.path == "/healthz":
                self.send_json(200, {"ok": True})
                return
            supplied = self.headers.get("Authorization", "").removeprefix("Bearer ")
            if not hmac.compare_digest(supplied.encode(), token.encode()):
                self.send_json(401, {"error": "missing or wrong bearer token"})
                return
            try:
                status, payload = 200, self._route(method, self.read_json_body())
            except (AgentError, BodyError) as exc:
                status, payload = exc.status, {"error": str(exc)}
            except Exception as exc:  # a mechanism's unforeseen failure: answer it all the same
                log.exception("%s %s failed", method, self.path)
                status, payload = 500, {"error": f"{type(exc).__name__}: {exc}"}
            self.send_json(status, payload)

        def _route(self, method: str, body: dict[str, Any]) -> dict[str, Any]:
            path = self.path
            if (method, path) == ("GET", "/v1/faults"):
                return agent.faults()
            if (method, path) == ("POST", "/v1/pause"):
                return {"paused": agent.pause(_deadline(body))}
            if (method, path) == ("POST", "/v1/resume"):
                return {"resumed": agent.resume()}
            if (method, path) == ("POST", "/v1/kill"):
                return {"killed": agent.kill(_deadline(body), _grace(body))}
            if (method, path) == ("POST", "/v1/hold"):
                agent.hold_restart(_deadline(body))
                return {"held": True}
            if (method, path) == ("POST", "/v1/release"):
                agent.release()
                return {"released": True}
            if (method, path) == ("DELETE", "/v1/drops"):
                agent.undrop_all()
                return {"dropped": []}
            if path.startswith("/v1/drops/") and method in ("PUT", "DELETE"):
                direction, peer = _link_target(path, "/v1/drops/")
                if method == "PUT":
                    agent.drop(direction, peer, _deadline(body))
                else:
                    agent.undrop(direction, peer)
                return {"direction": direction, "peer": peer}
            if (method, path) == ("DELETE", "/v1/delays"):
                agent.undelay_all()
                return {"delayed": []}
            if path.startswith("/v1/delays/") and method in ("PUT", "DELETE"):
                direction, peer = _link_target(path, "/v1/delays/")
                if method == "PUT":
                    agent.delay(direction, peer, _delay(body), _deadline(body))
                else:
                    agent.undelay(direction, peer)
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

    return ControlHTTPServer((host, port), Handler, limits, name="agent-http")
