"""The control endpoints against hostile or careless clients, over real sockets: the pods'
fault agent and the brokers' admin endpoint, both on ``minibroker.control_http``.

Half-sent requests hold no thread and do not keep a well-formed request out; a body that
never arrives is answered 408 at its deadline; a request beyond the queue is answered 503
at once; every malformed body gets a quick JSON 400 (413 beyond the size bound) naming the
problem; and the token is still checked before a body is read.
"""

from __future__ import annotations

import asyncio
import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kube_helpers import AGENT_TOKEN, Target, UnprivilegedNetfilter
from processes import ON_SIGTERM, sigterm_lines
from prometheus_client import CollectorRegistry

from minibroker.admin import AdminServer
from minibroker.control_http import MAX_JSON_DEPTH, ServerLimits
from minibroker.events import ReplicationEventLog
from undertow.kube.agent import FaultAgent, make_server
from undertow.platform.base import wait_for
from undertow.platform.control import ControlClient

FAILPOINT_TOKEN = "failpoint-secret"
ANSWER_S = 2.0
"""A malformed request is answered at once; this is how long "at once" may take here."""


@dataclass
class Endpoint:
    port: int
    token: str
    post: str
    """A POST path that takes a JSON body behind the token."""
    get: str
    """A GET path any client may call."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def running_agent(target: Target, limits: ServerLimits | None) -> Iterator[Endpoint]:
    agent = FaultAgent(UnprivilegedNetfilter(), target.processes())
    agent.start()
    server = make_server(agent, "127.0.0.1", 0, AGENT_TOKEN, limits)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Endpoint(server.server_address[1], AGENT_TOKEN, "/v1/resume", "/healthz")
    finally:
        server.shutdown()
        server.server_close()
        agent.heal()
        agent.close()


def running_admin(tmp_path: Path, limits: ServerLimits | None) -> Iterator[Endpoint]:
    """A broker's admin endpoint with its own event loop, and one failpoint that echoes."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    admin = AdminServer(loop, "127.0.0.1", 0, registry=CollectorRegistry(),
                        state=lambda: {"ok": True}, events=ReplicationEventLog(tmp_path),
                        token=FAILPOINT_TOKEN,
                        actions={("POST", "/v1/failpoints/echo"): lambda body: body},
                        limits=limits)
    admin.start()
    try:
        yield Endpoint(admin.port, FAILPOINT_TOKEN, "/v1/failpoints/echo", "/v1/state")
    finally:
        admin.stop()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def start(kind: str, request: pytest.FixtureRequest, tmp_path: Path,
          limits: ServerLimits | None = None, target: Target | None = None) -> Endpoint:
    """The ``agent`` (of ``target``, else of a sleeping process) or the ``admin`` endpoint,
    stopped when the test ends."""
    if kind == "agent":
        if target is None:
            target = Target()
            request.addfinalizer(target.close)
        running = running_agent(target, limits)
    else:
        running = running_admin(tmp_path, limits)
    endpoint = next(running)
    request.addfinalizer(running.close)
    return endpoint


@pytest.fixture(params=["agent", "admin"])
def endpoint(request: pytest.FixtureRequest, tmp_path: Path) -> Endpoint:
    return start(request.param, request, tmp_path)


def answer(sock: socket.socket, timeout_s: float = ANSWER_S) -> tuple[int, dict[str, Any]]:
    """The HTTP status and JSON body the server sent before closing ``sock``."""
    sock.settimeout(timeout_s)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:  # closed with our unread request in its buffer
        assert data, "reset before any answer"
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1."), data[:200]
    return int(head.split()[1]), json.loads(body)


def exchange(endpoint: Endpoint, head: str, body: bytes = b"", *,
             token: str | None = None) -> tuple[int, dict[str, Any]]:
    """Send ``head`` (request line and headers, without the blank line) and ``body``, say
    that nothing more comes, and return the answer, which must come within ANSWER_S."""
    auth = f"Authorization: Bearer {token or endpoint.token}\r\n"
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", endpoint.port), timeout=ANSWER_S) as sock:
        sock.sendall(f"{head}\r\n{auth}\r\n".encode() + body)
        sock.shutdown(socket.SHUT_WR)
        status, payload = answer(sock)
    assert time.monotonic() - started < ANSWER_S
    return status, payload


