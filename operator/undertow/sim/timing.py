"""The simulation's few physical constants: how long a broker takes to restart and a link
to carry a message. The nominal ones are a quiet machine's; the explorer runs a schedule
under others too (``undertow.explore.robust``), because real processes on a loaded machine
restart and answer more slowly."""

from __future__ import annotations

from dataclasses import dataclass

START_DELAY_MS = 250.0
"""From a restart to the new process serving: a local minibroker (re)starts, loads its logs
and registers in about 0.25 s (measured on local processes: a pod-delete or a power loss
healed, then its `log_recovery` event)."""
DEFAULT_LATENCY_MS = 1.0
"""One way over a link: loopback and a pod network are well under it."""


@dataclass(frozen=True)
class Timing:
    start_delay_ms: float = START_DELAY_MS
    latency_ms: float = DEFAULT_LATENCY_MS


NOMINAL = Timing()
