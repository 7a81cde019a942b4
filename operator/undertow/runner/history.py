"""The history: plain data, written once, append-only (see docs/history-format.md).

Every line goes to its file with one ``write`` as it is recorded (no buffer), so an interrupted
run still leaves an analysable history. Writers are called from the workload's threads and the
runner's loop alike.

The files and their fields are those of `undertow_history.schema`, the one schema the
analysis reads them with. Lines are not checked against it here (thousands a second go through
`_append`): tests check the lines a real run writes.

A history that cannot be written (a full disk, an I/O error) must not go on silently
incomplete (issue 22): the first failed write is reported, once, to the run's `Abort`, which
stops the run; the file is cut back to its last whole line and every later line is dropped.
The first meta.json sets aside room on the disk for the last one, so that even a run stopped
by a full disk can mark its history incomplete.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from undertow.runner.abort import Abort, HistoryWriteError
from undertow_history import schema

RESERVE_MIN_BYTES = 64 * 1024
"""Room set aside for the last meta.json: at least this, and four times the first one (the
last adds the drain's end offsets and the skipped faults, a few bytes per partition and
fault)."""
RESERVE_NAME = ".meta-reserve"
_LINE = json.JSONEncoder(separators=(",", ":"))
"""One encoder for every line (``json.dumps`` with arguments builds one per call)."""


class HistoryWriter:
    """Appends to one JSON Lines file per file of the schema; rewrites meta.json whole.

    Failures go to `abort` (the run's; a writer of its own when none is given).
    """

    def __init__(self, directory: Path, abort: Abort | None = None) -> None:
        self.directory = directory
        self.abort = Abort() if abort is None else abort
        self._lock = threading.Lock()
        self._failed = False
        self._closed = False
        self._paths = {f.name: directory / f.filename for f in schema.FILES if f.json_lines}
        self._fds: dict[str, int] = {}
        self._sizes: dict[str, int] = {}
        try:
            directory.mkdir(parents=True, exist_ok=True)
            for name, path in self._paths.items():
                fd = self._fds[name] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                                               0o644)
                self._sizes[name] = os.fstat(fd).st_size
        except OSError as exc:  # nothing has started: the caller gets the error at once
            self.close()
            raise HistoryWriteError(Path(exc.filename or directory), exc) from exc

    def _append(self, name: str, record: dict[str, Any]) -> None:
        data = (_LINE.encode(record) + "\n").encode()
        with self._lock:
            if self._failed or self._closed:
                return  # the run is stopping (or over): this line would follow a gap
            fd, size = self._fds[name], self._sizes[name]
            try:
                _write_all(fd, data)
            except OSError as exc:
                self._fail(self._paths[name], exc)
                _truncate(fd, size)
                return
            self._sizes[name] = size + len(data)

    def _fail(self, path: Path, error: OSError) -> None:
        """Called with the lock held: the first failure stops every later line."""
        self._failed = True
        self.abort.fail(HistoryWriteError(path, error))

    def send(self, *, producer: str, value: str, topic: str, partition: int | None, status: str,
             offset: int | None, error: str | None, t_invoke: float, t_complete: float,
             txn: str | None = None) -> None:
        self._append("sends", {"producer": producer, "value": value, "topic": topic,
                               "partition": partition, "status": status, "offset": offset,
                               "error": error, "t_invoke": t_invoke, "t_complete": t_complete,
                               "txn": txn})

    def read(self, *, consumer: str, phase: str, topic: str, partition: int, offset: int,
             value: str, t: float, generation: int | None = None,
             isolation: str | None = None) -> None:
        self._append("reads", {"consumer": consumer, "phase": phase, "topic": topic,
                               "partition": partition, "offset": offset, "value": value, "t": t,
                               "generation": generation, "isolation": isolation})

    def transaction(self, *, producer: str, txn: str, transactional_id: str, intent: str,
                    status: str, error: str | None, values: list[str], t_begin: float,
                    t_end_invoke: float | None, t_complete: float,
                    offsets: dict[str, int] | None = None) -> None:
        """One transaction, when it ended (``txns.jsonl``)."""
        self._append("txns", {"producer": producer, "txn": txn,
                              "transactional_id": transactional_id, "intent": intent,
                              "status": status, "error": error, "values": values,
                              "t_begin": t_begin, "t_end_invoke": t_end_invoke,
                              "t_complete": t_complete, "offsets": offsets})

    def group(self, *, member: str, member_id: str | None, generation: int | None, type: str,
              topic: str, partition: int, t: float, offset: int | None = None,
              status: str | None = None, error: str | None = None,
              t_invoke: float | None = None) -> None:
        """One group action of a member (``groups.jsonl``)."""
        self._append("groups", {"member": member, "member_id": member_id,
                                "generation": generation, "type": type, "topic": topic,
                                "partition": partition, "offset": offset, "status": status,
                                "error": error, "t_invoke": t_invoke, "t": t})

    def fault(self, *, fault: str, target: str, role: str, action: str,
              t: float | None = None) -> None:
        self._append("faults", {"fault": fault, "target": target, "role": role,
                                "action": action, "t": time.time() if t is None else t})

    def cluster_sample(self, record: dict[str, Any]) -> None:
        self._append("cluster", record)

    def event(self, record: dict[str, Any]) -> None:
        """One node's replication event (``runner.events.to_event``)."""
        self._append("events", record)

    def write_meta(self, meta: dict[str, Any]) -> None:
        """meta.json is rewritten whole (tmp + rename): once at the start, once at the end
        (`finish`). The first write also sets aside the room the last one will use."""
        text = json.dumps(meta, indent=2, default=str)
        path = self.directory / schema.META.filename
        tmp = path.with_name(f"{path.name}.tmp")
        reserve = self.directory / RESERVE_NAME
        with self._lock:
            try:
                tmp.write_text(text, encoding="utf-8")
                tmp.replace(path)
                if not self._closed and not reserve.exists():
                    _set_aside(reserve, max(RESERVE_MIN_BYTES, 4 * len(text)))
            except OSError as exc:
                tmp.unlink(missing_ok=True)
                self._fail(path, exc)

    def finish(self, meta: dict[str, Any]) -> None:
        """Close every file, giving back the room the first meta.json set aside, and write
        the last one into it."""
        self.close()
        self.write_meta(meta)

    def close(self) -> None:
        """Close every file and give back the room set aside; later lines are dropped."""
        with self._lock:
            self._closed = True
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
            (self.directory / RESERVE_NAME).unlink(missing_ok=True)


def _write_all(fd: int, data: bytes) -> None:
    """One write; more only when the file system took part of it (it is filling up)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _truncate(fd: int, size: int) -> None:
    """Cut a file back to its last whole line after a write failed partway. If even that
    fails, the torn line stays: the analysis reports it as a malformed line."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, size)


def _set_aside(path: Path, size: int) -> None:
    """`size` bytes of disk in `path`: random bytes, written, because a sparse file, or zeros
    on a compressing file system (ZFS, btrfs), would take no room."""
    with open(path, "wb") as f:
        f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())
