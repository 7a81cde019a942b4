"""The fault protocol: inject, recover, describe, and a time limit after which it heals.

A fault is injected once. ``inject()`` returns when the fault has taken effect;
``recover()`` undoes it, is idempotent, and is safe after a failed inject (it undoes
whatever part took effect). The time limit arms a timer at injection that recovers the
fault on its own, so a fault whose recover the runner never reaches still ends. The
listener hears ``inject`` and ``recover`` in that order, exactly once each, whoever
recovered: the runner writes its ``faults.jsonl`` lines from it.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar, Literal

from undertow.platform.base import Platform

log = logging.getLogger("undertow.faults")

Listener = Callable[["Fault", Literal["inject", "recover"]], None]
State = Literal["pending", "injected", "failed", "recovered"]


class FaultError(ValueError):
    """A fault was asked for with bad arguments, or used out of order."""


class Fault(ABC):
    """One fault on one target, with a symmetric inject/recover pair."""

    kind: ClassVar[str]

    def __init__(self, platform: Platform, target: str, *, time_limit_s: float,
                 listener: Listener | None = None) -> None:
        if not time_limit_s > 0:
            raise FaultError(f"{self.kind} {target}: time limit must be positive, "
                             f"got {time_limit_s!r}")
        self.platform = platform
        self.target = target
        self.time_limit_s = time_limit_s
        self.injected_at: float | None = None
        self.recovered_at: float | None = None
        self.expiry_error: BaseException | None = None
        self._listener = listener
        self._state: State = "pending"
        self._timer: threading.Timer | None = None
        self._lock = threading.RLock()

    @property
    def state(self) -> State:
        return self._state

    def describe(self) -> dict[str, str]:
        """The ``{"fault", "target"}`` part of a ``faults.jsonl`` line."""
        return {"fault": self.kind, "target": self.target}

    def inject(self) -> None:
        """Apply the fault; return once it has taken effect."""
        with self._lock:
            if self._state != "pending":
                raise FaultError(f"{self}: already {self._state}; a fault is injected once")
            try:
                self._inject()
            except BaseException:
                self._state = "failed"
                raise
            self._state = "injected"
            self.injected_at = time.time()
            self._timer = threading.Timer(self.time_limit_s, self._expire)
            self._timer.name = f"fault-limit {self}"
            self._timer.daemon = True
            self._timer.start()
            self._notify("inject")

    def recover(self) -> bool:
        """Undo the fault; True when this call did, False when there was nothing to undo.

        On an error the fault stays injected (or failed) so that a later call can retry.
        """
        with self._lock:
            if self._state in ("pending", "recovered"):
                return False
            if self._timer is not None:
                self._timer.cancel()
            self._recover()
            was_injected = self._state == "injected"
            self._state = "recovered"
            self.recovered_at = time.time()
            if was_injected:
                self._notify("recover")
            return True

    def _expire(self) -> None:
        try:
            self.recover()
        except Exception as exc:
            self.expiry_error = exc
            log.exception("%s: recovery at the end of its %gs time limit failed", self,
                          self.time_limit_s)

    def _notify(self, action: Literal["inject", "recover"]) -> None:
        if self._listener is not None:
            self._listener(self, action)

    @abstractmethod
    def _inject(self) -> None:
        """Make the fault take effect (the platform call returns once it has)."""

    @abstractmethod
    def _recover(self) -> None:
        """Undo the fault; must be a no-op for any part that is not in effect."""

    def __str__(self) -> str:
        return f"{self.kind} {self.target}"
