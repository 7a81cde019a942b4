"""Namespace mode: each node in its own network namespace, partitions as iptables DROP rules."""

from __future__ import annotations

import ipaddress
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from undertow.platform import netns
from undertow.platform.base import CLIENT, Link, PlatformError, wait_for
from undertow.platform.guardian import Guardian
from undertow.platform.link_delay import LinkDelay
from undertow.platform.netns import NetnsNetwork
from undertow.platform.process import ChildProcess, Spawner

pytestmark = pytest.mark.skipif(netns.unavailable_reason() is not None,
                                reason=str(netns.unavailable_reason()))

PORT = 7000
NODES = ["controller", "broker-1", "broker-2"]
ECHO = """
import socket, sys, threading
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
def serve(conn):
    while data := conn.recv(65536):
        conn.sendall(data)
while True:
    threading.Thread(target=serve, args=(server.accept()[0],), daemon=True).start()
"""
CONNECT = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 0.5)"


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsNetwork]:
    work = tmp_path_factory.mktemp("netns")
    guardian = Guardian.start(work / "guardian.log")
    spawner = Spawner()
    net = NetnsNetwork(NODES, guardian)
    net.setup()
    servers = [ChildProcess(node, [sys.executable, "-c", ECHO, net.address(node), str(PORT)],
                            log_path=work / f"{node}.log", spawner=spawner, guardian=guardian,
                            netns=net.namespace(node))
               for node in NODES]
    try:
        for server in servers:
            server.start()
        for node in NODES:  # refused: its server does not listen yet (a loaded machine)
            wait_for(lambda n=node: _can_connect_from(None, n, net, not_yet=NOT_LISTENING), 10,
                     f"{node}'s echo server")
        yield net
    finally:
        for server in servers:
            server.kill()
        net.teardown()
        spawner.close()
        guardian.close()


DROPPED = ("TimeoutError",)
"""A connection a DROP rule stops: no answer within the half second."""
NOT_LISTENING = (*DROPPED, "ConnectionRefusedError")


