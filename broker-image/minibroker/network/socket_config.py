"""The Kafka listener's resource limits, read once from the broker's configuration.

Kafka's ``SocketServerConfigs`` holds the same keys; ``config.py`` documents each one and
its default, and ``docs/design.md`` ("Resource limits") says what each bounds and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from minibroker.config import resolve

__all__ = ["SocketServerConfig"]


@dataclass(frozen=True)
class SocketServerConfig:
    max_request_size: int
    """``socket.request.max.bytes``: the largest frame read."""
    queued_max_request_bytes: int
    """``queued.max.request.bytes``: bytes of frames being read or parsed at once, all
    connections together; -1: no bound."""
    connections_max_idle_ms: int
    """``connections.max.idle.ms``: between requests, or an answer left unread."""
    request_read_timeout_ms: int
    """``socket.request.read.timeout.ms``: from a frame's first byte to its last."""
    max_connections: int
    """``max.connections``: all listeners together."""
    max_connections_per_ip: int
    """``max.connections.per.ip``, but for the addresses of ``..._overrides``."""
    max_connections_per_ip_overrides: Mapping[str, int]
    max_request_elements: int
    """``max.request.elements``: array elements and tagged fields in one request."""

    @classmethod
    def from_config(cls, config: Mapping[str, str]) -> SocketServerConfig:
        """The limits ``config`` sets, Kafka's (or minibroker's) defaults for the others."""
        return cls(
            max_request_size=resolve("socket.request.max.bytes", config),
            queued_max_request_bytes=resolve("queued.max.request.bytes", config),
            connections_max_idle_ms=resolve("connections.max.idle.ms", config),
            request_read_timeout_ms=resolve("socket.request.read.timeout.ms", config),
            max_connections=resolve("max.connections", config),
            max_connections_per_ip=resolve("max.connections.per.ip", config),
            max_connections_per_ip_overrides=resolve("max.connections.per.ip.overrides",
                                                     config),
            max_request_elements=resolve("max.request.elements", config),
        )
