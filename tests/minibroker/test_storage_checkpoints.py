"""Kafka checkpoint files: format, atomic replacement and clear errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from minibroker.storage.checkpoints import (
    LEADER_EPOCH_CHECKPOINT_FILE,
    REPLICATION_OFFSET_CHECKPOINT_FILE,
    CheckpointError,
    EpochEntry,
    LeaderEpochCheckpointFile,
    OffsetCheckpointFile,
)


def test_leader_epoch_checkpoint_round_trip_in_kafka_format(tmp_path: Path) -> None:
    checkpoint = LeaderEpochCheckpointFile(tmp_path / LEADER_EPOCH_CHECKPOINT_FILE)
    entries = [EpochEntry(0, 0), EpochEntry(1, 5000), EpochEntry(2, 10500)]

    checkpoint.write(entries)

    assert checkpoint.path.read_text() == "0\n3\n0 0\n1 5000\n2 10500\n"
    assert LeaderEpochCheckpointFile(checkpoint.path).read() == entries
    checkpoint.write([])
    assert checkpoint.path.read_text() == "0\n0\n"
    assert checkpoint.read() == []


def test_offset_checkpoint_round_trip_in_kafka_format(tmp_path: Path) -> None:
    checkpoint = OffsetCheckpointFile(tmp_path / REPLICATION_OFFSET_CHECKPOINT_FILE)
    offsets = {("orders", 1): 17, ("orders", 0): 42, ("audit-log", 3): 0}

    checkpoint.write(offsets)

    assert checkpoint.path.read_text() == "0\n3\naudit-log 3 0\norders 0 42\norders 1 17\n"
    assert OffsetCheckpointFile(checkpoint.path).read() == offsets


def test_missing_file_reads_as_empty(tmp_path: Path) -> None:
    assert LeaderEpochCheckpointFile(tmp_path / "absent").read() == []
    assert OffsetCheckpointFile(tmp_path / "absent").read() == {}


def test_write_replaces_the_file_atomically(tmp_path: Path) -> None:
    path = tmp_path / LEADER_EPOCH_CHECKPOINT_FILE
    checkpoint = LeaderEpochCheckpointFile(path)
    checkpoint.write([EpochEntry(0, 0)])
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("half-written garbage from a crash")

    assert checkpoint.read() == [EpochEntry(0, 0)]  # a stale .tmp is never read
    with open(path) as before:
        checkpoint.write([EpochEntry(0, 0), EpochEntry(4, 9)])
        assert before.read() == "0\n1\n0 0\n"  # the old file was replaced, not rewritten
    assert checkpoint.read() == [EpochEntry(0, 0), EpochEntry(4, 9)]
    assert not tmp.exists()


@pytest.mark.parametrize(("content", "message"), [
    ("", ":1: missing version line"),
    ("1\n0\n", ":1: unsupported checkpoint version 1 (expected 0)"),
    ("zero\n0\n", ":1: version 'zero' is not an integer"),
    ("0\n", ":2: missing entry count line"),
    ("0\n2\n0 0\n", ":2: entry count 2 but the file has 1 entry lines"),
    ("0\n1\n0 0\n1 5\n", ":2: entry count 1 but the file has 2 entry lines"),
    ("0\n2\n0 0\n1 x\n", ":4: malformed entry '1 x'"),
    ("0\n1\n0 0 0\n", ":3: malformed entry '0 0 0': expected 2 fields"),
    ("0\n1\n-1 0\n", ":3: malformed entry '-1 0': epoch -1 is negative"),
])
def test_malformed_leader_epoch_checkpoint_names_file_and_line(
        tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / LEADER_EPOCH_CHECKPOINT_FILE
    path.write_text(content)
    with pytest.raises(CheckpointError) as excinfo:
        LeaderEpochCheckpointFile(path).read()
    assert str(excinfo.value).startswith(str(path))
    assert message in str(excinfo.value)


@pytest.mark.parametrize(("content", "message"), [
    ("0\n1\norders 0\n", ":3: malformed entry 'orders 0': expected 3 fields"),
    ("0\n1\norders zero 5\n", ":3: malformed entry 'orders zero 5'"),
    ("0\n2\norders 0 5\norders 0 6\n", "appears more than once"),
])
def test_malformed_offset_checkpoint_names_file_and_line(
        tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / REPLICATION_OFFSET_CHECKPOINT_FILE
    path.write_text(content)
    with pytest.raises(CheckpointError, match=re.escape(str(path))) as excinfo:
        OffsetCheckpointFile(path).read()
    assert message in str(excinfo.value)


def test_topic_names_with_spaces_are_refused(tmp_path: Path) -> None:
    checkpoint = OffsetCheckpointFile(tmp_path / REPLICATION_OFFSET_CHECKPOINT_FILE)
    with pytest.raises(ValueError, match="topic name 'bad topic'"):
        checkpoint.write({("bad topic", 0): 1})
    assert not checkpoint.path.exists()
