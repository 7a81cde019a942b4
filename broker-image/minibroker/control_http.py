"""The HTTP server of the control endpoints: the broker's and the controller's (``admin``)
and, in every pod, the fault agent's (``undertow.kube.agent.server``).

These endpoints stop, kill and partition brokers, so a client that sends half a request,
a malformed one or a huge one must get a quick answer or a closed connection, and must
never tie up more than a bounded share of the process (the agent's container has 64 Mi).
``http.server.ThreadingHTTPServer`` gives every connection a thread of its own with no
timeout: 400 half-sent requests held 401 threads. This server is shaped as Kafka's
``SocketServer`` is:

- one network thread (Kafka's ``Processor``) multiplexes every connection with a selector
  until its request's headers are complete. A connection that sends nothing or half its
  headers costs a socket and at most ``MAX_HEADER_BYTES``, never a thread; it is answered
  408 and closed when its request deadline passes, and when ``max_connections`` of them
  wait, the oldest is closed to make room (a complete request never waits behind them);
- complete requests wait in a bounded queue (``RequestChannel``, ``queued.max.requests``):
  a request beyond ``queued_max`` is answered 503 at once, not held;
- a fixed pool of ``workers`` threads (``KafkaRequestHandlerPool``, ``num.io.threads``)
  handles them. A handler reads the body itself, after it checked the token, from a socket
  whose reads end at the request's deadline; answers are written with a timeout too.

``read_json_body`` turns a body into a JSON object or says, as ``BodyError``, what is wrong
with it: 400 for a malformed or negative ``Content-Length``, a body shorter than it says,
invalid UTF-8, JSON that is not an object or nests deeper than ``MAX_JSON_DEPTH``; 408 for
a body that does not arrive in time; 411 for a chunked body; 413 beyond ``max_body_bytes``.
Handlers answer every error as ``{"error": ...}`` (``ControlRequestHandler.send_json``).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import queue
import re
import selectors
import socket
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any

log = logging.getLogger("minibroker.control_http")

MAX_HEADER_BYTES = 16 * 1024
"""The request line and headers; a request still without its blank line beyond this is
answered 431."""
MAX_JSON_DEPTH = 32
"""Every body these endpoints take is a flat object; Python's JSON parser would recurse once
per level (100 000 levels: RecursionError, and the connection dropped unanswered)."""
_HEADER_END = re.compile(rb"\r?\n\r?\n")
_DIGITS = re.compile(r"[0-9]+")
_READ_CHUNK = 4096
_LINGER_S = 0.5
_LINGER_BYTES = 256 * 1024


@dataclass(frozen=True)
class ServerLimits:
    """What one client may cost the server, and how many requests it handles at once."""

    workers: int = 4
    """Threads that handle requests; with the network thread, all the threads it has."""
    queued_max: int = 16
    """Complete requests waiting for a worker; the next one is answered 503."""
    max_connections: int = 128
    """Connections still sending their headers; a new one closes the oldest."""
    request_timeout_s: float = 10.0
    """From accept to the last byte of the body: a request not in by then is answered 408."""
    write_timeout_s: float = 10.0
    """How long one write of an answer may block on a client that does not read."""
    max_body_bytes: int = 64 * 1024
    """Bodies are a few dozen bytes of JSON; a longer one is answered 413."""


@dataclass
class _Connection:
    """An accepted connection: what arrived so far and when its request must be in."""

    sock: socket.socket
    address: Any
    deadline: float
    received: bytearray


class BodyError(Exception):
    """A request body the endpoint will not parse; ``status`` is the HTTP answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _DeadlineReader(io.RawIOBase):
    """The request as a handler reads it: the bytes the network thread already received,
    then the socket, every read ending at the request's deadline (TimeoutError), so that
    a client trickling a byte at a time cannot hold a worker past it either. Past the
    deadline, what had arrived by then is still read: a request that waited in the queue
    is not the client's fault."""

    def __init__(self, connection: _Connection) -> None:
        self._sock = connection.sock
        self._deadline = connection.deadline
        self._received = memoryview(bytes(connection.received))

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._received:
            count = min(len(buffer), len(self._received))
            buffer[:count] = self._received[:count]
            self._received = self._received[count:]
            return count
        self._sock.settimeout(max(0.0, self._deadline - time.monotonic()))  # 0: no wait
        try:
            return self._sock.recv_into(buffer)
        except BlockingIOError:
            raise TimeoutError("the request did not arrive within its deadline") from None


