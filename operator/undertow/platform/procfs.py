"""What /proc says about a pid: whether it still runs, and whether it is still the process
that was recorded.

Its own module because both sides of the guardian's pipe need it: the runner's child
processes (`process.py`) to see a pause take effect and to record a child's start time, and
the guardian (`guardian.py`) to tell a recorded process group from a reused pid before it
kills. The guardian must not import the runner's process code, which imports it for typing.
"""

from __future__ import annotations

from pathlib import Path


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) from /proc, or None when there is no such pid."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return fields[0], int(fields[19])


def alive(pid: int) -> bool:
    """The pid exists and has not exited (a zombie only waits for its parent to reap it)."""
    stat = proc_stat(pid)
    return stat is not None and stat[0] != "Z"
