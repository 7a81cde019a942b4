"""Loopback ports for tests that start servers: one free port, whether a set is free, a
base port for a whole cluster."""

from __future__ import annotations

import random
import socket

from undertow.platform.ports import port_range, reserve_ports

_HANDED_OUT: set[int] = set()
"""Every port `free_port` and `free_base_port` gave this worker: free when drawn, but
nothing binds them until their server starts, so a second draw could give the same port
again (a cluster whose broker found its port taken by its own controller's)."""


def free_port() -> int:
    """A loopback port nothing listens on (connections to it are refused), from this
    worker's slice of the ports below the kernel's ephemeral range (``UNDERTOW_PORT_RANGE``,
    tests/conftest.py): a server started on it later cannot find it taken by another
    test's outgoing connection, as a port the kernel hands out (bind to 0) can be; and
    never one it gave before in this worker."""
    for _ in range(1000):
        (port,) = reserve_ports(1)
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError(f"no port left in {port_range()} that this worker did not give out")


def ports_free(ports: list[int]) -> bool:
    """Whether nothing listens on any of ``ports`` on loopback."""
    for port in ports:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def free_base_port(nodes: int, metrics_offset: int = 100) -> int:
    """A base port for `minibroker cluster --base-port`: BASE..BASE+nodes-1 (controller,
    brokers) and BASE+metrics_offset.. (their metrics ports) all free, drawn from this
    worker's slice of the ports (``UNDERTOW_PORT_RANGE``, tests/conftest.py) so that two
    pytest-xdist workers never draw the same, nor a port the kernel hands out to clients."""
    low, high = port_range()
    for _ in range(100):
        base = random.randrange(low, high - metrics_offset - nodes)
        ports = [base + i for i in range(nodes)] + [base + metrics_offset + i
                                                    for i in range(nodes)]
        if not _HANDED_OUT.intersection(ports) and ports_free(ports):
            _HANDED_OUT.update(ports)
            return base
    raise RuntimeError(f"no free port range of {nodes} nodes in {low}-{high}")
