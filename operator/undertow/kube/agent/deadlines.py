"""When each fault the agent applied must be healed, and the thread that heals it then.

The deadline is the agent's promise that no fault outlives its experiment: it holds even
when the runner and the operator are gone, and nobody needs to ask.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("undertow.agent")

RETRY_MIN_S = 0.1
RETRY_MAX_S = 2.0
"""A heal that failed at its deadline is tried again after RETRY_MIN_S, then twice as long
after each failure, at most RETRY_MAX_S apart: soon after a passing hiccup, without a
tight loop of failures (and of their log lines) while one lasts."""


@dataclass
class Fault:
    kind: str
    """``pause``, ``kill``, ``hold``, ``drop`` or ``delay``."""
    key: str
    """``pause``, ``kill`` or ``input/10.0.0.5``: one fault per key, a new one replaces the
    old."""
    deadline: float
    """``time.monotonic()`` at which the agent heals it."""
    failures: int = 0
    """Heals of it that failed: how long to back off before the next."""

    def to_json(self, now: float) -> dict[str, Any]:
        return {"kind": self.kind, "key": self.key,
                "expires_in_s": round(max(0.0, self.deadline - now), 3)}


class Deadlines:
    """The faults in place, each with its deadline; a thread hands each to ``heal`` once
    its deadline passes, and again, backing off, for as long as ``heal`` raises anything.

    The thread must outlive every failure: it is the only thing that heals a fault whose
    runner and operator are gone, so an error it did not foresee (an ``OSError`` from
    /proc, a missing binary, a bug) is logged and retried, never allowed to end it.

    ``lock`` is the caller's too: it applies a fault and adds its deadline under it, and
    ``heal`` runs under it, so a deadline that passes as a new fault of the same key is
    applied cannot heal the new one (an old pause's deadline resuming a fresh pause).
    """

    def __init__(self, heal: Callable[[Fault], None]) -> None:
        self.lock = threading.Condition()
        self._heal = heal
        self._faults: dict[str, Fault] = {}
        self._closed = False
        self._reaper = threading.Thread(target=self._reap, name="fault-deadlines", daemon=True)

    def start(self) -> None:
        self._reaper.start()

    def close(self) -> None:
        with self.lock:
            self._closed = True
            self.lock.notify_all()
        if self._reaper.is_alive():
            self._reaper.join()

    def add(self, kind: str, key: str, duration_s: float) -> None:
        """Heal ``key`` in ``duration_s``, replacing its earlier deadline."""
        with self.lock:
            self._faults[key] = Fault(kind, key, time.monotonic() + duration_s)
            self.lock.notify_all()

    def discard(self, key: str) -> None:
        """``key`` was healed on request: nothing to do at its deadline."""
        with self.lock:
            self._faults.pop(key, None)

    def discard_kind(self, kind: str) -> None:
        """Every fault of ``kind`` was healed on request."""
        with self.lock:
            for key in [key for key, fault in self._faults.items() if fault.kind == kind]:
                del self._faults[key]

    def clear(self) -> None:
        with self.lock:
            self._faults.clear()

    def to_json(self) -> list[dict[str, Any]]:
        with self.lock:
            now = time.monotonic()
            return [fault.to_json(now) for fault in self._faults.values()]

    def _reap(self) -> None:
        with self.lock:
            while not self._closed:
                now = time.monotonic()
                for fault in [f for f in self._faults.values() if f.deadline <= now]:
                    self._expire(fault)
                upcoming = [f.deadline for f in self._faults.values()]
                self.lock.wait(timeout=min(upcoming) - now if upcoming else None)

    def _expire(self, fault: Fault) -> None:
        try:
            self._heal(fault)
        except Exception:
            # Whatever failed, try again shortly rather than leave the fault in place.
            backoff = min(RETRY_MAX_S, RETRY_MIN_S * 2 ** min(fault.failures, 8))
            fault.failures += 1
            fault.deadline = time.monotonic() + backoff
            log.exception("healing %s at its deadline failed (%d times); retrying in %.1fs",
                          fault.key, fault.failures, backoff)
            return
        self._faults.pop(fault.key, None)
        log.info("%s healed at its deadline", fault.key)