def post(endpoint: Endpoint, body: bytes, length: str | None = None,
         extra: str = "") -> tuple[int, dict[str, Any]]:
    length = str(len(body)) if length is None else length
    return exchange(endpoint, f"POST {endpoint.post} HTTP/1.1\r\nHost: x\r\n"
                              f"Content-Length: {length}\r\n{extra}".rstrip("\r\n"), body)


# ---- bodies ---------------------------------------------------------------------------------


DEEP = b"[" * 30_000 + b"]" * 30_000
"""Deep enough for Python's JSON parser to give up (RecursionError), within the size bound."""
DEEPER = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize(("length", "body", "status", "error"), [
    ("abc", b"{}", 400, "Content-Length 'abc' is not a non-negative integer"),
    ("-1", b"", 400, "Content-Length '-1' is not a non-negative integer"),
    ("0x10", b"{}", 400, "Content-Length '0x10' is not a non-negative integer"),
    ("10", b'{"a"', 400, "the body ended after 4 of its 10 bytes"),
    (None, DEEP, 400, f"the body nests deeper than {MAX_JSON_DEPTH} levels"),
    (None, DEEPER, 413, "the body is 200000 bytes; at most 65536 are accepted"),
    ("9" * 40, b"", 413, f"the body is {'9' * 40} bytes; at most 65536 are accepted"),
    (None, b'{"deadline_s": "\xff"}', 400,
     "the body is not UTF-8: invalid start byte at byte 16"),
    (None, b'{"deadline_s": 10', 400, "the body is not JSON: Expecting ',' delimiter: "
                                      "line 1 column 18 (char 17)"),
    (None, b'{"deadline_s": NaN}', 400, "the body is not JSON: NaN is not a JSON number"),
    (None, b"[1, 2]", 400, "the body must be a JSON object"),
])
def test_a_malformed_body_gets_a_400_naming_the_problem(
        endpoint: Endpoint, length: str | None, body: bytes, status: int, error: str) -> None:
    assert post(endpoint, body, length) == (status, {"error": error})


def test_conflicting_lengths_and_chunked_bodies_are_refused(endpoint: Endpoint) -> None:
    assert post(endpoint, b"{}", extra="Content-Length: 3\r\n") == (
        400, {"error": "conflicting Content-Length headers ['2', '3']"})
    assert exchange(endpoint, f"POST {endpoint.post} HTTP/1.1\r\nHost: x\r\n"
                              "Transfer-Encoding: chunked", b"2\r\n{}\r\n0\r\n\r\n") == (
        411, {"error": "Transfer-Encoding is not supported: send the body with a "
                       "Content-Length"})


def test_the_token_is_checked_before_the_body_is_read(endpoint: Endpoint) -> None:
    """A wrong token is answered at once, though the body it announces never comes."""
    assert exchange(endpoint, f"POST {endpoint.post} HTTP/1.1\r\nContent-Length: 60000",
                    token="wrong") == (401, {"error": "missing or wrong bearer token"})


def test_a_well_formed_body_is_still_served(endpoint: Endpoint) -> None:
    status, payload = post(endpoint, b"{}")
    assert status == 200, payload
    client = ControlClient(endpoint.url, endpoint.token, timeout_s=5)
    assert isinstance(client.request("POST", endpoint.post, {}), dict)


def test_a_malformed_request_line_is_answered_in_json(endpoint: Endpoint) -> None:
    with socket.create_connection(("127.0.0.1", endpoint.port), timeout=ANSWER_S) as sock:
        sock.sendall(b"POST /x HTTP/1.1 extra\r\n\r\n")
        assert answer(sock) == (400, {"error": "Bad request version ('extra')"})


# ---- connections that never finish -----------------------------------------------------------


def closed_by_server(socks: list[socket.socket]) -> int:
    """How many of ``socks`` the server has answered or closed (readable: data or EOF).
    poll, not select: in a long test session the descriptors pass FD_SETSIZE (1024)."""
    poller = select.poll()
    for sock in socks:
        poller.register(sock, select.POLLIN)
    return len(poller.poll(0))


