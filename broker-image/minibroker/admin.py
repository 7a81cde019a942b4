"""The HTTP control endpoint of a broker or controller (``--metrics-port``).

``GET /metrics`` is Prometheus text, ``GET /v1/state`` the process's own view as JSON (what
the harness polls to wait on ISR, HW and leaders), ``GET /v1/events?log_id=ID&offset=N`` a
page of its replication events (``minibroker.events``; read-only like the state, so no
token), and the failpoints sit behind a bearer token, checked before the body is read. It
runs in threads of its own (``control_http``: one network thread, a few workers, bounded
requests, a 400 naming what is wrong with a malformed body); everything that reads or
changes broker state is handed to the event loop, so the core stays single-threaded (the
events file is read here: it is append-only and served by whole lines).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from minibroker.control_http import (
    BodyError,
    ControlHTTPServer,
    ControlRequestHandler,
    ServerLimits,
)
from minibroker.events import EventsQueryError, ReplicationEventLog, parse_events_query

log = logging.getLogger("minibroker.admin")

Action = Callable[[dict[str, Any]], Any]


class AdminServer:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        host: str,
        port: int,
        *,
        registry: CollectorRegistry,
        state: Callable[[], dict[str, Any]],
        events: ReplicationEventLog,
        token: str | None = None,
        actions: dict[tuple[str, str], Action] | None = None,
        limits: ServerLimits | None = None,
    ) -> None:
        self._loop = loop
        self._registry = registry
        self._state = state
        self._events = events
        self._token = token
        self._actions = actions or {}
        self._httpd = ControlHTTPServer((host, port), self._handler_class(), limits,
                                        name="admin-http")
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="admin-http",
                                        daemon=True)

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def on_loop(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the event loop and wait for its result (or exception)."""
        async def call() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(timeout=10)

    def _handler_class(self) -> type[ControlRequestHandler]:
        server = self

        class Handler(ControlRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                log.debug("%s " + format, self.address_string(), *args)

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                if url.path == "/metrics":
                    self.send_body(200, generate_latest(server._registry), CONTENT_TYPE_LATEST)
                elif url.path == "/v1/state":
                    self.send_json(200, server.on_loop(server._state))
                elif url.path == "/v1/events":
                    self._events(url.query)
                else:
                    self.send_json(404, {"error": f"no such endpoint {self.path}"})

            def _events(self, query: str) -> None:
                """Read in this thread, not on the event loop: the log serves only whole
                lines, so a line being appended meanwhile waits for the next page."""
                try:
                    page = server._events.read(*parse_events_query(query))
                except EventsQueryError as exc:
                    self.send_json(400, {"error": str(exc)})
                    return
                self.send_json(200, page)

            def _action(self, method: str) -> None:
                action = server._actions.get((method, self.path))
                if action is None:
                    self.send_json(404, {"error": f"no such endpoint {method} {self.path}"})
                    return
                if not server._token:
                    self.send_json(403, {"error": "failpoints are disabled: no token configured"})
                    return
                supplied = self.headers.get("Authorization", "").removeprefix("Bearer ")
                if not hmac.compare_digest(supplied.encode(), server._token.encode()):
                    self.send_json(401, {"error": "missing or wrong bearer token"})
                    return
                try:
                    body = self.read_json_body()
                except BodyError as exc:
                    self.send_json(exc.status, {"error": str(exc)})
                    return
                try:
                    result = server.on_loop(lambda: action(body))
                except (ValueError, KeyError, TypeError) as exc:
                    self.send_json(400, {"error": str(exc)})
                    return
                self.send_json(200, result if result is not None else {"ok": True})

            def do_POST(self) -> None:
                self._action("POST")

            def do_DELETE(self) -> None:
                self._action("DELETE")

        return Handler
