"""The broker process a pause stops or a kill ends: the one its launcher recorded.

The pod shares one process namespace, so everything in it is visible to the agent: the
broker, the agent itself, the pause container, and whatever someone runs with
``kubectl exec`` (a ``grep minibroker`` while debugging). A command line says nothing
about which of them is the broker, so the agent signals exactly one process: the one
whose pid the broker container's launcher writes, as ``PID START``, into a file on a
volume both containers mount (``cluster_objects._LAUNCHER``), just before it execs the
broker in its own place.

A pid outlives its process: after the broker died and before its launcher wrote the next
one, the file names a pid the kernel may have given to something else. So a recorded
process is the target only while /proc shows it with the recorded start time (clock
ticks since boot, which no later process with that pid can share) and ``marker`` in its
command line; and it is signalled through a pidfd whose process is checked again once the
pidfd is open, so that no other process can take its place between the check and the
signal.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from undertow.kube.agent.errors import AgentError
from undertow.platform.procfs import proc_stat

STOP_TIMEOUT_S = 5.0
"""How long a stop, or a SIGKILL, may take to show in /proc."""
_DEAD = ("Z", "X", None)


@dataclass(frozen=True)
class Recorded:
    """A process as its launcher recorded it: its pid and its start time in /proc."""

    pid: int
    start_ticks: int


class Processes:
    """The broker, found through ``pid_file`` and checked against /proc and ``marker``."""

    def __init__(self, marker: str, pid_file: Path) -> None:
        if not marker:
            raise ValueError("the target marker must not be empty")
        self.marker = marker
        self.pid_file = pid_file

    def pids(self) -> list[int]:
        """The broker's pid, or nothing when it is not running (or not recorded yet)."""
        target, _ = self._target()
        return [] if target is None else [target.pid]

    def _target(self) -> tuple[Recorded | None, str]:
        """The recorded broker if it still runs, else None and why not."""
        try:
            pid, start = (int(field) for field in self.pid_file.read_text().split())
        except FileNotFoundError:
            return None, f"{self.pid_file} does not exist (the broker has not started)"
        except (OSError, ValueError):
            return None, f"{self.pid_file} does not hold 'PID START'"
        if pid <= 1 or pid == os.getpid():
            return None, f"{self.pid_file} names pid {pid}, which is not the broker"
        stat = proc_stat(pid)
        if stat is None or stat[0] in _DEAD:
            return None, f"pid {pid} from {self.pid_file} has exited"
        if stat[1] != start:
            return None, (f"pid {pid} from {self.pid_file} started at tick {stat[1]}, not "
                          f"{start}: the broker exited and its pid was reused")
        if self.marker not in self._cmdline(pid):
            return None, f"pid {pid} from {self.pid_file} does not run {self.marker!r}"
        return Recorded(pid, start), ""

    @staticmethod
    def _cmdline(pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace")
        except OSError:
            return ""

    def stop(self) -> list[int]:
        """SIGSTOP the broker; return once it is stopped."""
        target = self._require()
        self._signal(target, signal.SIGSTOP)
        self._await(target, ("T", "t", None), "stop", STOP_TIMEOUT_S)
        return [target.pid]

    def kill(self, grace_s: float = 0.0) -> list[int]:
        """SIGKILL the broker; return once it no longer runs. With ``grace_s`` above 0,
        SIGTERM first (and SIGCONT, so that a paused broker acts on it), and SIGKILL only
        if it still runs ``grace_s`` seconds later: a clean shutdown, as the kubelet stops
        a container."""
        target = self._require()
        if grace_s > 0:
            self._signal(target, signal.SIGCONT)
            self._signal(target, signal.SIGTERM)
            if self._wait(target, _DEAD, grace_s):
                return [target.pid]
        self._signal(target, signal.SIGKILL)
        self._await(target, _DEAD, "die", STOP_TIMEOUT_S)
        return [target.pid]

    def resume(self) -> list[int]:
        target, _ = self._target()
        if target is None:
            return []
        self._signal(target, signal.SIGCONT)
        return [target.pid]

    def paused(self) -> bool:
        target, _ = self._target()
        stat = proc_stat(target.pid) if target is not None else None
        return stat is not None and stat[0] in ("T", "t")

    def _require(self) -> Recorded:
        target, why = self._target()
        if target is None:
            raise AgentError(f"no process matches {self.marker!r}: {why}", 409)
        return target

    def _await(self, target: Recorded, until: tuple[str | None, ...], what: str,
               timeout_s: float) -> None:
        if not self._wait(target, until, timeout_s):
            raise AgentError(f"process {target.pid} did not {what} within {timeout_s:g}s")

    def _wait(self, target: Recorded, until: tuple[str | None, ...], timeout_s: float) -> bool:
        """Whether the target reached a state in ``until`` (None: gone) within
        ``timeout_s``; a pid now started at another time counts as gone."""
        deadline = time.monotonic() + timeout_s
        while True:
            stat = proc_stat(target.pid)
            state = None if stat is None or stat[1] != target.start_ticks else stat[0]
            if state in until:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)

    @staticmethod
    def _signal(target: Recorded, sig: signal.Signals) -> None:
        """``sig`` to ``target`` and to no other process, even one that took its pid."""
        try:
            pidfd = os.pidfd_open(target.pid)
        except ProcessLookupError:
            return  # gone already
        except OSError as exc:
            if exc.errno != errno.ENOSYS:
                raise AgentError(f"cannot open pid {target.pid}: {exc}") from exc
            pidfd = None  # a kernel before 5.3: the check and the kill are a moment apart
        try:
            stat = proc_stat(target.pid)
            if stat is None or stat[1] != target.start_ticks:
                return  # exited, and the pid was reused, since the look at /proc
            if pidfd is None:
                os.kill(target.pid, sig)
            else:
                signal.pidfd_send_signal(pidfd, sig)
        except ProcessLookupError:
            pass
        except PermissionError as exc:
            raise AgentError(f"cannot send {sig.name} to {target.pid}: {exc} (the agent "
                             "needs CAP_KILL to signal another user's process)") from exc
        finally:
            if pidfd is not None:
                os.close(pidfd)
