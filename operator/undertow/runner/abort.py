"""The run's one failure path: the first failure of any of its threads stops the run.

A run has many threads (producers and consumers, the cluster sampler, the nemesis, fault
time limits, the platform's own) and one main loop. A thread that fails must not die on its
own with a traceback while the run goes on without it (issue 22: producers and the sampler
died one by one on a full disk and the run carried on for 89 s). Instead each failure is
handed to the run's `Abort`: the first one is kept, later ones are consequences of it and are
dropped, and the main loop, which polls it, stops the workload and the nemesis, heals, and
raises the kept failure as the run's one error.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("undertow.abort")


class RunAborted(Exception):
    """Why a run stopped early; its text is the one line the user reads."""


class HistoryWriteError(RunAborted):
    """A history file could not be written: the history would be silently incomplete from
    here on, so the run stops."""

    def __init__(self, path: Path, error: OSError) -> None:
        # "[Errno 28] No space left on device", without the file name an OSError may carry:
        # the path is named once, here.
        reason = f"[Errno {error.errno}] {error.strerror}" if error.strerror else str(error)
        super().__init__(f"history: could not write {path}: {reason}")


class WorkerFailed(RunAborted):
    """A thread of the run raised where nothing could catch it."""

    def __init__(self, worker: str, error: BaseException) -> None:
        super().__init__(f"{worker} failed: {type(error).__name__}: {error}")


class Abort:
    """Set once, by the first failure; thread-safe. The runner owns one per run and waits on
    it where it would otherwise sleep."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._event = threading.Event()
        self.reason: RunAborted | None = None

    def fail(self, reason: RunAborted) -> None:
        """Record `reason` if it is the run's first failure; later ones are dropped."""
        with self._lock:
            if self.reason is not None:
                log.debug("after the run was aborted: %s", reason)
                return
            self.reason = reason
        log.debug("run aborted: %s", reason)
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        """Sleep up to `timeout` seconds; True as soon as (or if) the run is aborted."""
        return self._event.wait(timeout)

    def raise_if_set(self) -> None:
        if self.reason is not None:
            raise self.reason

    @contextmanager
    def catching_thread_exceptions(self) -> Iterator[None]:
        """While the run goes on, an exception that ends any thread aborts it instead of
        printing a traceback (the traceback is logged at DEBUG)."""
        previous = threading.excepthook

        def hook(args: threading.ExceptHookArgs) -> None:
            if args.exc_type is SystemExit or args.exc_value is None:
                return
            name = args.thread.name if args.thread is not None else "a thread"
            log.debug("%s failed", name,
                      exc_info=(args.exc_type, args.exc_value, args.exc_traceback))
            self.fail(WorkerFailed(name, args.exc_value))

        threading.excepthook = hook
        try:
            yield
        finally:
            threading.excepthook = previous
