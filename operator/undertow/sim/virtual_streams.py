"""TCP between simulated hosts, in memory: the asyncio streams the broker's own servers and
clients use, delivered over links with a latency that faults can block.

The broker opens connections with ``asyncio.open_connection`` and serves with
``asyncio.start_server``; in simulation the same code gets the same ``StreamReader`` and
``StreamWriter`` from ``VirtualNetwork.open_connection`` and ``start_server``, over a
transport that hands each write to the peer's protocol one link latency later, on the
virtual clock (``virtual_loop.VirtualTimeLoop``).

What TCP does that faults rely on:
- bytes of one direction arrive in order, once;
- a link blocked as iptables' DROP blocks it holds the bytes, which arrive after it
  heals (TCP retransmits them), so the application's own timeouts fire meanwhile;
- connecting to an address nothing listens on is refused one latency later, and connecting
  over a blocked link waits until it heals (the SYN is retransmitted);
- ``close`` ends the peer's stream after the bytes already written (FIN); a host that dies
  (``reset_host``) resets its connections, whose peers read ``ConnectionResetError``.

A connection opened with ``parcels=True`` carries objects instead of bytes, in the same
order, with the same latency, blocking and resets: the client models' requests as the
broker's codec would decode them (``codec.Request``) and the handlers' responses as they
return them, through the listener's ``RequestChannel`` and the client's ``ClientChannel``
(``ParcelChannel``): the client models' connections and the broker's own Kafka connections
(``KafkaConnection``: the follower fetchers) are of this kind (``Environment``'s
``open_object_connection``). Encoding and decoding them was a third of a simulated run's
time. The controller channel's JSON lines (``minibroker.rpc``) and everything else travel
as bytes.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from kio.static.protocol import ResponsePayload

from minibroker.environment import Environment
from minibroker.event_queue import LoopEventQueue
from minibroker.network.channel import REQUEST_CHANNEL
from minibroker.network.codec import KafkaProtocolError, Request
from undertow.platform.link_delay import DelayDraw, LinkDelay
from undertow.sim.files import simulated_fsync

Address = tuple[str, int]
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None] | None]
STREAM_LIMIT = 2 ** 16  # asyncio's default StreamReader limit


@dataclass(frozen=True)
class VirtualSocket:
    """What code asks of a socket (``getsockname``, ``setsockopt``: TCP_NODELAY) of an
    address that has none."""

    address: Address

    def getsockname(self) -> Address:
        return self.address

    def setsockopt(self, *_option: object) -> None:
        """Nothing to set: the in-memory link has no Nagle."""


@dataclass
class _Link:
    """One direction between two hosts: blocked or not, and what waits for it to heal;
    delayed or not (a `delay` fault's draw, added to the network's latency)."""

    blocked: bool = False
    waiting: list[Callable[[], None]] = field(default_factory=list)
    delay: DelayDraw | None = None

    def latency(self, base_s: float) -> float:
        return base_s if self.delay is None else base_s + self.delay.draw()


class ParcelChannel:
    """The objects arriving at one end of a ``parcels`` connection; at the listener's end,
    its ``RequestChannel`` (``minibroker.network.channel``)."""

    def __init__(self, transport: VirtualTransport) -> None:
        self._transport = transport
        self._arrived: deque[Any] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._end: Exception | None = None
        self._ended = False

    async def next(self) -> Any:
        """The next object; None once the peer closed; raises ``ConnectionResetError``
        once the connection was reset, whatever had arrived (as a stream's read does)."""
        while True:
            if self._end is not None:
                raise self._end
            if self._arrived:
                return self._arrived.popleft()
            if self._ended:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def post(self, parcel: Any) -> None:
        self._transport.send_parcel(parcel)

    async def receive(self) -> Request | None:
        request: Request | None = await self.next()
        return request

    def send(self, request: Request, response: ResponsePayload) -> None:
        self.post((request.correlation_id, response))

    def buffered(self) -> bool:
        return bool(self._arrived)

    # -- a client's ``ClientChannel`` (``minibroker.network.client.KafkaConnection``) ------

    def send_request(self, request: Request) -> None:
        self.post(request)

    async def receive_response(self, request: Request) -> tuple[int, ResponsePayload]:
        del request  # the response arrives as the handler returned it
        answer: tuple[int, ResponsePayload] | None = await self.next()
        if answer is None:
            raise KafkaProtocolError("connection closed by the broker")
        return answer

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def arrive(self, parcel: Any) -> None:
        self._arrived.append(parcel)
        self._wake()

    def end(self, error: Exception | None) -> None:
        self._ended = True
        if error is not None and self._end is None:
            self._end = error
        self._wake()


class VirtualTransport(asyncio.Transport):
    """One end of a simulated TCP connection."""

    def __init__(self, network: VirtualNetwork, local: Address, remote: Address,
                 protocol: asyncio.Protocol, parcels: bool = False) -> None:
        super().__init__()
        self._network = network
        self._local, self._remote = local, remote
        self._protocol = protocol
        self.channel = ParcelChannel(self) if parcels else None
        self.peer: VirtualTransport | None = None
        self._closing = False
        self._lost = False
        self._reading_paused = False
        # Deliveries held while reading is paused: (what arrived, its argument).
        self._inbox: list[tuple[Callable[[VirtualTransport, Any], None], Any]] = []
        self._last_arrival = 0.0  # bytes of a direction arrive in order

    # -- asyncio.Transport ------------------------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": self._remote, "sockname": self._local,
                "socket": VirtualSocket(self._local),
                REQUEST_CHANNEL: self.channel}.get(name, default)

    def is_closing(self) -> bool:
        return self._closing

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or not data:
            return
        self._send(VirtualTransport._data_arrived, bytes(data))

    def send_parcel(self, parcel: Any) -> None:
        if not self._closing:
            self._send(VirtualTransport._parcel_arrived, parcel)

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self._send(VirtualTransport._eof)

    def close(self) -> None:
        """FIN after what was written: the peer reads the rest, then the end of its stream."""
        if self._closing:
            return
        self._closing = True
        self._send(VirtualTransport._eof)
        if not self._network.loop.is_closed():
            self._network.loop.call_soon(self._connection_lost, None)

    def abort(self) -> None:
        """RST: the peer's stream fails with ConnectionResetError, unread bytes or not."""
        if self._lost:
            return
        self._closing = True
        self._send(VirtualTransport._reset, ConnectionResetError(
            f"connection reset by {self._local[0]}:{self._local[1]}"))
        self._network.loop.call_soon(self._connection_lost, None)

    def pause_reading(self) -> None:
        self._reading_paused = True

    def resume_reading(self) -> None:
        self._reading_paused = False
        inbox, self._inbox = self._inbox, []
        for arrived, argument in inbox:
            self._arrive(arrived, argument)

    def is_reading(self) -> bool:
        return not self._reading_paused

    def get_write_buffer_size(self) -> int:
        return 0  # a write leaves at once: the link, not a buffer, holds the bytes

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        """Nothing is buffered here (``get_write_buffer_size``)."""

    # -- delivery ---------------------------------------------------------------------------

    def _send(self, arrived: Callable[[VirtualTransport, Any], None],
              argument: Any = None) -> None:
        """``arrived(peer, argument)`` at the peer one latency from now (``_arrive``)."""
        peer = self.peer
        # After the run (the loop closed), a node's coroutines are closed as they are
        # garbage-collected, and their finally blocks close their connections: nothing moves.
        if peer is None or self._network.loop.is_closed():
            return
        self._network.deliver(self._local[0], self._remote[0], self,
                              peer._arrive, arrived, argument)

    def _arrive(self, arrived: Callable[[VirtualTransport, Any], None], argument: Any) -> None:
        """What the peer sent arrives: nothing once this end is gone; held while reading is
        paused, but for a reset, which ends the connection whatever is unread."""
        if self._lost:
            return
        if self._reading_paused and arrived is not VirtualTransport._reset:
            self._inbox.append((arrived, argument))
        else:
            arrived(self, argument)

    def _data_arrived(self, data: bytes) -> None:
        self._protocol.data_received(data)

    def _parcel_arrived(self, parcel: Any) -> None:
        if self.channel is not None:
            self.channel.arrive(parcel)

    def _reset(self, error: ConnectionResetError) -> None:
        self._connection_lost(error)

    def _eof(self, _argument: None = None) -> None:
        if self.channel is not None:
            self.channel.end(None)
        keep_open = self._protocol.eof_received()
        if not keep_open:
            self._closing = True
            self._connection_lost(None)

    def _connection_lost(self, error: Exception | None) -> None:
        if self._lost:
            return
        self._lost = self._closing = True
        self._network.forget(self)
        if self.channel is not None:
            self.channel.end(error)
        self._protocol.connection_lost(error)


