"""Collects the nodes' replication events into ``events.jsonl`` while the run goes on.

Every broker and the controller log their replication state changes (became leader,
truncated, changed an ISR, elected a leader, fenced a broker, ...) to an events log on their
own disk and serve it at ``/v1/events`` (minibroker's ``events`` module). The collector pulls
each node's new events every half second and once more at the end, so that the history keeps
what a node logged even when the node is later killed, or its pod deleted with its disk:
only the events of the last half second before such a loss can be missed.

Each node's log has an id; a node that answers with another id than the last (a pod that came
back with an empty disk) is read from its start. A node that does not answer (killed, paused,
partitioned) is asked again next round. Lines are written in the order they were collected,
each with the node that logged it; the analysis orders them by time.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from undertow.platform.base import Platform, PlatformError
from undertow.runner.history import HistoryWriter
from undertow.runner.scheduler import Scheduler, ThreadScheduler
from undertow_history.schema import EVENTS

log = logging.getLogger("undertow.events")

INTERVAL_S = 0.5
STOP_WAIT_S = 30.0
"""How long `stop` waits for a round under way."""
MAX_PAGES = 20
"""Pages read from one node in one round (a node answers a few thousand events a page)."""


@dataclass
class _Cursor:
    log_id: str | None = None
    offset: int = 0


def to_event(node: str, raw: dict[str, Any]) -> dict[str, Any]:
    """An ``events.jsonl`` line: the node's event with every field of the schema (null
    where it does not apply) and the node that logged it; unknown fields are left out."""
    return {name: node if name == "node" else raw.get(name) for name in EVENTS.names}


class EventCollector:
    """Appends every node's new events to the history each INTERVAL_S, on a `Scheduler`
    (a thread per round on real platforms, the virtual loop in simulation)."""

    def __init__(self, platform: Platform, history: HistoryWriter,
                 scheduler: Scheduler | None = None) -> None:
        self._platform = platform
        self._history = history
        self._scheduler = scheduler or ThreadScheduler()
        self._cursors = {node: _Cursor() for node in platform.nodes}
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def start(self) -> None:
        self._scheduler.call_later(INTERVAL_S, self._round, "events")

    def stop(self) -> None:
        """Stop the rounds, then read every node that answers one last time."""
        self._stop.set()
        self._scheduler.shutdown(STOP_WAIT_S)
        self.collect()

    def _round(self) -> None:
        if self._stop.is_set():
            return
        self.collect()
        self._scheduler.call_later(INTERVAL_S, self._round, "events")

    def collect(self) -> None:
        """One round: every node's events since the last round."""
        with self._lock:
            for node, cursor in self._cursors.items():
                for _ in range(MAX_PAGES):
                    try:
                        page = self._platform.events(node, cursor.log_id, cursor.offset)
                    except PlatformError as exc:
                        log.debug("events of %s: %s", node, exc)
                        break
                    if page.get("log_id") != cursor.log_id and cursor.log_id is not None:
                        log.info("%s has a new events log (%s): reading it from its start",
                                 node, page.get("log_id"))
                    events = page.get("events") or []
                    cursor.log_id = page.get("log_id")
                    cursor.offset = page.get("next_offset", cursor.offset)
                    for raw in events:
                        self._history.event(to_event(node, raw))
                    if not events:
                        break

