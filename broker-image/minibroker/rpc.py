"""The controller channel: newline-delimited JSON requests and responses over TCP.

Brokers talk to the controller over this small RPC (KRaft uses its own Kafka APIs; the
controller's state transitions, not its wire format, are what Undertow measures). Requests
carry an ``id``; the server answers each in its own task, so a long-polling metadata fetch
does not hold up heartbeats on the same connection. Like every other link, it goes through
the runner's proxies, so a partition between a broker and the controller is real.

It is guarded as Kafka guards its controller listener (KIP-631, KIP-500): every connection
starts with a challenge-response over the cluster's secret (``rpc_auth``), and a connection
that has not proven it holds the secret gets no answer but a refusal. What one peer can make
the controller hold is bounded (``RpcLimits``): connections, requests in flight on one
connection (past the cap each is answered at once with an error, never queued), and the
length of a request line. Kafka's SocketServer bounds the same things (``max.connections``,
``socket.request.max.bytes``, and one request in flight per connection, since it mutes a
channel until its answer is sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from minibroker import environment
from minibroker.rpc_auth import (
    AUTHENTICATE,
    CLIENT,
    MECHANISM,
    SERVER,
    new_nonce,
    proof,
    valid_nonce,
    verify,
)
from minibroker.shutdown import STOP_TIMEOUT_S, end_tasks

log = logging.getLogger("minibroker.rpc")

MAX_RESPONSE_LINE = 16 << 20
"""The longest answer a client reads (a metadata image of many topics)."""
FAILED_AUTHENTICATION_DELAY_S = 0.1
"""Kafka's ``connection.failed.authentication.delay.ms`` default: a refused peer's answer
waits this long, so that a client in a tight reconnect loop cannot spin the controller."""

Handler = Callable[[dict[str, Any]], Awaitable[Any]]


class RpcError(Exception):
    """The peer answered with an error, or the connection failed."""


class RpcAuthenticationError(RpcError):
    """The handshake failed: a wrong secret on either side, or no handshake at all."""


@dataclass(frozen=True)
class RpcLimits:
    """What one peer can make the server hold (``controller/server.py`` reads them from the
    ``listener.name.controller.*`` configs)."""

    max_connections: int
    """Open connections, authenticated or not; past it a new one is refused and closed."""
    max_in_flight_per_connection: int
    """Requests being answered on one connection; past it each is refused at once."""
    max_request_bytes: int
    """The longest request line; a longer one closes its connection."""
    authentication_timeout_s: float = 5.0
    """A connection that has not authenticated within this long is closed."""


class RpcServer:
    """Serves ``handlers`` to clients that prove they hold ``secret``, within ``limits``."""

    def __init__(self, handlers: dict[str, Handler], *, secret: bytes,
                 limits: RpcLimits) -> None:
        self._handlers = handlers
        self._secret = secret
        self._limits = limits
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.StreamWriter] = set()
        self._stats = {"refused_connections": 0, "failed_authentications": 0,
                       "refused_requests": 0}

    async def start(self, host: str, port: int) -> None:
        self._server = await environment.current().start_server(
            self._serve, host, port, limit=self._limits.max_request_bytes)

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    def stats(self) -> dict[str, int]:
        """Open connections and what was refused since the start (in ``/v1/state``)."""
        return {"connections": len(self._connections), **self._stats}

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._connections):
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        if len(self._connections) >= self._limits.max_connections:
            self._stats["refused_connections"] += 1
            log.warning("Refusing a controller connection from %s: %d connections open "
                        "(listener.name.controller.max.connections)", peer,
                        len(self._connections))
            await _refuse(writer, {"error": "TooManyConnections: the controller has "
                                            f"{len(self._connections)} connections open"})
            return
        self._connections.add(writer)
        tasks: set[asyncio.Task] = set()
        try:
            if await self._authenticate(reader, writer, peer):
                await self._dispatch(reader, writer, peer, tasks)
        except (ConnectionError, asyncio.CancelledError):
            pass  # the peer went away, or the server is stopping
        finally:
            for task in tasks:
                task.cancel()
            self._connections.discard(writer)
            writer.close()

    async def _authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                            peer: Any) -> bool:
        """The server's half of ``rpc_auth``'s handshake; False: refused, logged, answered."""
        server_nonce = new_nonce()
        await _send(writer, None, {"challenge": {"mechanism": MECHANISM,
                                                 "nonce": server_nonce}})
        try:
            async with asyncio.timeout(self._limits.authentication_timeout_s):
                line = await reader.readline()
        except TimeoutError:
            log.warning("Closing a controller connection from %s: no authentication within "
                        "%.0f s", peer, self._limits.authentication_timeout_s)
            return False
        except ValueError:  # asyncio's readline: longer than the stream's limit
            line = None
        if line == b"":
            return False  # closed before a word
        request = _request_object(line)
        request_id, method = request.get("id"), request.get("method")
        params = request.get("params")
        params = params if isinstance(params, dict) else {}
        if line is None:
            reason = (f"InvalidRequestException: a handshake over "
                      f"{self._limits.max_request_bytes} bytes")
        elif method != AUTHENTICATE:
            reason = (f"IllegalSaslStateException: {str(method)[:64]!r} on an "
                      f"unauthenticated connection; authenticate first ({MECHANISM})")
        elif params.get("mechanism") != MECHANISM:
            reason = (f"UnsupportedSaslMechanismException: {str(params.get('mechanism'))[:64]!r};"
                      f" the controller takes {MECHANISM}")
        elif not valid_nonce(params.get("nonce")) or not verify(
                self._secret, CLIENT, server_nonce, params["nonce"], params.get("proof")):
            reason = "SaslAuthenticationException: authentication failed (wrong secret)"
        else:
            await _send(writer, None, {"id": request_id, "result": {
                "proof": proof(self._secret, SERVER, server_nonce, params["nonce"])}})
            return True
        self._stats["failed_authentications"] += 1
        log.warning("Refused a request from %s: %s", peer, reason)
        await asyncio.sleep(FAILED_AUTHENTICATION_DELAY_S)
        await _refuse(writer, {"id": request_id, "error": reason})
        return False

    async def _dispatch(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        peer: Any, tasks: set[asyncio.Task]) -> None:
        """Answer the requests of an authenticated connection, each in a task of its own, at
        most ``max_in_flight_per_connection`` at once."""
        lock = asyncio.Lock()  # one answer written at a time, each drained before the next
        refused = 0
        try:
            while line := await reader.readline():
                try:
                    request = json.loads(line)
                    request_id = request["id"]
                    handler = self._handlers[request["method"]]
                    params = request.get("params", {})
                except (ValueError, KeyError, TypeError) as exc:
                    log.warning("Closing the controller connection from %s: malformed "
                                "request (%s)", peer, exc)
                    return
                if len(tasks) < self._limits.max_in_flight_per_connection:
                    task = asyncio.create_task(self._answer(writer, lock, request_id, handler,
                                                            params))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                else:
                    if not refused:
                        log.warning("Refusing requests from %s: %d in flight on its "
                                    "connection (listener.name.controller.max.in.flight."
                                    "requests.per.connection)", peer, len(tasks))
                    refused += 1
                    self._stats["refused_requests"] += 1
                    # Answered (and drained) here: a client that sends without reading
                    # stops being read, instead of piling up answers.
                    await _send(writer, lock, {"id": request_id, "error": (
                        f"TooManyInFlightRequests: {len(tasks)} requests in flight on "
                        f"this connection")})
                # One request at a time: the heartbeats of other connections go between.
                await asyncio.sleep(0)
        except ValueError:  # asyncio's readline: a line longer than the stream's limit
            log.warning("Closing the controller connection from %s: a request over %d bytes "
                        "(listener.name.controller.socket.request.max.bytes)", peer,
                        self._limits.max_request_bytes)
        finally:
            if refused:
                log.warning("Refused %d requests from %s past the in-flight cap", refused,
                            peer)

    @staticmethod
    async def _answer(writer: asyncio.StreamWriter, lock: asyncio.Lock, request_id: Any,
                      handler: Handler, params: dict[str, Any]) -> None:
        try:
            response = {"id": request_id, "result": await handler(params)}
        except Exception as exc:  # the handler's failure goes back to the caller
            log.exception("RPC handler failed")
            response = {"id": request_id, "error": f"{type(exc).__name__}: {exc}"}
        await _send(writer, lock, response)


async def _send(writer: asyncio.StreamWriter, lock: asyncio.Lock | None,
                message: dict[str, Any]) -> None:
    data = json.dumps(message).encode() + b"\n"
    async with lock or contextlib.nullcontext():
        with contextlib.suppress(ConnectionError):
            writer.write(data)
            await writer.drain()


async def _refuse(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    """Answer once and close."""
    await _send(writer, None, message)
    writer.close()
    with contextlib.suppress(ConnectionError, TimeoutError):
        async with asyncio.timeout(1.0):
            await writer.wait_closed()


def _request_object(line: bytes | None) -> dict[str, Any]:
    """A request line as a dict; anything else (no JSON, no object) as an empty one."""
    try:
        value = json.loads(line) if line is not None else None
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {}


class RpcClient:
    """One authenticated connection, many concurrent calls; reconnects (and authenticates
    again) on the next call after a failure, until ``aclose``.

    Its deadlines are ``asyncio.timeout``, never ``asyncio.wait_for``: before Python 3.12,
    ``wait_for`` returns the answer (or raises ``RpcError``) when its caller is cancelled in
    the same turn of the loop as the answer arrives or the connection drops, and the
    cancellation is lost. The broker's metadata loop and heartbeats retry on ``RpcError``,
    so a lost cancellation kept them calling the controller after the broker had stopped.
    ``asyncio.timeout`` cancels through the task, which delivers a cancellation whatever
    the awaited future holds."""

    def __init__(self, host: str, port: int, *, secret: bytes,
                 connect_timeout: float = 2.0) -> None:
        self.host = host
        self.port = port
        self._secret = secret
        self._connect_timeout = connect_timeout
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)  # 0 is the handshake's
        self._lock = asyncio.Lock()
        self._closed = False

    async def _ensure_connected(self) -> asyncio.StreamWriter:
        async with self._lock:
            self._raise_if_closed()
            if self._writer is None or self._writer.is_closing():
                try:
                    async with asyncio.timeout(self._connect_timeout):
                        reader, writer = await self._open()
                except (TimeoutError, OSError, ValueError) as exc:
                    raise RpcError(f"cannot connect to {self.host}:{self.port}: "
                                   f"{str(exc) or type(exc).__name__}") from exc
                if self._closed:  # closed while connecting: the connection is not kept
                    writer.close()
                    self._raise_if_closed()
                self._writer = writer
                self._reader_task = asyncio.create_task(
                    self._read_loop(reader, writer), name=f"rpc-reader-{self.host}:{self.port}")
            return self._writer

    def _raise_if_closed(self) -> None:
        if self._closed:
            raise RpcError(f"the client of {self.host}:{self.port} is closed")

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await environment.current().open_connection(
            self.host, self.port, limit=MAX_RESPONSE_LINE)
        try:
            await self._authenticate(reader, writer)
        except BaseException:
            writer.close()
            raise
        return reader, writer

    async def _authenticate(self, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter) -> None:
        """The client's half of ``rpc_auth``'s handshake: prove it holds the secret, then
        check that the controller does too."""
        where = f"{self.host}:{self.port}"
        challenge = _json_object(await reader.readline())
        offer = challenge.get("challenge")
        if not isinstance(offer, dict) or offer.get("mechanism") != MECHANISM \
                or not valid_nonce(offer.get("nonce")):
            raise RpcAuthenticationError(f"{where} sent no {MECHANISM} challenge: "
                                         f"{challenge.get('error') or challenge}")
        server_nonce, client_nonce = offer["nonce"], new_nonce()
        writer.write(json.dumps({"id": 0, "method": AUTHENTICATE, "params": {
            "mechanism": MECHANISM, "nonce": client_nonce,
            "proof": proof(self._secret, CLIENT, server_nonce, client_nonce)}}).encode()
            + b"\n")
        await writer.drain()
        answer = _json_object(await reader.readline())
        if "error" in answer:
            raise RpcAuthenticationError(f"{where} refused: {answer['error']}")
        result = answer.get("result")
        if not isinstance(result, dict) or not verify(self._secret, SERVER, server_nonce,
                                                      client_nonce, result.get("proof")):
            raise RpcAuthenticationError(f"{where} did not prove it holds the controller "
                                         f"secret")

    async def _read_loop(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                response = json.loads(line)
                future = self._pending.pop(response.get("id"), None)
                if future is not None and not future.done():
                    if "error" in response:
                        future.set_exception(RpcError(response["error"]))
                    else:
                        future.set_result(response.get("result"))
        except (ConnectionError, ValueError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()
            if self._writer is writer:
                self._writer = None
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(RpcError("connection to the controller lost"))
            self._pending.clear()

    async def call(self, method: str, params: dict[str, Any] | None = None, *,
                   timeout: float = 5.0) -> Any:
        writer = await self._ensure_connected()
        request_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            async with asyncio.timeout(timeout):  # a peer that reads nothing blocks drain()
                writer.write(json.dumps({"id": request_id, "method": method,
                                         "params": params or {}}).encode() + b"\n")
                await writer.drain()
                return await future
        except TimeoutError as exc:
            # A silent peer (a paused controller, a one-way partition): start afresh.
            self.close()
            raise RpcError(f"{method} to {self.host}:{self.port} timed out") from exc
        except ConnectionError as exc:
            raise RpcError(f"{method} to {self.host}:{self.port} failed: {exc}") from exc
        finally:
            self._pending.pop(request_id, None)

    def close(self) -> None:
        """Drop the connection; the next call connects again."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._reader_task is not None:
            self._reader_task.cancel()

    async def aclose(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Close for good, as its owner stops (Kafka's NodeToControllerChannelManager
        ``shutdown``): calls in flight and every later one fail with ``RpcError`` instead of
        connecting again, and the reader task has ended when this returns."""
        self._closed = True
        reader_task = self._reader_task
        self.close()
        if reader_task is not None:
            await end_tasks([reader_task], f"the client of {self.host}:{self.port}", timeout)


def _json_object(line: bytes) -> dict[str, Any]:
    """A handshake line; a closed connection or anything but a JSON object is an error."""
    if not line:
        raise RpcAuthenticationError("the controller closed the connection during the "
                                     "handshake")
    try:
        value = json.loads(line)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise RpcAuthenticationError(f"not a handshake message: {line[:200]!r}")
    return value
