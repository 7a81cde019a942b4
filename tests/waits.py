"""Bounded waits on a system's own state, shared by the tests of real processes."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path


def wait_for(condition: Callable[[], object], timeout: float, what: str,
             log: Path | None = None) -> None:
    """Poll `condition` until it holds; an ``OSError`` it raises (a server not up yet, or
    gone) counts as not yet. ``AssertionError`` naming `what` after `timeout` seconds, with
    the end of `log` (a cluster's output) when given."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except OSError:
            pass
        time.sleep(0.1)
    tail = "" if log is None else "\n" + log.read_text(errors="replace")[-4000:]
    raise AssertionError(f"timed out after {timeout} s waiting for {what}{tail}")