def _can_connect_from(src: str | None, dst: str, net: NetnsNetwork, *,
                      not_yet: tuple[str, ...] = DROPPED) -> bool:
    """Connect from ``src``'s namespace (the root namespace for None) within half a second;
    a failure other than those of `not_yet` fails the test."""
    prefix = ["ip", "netns", "exec", net.namespace(src)] if src else []
    result = subprocess.run([*prefix, sys.executable, "-c", CONNECT, net.address(dst), str(PORT)],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0 and not any(error in result.stderr for error in not_yet):
        raise AssertionError(f"connect {src}->{dst} failed otherwise: {result.stderr}")
    return result.returncode == 0


def test_addresses_are_private_and_every_node_reaches_every_other(network: NetnsNetwork) -> None:
    assert network.subnet is not None and network.subnet.is_private
    assert network.subnet.prefixlen == 24
    addresses = {network.address(n) for n in [*NODES, CLIENT]}
    assert len(addresses) == 4
    assert all(ipaddress.ip_address(a) in network.subnet for a in addresses)
    assert _can_connect_from("broker-1", "broker-2", network)
    assert _can_connect_from("broker-2", "controller", network)


def test_one_way_node_link_is_an_input_drop_rule_and_heals(network: NetnsNetwork) -> None:
    link = Link("broker-2", "broker-1")
    network.set_blocked(link, True)
    try:
        rules = network.rules("broker-1")
        assert f"-A INPUT -s {network.address('broker-2')}/32 -j DROP" in rules
        assert not _can_connect_from("broker-2", "broker-1", network)  # SYN dropped
        assert _can_connect_from("broker-2", "controller", network)  # other links unaffected
    finally:
        network.set_blocked(link, False)
    assert "DROP" not in network.rules("broker-1")
    assert _can_connect_from("broker-2", "broker-1", network)


def _echo_connection(network: NetnsNetwork, node: str) -> socket.socket:
    sock = socket.create_connection((network.address(node), PORT), timeout=5)
    sock.sendall(b"x")
    assert sock.recv(1) == b"x"
    return sock


def _quiet(sock: socket.socket) -> None:
    sock.settimeout(0.5)
    with pytest.raises(TimeoutError):
        sock.recv(1)
    sock.settimeout(10)


def test_clients_one_way_drops_keep_established_connections_open(
        network: NetnsNetwork) -> None:
    with _echo_connection(network, "broker-1") as sock:
        # The node's answers to the clients are dropped: an OUTPUT rule in the node.
        network.set_blocked(Link("broker-1", CLIENT), True)
        assert (f"-A OUTPUT -d {network.address(CLIENT)}/32 -j DROP"
                in network.rules("broker-1"))
        sock.sendall(b"late")
        _quiet(sock)
        network.set_blocked(Link("broker-1", CLIENT), False)
        assert sock.recv(4) == b"late"  # TCP retransmits what was dropped
        # The clients' requests to the node are dropped: an INPUT rule in the node.
        network.set_blocked(Link(CLIENT, "broker-1"), True)
        sock.sendall(b"held")
        _quiet(sock)
        network.set_blocked(Link(CLIENT, "broker-1"), False)
        assert sock.recv(4) == b"held"


def _pids_in(network: NetnsNetwork, node: str) -> set[int]:
    listed = subprocess.run(["ip", "netns", "pids", network.namespace(node)],
                            capture_output=True, text=True, check=True).stdout
    return {int(pid) for pid in listed.split()}


def _round_trip_s(sock: socket.socket, rounds: int = 7) -> float:
    """The median time of a byte to the echo server and back."""
    times = []
    for _ in range(rounds):
        started = time.monotonic()
        sock.sendall(b"r")
        assert sock.recv(1) == b"r"
        times.append(time.monotonic() - started)
    return statistics.median(times)


def test_a_delay_holds_each_packet_of_its_links_and_ends(network: NetnsNetwork) -> None:
    """150 ms on the clients' link to broker-1 and on its answers: a round trip takes
    300 ms, within 20 %, while the delayers' NFQUEUE rules are there; a partition of a
    delayed link still drops (DROP is checked first); undelayed, the rules and the
    delayer processes are gone and a round trip is fast again."""
    there, back = Link(CLIENT, "broker-1"), Link("broker-1", CLIENT)
    with _echo_connection(network, "broker-1") as sock:
        base = _round_trip_s(sock)
        before = _pids_in(network, "broker-1")
        network.set_delay(there, LinkDelay(0.15))
        network.set_delay(back, LinkDelay(0.15))
        try:
            rules = network.rules("broker-1")
            assert f"-A INPUT -s {network.address(CLIENT)}/32 -j NFQUEUE" in rules
            assert f"-A OUTPUT -d {network.address(CLIENT)}/32 -j NFQUEUE" in rules
            added = _round_trip_s(sock) - base
            assert 0.24 <= added <= 0.36, (base, added)
            network.set_blocked(there, True)
            sock.sendall(b"cut")
            _quiet(sock)
            network.set_blocked(there, False)
            assert sock.recv(3) == b"cut"
            assert len(_pids_in(network, "broker-1") - before) == 2  # the two delayers
        finally:
            network.set_delay(there, None)
            network.set_delay(back, None)
        assert "NFQUEUE" not in network.rules("broker-1")
        assert _pids_in(network, "broker-1") == before
        assert _round_trip_s(sock) < 0.05


def test_teardown_removes_everything_and_a_client_link_needs_a_node() -> None:
    net = NetnsNetwork(["broker-1"])
    net.setup()
    namespace, prefix = net.namespace("broker-1"), f"ut{net.run_id}"
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    assert f"{prefix}br" in links and f"{prefix}h0" in links
    net.teardown()
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert namespace not in listing
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    assert prefix not in links, "a veth or the bridge outlived the teardown"
    with pytest.raises(PlatformError, match="clients' side"):
        NetnsNetwork(["broker-1", CLIENT])
