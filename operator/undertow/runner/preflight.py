"""The disk space a run needs, checked before anything starts.

A run that fills its file system midway loses its history's tail and leaves the user with
tracebacks (issue 22); refusing up front, with both figures, costs nothing. The estimate
is deliberately simple and a little generous: every record the producers may send, stored
once per replica, plus the history's lines, plus a margin. The per-record figures come from
a real run (acks1-leader-kill, 2026-11-25: 18,014 sends of 100-byte values took 2.30 MB per
broker, 128 bytes a record; sends lines averaged 169 bytes, reads 119, cluster samples
160); the estimate for that run is 19 MB against 14.2 MB used.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from undertow.spec.experiment import ChaosExperimentSpec

RECORD_OVERHEAD_BYTES = 40
"""Per record and replica beyond its value: its share of a v2 batch header (61 bytes per
batch) and its own header (measured: 28)."""
SEND_LINE_BYTES = 175
READ_LINE_BYTES = 125
CLUSTER_LINE_BYTES = 170
SAMPLES_PER_SECOND = 4
MARGIN = 1.25
"""Retries (one sends line per attempt), logs and the analysis' report ride on this."""


@dataclass(frozen=True)
class SpaceEstimate:
    brokers: int
    """The brokers' logs: rate x producers x duration x (record size + overhead) x RF."""
    history: int
    """sends, reads (every run-phase consumer and the drain), cluster samples."""

    @property
    def total(self) -> int:
        return self.brokers + self.history


class InsufficientSpace(RuntimeError):
    """The file system a run writes to has less free space than the run needs."""


def estimate(spec: ChaosExperimentSpec) -> SpaceEstimate:
    w = spec.workload
    records = w.producers * w.rate * w.duration
    brokers = records * (w.record_size + RECORD_OVERHEAD_BYTES) * spec.topic.replication_factor
    history = (records * (SEND_LINE_BYTES + READ_LINE_BYTES * (w.consumers + 1))
               + w.duration * SAMPLES_PER_SECOND * spec.topic.partitions * CLUSTER_LINE_BYTES)
    return SpaceEstimate(brokers=int(brokers * MARGIN), history=int(history * MARGIN))


def check_free_space(directory: Path, needed: SpaceEstimate) -> None:
    """Raise `InsufficientSpace` naming both figures when ``directory`` (or, while it does
    not exist yet, its nearest existing parent) has less free space than ``needed``."""
    existing = directory.absolute()
    while not existing.exists():
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    if free < needed.total:
        raise InsufficientSpace(
            f"{directory}: {_size(free)} free, but the run needs about {_size(needed.total)} "
            f"({_size(needed.brokers)} for the brokers' logs, {_size(needed.history)} for the "
            f"history); free some space or choose another --out")


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError(n)
