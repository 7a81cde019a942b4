"""The processes a pause stops, found by command line in the pod's shared process namespace."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from undertow.kube.agent.errors import AgentError

STOP_TIMEOUT_S = 5.0


class Processes:
    """The processes a pause targets: those whose command line contains ``marker``."""

    def __init__(self, marker: str, proc: Path = Path("/proc")) -> None:
        if not marker:
            raise ValueError("the target marker must not be empty")
        self.marker = marker
        self.proc = proc

    def pids(self) -> list[int]:
        found = []
        for entry in self.proc.iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                    errors="replace")
            except OSError:
                continue  # exited meanwhile
            if self.marker in cmdline and self.state(int(entry.name)) not in ("Z", "X", None):
                found.append(int(entry.name))
        return sorted(found)

    def state(self, pid: int) -> str | None:
        """The one-letter state of /proc/PID/stat (T: stopped), None when gone."""
        try:
            stat = (self.proc / str(pid) / "stat").read_text()
        except OSError:
            return None
        return stat.rsplit(")", 1)[1].split()[0]

    def stop(self) -> list[int]:
        """SIGSTOP every target; return once all of them are stopped."""
        return self._signal_all(signal.SIGSTOP, until=("T", "t", None), what="stop")

    def kill(self) -> list[int]:
        """SIGKILL every target; return once none of them runs any more."""
        return self._signal_all(signal.SIGKILL, until=("Z", "X", None), what="die")

    def _signal_all(self, sig: signal.Signals, *, until: tuple[str | None, ...],
                    what: str) -> list[int]:
        """Send ``sig`` to every target, then wait until each one's state is in ``until``."""
        pids = self.pids()
        if not pids:
            raise AgentError(f"no process matches {self.marker!r}", 409)
        for pid in pids:
            self._signal(pid, sig)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while any(self.state(pid) not in until for pid in pids):
            if time.monotonic() > deadline:
                raise AgentError(f"processes {pids} did not {what} within {STOP_TIMEOUT_S:g}s")
            time.sleep(0.01)
        return pids

    def resume(self) -> list[int]:
        pids = self.pids()
        for pid in pids:
            self._signal(pid, signal.SIGCONT)
        return pids

    def paused(self) -> bool:
        return any(self.state(pid) in ("T", "t") for pid in self.pids())

    @staticmethod
    def _signal(pid: int, sig: signal.Signals) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError as exc:
            raise AgentError(f"cannot send {sig.name} to {pid}: {exc} (the agent needs "
                             "CAP_KILL to signal another user's process)") from exc
