"""The processes a pause stops or a kill ends, found by command line in the pod's shared
process namespace."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from undertow.kube.agent.errors import AgentError

STOP_TIMEOUT_S = 5.0
"""How long a stop, or a SIGKILL, may take to show in /proc."""
_DEAD = ("Z", "X", None)


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

    def kill(self, grace_s: float = 0.0) -> list[int]:
        """SIGKILL every target; return once none of them runs any more. With ``grace_s``
        above 0, SIGTERM first (and SIGCONT, so that a paused target acts on it), and
        SIGKILL only those still running ``grace_s`` seconds later: a clean shutdown, as
        the kubelet stops a container."""
        pids = self._targets()
        if grace_s > 0:
            for pid in pids:
                self._signal(pid, signal.SIGCONT)
                self._signal(pid, signal.SIGTERM)
            if self._wait(pids, _DEAD, grace_s):
                return pids
        self._signal_all(signal.SIGKILL, until=_DEAD, what="die",
                         pids=[pid for pid in pids if self.state(pid) not in _DEAD])
        return pids

    def _targets(self) -> list[int]:
        pids = self.pids()
        if not pids:
            raise AgentError(f"no process matches {self.marker!r}", 409)
        return pids

    def _signal_all(self, sig: signal.Signals, *, until: tuple[str | None, ...],
                    what: str, pids: list[int] | None = None) -> list[int]:
        """Send ``sig`` to ``pids`` (default: every target), then wait until each one's
        state is in ``until``."""
        targets = self._targets() if pids is None else pids
        for pid in targets:
            self._signal(pid, sig)
        if not self._wait(targets, until, STOP_TIMEOUT_S):
            raise AgentError(f"processes {targets} did not {what} within {STOP_TIMEOUT_S:g}s")
        return targets

    def _wait(self, pids: list[int], until: tuple[str | None, ...], timeout_s: float) -> bool:
        """Whether every one of ``pids`` reached a state in ``until`` within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while any(self.state(pid) not in until for pid in pids):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

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
