"""The controller channel: newline-delimited JSON requests and responses over TCP.

Brokers talk to the controller over this small RPC (KRaft uses its own Kafka APIs; the
controller's state transitions, not its wire format, are what Undertow measures). Requests
carry an ``id``; the server answers each in its own task, so a long-polling metadata fetch
does not hold up heartbeats on the same connection. Like every other link, it goes through
the runner's proxies, so a partition between a broker and the controller is real.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger("minibroker.rpc")

MAX_LINE = 16 << 20

Handler = Callable[[dict[str, Any]], Awaitable[Any]]


class RpcError(Exception):
    """The peer answered with an error, or the connection failed."""


class RpcServer:
    def __init__(self, handlers: dict[str, Handler]) -> None:
        self._handlers = handlers
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.StreamWriter] = set()

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_LINE)

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._connections):
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections.add(writer)
        peer = writer.get_extra_info("peername")
        tasks: set[asyncio.Task] = set()
        try:
            while line := await reader.readline():
                try:
                    request = json.loads(line)
                    request_id = request["id"]
                    handler = self._handlers[request["method"]]
                    params = request.get("params", {})
                except (ValueError, KeyError, TypeError) as exc:
                    log.warning("Closing RPC connection from %s: malformed request (%s)", peer,
                                exc)
                    break
                task = asyncio.create_task(self._answer(writer, request_id, handler, params))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        except (ConnectionError, asyncio.LimitOverrunError, ValueError):
            pass
        except asyncio.CancelledError:
            pass  # the server is stopping
        finally:
            for task in tasks:
                task.cancel()
            self._connections.discard(writer)
            writer.close()

    @staticmethod
    async def _answer(writer: asyncio.StreamWriter, request_id: Any, handler: Handler,
                      params: dict[str, Any]) -> None:
        try:
            response = {"id": request_id, "result": await handler(params)}
        except Exception as exc:  # the handler's failure goes back to the caller
            log.exception("RPC handler failed")
            response = {"id": request_id, "error": f"{type(exc).__name__}: {exc}"}
        with contextlib.suppress(ConnectionError):
            writer.write(json.dumps(response).encode() + b"\n")
            await writer.drain()


class RpcClient:
    """One connection, many concurrent calls; reconnects on the next call after a failure."""

    def __init__(self, host: str, port: int, *, connect_timeout: float = 2.0) -> None:
        self.host = host
        self.port = port
        self._connect_timeout = connect_timeout
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._ids = itertools.count()
        self._lock = asyncio.Lock()

    async def _ensure_connected(self) -> asyncio.StreamWriter:
        async with self._lock:
            if self._writer is None or self._writer.is_closing():
                try:
                    reader, writer = await asyncio.wait_for(
                        asyncio.open_connection(self.host, self.port, limit=MAX_LINE),
                        self._connect_timeout)
                except (TimeoutError, OSError) as exc:
                    raise RpcError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
                self._writer = writer
                self._reader_task = asyncio.create_task(self._read_loop(reader, writer))
            return self._writer

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
            writer.write(json.dumps({"id": request_id, "method": method,
                                     "params": params or {}}).encode() + b"\n")
            await writer.drain()
            return await asyncio.wait_for(future, timeout)
        except TimeoutError as exc:
            # A silent peer (a paused controller, a one-way partition): start afresh.
            self.close()
            raise RpcError(f"{method} to {self.host}:{self.port} timed out") from exc
        except ConnectionError as exc:
            raise RpcError(f"{method} to {self.host}:{self.port} failed: {exc}") from exc
        finally:
            self._pending.pop(request_id, None)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._reader_task is not None:
            self._reader_task.cancel()
