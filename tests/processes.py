"""Processes that tests start in a group of their own (`start_new_session=True`)."""

from __future__ import annotations

import os
import signal
import subprocess


def stop_group(process: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM the process's group, SIGKILL it if it has not exited within `timeout`."""
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
