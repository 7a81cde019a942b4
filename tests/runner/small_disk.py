"""A small real file system for tests of what a full disk does: a tmpfs of a given size,
mounted for the test (root only; the test is skipped, with the reason, where mount fails),
and a filler that takes every byte left on it."""

from __future__ import annotations

import errno
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CHUNK = 1 << 20


@contextmanager
def mounted_tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (as mount's size= takes it, e.g. "32m") on `mount`, unmounted after."""
    mount.mkdir(parents=True, exist_ok=True)
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield mount
    finally:
        # Lazily, should a process the test failed to stop still hold a file there.
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(path: Path) -> float:
    """Write `path` until the file system is full; return the time.monotonic() at which not
    one more byte fit (unbuffered: write(2) takes what fits, and fails with ENOSPC only when
    nothing does)."""
    chunk = bytes(CHUNK)
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                f.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                return time.monotonic()
