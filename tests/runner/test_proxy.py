"""Per-link TCP proxies against a local echo server: pass-through, isolate, heal, one-way."""

from __future__ import annotations

import contextlib
import os
import socket
import threading

import pytest
from echo_proxy import CLIENT_TO_ECHO, ECHO_TO_CLIENT, QUIET_S, EchoServer, connect, recv_exactly

from undertow.platform.base import Link, PlatformError, wait_for
from undertow.platform.proxy import ProxyNetwork


def assert_silent(sock: socket.socket) -> None:
    """Nothing arrives and the connection is not closed (a drop, not a reset or FIN)."""
    sock.settimeout(QUIET_S)
    with pytest.raises(TimeoutError):
        sock.recv(1)
    sock.settimeout(5)


def test_pass_through_keeps_every_byte_in_order(network: ProxyNetwork) -> None:
    payload = os.urandom(1 << 20)
    with connect(network) as sock:
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        assert recv_exactly(sock, len(payload)) == payload
        sender.join()
    assert network.accepted_count(CLIENT_TO_ECHO) == 1


def test_isolate_drops_both_ways_and_heal_delivers(network: ProxyNetwork,
                                                    echo: EchoServer) -> None:
    with connect(network) as sock:
        sock.sendall(b"before")
        assert recv_exactly(sock, 6) == b"before"
        network.set_blocked(CLIENT_TO_ECHO, True)
        network.set_blocked(ECHO_TO_CLIENT, True)
        sock.sendall(b"during")
        assert_silent(sock)
        assert echo.received == 6
        network.set_blocked(CLIENT_TO_ECHO, False)
        network.set_blocked(ECHO_TO_CLIENT, False)
        assert recv_exactly(sock, 6) == b"during"


def test_new_connection_waits_until_heal(network: ProxyNetwork, echo: EchoServer) -> None:
    network.set_blocked(CLIENT_TO_ECHO, True)
    with connect(network) as sock:
        sock.sendall(b"hello")
        assert_silent(sock)
        assert echo.connections == 0, "the SYN of a blocked link must not reach the server"
        network.set_blocked(CLIENT_TO_ECHO, False)
        assert recv_exactly(sock, 5) == b"hello"
    assert echo.connections == 1


def test_one_way_client_to_server_drop(network: ProxyNetwork, echo: EchoServer) -> None:
    with connect(network) as sock:
        sock.sendall(b"x")
        recv_exactly(sock, 1)
        network.set_blocked(CLIENT_TO_ECHO, True)
        sock.sendall(b"lost?")
        assert_silent(sock)
        assert echo.received == 1, "bytes crossed a blocked direction"
        network.set_blocked(CLIENT_TO_ECHO, False)
        assert recv_exactly(sock, 5) == b"lost?"


def test_one_way_server_to_client_drop(network: ProxyNetwork, echo: EchoServer) -> None:
    with connect(network) as sock:
        sock.sendall(b"x")
        recv_exactly(sock, 1)  # established: a new connection would wait for its SYN-ACK
        network.set_blocked(ECHO_TO_CLIENT, True)
        sock.sendall(b"ping")
        # The request gets through (the server sees it) but the answer does not.
        wait_for(lambda: echo.received == 5, 5, "the server to receive the request")
        assert_silent(sock)
        network.set_blocked(ECHO_TO_CLIENT, False)
        assert recv_exactly(sock, 4) == b"ping"


def test_server_close_reaches_client_only_when_its_direction_opens(
        network: ProxyNetwork, echo: EchoServer) -> None:
    with connect(network) as sock:
        sock.sendall(b"x")
        recv_exactly(sock, 1)
        network.set_blocked(ECHO_TO_CLIENT, True)
        sock.sendall(b"close")
        wait_for(lambda: echo.received == 6, 5, "the server to receive the close request")
        assert_silent(sock)  # the server's FIN is dropped with everything else it sends
        network.set_blocked(ECHO_TO_CLIENT, False)
        assert sock.recv(1) == b""


def test_blocking_a_link_without_a_proxy_is_a_no_op_and_unknown_links_are_errors(
        network: ProxyNetwork) -> None:
    network.set_blocked(Link("a", "b"), True)
    with connect(network) as sock:
        sock.sendall(b"ok")
        assert recv_exactly(sock, 2) == b"ok"
    with pytest.raises(PlatformError, match="no proxy for link a->b"):
        network.address(Link("a", "b"))
    with pytest.raises(PlatformError, match="already has a proxy"):
        network.add_link(CLIENT_TO_ECHO, ("127.0.0.1", 1))


def test_refused_upstream_resets_the_client(network: ProxyNetwork) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        dead_port = unused.getsockname()[1]
    network.add_link(Link("client", "dead"), ("127.0.0.1", dead_port))
    address = network.address(Link("client", "dead"))
    # The reset shows at connect() or at the first read, whichever the RST beats.
    with pytest.raises(ConnectionResetError), socket.create_connection(address, 5) as sock:
        sock.sendall(b"x")
        sock.recv(1)


def test_close_ends_every_connection(echo: EchoServer) -> None:
    net = ProxyNetwork()
    net.add_link(CLIENT_TO_ECHO, echo.server_address[:2])
    sock = connect(net)
    sock.sendall(b"a")
    recv_exactly(sock, 1)
    net.close()
    with sock, contextlib.suppress(ConnectionResetError):
        assert sock.recv(1) == b"", "a closed proxy must end its connections"
    net.close()  # idempotent
