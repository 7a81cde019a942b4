"""The history: plain data, written once, append-only (see docs/history-format.md).

Every line is flushed as it is written, so an interrupted run still leaves an analysable
history. Writers are called from the workload's threads and the runner's loop alike.

The files and their fields are those of `undertow_analysis.history_schema`, the one schema the
analysis reads them with. Lines are not checked against it here (thousands a second go through
`_append`): tests check the lines a real run writes.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from undertow_analysis import history_schema as schema


class HistoryWriter:
    """Appends to one JSON Lines file per file of the schema; rewrites meta.json whole."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._files: dict[str, TextIO] = {
            f.name: open(directory / f.filename, "a", encoding="utf-8")  # noqa: SIM115
            for f in schema.FILES if f.json_lines
        }

    def _append(self, name: str, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._lock:
            f = self._files[name]
            f.write(line)
            f.flush()

    def send(self, *, producer: str, value: str, topic: str, partition: int | None, status: str,
             offset: int | None, error: str | None, t_invoke: float, t_complete: float) -> None:
        self._append("sends", {"producer": producer, "value": value, "topic": topic,
                               "partition": partition, "status": status, "offset": offset,
                               "error": error, "t_invoke": t_invoke, "t_complete": t_complete})

    def read(self, *, consumer: str, phase: str, topic: str, partition: int, offset: int,
             value: str, t: float) -> None:
        self._append("reads", {"consumer": consumer, "phase": phase, "topic": topic,
                               "partition": partition, "offset": offset, "value": value, "t": t})

    def fault(self, *, fault: str, target: str, role: str, action: str,
              t: float | None = None) -> None:
        self._append("faults", {"fault": fault, "target": target, "role": role,
                                "action": action, "t": time.time() if t is None else t})

    def cluster_sample(self, record: dict[str, Any]) -> None:
        self._append("cluster", record)

    def write_meta(self, meta: dict[str, Any]) -> None:
        """meta.json is rewritten whole (tmp + rename): once at the start, once at the end."""
        tmp = self.directory / f"{schema.META.filename}.tmp"
        tmp.write_text(json.dumps(meta, indent=2, default=str), encoding="utf-8")
        tmp.replace(self.directory / schema.META.filename)

    def close(self) -> None:
        with self._lock:
            for f in self._files.values():
                f.close()
