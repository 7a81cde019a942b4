"""Loopback ports for child processes that bind them themselves.

A broker must get the same port back after every restart, so ports come from below the
kernel's ephemeral range: outgoing connections never take them while a broker is down.
Experiments run side by side on one machine (pytest-xdist's workers, two terminals) take
disjoint ranges with ``UNDERTOW_PORT_RANGE=LOW-HIGH``, so that neither takes a port the
other's stopped broker is about to bind again.
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Collection
from pathlib import Path

_FLOOR = 20000
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
PORT_RANGE_ENV = "UNDERTOW_PORT_RANGE"


def _ceiling() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_range() -> tuple[int, int]:
    """[low, high): ``UNDERTOW_PORT_RANGE`` if set, else from 20000 to the ephemeral range."""
    text = os.environ.get(PORT_RANGE_ENV)
    if not text:
        return _FLOOR, _ceiling()
    try:
        low, high = (int(part) for part in text.split("-"))
    except ValueError:
        raise ValueError(f"{PORT_RANGE_ENV}={text!r}: expected LOW-HIGH (20000-26000)") from None
    if not 1024 <= low < high <= 65536:
        raise ValueError(f"{PORT_RANGE_ENV}={text!r}: expected 1024 <= LOW < HIGH <= 65536")
    return low, high


def reserve_ports(count: int, host: str = "127.0.0.1",
                  taken: Collection[int] = ()) -> list[int]:
    """``count`` distinct ports that are free on ``host`` right now, none of ``taken`` (the
    caller's own, whose processes may be down and about to bind them again)."""
    low, high = port_range()
    if high - low < count * 10:
        raise RuntimeError(f"ports {low}-{high}: too few for {count} (set {PORT_RANGE_ENV})")
    chosen: list[int] = []
    while len(chosen) < count:
        port = random.randrange(low, high)
        if port not in chosen and port not in taken and _bindable(host, port):
            chosen.append(port)
    return chosen


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Servers set SO_REUSEADDR (asyncio does), so a TIME_WAIT leftover is no conflict.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True
