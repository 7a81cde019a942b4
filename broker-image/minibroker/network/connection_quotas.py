"""How many connections the broker holds, in all and per client address.

Kafka's ``ConnectionQuotas``: the Acceptor counts every accepted connection against
``max.connections`` and ``max.connections.per.ip`` (with ``max.connections.per.ip.overrides``)
and closes one over the per-address limit at once, logging the address. Past
``max.connections`` Kafka's Acceptor stops accepting until a slot frees, leaving the newcomers
in the listen backlog; asyncio's server has no public way to pause accepting, so minibroker
closes the newcomer at once there too: a client sees a closed connection and retries after
its backoff, as it would after Kafka's per-address refusal.

One instance serves every listener of a broker, as Kafka's does.
"""

from __future__ import annotations

from collections import Counter

from minibroker.network.socket_config import SocketServerConfig

__all__ = ["ConnectionQuotas"]


class ConnectionQuotas:
    def __init__(self, config: SocketServerConfig) -> None:
        self._max = config.max_connections
        self._max_per_ip = config.max_connections_per_ip
        self._overrides = dict(config.max_connections_per_ip_overrides)
        self._per_ip: Counter[str] = Counter()
        self._total = 0

    @property
    def total(self) -> int:
        """Connections open now, all listeners together."""
        return self._total

    def inc(self, ip: str) -> str | None:
        """Count a new connection from ``ip``; None when it may stay, else why it may not
        (then it is not counted)."""
        if self._total >= self._max:
            return (f"the broker already has the configured maximum of {self._max} "
                    "connections (max.connections)")
        limit = self._overrides.get(ip, self._max_per_ip)
        if self._per_ip[ip] >= limit:
            return (f"address already has the configured maximum of {limit} connections "
                    "(max.connections.per.ip)")
        self._per_ip[ip] += 1
        self._total += 1
        return None

    def dec(self, ip: str) -> None:
        """A connection ``inc`` accepted is closed."""
        self._total -= 1
        self._per_ip[ip] -= 1
        if self._per_ip[ip] <= 0:
            del self._per_ip[ip]
