"""Per-link TCP proxies: network partitions without root.

Every connection a node opens to another node (broker to broker, broker to controller,
client to broker) goes through the proxy of that directed link, which the runner owns. A
connection carries bytes both ways, so each proxied connection has two gates: ``forward``
(from the side that connected to the side that accepted) and ``backward``. Blocking
``A -> B`` (A's packets to B are dropped) closes the forward gate of link ``A -> B`` and
the backward gate of link ``B -> A``.

A closed gate behaves like a firewall that drops packets, not like a closed socket: no
byte crosses it, the bytes wait (in the proxy's bounded buffer, then in the kernel's, so
the sender's window closes), the connection stays open, and everything held is delivered
after the heal, as TCP retransmission would. A FIN or RST also crosses only once its
direction opens. A new connection is not passed upstream while either gate of its link
is closed, as its SYN or SYN-ACK would be dropped. The proxies run on one event loop
thread inside the runner, so they vanish with it.

A delayed direction (a `delay` fault, ``link_delay``) hands each chunk it reads to a
queue, from which it is written once its drawn delay has passed, in the order read (a
TCP stream stays in order), so several requests can be on the wire at once as with netem.
The queue holds at most ``_DELAYED_CHUNKS`` chunks; a full queue stops the reading, and
the sender's window closes as it would behind a slow link.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from undertow.platform.base import Link, PlatformError
from undertow.platform.link_delay import DelayDraw, LinkDelay

T = TypeVar("T")
_CHUNK = 64 * 1024
_DELAYED_CHUNKS = 64
"""The chunks one delayed direction holds in flight (4 MiB at most)."""
_CALL_TIMEOUT_S = 10.0


class _Connection:
    """One client connection and its upstream twin."""

    def __init__(self, down: asyncio.StreamWriter) -> None:
        self.down = down
        self.up: asyncio.StreamWriter | None = None
        self.task: asyncio.Task | None = None

    def abort(self) -> None:
        for writer in (self.down, self.up):
            if writer is not None:
                writer.transport.abort()


class LinkProxy:
    """The proxy of one directed link: a listener forwarding to ``upstream``."""

    def __init__(self, link: Link, upstream: tuple[str, int]) -> None:
        self.link = link
        self.upstream = upstream
        self.forward = asyncio.Event()
        self.backward = asyncio.Event()
        self.forward.set()
        self.backward.set()
        self.forward_delay: DelayDraw | None = None
        self.backward_delay: DelayDraw | None = None
        self.connections: set[_Connection] = set()
        self.accepted = 0
        self._server: asyncio.base_events.Server | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    async def listen(self, host: str) -> None:
        self._server = await asyncio.start_server(self._handle, host, 0)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.abort()
            if conn.task is not None:
                conn.task.cancel()
        if self._server is not None:
            await self._server.wait_closed()

    async def _handle(self, down_reader: asyncio.StreamReader,
                      down_writer: asyncio.StreamWriter) -> None:
        conn = _Connection(down_writer)
        conn.task = asyncio.current_task()
        self.connections.add(conn)
        self.accepted += 1
        try:
            await self._serve(conn, down_reader)
        except asyncio.CancelledError:
            pass  # the network is closing; ending quietly keeps asyncio's stream callback calm
        finally:
            self.connections.discard(conn)
            conn.abort()

    async def _serve(self, conn: _Connection, down_reader: asyncio.StreamReader) -> None:
        await self._open_both()
        try:
            up_reader, conn.up = await asyncio.open_connection(*self.upstream)
        except OSError:
            _reset(conn.down)  # what the RST answering a refused SYN does
            return
        pumps = [asyncio.create_task(self._pump(
                     down_reader, _Delivery(conn.up, self.forward, lambda: self.forward_delay))),
                 asyncio.create_task(self._pump(
                     up_reader, _Delivery(conn.down, self.backward,
                                          lambda: self.backward_delay)))]
        try:
            clean, pending = True, set(pumps)
            while pending and clean:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                clean = all(pump.result() for pump in done)
            # Each side learns of the end only through its own direction's gate.
            await asyncio.gather(self._close_through(conn.up, self.forward, clean),
                                 self._close_through(conn.down, self.backward, clean))
        finally:
            for pump in pumps:
                pump.cancel()

    async def _open_both(self) -> None:
        while not (self.forward.is_set() and self.backward.is_set()):
            await self.forward.wait()
            await self.backward.wait()

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, out: _Delivery) -> bool:
        """Copy one direction; True when it ended with a FIN, False on a reset."""
        try:
            while True:
                await out.gate.wait()  # stop taking bytes while the gate is closed
                data = await reader.read(_CHUNK)
                await out.gate.wait()  # hold a chunk (or FIN) read just before it closed
                await out.send(data)
                if not data:
                    return True
        except OSError:
            return False
        finally:
            out.close()

    @staticmethod
    async def _close_through(writer: asyncio.StreamWriter, gate: asyncio.Event,
                             clean: bool) -> None:
        """Pass a FIN (after a clean end) or a RST (after a reset) once ``gate`` is open."""
        await gate.wait()
        if not clean:
            _reset(writer)
            return
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


class _Delivery:
    """One direction's far end: written at once, or through the delay queue while the
    link is delayed or the queue still holds chunks (a FIN waits behind them)."""

    def __init__(self, writer: asyncio.StreamWriter, gate: asyncio.Event,
                 delay: Callable[[], DelayDraw | None]) -> None:
        self.writer = writer
        self.gate = gate
        self._delay = delay
        self._queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(_DELAYED_CHUNKS)
        self._task: asyncio.Task[None] | None = None
        self._failed: OSError | None = None
        self._due = 0.0
        self._in_flight = 0
        """Chunks handed to the queue and not yet written."""

    async def send(self, data: bytes) -> None:
        """``data`` (b"": the FIN) to the far end, delayed if the link is."""
        if self._failed is not None:
            raise self._failed
        draw = self._delay()
        if draw is None and not self._in_flight:
            self._write(data)
            await self.writer.drain()
            return
        loop = asyncio.get_running_loop()
        self._due = max(self._due, loop.time() + (draw.draw() if draw else 0.0))
        if self._task is None:
            self._task = asyncio.create_task(self._deliver())
        self._in_flight += 1
        await self._queue.put((self._due, data))
        if not data:
            await self._queue.join()
            if self._failed is not None:
                raise self._failed

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def _write(self, data: bytes) -> None:
        if data:
            self.writer.write(data)
        elif self.writer.can_write_eof():
            self.writer.write_eof()

    async def _deliver(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, data = await self._queue.get()
            try:
                if (wait := due - loop.time()) > 0:
                    await asyncio.sleep(wait)
                await self.gate.wait()
                self._write(data)
                await self.writer.drain()
            except OSError as exc:
                self._failed = exc
            finally:
                self._in_flight -= 1
                self._queue.task_done()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a RST rather than a FIN (SO_LINGER with a zero timeout)."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class ProxyNetwork:
    """Every link proxy of a cluster, on one event loop thread owned by the runner."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self._proxies: dict[Link, LinkProxy] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="undertow-proxies",
                                        daemon=True)
        self._thread.start()

    def add_link(self, link: Link, upstream: tuple[str, int]) -> tuple[str, int]:
        """Listen for ``link`` and forward to ``upstream``; return the address to dial."""
        if link in self._proxies:
            raise PlatformError(f"link {link} already has a proxy")
        proxy = LinkProxy(link, upstream)
        self._call(self._create(proxy))
        self._proxies[link] = proxy
        return proxy.address

    def address(self, link: Link) -> tuple[str, int]:
        return self._proxy(link).address

    def move_upstream(self, dst: str, upstream: tuple[str, int], *,
                      but: frozenset[str] = frozenset()) -> None:
        """Every link to ``dst`` (but those from ``but``) forwards to ``upstream`` from now
        on, as a Service name resolves to a replaced pod's new IP; connections to the old
        address are reset."""
        self._call(self._move([link for link in self._proxies
                               if link.dst == dst and link.src not in but], upstream))

    def move_link(self, link: Link, upstream: tuple[str, int]) -> None:
        """``link`` alone forwards to ``upstream`` from now on (``move_upstream``)."""
        self._call(self._move([link], upstream))

    def links(self) -> list[Link]:
        return sorted(self._proxies)

    def set_blocked(self, link: Link, blocked: bool) -> None:
        """Drop (or pass again) ``link.src``'s bytes to ``link.dst`` on every connection."""
        gates = []
        if link in self._proxies:
            gates.append(self._proxies[link].forward)
        reverse = Link(link.dst, link.src)
        if reverse in self._proxies:
            gates.append(self._proxies[reverse].backward)
        self._call(self._set_gates(gates, open_=not blocked))

    def set_delay(self, link: Link, delay: LinkDelay | None) -> None:
        """Delay ``link.src``'s bytes to ``link.dst`` on every connection (None: no more)."""
        self._call(self._set_delay(link, delay))

    async def _set_delay(self, link: Link, delay: LinkDelay | None) -> None:
        draw = None if delay is None else DelayDraw(delay, random.Random())
        if link in self._proxies:
            self._proxies[link].forward_delay = draw
        reverse = Link(link.dst, link.src)
        if reverse in self._proxies:
            self._proxies[reverse].backward_delay = draw

    def accepted_count(self, link: Link) -> int:
        return self._proxy(link).accepted

    def close(self) -> None:
        """Close every listener and connection and stop the loop; idempotent."""
        if self._loop.is_closed():
            return
        if self._thread.is_alive():
            self._call(self._close_all())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()

    def _proxy(self, link: Link) -> LinkProxy:
        try:
            return self._proxies[link]
        except KeyError:
            raise PlatformError(f"no proxy for link {link}") from None

    async def _create(self, proxy: LinkProxy) -> None:
        await proxy.listen(self.host)

    @staticmethod
    async def _set_gates(gates: list[asyncio.Event], open_: bool) -> None:
        for gate in gates:
            if open_:
                gate.set()
            else:
                gate.clear()

    async def _move(self, links: list[Link], upstream: tuple[str, int]) -> None:
        for link in links:
            proxy = self._proxies[link]
            proxy.upstream = upstream
            for conn in list(proxy.connections):
                conn.abort()

    async def _close_all(self) -> None:
        await asyncio.gather(*(proxy.close() for proxy in self._proxies.values()))

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(_CALL_TIMEOUT_S)
