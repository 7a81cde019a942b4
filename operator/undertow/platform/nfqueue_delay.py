"""A link delay inside a network namespace, without tc netem: iptables hands the link's
packets to an NFQUEUE, and this process, run in that namespace, holds each one for its drawn
delay before accepting it.

Chaos Mesh's NetworkChaos `delay` uses tc netem, which some kernels lack (a kernel built
without ``sch_netem``, and no modules to load: "Specified qdisc kind is unknown"). The
netfilter queue (``nfnetlink_queue``) is there wherever iptables is, and the delay it gives
is netem's: each packet of the link late by its own draw (``link_delay.DelayDraw``), in the
order they came, several in flight at once. The queue's rule carries ``--queue-bypass``: if
this process dies, the kernel passes the link's packets at once, so a delay never outlives
its delayer (the run's guardian kills it, and removes the rule with the namespace).

The netlink protocol is the kernel's ``nfnetlink_queue`` (``linux/netfilter/
nfnetlink_queue.h``): bind the queue with NFQNL_MSG_CONFIG (command BIND, then copy mode
META: only the packet's id is needed), read NFQNL_MSG_PACKET messages, and answer each with
an NFQNL_MSG_VERDICT of NF_ACCEPT once its time has come.

Usage: ``python -m undertow.platform.nfqueue_delay QUEUE LATENCY_S JITTER_S CORRELATION``
inside the receiving node's namespace (``ip netns exec``); it prints ``bound`` once the
queue is bound and runs until killed, or until its parent (the runner, the fault agent)
is gone: an orphan would keep its queue number bound.
"""

from __future__ import annotations

import heapq
import os
import random
import select
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Sequence

from undertow.platform.link_delay import DelayDraw, LinkDelay

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS = 1, 2
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NF_ACCEPT = 1
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
NLMSG_ERROR = 2
_NLMSG = struct.Struct("=IHHII")  # length, type, flags, seq, pid
_NFGEN = struct.Struct("=BBH")  # family, version, res_id (big-endian queue number)
_ATTR = struct.Struct("=HH")
_PARENT_CHECK_S = 0.5
"""How often, at least, the delayer looks whether its parent is still there."""


def _attr(kind: int, payload: bytes) -> bytes:
    length = _ATTR.size + len(payload)
    return _ATTR.pack(length, kind) + payload + b"\0" * (-length % 4)


def _message(msg_type: int, queue: int, attrs: bytes, seq: int, flags: int = 0) -> bytes:
    body = _NFGEN.pack(socket.AF_UNSPEC, 0, socket.htons(queue)) + attrs
    return _NLMSG.pack(_NLMSG.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg_type,
                       NLM_F_REQUEST | flags, seq, 0) + body


def _attrs(data: bytes) -> dict[int, bytes]:
    found, offset = {}, 0
    while offset + _ATTR.size <= len(data):
        length, kind = _ATTR.unpack_from(data, offset)
        if length < _ATTR.size:
            break
        found[kind & 0x7FFF] = data[offset + _ATTR.size:offset + length]
        offset += length + (-length % 4)
    return found


