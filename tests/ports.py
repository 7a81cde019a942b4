"""Loopback ports for tests that start servers: one free port, or whether a set is free."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port nothing listens on (connections to it are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ports_free(ports: list[int]) -> bool:
    """Whether nothing listens on any of ``ports`` on loopback."""
    for port in ports:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True
