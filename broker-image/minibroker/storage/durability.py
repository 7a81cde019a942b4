"""The storage device as the log sees it, emulated in-process: what a power loss does to the
log files (LazyFS's clear-cache), and a full disk.

A killed process loses nothing that it wrote: the page cache survives. A power loss also
drops every byte that was never fsynced. The log reports each fsync here (``mark_durable``),
and ``simulate_power_loss`` cuts every file back to its last durable size just before the
broker exits, so that a restart sees what a machine would see after losing power. Metadata
operations (create, truncate, delete) are modelled as surviving, as a journaling file system
commits them; a file that was never fsynced comes back empty.

A full disk (``out_of_space``) makes every log append and fsync fail with ENOSPC, as a file
system with no free blocks does; what the broker does about it is Kafka's log directory
failure handling (``cluster/log_dir_failure.py``).
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

__all__ = ["DurabilityTracker"]

log = logging.getLogger("minibroker.log")


class DurabilityTracker:
    """The durable size of every file the log appends to."""

    def __init__(self) -> None:
        self._durable: dict[Path, int] = {}
        self.fsync_count = 0
        self.out_of_space = False

    def check_space(self, path: Path) -> None:
        """Before an append or fsync of ``path``: a full disk refuses it."""
        if self.out_of_space:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    def register(self, path: Path) -> None:
        """A file was created (or opened for appending) and nothing of it is durable yet."""
        self._durable.setdefault(path, 0)

    def mark_durable(self, path: Path, size: int) -> None:
        """``path`` was fsynced when it was ``size`` bytes long."""
        self._durable[path] = size
        self.fsync_count += 1

    def assume_durable(self, path: Path, size: int) -> None:
        """An earlier process fsynced ``path`` up to ``size`` (a recovery point says so);
        not an fsync of this one."""
        self._durable[path] = max(self._durable.get(path, 0), size)

    def on_truncate(self, path: Path, size: int) -> None:
        """The file was cut to ``size``: bytes past it cannot come back."""
        if path in self._durable:
            self._durable[path] = min(self._durable[path], size)

    def forget(self, path: Path) -> None:
        """The file was deleted."""
        self._durable.pop(path, None)

    def durable_size(self, path: Path) -> int | None:
        return self._durable.get(path)

    def simulate_power_loss(self) -> dict[Path, int]:
        """Cut every tracked file to its durable size; returns the bytes lost per file.

        The caller must exit right after (``os._exit``): the open handles still point at the
        cut files, and a further write would recreate data a real power loss destroyed.
        """
        lost: dict[Path, int] = {}
        for path, durable in self._durable.items():
            try:
                size = os.path.getsize(path)
            except FileNotFoundError:
                continue
            if size > durable:
                os.truncate(path, durable)
                lost[path] = size - durable
        log.warning("power loss: dropped %d unsynced bytes in %d of %d files",
                    sum(lost.values()), len(lost), len(self._durable))
        return lost
