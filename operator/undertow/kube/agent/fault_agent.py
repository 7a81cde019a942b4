"""Faults with deadlines: applied through the two mechanisms, healed when their time is up."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from undertow.kube.agent.errors import AgentError
from undertow.kube.agent.hold import Hold
from undertow.kube.agent.netfilter import Netfilter
from undertow.kube.agent.processes import Processes

log = logging.getLogger("undertow.agent")


@dataclass
class Fault:
    kind: str
    """``pause``, ``kill`` or ``drop``."""
    key: str
    """``pause``, ``kill`` or ``input/10.0.0.5``: one fault per key, a new one replaces the
    old."""
    deadline: float
    """``time.monotonic()`` at which the agent heals it."""

    def to_json(self, now: float) -> dict[str, Any]:
        return {"kind": self.kind, "key": self.key,
                "expires_in_s": round(max(0.0, self.deadline - now), 3)}


class FaultAgent:
    """Applies faults, remembers their deadlines and heals each one when its time is up."""

    def __init__(self, netfilter: Netfilter, processes: Processes, hold: Hold | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.netfilter = netfilter
        self.processes = processes
        self.hold = hold or Hold(None)
        self._clock = clock
        self._faults: dict[str, Fault] = {}
        self._lock = threading.Condition()
        self._closed = False
        self._reaper = threading.Thread(target=self._reap, name="fault-deadlines", daemon=True)

    def start(self) -> None:
        """Heal what a previous agent may have left (its deadlines died with it), then run."""
        self.netfilter.setup()
        self.processes.resume()
        self.hold.clear()
        self._reaper.start()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        if self._reaper.is_alive():
            self._reaper.join()

    # ---- faults ---------------------------------------------------------------------------

    def pause(self, deadline_s: float) -> list[int]:
        with self._lock:
            pids = self.processes.stop()
            self._remember(Fault("pause", "pause", self._clock() + deadline_s))
            log.info("paused %s for at most %.1fs", pids, deadline_s)
            return pids

    def resume(self) -> list[int]:
        with self._lock:
            self._faults.pop("pause", None)
            return self.processes.resume()

    def kill(self, deadline_s: float) -> list[int]:
        """SIGKILL the target in place; its restart waits (``Hold``) until ``release`` or
        the deadline, whichever comes first."""
        with self._lock:
            self.hold.set(deadline_s)
            try:
                pids = self.processes.kill()
            except AgentError:
                self.hold.clear()
                raise
            self._remember(Fault("kill", "kill", self._clock() + deadline_s))
            log.info("killed %s; held down for at most %.1fs", pids, deadline_s)
            return pids

    def release(self) -> None:
        """Let a killed target start again."""
        with self._lock:
            self._faults.pop("kill", None)
            self.hold.clear()

    def drop(self, direction: str, peer: str, deadline_s: float) -> None:
        with self._lock:
            self.netfilter.drop(direction, peer)
            self._remember(Fault("drop", f"{direction}/{peer}", self._clock() + deadline_s))
            log.info("dropping %s %s for at most %.1fs", direction, peer, deadline_s)

    def undrop(self, direction: str, peer: str) -> None:
        with self._lock:
            self.netfilter.undrop(direction, peer)
            self._faults.pop(f"{direction}/{peer}", None)

    def heal(self) -> None:
        """Remove every rule and resume every target, whatever the agent remembers."""
        with self._lock:
            self.netfilter.flush()
            self.processes.resume()
            self.hold.clear()
            self._faults.clear()

    def faults(self) -> dict[str, Any]:
        with self._lock:
            now = self._clock()
            return {"faults": [f.to_json(now) for f in self._faults.values()],
                    "paused": self.processes.paused(),
                    "running": bool(self.processes.pids())}

    # ---- deadlines ------------------------------------------------------------------------

    def _remember(self, fault: Fault) -> None:
        self._faults[fault.key] = fault
        self._lock.notify_all()

    def _reap(self) -> None:
        with self._lock:
            while not self._closed:
                now = self._clock()
                for fault in [f for f in self._faults.values() if f.deadline <= now]:
                    self._expire(fault)
                upcoming = [f.deadline for f in self._faults.values()]
                self._lock.wait(timeout=min(upcoming) - now if upcoming else None)

    def _expire(self, fault: Fault) -> None:
        try:
            if fault.kind == "pause":
                self.processes.resume()
            elif fault.kind == "kill":
                self.hold.clear()
            else:
                direction, peer = fault.key.split("/", 1)
                self.netfilter.undrop(direction, peer)
        except AgentError:
            # Try again shortly rather than leave the fault in place.
            log.exception("healing %s at its deadline failed; retrying", fault.key)
            fault.deadline = self._clock() + 1.0
            return
        del self._faults[fault.key]
        log.info("%s healed at its deadline", fault.key)