class VirtualServer:
    """What ``VirtualNetwork.start_server`` returns, as ``asyncio.Server`` is used."""

    def __init__(self, network: VirtualNetwork, address: Address) -> None:
        self._network = network
        self.address = address
        self._closed = asyncio.Event()

    @property
    def sockets(self) -> tuple[VirtualSocket, ...]:
        return (VirtualSocket(self.address),)

    def close(self) -> None:
        """Stop accepting; connections already made stay, as with a real listener."""
        self._network.unlisten(self.address, self)
        self._closed.set()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def __aenter__(self) -> VirtualServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
        await self.wait_closed()


@dataclass(frozen=True)
class _Listener:
    server: VirtualServer
    handler: Handler
    limit: int
    context: contextvars.Context
    """The listening node's context, in which its connections are served."""


class VirtualNetwork:
    """Hosts, their listeners and the directed links between them, on one virtual loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, latency_s: float = 0.001) -> None:
        self.loop = loop
        self.latency_s = latency_s
        self._listeners: dict[Address, _Listener] = {}
        self._links: dict[tuple[str, str], _Link] = {}
        # Per host, in the order made (a dict, not a set: resets run in a fixed order).
        self._transports: dict[str, dict[VirtualTransport, None]] = {}
        self._ports: dict[str, int] = {}

    # -- faults -----------------------------------------------------------------------------

    def block(self, src: str, dst: str) -> None:
        """Drop what ``src`` sends to ``dst`` (iptables DROP): held, then resent on heal."""
        self._link(src, dst).blocked = True

    def set_delay(self, src: str, dst: str, delay: LinkDelay | None, rng: random.Random
                  ) -> None:
        """What ``src`` sends to ``dst`` from now on arrives ``delay`` later (tc netem's
        delay), drawn from ``rng``; None: at the network's latency again."""
        self._link(src, dst).delay = None if delay is None else DelayDraw(delay, rng)

    def heal(self, src: str, dst: str) -> None:
        link = self._link(src, dst)
        link.blocked = False
        waiting, link.waiting = link.waiting, []
        for resend in waiting:
            resend()

    def reset_host(self, host: str) -> None:
        """The host died: every connection of its resets (its peers read the reset once it
        reaches them), and its listeners are gone."""
        for transport in list(self._transports.get(host, {})):
            transport.abort()
        for address, listener in list(self._listeners.items()):
            if address[0] == host:
                listener.server.close()

    # -- sockets ----------------------------------------------------------------------------

    def environment(self, host: str, wall_clock: Callable[[], float],
                    rng: random.Random | None = None) -> Environment:
        """The network and wall clock of the node on ``host``, for
        ``minibroker.environment.entered``, with its components' event queues on the
        node's loop (``LoopEventQueue``) and ``rng`` its random source. The node listens on
        its own host whatever address it names (its config's 0.0.0.0 or 127.0.0.1), and
        connects from it."""
        async def start_server(handler: Handler, _host: str | None, port: int,
                               **options: Any) -> VirtualServer:
            return await self.start_server(handler, host, port, **options)

        async def open_connection(to_host: str, port: int, **options: Any
                                  ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            return await self.open_connection(to_host, port, local_host=host, **options)

        async def open_object_connection(to_host: str, port: int, **options: Any
                                         ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            return await self.open_connection(to_host, port, local_host=host, parcels=True,
                                              **options)

        return Environment(start_server=start_server, open_connection=open_connection,
                           open_object_connection=open_object_connection,
                           wall_clock=wall_clock, event_queue=LoopEventQueue, rng=rng,
                           fsync=simulated_fsync)

    async def start_server(self, handler: Handler, host: str, port: int, *,
                           limit: int = STREAM_LIMIT) -> VirtualServer:
        """Listen on ``host:port`` (port 0: a free one, as the kernel picks)."""
        address = (host, port or self._ephemeral_port(host))
        if address in self._listeners:
            raise OSError(98, f"[Errno 98] address already in use: {host}:{port}")
        server = VirtualServer(self, address)
        # The node that listens serves: its connections' handler tasks start in its context
        # (a real loop's accept callback runs in the context start_server was called in).
        self._listeners[address] = _Listener(server, handler, limit, contextvars.copy_context())
        return server

    async def open_connection(self, host: str, port: int, *, local_host: str,
                              limit: int = STREAM_LIMIT, parcels: bool = False
                              ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Connect from ``local_host`` (the simulated host the caller runs on); with
        ``parcels``, a connection that carries objects (``ParcelChannel``)."""
        await self._crossed(local_host, host)  # the SYN
        listener = self._listeners.get((host, port))
        if listener is None:
            raise ConnectionRefusedError(111, f"Connect call failed ('{host}', {port})")
        await self._crossed(host, local_host)  # the SYN-ACK
        listener = self._listeners.get((host, port))
        if listener is None:
            raise ConnectionRefusedError(111, f"Connect call failed ('{host}', {port})")
        local = (local_host, self._ephemeral_port(local_host))
        client, client_protocol, reader = self._end(local, (host, port), limit,
                                                    parcels=parcels)
        accepted, accepted_protocol, _ = self._end((host, port), local, listener.limit,
                                                   listener.handler, parcels)
        client.peer, accepted.peer = accepted, client
        # Starts the server's handler, in the listening node's context, not the caller's.
        listener.context.copy().run(accepted_protocol.connection_made, accepted)
        client_protocol.connection_made(client)
        return reader, asyncio.StreamWriter(client, client_protocol, reader, self.loop)

    def _end(self, local: Address, remote: Address, limit: int, handler: Handler | None = None,
             parcels: bool = False
             ) -> tuple[VirtualTransport, asyncio.StreamReaderProtocol, asyncio.StreamReader]:
        reader = asyncio.StreamReader(limit=limit, loop=self.loop)
        protocol = asyncio.StreamReaderProtocol(reader, handler, loop=self.loop)
        transport = VirtualTransport(self, local, remote, protocol, parcels)
        self._transports.setdefault(local[0], {})[transport] = None
        return transport, protocol, reader

    # -- links ------------------------------------------------------------------------------

    def deliver(self, src: str, dst: str, sender: VirtualTransport,
                deliver: Callable[..., None], *args: Any) -> None:
        """``deliver(*args)`` at ``dst`` one latency from now, after what ``sender`` sent
        before, or once the link heals."""
        link = self._link(src, dst)
        if link.blocked:
            link.waiting.append(lambda: self.deliver(src, dst, sender, deliver, *args))
            return
        # In order: never before what this end sent earlier, and at the same instant after
        # it (the loop runs timers due together in the order they were set).
        arrival = max(self.loop.time() + link.latency(self.latency_s), sender._last_arrival)
        sender._last_arrival = arrival
        # In no node's context: bytes on the wire arrive whatever their sender does meanwhile
        # (paused, killed); the receiver's code that they wake runs in its own.
        self.loop.call_at(arrival, deliver, *args, context=contextvars.Context())

    async def _crossed(self, src: str, dst: str) -> None:
        """One packet from ``src`` to ``dst``: a latency, after the link heals."""
        link = self._link(src, dst)
        while link.blocked:
            healed: asyncio.Future[None] = self.loop.create_future()
            link.waiting.append(lambda healed=healed: healed.done() or healed.set_result(None))
            await healed
        await asyncio.sleep(link.latency(self.latency_s))

    def _link(self, src: str, dst: str) -> _Link:
        link = self._links.get((src, dst))
        if link is None:
            link = self._links[src, dst] = _Link()
        return link

    def _ephemeral_port(self, host: str) -> int:
        self._ports[host] = self._ports.get(host, 32767) + 1
        return self._ports[host]

    def unlisten(self, address: Address, server: VirtualServer) -> None:
        if (listener := self._listeners.get(address)) is not None and listener.server is server:
            del self._listeners[address]

    def forget(self, transport: VirtualTransport) -> None:
        self._transports.get(transport.get_extra_info("sockname")[0], {}).pop(transport, None)
