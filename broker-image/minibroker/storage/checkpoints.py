"""Kafka's checkpoint files: a version line, a count line, then one entry per line.

They hold what replication must not forget across a crash (leader epochs, high watermarks),
so unlike log appends every write is durable at once: ``.tmp``, fsync, rename, fsync of the
directory. A crash leaves the old or the new file, never a mix; a stale ``.tmp`` is ignored
and overwritten by the next write.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from minibroker.fsutil import atomic_write

__all__ = [
    "LEADER_EPOCH_CHECKPOINT_FILE",
    "REPLICATION_OFFSET_CHECKPOINT_FILE",
    "CheckpointError",
    "CheckpointFile",
    "EpochEntry",
    "LeaderEpochCheckpointFile",
    "OffsetCheckpointFile",
]

LEADER_EPOCH_CHECKPOINT_FILE = "leader-epoch-checkpoint"  # in the partition directory
REPLICATION_OFFSET_CHECKPOINT_FILE = "replication-offset-checkpoint"  # in the data directory
RECOVERY_POINT_OFFSET_CHECKPOINT_FILE = "recovery-point-offset-checkpoint"  # ditto

T = TypeVar("T")


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read; the message names the file and line."""


class CheckpointFile(Generic[T]):
    """Entries of type ``T`` formatted as one line each by ``format_entry`` and parsed back
    from the line's space-separated fields by ``parse_entry`` (which raises ValueError)."""

    def __init__(self, path: Path, version: int, format_entry: Callable[[T], str],
                 parse_entry: Callable[[list[str]], T]) -> None:
        self.path = Path(path)
        self.version = version
        self._format_entry = format_entry
        self._parse_entry = parse_entry

    def write(self, entries: Sequence[T]) -> None:
        lines = [str(self.version), str(len(entries))]
        lines.extend(self._format_entry(entry) for entry in entries)
        atomic_write(self.path, ("\n".join(lines) + "\n").encode())

    def read(self) -> list[T]:
        """The entries; none when the file does not exist."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        version = self._parse_int(lines, 0, "version")
        if version != self.version:
            raise CheckpointError(
                f"{self.path}:1: unsupported checkpoint version {version} "
                f"(expected {self.version})")
        count = self._parse_int(lines, 1, "entry count")
        if count < 0 or len(lines) - 2 != count:
            raise CheckpointError(
                f"{self.path}:2: entry count {count} but the file has {len(lines) - 2} "
                "entry lines")
        entries = []
        for number, line in enumerate(lines[2:], start=3):
            try:
                entries.append(self._parse_entry(line.split(" ")))
            except ValueError as exc:
                raise CheckpointError(f"{self.path}:{number}: malformed entry {line!r}: {exc}") \
                    from None
        return entries

    def _parse_int(self, lines: list[str], index: int, what: str) -> int:
        if index >= len(lines):
            raise CheckpointError(f"{self.path}:{index + 1}: missing {what} line")
        try:
            return int(lines[index])
        except ValueError:
            raise CheckpointError(
                f"{self.path}:{index + 1}: {what} {lines[index]!r} is not an integer") from None


def _non_negative_ints(fields: list[str], names: tuple[str, ...]) -> list[int]:
    if len(fields) != len(names):
        raise ValueError(f"expected {len(names)} fields ({' '.join(names)}), got {len(fields)}")
    values = [int(field) for field in fields]
    for name, value in zip(names, values, strict=True):
        if value < 0:
            raise ValueError(f"{name} {value} is negative")
    return values


@dataclass(frozen=True, slots=True)
class EpochEntry:
    """Leader ``epoch`` wrote its first batch at ``start_offset``."""

    epoch: int
    start_offset: int


def _parse_epoch_entry(fields: list[str]) -> EpochEntry:
    epoch, start_offset = _non_negative_ints(fields, ("epoch", "start_offset"))
    return EpochEntry(epoch, start_offset)


class LeaderEpochCheckpointFile:
    """``leader-epoch-checkpoint``: ``epoch start_offset`` lines, oldest first."""

    VERSION = 0

    def __init__(self, path: Path) -> None:
        self._file = CheckpointFile(path, self.VERSION,
                                    lambda e: f"{e.epoch} {e.start_offset}", _parse_epoch_entry)

    @property
    def path(self) -> Path:
        return self._file.path

    def write(self, entries: Sequence[EpochEntry]) -> None:
        self._file.write(entries)

    def read(self) -> list[EpochEntry]:
        return self._file.read()


def _parse_offset_entry(fields: list[str]) -> tuple[tuple[str, int], int]:
    if len(fields) != 3 or not fields[0]:
        raise ValueError(f"expected 3 fields (topic partition offset), got {len(fields)}")
    partition, offset = _non_negative_ints(fields[1:], ("partition", "offset"))
    return (fields[0], partition), offset


class OffsetCheckpointFile:
    """``replication-offset-checkpoint``: ``topic partition offset`` lines (the high
    watermarks of every partition in a data directory)."""

    VERSION = 0

    def __init__(self, path: Path) -> None:
        self._file: CheckpointFile[tuple[tuple[str, int], int]] = CheckpointFile(
            path, self.VERSION, lambda e: f"{e[0][0]} {e[0][1]} {e[1]}", _parse_offset_entry)

    @property
    def path(self) -> Path:
        return self._file.path

    def write(self, offsets: Mapping[tuple[str, int], int]) -> None:
        for (topic, _), _offset in offsets.items():
            if not topic or any(c.isspace() for c in topic):
                raise ValueError(f"{self.path}: topic name {topic!r} cannot be checkpointed")
        self._file.write(sorted(offsets.items()))

    def read(self) -> dict[tuple[str, int], int]:
        entries = self._file.read()
        offsets = dict(entries)
        if len(offsets) != len(entries):
            raise CheckpointError(f"{self.path}: a topic partition appears more than once")
        return offsets

