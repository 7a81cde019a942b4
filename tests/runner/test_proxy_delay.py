"""A `delay` fault on the local proxies: a delayed direction's bytes arrive at least its
latency late, several requests are on the wire at once (as behind netem, not one per
latency), a connection's bytes and its FIN stay in order, and taking the delay off brings
the link back to speed (a platform without delays refuses such a run before it starts:
tests/operator/test_kube_platform.py). Lower bounds are exact; upper bounds are generous
(a loaded machine slows everything), each well below what the wrong behaviour would take."""

from __future__ import annotations

import socket
import time

from echo_proxy import CLIENT_TO_ECHO, ECHO_TO_CLIENT, EchoServer, connect, recv_exactly

from undertow.platform.base import wait_for
from undertow.platform.link_delay import LinkDelay
from undertow.platform.proxy import ProxyNetwork

LATENCY_S = 1.0


def round_trip(sock: socket.socket, data: bytes) -> float:
    started = time.monotonic()
    sock.sendall(data)
    assert recv_exactly(sock, len(data)) == data
    return time.monotonic() - started


def test_a_delayed_direction_arrives_late_and_heals(network: ProxyNetwork) -> None:
    sock = connect(network)
    assert round_trip(sock, b"warm") < LATENCY_S
    network.set_delay(CLIENT_TO_ECHO, LinkDelay(LATENCY_S))
    assert round_trip(sock, b"slow") >= LATENCY_S
    network.set_delay(CLIENT_TO_ECHO, None)
    assert round_trip(sock, b"fast") < LATENCY_S
    network.set_delay(ECHO_TO_CLIENT, LinkDelay(LATENCY_S))  # the answers' direction
    assert round_trip(sock, b"back") >= LATENCY_S
    sock.close()


def test_requests_in_flight_are_delayed_together_and_in_order(network: ProxyNetwork) -> None:
    sock = connect(network)
    network.set_delay(CLIENT_TO_ECHO, LinkDelay(LATENCY_S, 0.2, 0.25))
    started = time.monotonic()
    parts = [b"%03d;" % i for i in range(5)]
    for part in parts:  # five requests, each its own chunk at the proxy
        sock.sendall(part)
        time.sleep(0.1)  # hold: the requests' spacing, so that each is a chunk of its own
    assert recv_exactly(sock, 5 * len(parts[0])) == b"".join(parts)
    took = time.monotonic() - started
    # One latency (less the jitter) and the 0.4 s of sending: one at a time would be 5 s.
    assert LATENCY_S - 0.2 <= took < 3 * LATENCY_S
    sock.close()


def test_a_fin_waits_behind_the_delayed_bytes(network: ProxyNetwork,
                                              echo: EchoServer) -> None:
    sock = connect(network)
    network.set_delay(CLIENT_TO_ECHO, LinkDelay(LATENCY_S))
    sock.sendall(b"last words")
    sock.shutdown(socket.SHUT_WR)
    # The echo server answers the bytes, then sees the FIN and closes: had the FIN
    # overtaken them, it would have closed first and echoed nothing.
    assert recv_exactly(sock, 10) == b"last words"
    assert sock.recv(10) == b""
    wait_for(lambda: echo.received == 10, 5, "the echo server to have read every byte")
    sock.close()
