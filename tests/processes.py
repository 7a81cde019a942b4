"""Processes that tests start: in a group of their own (`start_new_session=True`), and a
stand-in for a broker's SIGTERM handling (`ON_SIGTERM`)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from undertow.platform.errors import PlatformError
from undertow.platform.local import default_command


def needs_local_minibroker() -> pytest.MarkDecorator:
    """A module's ``pytestmark``: skip it, with the reason, where ``minibroker`` cannot be
    started as a local process."""
    try:
        default_command()
    except PlatformError as exc:
        return pytest.mark.skipif(True, reason=str(exc))
    return pytest.mark.skipif(False, reason="minibroker starts here")


def stop_group(process: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM the process's group, SIGKILL it if it has not exited within `timeout`."""
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


ON_SIGTERM = """\
import pathlib, signal, sys, time
record, then = pathlib.Path(sys.argv[-2]), sys.argv[-1]
def on_sigterm(*_):
    record.write_text(record.read_text() + "sigterm\\n")
    if then == "exit":
        sys.exit(0)
signal.signal(signal.SIGTERM, on_sigterm)
record.write_text("ready\\n")
while True:
    time.sleep(0.05)
"""
"""``python -c`` code standing in for a broker's SIGTERM handling. Its last two arguments:
a file, where it writes ``ready`` once its handler is in place and then a ``sigterm``
line for each SIGTERM; and ``exit`` (it then exits with status 0: a clean shutdown) or
``stay`` (it goes on running, until a SIGKILL)."""


def sigterm_lines(record: Path) -> list[str]:
    """What an ``ON_SIGTERM`` process wrote to its file (nothing yet: [])."""
    try:
        return record.read_text().split()
    except FileNotFoundError:
        return []
