"""Healing a cluster of every fault kind at once, without the units that injected them.

The units' own ``recover`` is the normal path, and their time limits the next. This is the
one for whoever holds no unit: a Kubernetes runner that starts or ends (an earlier runner
may have died mid-fault), the operator healing a cluster after its runner failed or its
experiment was deleted, a test between cases. It asks every unit of the registry to
``clear`` every node, so a kind added to the registry is healed here too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from undertow.faults.registry import FAULT_UNITS
from undertow.platform.base import Platform
from undertow.platform.control import EndpointUnreachable
from undertow.platform.errors import PlatformError

log = logging.getLogger("undertow.faults")


def clear(platform: Platform, nodes: Iterable[str] | None = None) -> list[str]:
    """Undo every kind of fault on ``nodes`` (default: every node, then every workload
    client running as a process of its own) without waiting for them to serve; return the
    problems (an endpoint that refused, a primitive that failed), one line each. An
    endpoint that cannot be reached is none: its node is gone or restarting, and its
    rules, failpoints and stopped processes with it."""
    problems: list[str] = []
    units = sorted(FAULT_UNITS.items(), key=lambda item: not item[1].cleared_first)
    clients = platform.client_processes
    for node in (*platform.nodes, *clients) if nodes is None else nodes:
        for kind, unit in units:
            if unit.brokers_only and node not in platform.brokers:
                continue
            if node in clients and not unit.hits_client_processes:
                continue  # a client's links are cleared with the brokers' at their end
            try:
                unit.clear(platform, node)
            except EndpointUnreachable as exc:
                log.debug("clearing %s on %s: unreachable (%s)", kind, node, exc)
            except PlatformError as exc:  # refused by its endpoint, or failed
                problems.append(f"{node}: clearing {kind}: {exc}")
    return problems


def heal(platform: Platform) -> None:
    """Undo every fault on every node, then wait until each serves again."""
    problems = clear(platform)
    for node in platform.nodes:
        platform.await_serving(node)
    if problems:
        raise PlatformError(f"healing the cluster: {'; '.join(problems)}")
