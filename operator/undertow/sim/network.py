"""The virtual network: request/answer exchanges over links with a latency, which a
partition can cut.

It models what a Kafka client or broker sees of TCP, not packets:

- A request to an address nothing listens on is refused (RST) one latency later.
- A request or answer sent over a blocked link, or arriving while it is blocked, is lost:
  the requester's timeout fires (iptables DROP; TCP retransmits into the void).
- When the process serving a request dies before answering, the requester's connection is
  reset: it learns one latency later (unless the way back is blocked: then it times out).
- A paused process (SIGSTOP) answers nothing, but what reaches it is kept and served when it
  resumes (the kernel's socket buffers).

Latency is the same on every link, so each link delivers in order (one TCP connection).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from undertow.sim.loop import SimLoop, SimTimer
from undertow.sim.process import Process
from undertow.sim.timing import DEFAULT_LATENCY_MS


class NetworkError(Exception):
    """The exchange failed without an answer; ``reason``: refused, reset or timeout."""

    def __init__(self, reason: str, address: tuple[str, int]) -> None:
        super().__init__(f"{reason}: {address[0]}:{address[1]}")
        self.reason = reason


Reply = Callable[[Any], None]
OnAnswer = Callable[[Any, NetworkError | None], None]
Handler = Callable[[Any, Reply], None]
"""Serves one request (the message) and answers it through ``reply``, now or later."""


class _Exchange:
    __slots__ = ("address", "back", "on_answer", "src")

    def __init__(self, src: Process, back: tuple[str, str], address: tuple[str, int],
                 on_answer: OnAnswer) -> None:
        self.src = src
        self.back = back
        """The answer's direction: (server endpoint, client endpoint)."""
        self.address = address
        self.on_answer = on_answer


class _Listener:
    __slots__ = ("endpoint", "handler", "pending", "process")

    def __init__(self, endpoint: str, process: Process, handler: Handler) -> None:
        self.endpoint = endpoint
        self.process = process
        self.handler = handler
        self.pending: set[int] = set()


class VirtualNetwork:
    def __init__(self, loop: SimLoop, latency_ms: float = DEFAULT_LATENCY_MS) -> None:
        self.loop = loop
        self.latency_ms = latency_ms
        self.blocked: set[tuple[str, str]] = set()
        """Directed links (source endpoint, destination endpoint) that drop everything."""
        self._listeners: dict[tuple[str, int], _Listener] = {}
        self._endpoint_of: dict[tuple[str, int], str] = {}
        self._exchanges: dict[int, _Exchange] = {}
        self._next_id = 0
        self._deadlines: list[tuple[float, int]] = []
        """(deadline, exchange id), answered ones included until they reach the head."""
        self._sweep_at: float | None = None
        self._sweep_timer: SimTimer | None = None

    # ---- addresses ----------------------------------------------------------------------------

    def listen(self, address: tuple[str, int], endpoint: str, process: Process,
               handler: Handler) -> None:
        """``process`` (of node ``endpoint``) serves ``address`` with ``handler`` until it
        dies."""
        listener = self._listeners[address] = _Listener(endpoint, process, handler)
        self._endpoint_of[address] = endpoint
        process.on_exit(lambda: self._closed(address, listener))

    def _closed(self, address: tuple[str, int], listener: _Listener) -> None:
        if self._listeners.get(address) is listener:
            del self._listeners[address]
        for exchange_id in sorted(listener.pending):
            exchange = self._exchanges.get(exchange_id)
            if exchange is not None:
                self._send_back(exchange_id, exchange, None, NetworkError("reset", address))

    # ---- exchanges ------------------------------------------------------------------------

    def request(self, src: Process, src_endpoint: str, address: tuple[str, int],
                message: Any, on_answer: OnAnswer, timeout_ms: float) -> None:
        """Send ``message`` from ``src`` to whoever serves ``address`` (its handler runs
        there), and call ``on_answer(answer, None)`` back in ``src`` once the answer arrives,
        or ``on_answer(None, error)`` when none will."""
        exchange_id = self._next_id
        self._next_id += 1
        dst_endpoint = self._endpoint_of.get(address, address[0])
        exchange = _Exchange(src, (dst_endpoint, src_endpoint), address, on_answer)
        self._exchanges[exchange_id] = exchange
        deadline = self.loop.now_ms() + timeout_ms
        heapq.heappush(self._deadlines, (deadline, exchange_id))
        if self._sweep_at is None or deadline < self._sweep_at:
            self._arm_sweep(deadline)
        listener = self._listeners.get(address)
        if listener is None:
            self._send_back(exchange_id, exchange, None, NetworkError("refused", address))
            return
        link = (src_endpoint, dst_endpoint)
        blocked = self.blocked
        if blocked and link in blocked:
            return  # dropped: the timeout answers

        def arrive() -> None:
            if blocked and link in blocked:
                return
            if self._listeners.get(address) is not listener:
                self._send_back(exchange_id, exchange, None, NetworkError("refused", address))
                return
            listener.pending.add(exchange_id)
            replied = False

            def reply(answer: Any) -> None:
                nonlocal replied
                if replied or not listener.process.alive:
                    return
                replied = True
                listener.pending.discard(exchange_id)
                self._send_back(exchange_id, exchange, answer, None)

            listener.process.run(lambda: listener.handler(message, reply))

        self.loop.call_later(self.latency_ms, arrive)

    def _send_back(self, exchange_id: int, exchange: _Exchange, answer: Any,
                   error: NetworkError | None) -> None:
        back, blocked = exchange.back, self.blocked
        if blocked and back in blocked:
            return

        def arrive() -> None:
            if blocked and back in blocked:
                return
            exchange.src.run(lambda: self._finish(exchange_id, answer, error))

        self.loop.call_later(self.latency_ms, arrive)

    def _arm_sweep(self, at_ms: float) -> None:
        """One timer for every timeout, at the earliest deadline of an exchange still
        waiting: most exchanges are answered long before theirs."""
        if self._sweep_timer is not None:
            self._sweep_timer.cancel()
        self._sweep_at = at_ms
        self._sweep_timer = self.loop.call_later(at_ms - self.loop.now_ms(), self._sweep)

    def _sweep(self) -> None:
        """Time out every exchange past its deadline (in its requester, which a pause
        holds), then wait for the next waiting one's."""
        now, deadlines, exchanges = self.loop.now_ms(), self._deadlines, self._exchanges
        self._sweep_at = self._sweep_timer = None
        while deadlines and (deadlines[0][0] <= now or deadlines[0][1] not in exchanges):
            _, exchange_id = heapq.heappop(deadlines)
            exchange = exchanges.get(exchange_id)
            if exchange is not None:
                error = NetworkError("timeout", exchange.address)
                exchange.src.run(lambda i=exchange_id, e=error: self._finish(i, None, e))
        if deadlines:
            self._arm_sweep(deadlines[0][0])

    def _finish(self, exchange_id: int, answer: Any, error: NetworkError | None) -> None:
        exchange = self._exchanges.pop(exchange_id, None)
        if exchange is not None:
            exchange.on_answer(answer, error)