def test_400_half_sent_requests_hold_no_thread_and_keep_no_request_out(
        endpoint: Endpoint) -> None:
    """Each connection sends half its headers and stops. The server's threads stay what
    they were, it closes all but ``max_connections`` of them (the oldest first), and a
    well-formed request is served at once all the same."""
    client = ControlClient(endpoint.url, endpoint.token, timeout_s=ANSWER_S)
    client.request("GET", endpoint.get)  # every worker started
    threads = threading.active_count()
    half = f"POST {endpoint.post} HTTP/1.1\r\nHost: x\r\nAuthorization: Bear".encode()
    socks = []
    try:
        for _ in range(400):
            sock = socket.create_connection(("127.0.0.1", endpoint.port), timeout=ANSWER_S)
            socks.append(sock)
            sock.sendall(half)
        held = 400 - ServerLimits().max_connections
        wait_for(lambda: closed_by_server(socks) >= held, 10,
                 f"the server to close the {held} oldest half-sent requests")
        assert threading.active_count() == threads
        started = time.monotonic()
        assert client.request("GET", endpoint.get)
        assert client.request("POST", endpoint.post, {}) is not None
        assert time.monotonic() - started < ANSWER_S
        assert closed_by_server(socks[:held]) == held  # the oldest went first
        assert answer(socks[0]) == (503, {"error": (
            "128 connections are still sending their requests; this one, the oldest, "
            "is closed to make room")})
        assert threading.active_count() == threads
    finally:
        for sock in socks:
            sock.close()


@pytest.mark.parametrize("kind", ["agent", "admin"])
def test_a_request_that_never_finishes_is_answered_408_at_its_deadline(
        kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Half the headers (held by the network thread) or half the body (held by a worker,
    with the token checked): both answered 408 when the request's deadline passes, and
    the worker serves the next request."""
    endpoint = start(kind, request, tmp_path, ServerLimits(workers=1, request_timeout_s=0.5))
    with socket.create_connection(("127.0.0.1", endpoint.port)) as headers, \
            socket.create_connection(("127.0.0.1", endpoint.port)) as body:
        headers.sendall(f"POST {endpoint.post} HTTP/1.1\r\nHost: x\r\n".encode())
        body.sendall(f"POST {endpoint.post} HTTP/1.1\r\nContent-Length: 50\r\n"
                     f"Authorization: Bearer {endpoint.token}\r\n\r\n{{".encode())
        assert answer(headers, 5) == (408, {"error": "the request did not arrive within 0.5s"})
        assert answer(body, 5) == (408, {"error": "the body's 50 bytes did not arrive in time"})
    assert ControlClient(endpoint.url, endpoint.token, timeout_s=ANSWER_S).request(
        "GET", endpoint.get)


def test_a_request_beyond_the_queue_is_answered_503_at_once(
        request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """One worker, one place in the queue. The worker is busy with a kill that waits out
    its grace period (the target ignores SIGTERM); of the two requests that come next, one
    waits for the worker and the other is refused at once rather than held. The one that
    waited is served though its deadline passed meanwhile: its body had come in time."""
    record = tmp_path / "sigterm"
    target = Target(ON_SIGTERM, str(record), "stay")
    request.addfinalizer(target.close)
    wait_for(lambda: sigterm_lines(record) == ["ready"], 10, "the SIGTERM handler")
    limits = ServerLimits(workers=1, queued_max=1, request_timeout_s=1.0)
    endpoint = start("agent", request, tmp_path, limits, target)
    kill = json.dumps({"deadline_s": 30, "grace_s": 2.5}).encode()
    with socket.create_connection(("127.0.0.1", endpoint.port)) as busy, \
            socket.create_connection(("127.0.0.1", endpoint.port)) as first, \
            socket.create_connection(("127.0.0.1", endpoint.port)) as second:
        busy.sendall(f"POST /v1/kill HTTP/1.1\r\nContent-Length: {len(kill)}\r\n"
                     f"Authorization: Bearer {endpoint.token}\r\n\r\n".encode() + kill)
        wait_for(lambda: sigterm_lines(record) == ["ready", "sigterm"], 10,
                 "the worker to be waiting out the grace period")
        for sock in (first, second):  # the body in a packet of its own
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(f"POST /v1/resume HTTP/1.1\r\nContent-Length: 2\r\n"
                         f"Authorization: Bearer {endpoint.token}\r\n\r\n".encode())
            sock.sendall(b"{}")
        refused = wait_for(lambda: next(iter(select.select([first, second], [], [], 0)[0]),
                                        None), ANSWER_S, "one of them to be refused at once")
        queued = second if refused is first else first
        assert answer(refused) == (503, {"error": "1 requests are waiting already; try again"})
        assert not readable(queued)  # still waiting for the worker
        assert answer(busy, 10) == (200, {"killed": [target.process.pid]})
        assert answer(queued, 5) == (200, {"resumed": []})  # the broker is dead by now


def readable(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])
