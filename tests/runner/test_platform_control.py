"""The control-endpoint client against real loopback servers: what it sends, what it
returns, and which of its two errors each way of failing is."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from ports import free_port

from undertow.platform.base import PlatformError
from undertow.platform.control import (
    ControlClient,
    EndpointError,
    EndpointRefused,
    EndpointUnreachable,
)


@dataclass
class Endpoint:
    """A real HTTP server answering each path with a fixed status and body, and recording
    every request it receives."""

    answers: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    received: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    served = Endpoint()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            served.received.append({"method": self.command, "path": self.path,
                                    "body": self.rfile.read(length),
                                    "authorization": self.headers.get("Authorization"),
                                    "content_type": self.headers.get("Content-Type")})
            status, body = served.answers.get(self.path, (404, b'{"error": "no such path"}'))
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_DELETE = _answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    served.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()


def test_a_request_sends_json_with_the_bearer_token_and_returns_the_answer(
        endpoint: Endpoint) -> None:
    endpoint.answers["/v1/pause"] = (200, b'{"paused": [42]}')
    client = ControlClient(endpoint.url + "/", "s3cret", timeout_s=5)
    assert client.request("POST", "/v1/pause", {"deadline_s": 10}) == {"paused": [42]}
    assert endpoint.received == [{"method": "POST", "path": "/v1/pause",
                                  "body": b'{"deadline_s": 10}',
                                  "authorization": "Bearer s3cret",
                                  "content_type": "application/json"}]


def test_without_a_token_or_a_body_neither_is_sent_and_an_empty_answer_is_empty(
        endpoint: Endpoint) -> None:
    endpoint.answers["/v1/failpoints/disk-stall"] = (200, b" \n")
    client = ControlClient(endpoint.url, timeout_s=5)
    assert client.request("DELETE", "/v1/failpoints/disk-stall") == {}
    assert endpoint.received == [{"method": "DELETE", "path": "/v1/failpoints/disk-stall",
                                  "body": b"", "authorization": None, "content_type": None}]


@pytest.mark.parametrize(("status", "body", "detail"), [
    (409, b'{"error": "no process matches \'minibroker\'"}', "no process matches 'minibroker'"),
    (401, b'{"error": "missing or wrong bearer token"}', "missing or wrong bearer token"),
    (503, b"<html>upstream down</html>", "<html>upstream down</html>"),
    (500, b"", ""),
])
def test_an_http_error_status_is_a_refusal_with_its_status_and_detail(
        endpoint: Endpoint, status: int, body: bytes, detail: str) -> None:
    endpoint.answers["/v1/kill"] = (status, body)
    with pytest.raises(EndpointRefused) as refused:
        ControlClient(endpoint.url, "t", timeout_s=5).request("POST", "/v1/kill", {})
    assert (refused.value.status, refused.value.detail) == (status, detail)
    assert str(refused.value) == f"POST {endpoint.url}/v1/kill: HTTP {status} {detail}".strip()
    assert isinstance(refused.value, EndpointError) and isinstance(refused.value, PlatformError)


@pytest.mark.parametrize("body", [b"<html>not the agent</html>", b"[1, 2]", b"\xff\xfe"])
def test_an_answer_that_is_not_a_json_object_is_unreachable(endpoint: Endpoint,
                                                            body: bytes) -> None:
    """Something answered, but not the endpoint: as good as nobody."""
    endpoint.answers["/v1/state"] = (200, body)
    with pytest.raises(EndpointUnreachable, match="the answer is not a JSON object"):
        ControlClient(endpoint.url, timeout_s=5).request("GET", "/v1/state")


def test_a_port_nobody_listens_on_is_unreachable() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EndpointUnreachable, match=rf"GET {url}/v1/state: .*refused") as caught:
        ControlClient(url, timeout_s=5).request("GET", "/v1/state")
    assert isinstance(caught.value, PlatformError)
    assert not isinstance(caught.value, EndpointRefused)


@pytest.fixture
def raw_listener() -> Iterator[socket.socket]:
    """A loopback TCP socket the test answers by hand (or not at all)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield listener


def answer_once(listener: socket.socket, response: bytes) -> threading.Thread:
    """Accept one connection, read the request, send ``response`` and close."""
    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(response)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def url_of(listener: socket.socket) -> str:
    return f"http://127.0.0.1:{listener.getsockname()[1]}"


@pytest.mark.parametrize("response", [
    b"",  # closed without a word: a node exiting before it answers
    b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"partial\":",  # cut short
    b"SSH-2.0-OpenSSH_9.6\r\n",  # not HTTP at all
])
def test_a_response_cut_short_or_not_http_is_unreachable(raw_listener: socket.socket,
                                                         response: bytes) -> None:
    server = answer_once(raw_listener, response)
    with pytest.raises(EndpointUnreachable):
        ControlClient(url_of(raw_listener), timeout_s=5).request("POST", "/v1/failpoints/"
                                                                 "power-loss", {})
    server.join(5)


def test_an_endpoint_that_never_answers_is_unreachable_after_the_timeout(
        raw_listener: socket.socket) -> None:
    """The kernel accepts the connection (a paused process's backlog); nothing answers."""
    began = time.monotonic()
    with pytest.raises(EndpointUnreachable, match="timed out"):
        ControlClient(url_of(raw_listener), timeout_s=0.3).request("GET", "/v1/faults")
    assert 0.3 <= time.monotonic() - began < 3


def test_a_refusal_detail_is_shortened(endpoint: Endpoint) -> None:
    endpoint.answers["/v1/heal"] = (502, b"x" * 5000)
    with pytest.raises(EndpointRefused) as refused:
        ControlClient(endpoint.url, timeout_s=5).request("POST", "/v1/heal", {})
    assert refused.value.detail == "x" * 300


def test_the_error_answer_field_wins_over_the_rest_of_the_body(endpoint: Endpoint) -> None:
    endpoint.answers["/v1/drops/input/10.0.0.1"] = (
        400, json.dumps({"error": "deadline_s must be a number", "hint": "seconds"}).encode())
    with pytest.raises(EndpointRefused) as refused:
        ControlClient(endpoint.url, timeout_s=5).request("PUT", "/v1/drops/input/10.0.0.1",
                                                         {"deadline_s": "10"})
    assert refused.value.detail == "deadline_s must be a number"
