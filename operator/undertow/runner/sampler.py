"""Samples the cluster's own state every ~250 ms into ``cluster.jsonl``.

Leader, leader epoch, ISR and the eligible leader replicas (KIP-966's ELR and last known
ELR, empty where the controller keeps none) come from the controller (the source of truth);
each replica's LEO and the leader's HW and LSO come from the brokers' ``/v1/state``. A node
that does not answer (killed, paused, partitioned) is simply missing from that sample.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from undertow.cluster_view import PartitionView
from undertow.platform.base import Platform
from undertow.runner.history import HistoryWriter
from undertow.runner.scheduler import Scheduler, ThreadScheduler

log = logging.getLogger("undertow.sampler")

INTERVAL_S = 0.25
STOP_WAIT_S = 30.0
"""How long `stop` waits for a round under way (a controller that answers slowly)."""


def sample(platform: Platform, topics: Sequence[str], group_id: str | None = None,
           clock: Callable[[], float] = time.time) -> list[dict[str, Any]]:
    """One sample per partition of each of ``topics`` (the experiment's, and a pipeline's
    output topic), and of the ``__consumer_offsets`` partition holding ``group_id`` once it
    exists; empty when the controller does not answer."""
    try:
        view = platform.cluster_view(replicas=True)
    except Exception:  # a paused or killed controller: no sample this round
        return []
    now = clock()
    partitions = [p for topic in topics for p in view.topic_partitions(topic)]
    if group_id is not None:
        with contextlib.suppress(KeyError):  # the group's first member creates the topic
            partitions.append(view.group_partition(group_id))
    return [to_sample(p, now) for p in partitions]


def to_sample(p: PartitionView, t: float) -> dict[str, Any]:
    """A ``cluster.jsonl`` line: plain data, written once (docs/history-format.md)."""
    return {"t": t, "topic": p.topic, "partition": p.partition, "leader": p.leader,
            "leader_epoch": p.leader_epoch, "isr": list(p.isr),
            "high_watermark": p.high_watermark,
            "log_end_offsets": {str(b): leo for b, leo in sorted(p.log_end_offsets.items())},
            "elr": list(p.elr), "last_known_elr": list(p.last_known_elr),
            "leader_recovery_state": p.leader_recovery_state,
            "last_stable_offset": p.last_stable_offset}


class ClusterSampler:
    """Writes a sample of every partition each INTERVAL_S until stopped, on a `Scheduler`
    (a thread per round on real platforms, the virtual loop in simulation); keeps the latest
    for progress and hands every round to `on_round(began, samples)` (the workload's
    leader-epoch gate)."""

    def __init__(self, platform: Platform, topics: Sequence[str], history: HistoryWriter,
                 on_round: Callable[[float, list[dict[str, Any]]], None] = lambda _t, _s: None,
                 group_id: str | None = None, clock: Callable[[], float] = time.time,
                 scheduler: Scheduler | None = None) -> None:
        self._platform = platform
        self._topics = tuple(topics)
        self._group_id = group_id
        self._history = history
        self._on_round = on_round
        self._clock = clock
        self._scheduler = scheduler or ThreadScheduler()
        self._stop = threading.Event()
        self.latest: list[dict[str, Any]] = []

    def start(self) -> None:
        """The first round now, on the caller's thread: the history has a sample from the
        workload's first instant."""
        self._round()

    def stop(self) -> None:
        self._stop.set()
        self._scheduler.shutdown(STOP_WAIT_S)

    def _round(self) -> None:
        if self._stop.is_set():
            return
        started, began = self._scheduler.monotonic(), self._clock()
        samples = sample(self._platform, self._topics, self._group_id, self._clock)
        for record in samples:
            self._history.cluster_sample(record)
        if samples:
            self.latest = samples
        self._on_round(began, samples)
        self._scheduler.call_later(
            max(INTERVAL_S - (self._scheduler.monotonic() - started), 0.01), self._round,
            "sampler")
