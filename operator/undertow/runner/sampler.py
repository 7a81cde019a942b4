"""Samples the cluster's own state every ~250 ms into ``cluster.jsonl``.

Leader, leader epoch and ISR come from the controller (the source of truth); each replica's
LEO and the leader's HW come from the brokers' ``/v1/state``. A node that does not answer
(killed, paused, partitioned) is simply missing from that sample.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from undertow.platform.base import CONTROLLER, Platform
from undertow.runner.history import HistoryWriter

log = logging.getLogger("undertow.sampler")

INTERVAL_S = 0.25


def sample(platform: Platform, topic: str) -> list[dict[str, Any]]:
    """One sample per partition of ``topic``; empty when the controller does not answer."""
    try:
        controller = platform.state(CONTROLLER)
    except Exception:  # a paused or killed controller: no sample this round
        return []
    partitions = controller.get("topics", {}).get(topic, {}).get("partitions", {})
    if not partitions:
        return []
    replicas: dict[int, dict[str, Any]] = {}
    for node in platform.brokers:
        try:
            state = platform.state(node)
        except Exception:
            continue
        for p in state.get("partitions", []):
            if p["topic"] == topic:
                replicas.setdefault(p["partition"], {})[state["broker_id"]] = p
    now = time.time()
    samples = []
    for index, reg in sorted(partitions.items(), key=lambda kv: int(kv[0])):
        by_broker = replicas.get(int(index), {})
        leader_view = by_broker.get(reg["leader"])
        samples.append({
            "t": now,
            "topic": topic,
            "partition": int(index),
            "leader": reg["leader"],
            "leader_epoch": reg["leader_epoch"],
            "isr": reg["isr"],
            "high_watermark": leader_view["high_watermark"] if leader_view else None,
            "log_end_offsets": {str(b): p["log_end_offset"] for b, p in sorted(by_broker.items())},
        })
    return samples


class ClusterSampler:
    """A background thread writing samples until stopped; keeps the latest for progress and
    hands every round to `on_round(began, samples)` (the workload's leader-epoch gate)."""

    def __init__(self, platform: Platform, topic: str, history: HistoryWriter,
                 on_round: Callable[[float, list[dict[str, Any]]], None] = lambda _t, _s: None
                 ) -> None:
        self._platform = platform
        self._topic = topic
        self._history = history
        self._on_round = on_round
        self._stop = threading.Event()
        self.latest: list[dict[str, Any]] = []
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            started, began = time.monotonic(), time.time()
            samples = sample(self._platform, self._topic)
            for record in samples:
                self._history.cluster_sample(record)
            if samples:
                self.latest = samples
            self._on_round(began, samples)
            self._stop.wait(max(INTERVAL_S - (time.monotonic() - started), 0.01))
