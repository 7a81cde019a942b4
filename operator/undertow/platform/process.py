"""Supervised child processes that cannot outlive the runner.

Each child runs in its own session and process group (a Ctrl-C at the terminal reaches the
runner only, which then heals and stops the cluster in order) and carries
PR_SET_PDEATHSIG=SIGKILL, so the kernel kills it when the runner dies for any reason. A
tiny launcher sets that flag (and enters the node's network namespace) and then execs
the real command: ``preexec_fn`` is not safe in a process that has threads.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from undertow.platform.base import PlatformError, wait_for
from undertow.platform.procfs import proc_stat

if TYPE_CHECKING:
    from undertow.platform.guardian import Guardian

_PR_SET_PDEATHSIG = 1
_CLONE_NEWNET = 0x40000000

# argv: runner pid, exec-report fd, network namespace ("" for none), command...
# The report fd is close-on-exec: the runner reads EOF once the command replaced the
# launcher, or the reason it could not.
_LAUNCHER = f"""
import ctypes, os, sys
report = int(sys.argv[2])
try:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl({_PR_SET_PDEATHSIG}, {int(signal.SIGKILL)}) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != int(sys.argv[1]):
        os._exit(70)  # the runner died before the flag was set
    if sys.argv[3]:
        fd = os.open("/run/netns/" + sys.argv[3], os.O_RDONLY)
        if libc.setns(fd, {_CLONE_NEWNET}) != 0:
            raise OSError(ctypes.get_errno(), "setns " + sys.argv[3])
        os.close(fd)
    os.set_inheritable(report, False)
    os.execvp(sys.argv[4], sys.argv[4:])
except OSError as exc:
    os.write(report, str(exc).encode())
    os._exit(71)
"""


class Spawner:
    """Forks every child from one long-lived thread.

    The kernel sends the parent-death signal when the *thread* that forked the child ends,
    not the process: a broker restarted from a fault's timer thread would otherwise be
    killed as soon as that timer thread finished.
    """

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="undertow-spawner")

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        return self._executor.submit(subprocess.Popen, list(argv), **kwargs).result()

    def close(self) -> None:
        self._executor.shutdown(wait=True)


class ChildProcess:
    """One node's process: start, kill, pause, resume, restart with the same command."""

    def __init__(self, name: str, argv: Sequence[str], *, log_path: Path, spawner: Spawner,
                 guardian: Guardian | None = None, env: Mapping[str, str] | None = None,
                 netns: str | None = None, pipes: bool = False) -> None:
        """``pipes``: the process's stdin and stdout are pipes to the runner (``stdin``,
        ``stdout``), its stderr alone goes to the log: a workload client's own process
        reports on its stdout and stops when its stdin closes."""
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.netns = netns
        self._pipes = pipes
        self._env = dict(env) if env is not None else None
        self._spawner = spawner
        self._guardian = guardian
        self._popen: subprocess.Popen | None = None
        self._tracked_pid: int | None = None
        self._lock = threading.RLock()

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    @property
    def stdin(self) -> IO[bytes]:
        """The pipe to the process's stdin (``pipes`` only)."""
        assert self._popen is not None and self._popen.stdin is not None, "started with pipes"
        return self._popen.stdin

    @property
    def stdout(self) -> IO[bytes]:
        """The pipe from the process's stdout (``pipes`` only)."""
        assert self._popen is not None and self._popen.stdout is not None, "started with pipes"
        return self._popen.stdout

    @property
    def running(self) -> bool:
        with self._lock:
            return self._popen is not None and self._popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode if self._popen is not None else None

    @property
    def paused(self) -> bool:
        stat = proc_stat(self._popen.pid) if self.running and self._popen else None
        return stat is not None and stat[0] in ("T", "t")

    def start(self) -> None:
        with self._lock:
            if self.running:
                raise PlatformError(f"{self.name} is already running (pid {self.pid})")
            self._forget()
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "ab") as log:
                log.write(f"=== {time.strftime('%H:%M:%S')} start: {' '.join(self.argv)}\n"
                          .encode())
                log.flush()
                report_r, report_w = os.pipe()
                try:
                    streams: dict[str, Any] = (
                        {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": log}
                        if self._pipes else
                        {"stdin": subprocess.DEVNULL, "stdout": log, "stderr": subprocess.STDOUT})
                    self._popen = self._spawner.popen(
                        [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(os.getpid()),
                         str(report_w), self.netns or "", *self.argv],
                        env=self._env, start_new_session=True, pass_fds=(report_w,), **streams)
                finally:
                    os.close(report_w)
                with os.fdopen(report_r, "rb") as report:
                    failure = report.read()
            if failure:
                self._popen.wait()
                raise PlatformError(f"{self.name}: cannot start {self.argv[0]}: "
                                    f"{failure.decode(errors='replace')}")
            if self._guardian is not None:
                stat = proc_stat(self._popen.pid)
                self._guardian.track("process", self._popen.pid, stat[1] if stat else None)
                self._tracked_pid = self._popen.pid

    def kill(self) -> None:
        """SIGKILL the whole process group and reap it."""
        with self._lock:
            if self.running:
                self._signal(signal.SIGKILL)
            if self._popen is not None:
                self._popen.wait()
            self._forget()

    def terminate(self, grace_s: float) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``; reaps in both cases."""
        with self._lock:
            if self.running:
                self._signal(signal.SIGCONT)
                self._signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._popen.wait(grace_s)
            self.kill()

    def pause(self, timeout: float = 5.0) -> None:
        with self._lock:
            if not self.running:
                raise PlatformError(f"cannot pause {self.name}: it is not running")
            self._signal(signal.SIGSTOP)
        wait_for(lambda: self.paused or not self.running, timeout, f"{self.name} to stop")
        if not self.running:
            raise PlatformError(f"{self.name} exited while being paused")

    def resume(self, timeout: float = 5.0) -> None:
        with self._lock:
            if not self.running:
                return
            self._signal(signal.SIGCONT)
        wait_for(lambda: not self.paused, timeout, f"{self.name} to continue")

    def wait_exit(self, timeout: float) -> int:
        """Wait for the process to exit on its own and reap it; return its exit status."""
        if self._popen is None:
            raise PlatformError(f"{self.name} was never started")
        try:
            code = self._popen.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise PlatformError(f"{self.name} (pid {self.pid}) did not exit within "
                                f"{timeout:g}s") from exc
        with self._lock:
            self._forget()
        return code

    def send(self, sig: signal.Signals) -> None:
        """Signal the process group if the process is running."""
        with self._lock:
            if self.running:
                self._signal(sig)

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._popen.pid, sig)

    def _forget(self) -> None:
        """Tell the guardian about a reaped child, so it never signals a reused pid."""
        if (self._guardian is not None and self._tracked_pid is not None
                and self._popen is not None and self._popen.returncode is not None):
            self._guardian.forget("process", self._tracked_pid)
            self._tracked_pid = None