class _TimedWriter(io.BufferedIOBase):
    """The answer: each write may block at most ``timeout_s`` on a client that reads
    nothing."""

    def __init__(self, sock: socket.socket, timeout_s: float) -> None:
        self._sock = sock
        self._timeout_s = timeout_s

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._sock.settimeout(self._timeout_s)
        self._sock.sendall(data)
        return memoryview(data).nbytes


class ControlRequestHandler(BaseHTTPRequestHandler):
    """A handler for ``ControlHTTPServer``: one request per connection (HTTP/1.0), its
    reads bounded by the request's deadline, every answer JSON."""

    server: ControlHTTPServer
    default_request_version = "HTTP/1.0"
    """So that an answer to a request line too broken to name its version still has a
    status line (the default, HTTP/0.9, answers with the bare body)."""

    def setup(self) -> None:
        connection: _Connection = self.request
        self.connection = connection.sock
        self.rfile = io.BufferedReader(_DeadlineReader(connection))
        self.wfile = _TimedWriter(connection.sock, self.server.limits.write_timeout_s)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            self.wfile.flush()
        self.rfile.close()

    def send_json(self, status: int, payload: Any) -> None:
        self.send_body(status, json.dumps(payload).encode(), "application/json")

    def send_body(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def send_error(self, code: int, message: str | None = None,
                   explain: str | None = None) -> None:
        """What ``BaseHTTPRequestHandler`` answers itself (a malformed request line or
        headers, an unsupported method), as JSON like every other answer."""
        self.send_json(code, {"error": message or HTTPStatus(code).phrase})

    def read_json_body(self) -> dict[str, Any]:
        return read_json_body(self, self.server.limits.max_body_bytes)


class ControlHTTPServer:
    """Serves ``handler`` (a ``ControlRequestHandler``) within ``limits``; ``serve_forever``,
    ``shutdown``, ``server_close`` and ``server_address`` as ``socketserver``'s."""

    def __init__(self, address: tuple[str, int], handler: type[ControlRequestHandler],
                 limits: ServerLimits | None = None, *, name: str = "control-http") -> None:
        self.limits = limits or ServerLimits()
        self._handler = handler
        self._name = name
        host = address[0]
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # The kernel's accept queue costs no thread, and the network thread empties it as
        # fast as connections come: a short one would only drop SYNs of a burst.
        self.socket = socket.create_server(address, family=family, backlog=socket.SOMAXCONN)
        self.socket.setblocking(False)
        self.server_address = self.socket.getsockname()
        self._wakeup_r, self._wakeup_w = socket.socketpair()
        self._wakeup_r.setblocking(False)
        self._requests: queue.Queue[_Connection | None] = queue.Queue()
        self._receiving: dict[socket.socket, _Connection] = {}
        """Connections still sending their headers, oldest first."""
        self._workers: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()

    # ---- the network thread ---------------------------------------------------------------

    def serve_forever(self) -> None:
        """Accept and receive until ``shutdown``; the workers handle what is complete."""
        self._stopped.clear()
        try:
            self._start_workers()
            with selectors.DefaultSelector() as selector:
                selector.register(self.socket, selectors.EVENT_READ)
                selector.register(self._wakeup_r, selectors.EVENT_READ)
                while not self._stopping.is_set():
                    for key, _ in selector.select(self._next_deadline_in()):
                        if key.fileobj is self.socket:
                            self._accept(selector)
                        elif key.fileobj is self._wakeup_r:
                            with contextlib.suppress(OSError):
                                self._wakeup_r.recv(_READ_CHUNK)
                        else:
                            self._receive(selector, key.data)
                    self._expire(selector)
                for connection in list(self._receiving.values()):
                    self._forget(selector, connection)
                    _close(connection.sock)
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop ``serve_forever`` and wait until it has returned."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._wakeup_w.send(b"x")
        self._stopped.wait()

    def server_close(self) -> None:
        """Close the listening socket and let the idle workers end (a busy one ends after
        its request)."""
        self.socket.close()
        for _ in self._workers:
            self._requests.put(None)
        self._wakeup_r.close()
        self._wakeup_w.close()

    def _start_workers(self) -> None:
        while len(self._workers) < self.limits.workers:
            worker = threading.Thread(target=self._work, daemon=True,
                                      name=f"{self._name}-{len(self._workers)}")
            worker.start()
            self._workers.append(worker)

    def _next_deadline_in(self) -> float | None:
        oldest = next(iter(self._receiving.values()), None)
        return None if oldest is None else max(0.0, oldest.deadline - time.monotonic())

    def _accept(self, selector: selectors.BaseSelector) -> None:
        while True:
            try:
                sock, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of file descriptors, or memory: shed the oldest
                if not self._receiving:
                    log.warning("%s: cannot accept: %s", self._name, exc)
                    time.sleep(0.05)
                    return
                self._evict_oldest(selector)
                continue
            sock.setblocking(False)
            if len(self._receiving) >= self.limits.max_connections:
                self._evict_oldest(selector)
            connection = _Connection(sock, address,
                                     time.monotonic() + self.limits.request_timeout_s,
                                     bytearray())
            self._receiving[sock] = connection
            selector.register(sock, selectors.EVENT_READ, connection)

    def _receive(self, selector: selectors.BaseSelector, connection: _Connection) -> None:
        if self._receiving.get(connection.sock) is not connection:
            return  # evicted or expired earlier in the same batch of selector events
        try:
            chunk = connection.sock.recv(_READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:  # the client gave up
            self._forget(selector, connection)
            _close(connection.sock)
            return
        searched = max(0, len(connection.received) - 3)
        connection.received += chunk
        if _HEADER_END.search(connection.received, searched) is None:
            if len(connection.received) > MAX_HEADER_BYTES:
                self._forget(selector, connection)
                _refuse(connection.sock, HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                        f"the request line and headers exceed {MAX_HEADER_BYTES} bytes")
            return
        self._forget(selector, connection)
        if self._requests.qsize() >= self.limits.queued_max:
            _refuse(connection.sock, HTTPStatus.SERVICE_UNAVAILABLE,
                    f"{self.limits.queued_max} requests are waiting already; try again")
            return
        self._requests.put(connection)

    def _expire(self, selector: selectors.BaseSelector) -> None:
        """Answer 408 to the connections whose request deadline passed (oldest first: all
        have the same timeout)."""
        now = time.monotonic()
        while self._receiving:
            connection = next(iter(self._receiving.values()))
            if connection.deadline > now:
                return
            self._forget(selector, connection)
            _refuse(connection.sock, HTTPStatus.REQUEST_TIMEOUT,
                    f"the request did not arrive within {self.limits.request_timeout_s:g}s")

    def _evict_oldest(self, selector: selectors.BaseSelector) -> None:
        connection = next(iter(self._receiving.values()))
        self._forget(selector, connection)
        _refuse(connection.sock, HTTPStatus.SERVICE_UNAVAILABLE,
                f"{self.limits.max_connections} connections are still sending their "
                "requests; this one, the oldest, is closed to make room")

    def _forget(self, selector: selectors.BaseSelector, connection: _Connection) -> None:
        del self._receiving[connection.sock]
        selector.unregister(connection.sock)

    # ---- the workers ----------------------------------------------------------------------

    def _work(self) -> None:
        while (connection := self._requests.get()) is not None:
            try:
                self._handler(connection, connection.address, self)
            except (ConnectionError, TimeoutError) as exc:  # the client went, or stalled
                log.debug("%s: %s: %s", self._name, connection.address, exc)
            except Exception:  # one request's failure must not end the worker
                log.exception("%s: request from %s failed", self._name, connection.address)
            finally:
                _linger_and_close(connection.sock)


def _refuse(sock: socket.socket, status: HTTPStatus, message: str) -> None:
    """From the network thread, which must never block: a short answer into the socket's
    empty send buffer, or nothing, and the connection closed."""
    body = json.dumps({"error": message}).encode()
    head = (f"HTTP/1.0 {status.value} {status.phrase}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    with contextlib.suppress(OSError):
        sock.send(head + body)
    _close(sock)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
    sock.close()


def _linger_and_close(sock: socket.socket) -> None:
    """Close after a bounded drain: a socket closed with unread data (a body the handler
    refused unread) is reset, and the reset can reach the client before the answer does."""
    try:
        sock.shutdown(socket.SHUT_WR)
        deadline, drained = time.monotonic() + _LINGER_S, 0
        while drained < _LINGER_BYTES and (remaining := deadline - time.monotonic()) > 0:
            sock.settimeout(remaining)
            chunk = sock.recv(_READ_CHUNK)
            if not chunk:
                break
            drained += len(chunk)
    except OSError:
        pass
    finally:
        sock.close()


# ---- bodies ---------------------------------------------------------------------------------


def read_json_body(handler: BaseHTTPRequestHandler, max_bytes: int) -> dict[str, Any]:
    """The request's body as a JSON object (``{}`` when it has none), or ``BodyError``.

    Call it only once the request is authorised: a refused request's body is never read.
    """
    if handler.headers.get("Transfer-Encoding") is not None:
        raise BodyError(HTTPStatus.LENGTH_REQUIRED,
                        "Transfer-Encoding is not supported: send the body with a "
                        "Content-Length")
    length = _content_length(handler.headers.get_all("Content-Length") or [], max_bytes)
    try:
        data = handler.rfile.read(length) if length else b""
    except TimeoutError:
        raise BodyError(HTTPStatus.REQUEST_TIMEOUT,
                        f"the body's {length} bytes did not arrive in time") from None
    if len(data) < length:
        raise BodyError(HTTPStatus.BAD_REQUEST,
                        f"the body ended after {len(data)} of its {length} bytes")
    if not data:
        return {}
    return parse_json_object(data)


def _content_length(values: list[str], max_bytes: int) -> int:
    if not values:
        return 0
    if len({value.strip() for value in values}) > 1:
        raise BodyError(HTTPStatus.BAD_REQUEST, f"conflicting Content-Length headers {values}")
    raw = values[0].strip()
    if not _DIGITS.fullmatch(raw):
        raise BodyError(HTTPStatus.BAD_REQUEST,
                        f"Content-Length {raw[:40]!r} is not a non-negative integer")
    if len(raw) > 18 or int(raw) > max_bytes:
        raise BodyError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                        f"the body is {raw[:40]} bytes; at most {max_bytes} are accepted")
    return int(raw)


def parse_json_object(data: bytes) -> dict[str, Any]:
    """``data`` as a JSON object: strict UTF-8, at most ``MAX_JSON_DEPTH`` levels, no
    NaN or Infinity (not JSON, though Python's parser takes them)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyError(HTTPStatus.BAD_REQUEST,
                        f"the body is not UTF-8: {exc.reason} at byte {exc.start}") from None
    if _deeper_than(text, MAX_JSON_DEPTH):
        raise BodyError(HTTPStatus.BAD_REQUEST,
                        f"the body nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except ValueError as exc:  # JSONDecodeError, or a NaN/Infinity refused
        raise BodyError(HTTPStatus.BAD_REQUEST, f"the body is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BodyError(HTTPStatus.BAD_REQUEST, "the body must be a JSON object")
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _deeper_than(text: str, limit: int) -> bool:
    """Whether JSON ``text`` nests more than ``limit`` arrays and objects (brackets inside
    strings do not count), found before parsing, in one pass, without recursion."""
    depth, in_string, escaped = 0, False, False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth -= 1
    return False
