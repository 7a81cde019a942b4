"""What a run left behind, read from /proc and `ip netns`: shared by the tests that check
that interrupted, crashed or finished runs leave no process or namespace behind."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from undertow.platform.procfs import proc_stat


def _processes(matches: Callable[[Path], bool]) -> list[tuple[int, str]]:
    """(pid, state) of every live process other than this one for which `matches` holds."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            matched = matches(entry)
        except OSError:  # gone, or not ours to read
            continue
        stat = proc_stat(int(entry.name))
        if matched and stat is not None and stat[0] != "Z":
            found.append((int(entry.name), stat[0]))
    return found


def living_with_mark(mark: str) -> list[tuple[int, str]]:
    """Processes whose environment carries UNDERTOW_TEST_MARK=mark (children inherit it)."""
    needle = f"UNDERTOW_TEST_MARK={mark}".encode()
    return _processes(lambda entry: needle in (entry / "environ").read_bytes().split(b"\0"))


def processes_mentioning(marker: str) -> list[tuple[int, str]]:
    """Processes whose command line mentions `marker`."""
    return _processes(lambda entry: marker.encode() in (entry / "cmdline").read_bytes())


def netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                         check=False).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def analysis_processes(mark: str) -> list[int]:
    """The marked analysis processes: `python -m undertow_analysis` and its JVM."""
    found = []
    for pid, _state in living_with_mark(mark):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"undertow_analysis" in cmdline or b"java" in cmdline:
            found.append(pid)
    return found
