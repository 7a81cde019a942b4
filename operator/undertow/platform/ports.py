"""Loopback ports for child processes that bind them themselves.

A broker must get the same port back after every restart, so ports come from below the
kernel's ephemeral range: outgoing connections never take them while a broker is down.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_FLOOR = 20000
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ceiling() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def reserve_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports that are free on ``host`` right now."""
    ceiling = _ceiling()
    if ceiling - _FLOOR < count * 10:
        raise RuntimeError(f"ephemeral range starts at {ceiling}: too few ports below it")
    chosen: list[int] = []
    while len(chosen) < count:
        port = random.randrange(_FLOOR, ceiling)
        if port not in chosen and _bindable(host, port):
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