class QueueDelay:
    """One bound queue: packets in, each accepted after its drawn delay."""

    def __init__(self, queue: int, delay: LinkDelay, rng: random.Random) -> None:
        self.queue = queue
        self._draw = DelayDraw(delay, rng)
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self._sock.bind((0, 0))
        self._seq = 0
        self._held: list[tuple[float, int, int]] = []  # (due, arrival order, packet id)
        self._arrivals = 0
        self._last_due = 0.0

    def bind(self) -> None:
        """Bind the queue and ask for each packet's metadata only (its id)."""
        self._request(_attr(NFQA_CFG_CMD, struct.pack("=BxH", NFQNL_CFG_CMD_BIND,
                                                      socket.htons(socket.AF_INET))))
        self._request(_attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META)))

    def _request(self, attrs: bytes) -> None:
        self._seq += 1
        self._sock.send(_message(NFQNL_MSG_CONFIG, self.queue, attrs, self._seq, NLM_F_ACK))
        reply = self._sock.recv(65536)
        _, kind, _, _, _ = _NLMSG.unpack_from(reply)
        if kind == NLMSG_ERROR:
            (error,) = struct.unpack_from("=i", reply, _NLMSG.size)
            if error:
                raise OSError(-error, f"nfnetlink_queue {self.queue}: configuration refused")

    def run_forever(self) -> None:
        parent = os.getppid()
        while os.getppid() == parent:
            timeout = _PARENT_CHECK_S
            if self._held:
                timeout = min(timeout, max(0.0, self._held[0][0] - time.monotonic()))
            readable, _, _ = select.select([self._sock], [], [], timeout)
            if readable:
                self._receive(self._sock.recv(1 << 16))
            self._release(time.monotonic())

    def _receive(self, data: bytes) -> None:
        offset = 0
        now = time.monotonic()
        while offset + _NLMSG.size <= len(data):
            length, kind, _, _, _ = _NLMSG.unpack_from(data, offset)
            if length < _NLMSG.size:
                break
            if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                attrs = _attrs(data[offset + _NLMSG.size + _NFGEN.size:offset + length])
                (packet_id,) = struct.unpack_from("!I", attrs[NFQA_PACKET_HDR])
                # In arrival order, as netem keeps a link's packets when its jitter is
                # small beside their spacing; a later draw never overtakes an earlier one.
                due = max(now + self._draw.draw(), self._last_due)
                self._last_due = due
                self._arrivals += 1
                heapq.heappush(self._held, (due, self._arrivals, packet_id))
            offset += length + (-length % 4)

    def _release(self, now: float) -> None:
        while self._held and self._held[0][0] <= now:
            _, _, packet_id = heapq.heappop(self._held)
            self._seq += 1
            verdict = _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, packet_id))
            self._sock.send(_message(NFQNL_MSG_VERDICT, self.queue, verdict, self._seq))


BIND_TIMEOUT_S = 10.0
"""How long a delayer may take to bind its queue."""


class DelayerError(Exception):
    """A delayer that did not bind its queue."""


class Delayer:
    """A delayer process, bound to its queue (``start``), until ``stop``: what the netns
    platform and the fault agent run for each delayed link."""

    def __init__(self, process: subprocess.Popen) -> None:
        self._process = process

    @property
    def pid(self) -> int:
        return self._process.pid

    @classmethod
    def start(cls, queue: int, delay: LinkDelay, prefix: Sequence[str] = (), *,
              new_session: bool = False) -> Delayer:
        """Run this module behind ``prefix`` (``ip netns exec NS``) and wait until it says
        ``bound``; ``new_session``: its own process group, for the guardian."""
        process = subprocess.Popen(
            [*prefix, sys.executable, "-m", "undertow.platform.nfqueue_delay", str(queue),
             str(delay.latency_s), str(delay.jitter_s), str(delay.correlation)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=new_session)
        delayer = cls(process)
        assert process.stdout is not None and process.stderr is not None
        ready, _, _ = select.select([process.stdout], [], [], BIND_TIMEOUT_S)
        if not ready or process.stdout.readline().strip() != b"bound":
            process.kill()
            error = process.stderr.read().decode(errors="replace")[-300:]
            delayer.stop()
            raise DelayerError(f"queue {queue} not bound within {BIND_TIMEOUT_S:g}s: {error}")
        return delayer

    def stop(self) -> None:
        self._process.kill()
        self._process.wait(10)
        for pipe in (self._process.stdout, self._process.stderr):
            if pipe is not None:
                pipe.close()


def main(argv: list[str]) -> int:
    queue, latency, jitter, correlation = (int(argv[0]), float(argv[1]), float(argv[2]),
                                           float(argv[3]))
    delayer = QueueDelay(queue, LinkDelay(latency, jitter, correlation), random.Random())
    delayer.bind()
    print("bound", flush=True)
    delayer.run_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
