"""One incarnation of a simulated process, and the clock its code runs on.

Every callback of a node's code (its timers, the requests and answers the network hands it)
runs through its ``Process``: not at all once the process is dead, and only after its
``resume`` while it is paused (SIGSTOP: nothing runs, the kernel buffers what arrives).
A ``Process`` is also the ``Scheduler`` that minibroker's ``ReplicaManager`` and purgatories
take, so the broker's own timers stop with it.
"""

from __future__ import annotations

from collections.abc import Callable

from undertow.sim.loop import SimLoop, SimTimer


class Process:
    def __init__(self, loop: SimLoop, node: str, incarnation: int) -> None:
        self.loop = loop
        self.node = node
        self.incarnation = incarnation
        self.alive = True
        self.paused = False
        self._deferred: list[Callable[[], None]] = []
        self._on_exit: list[Callable[[], None]] = []

    # ---- the Scheduler protocol (minibroker.cluster.scheduler) ------------------------------

    def now_ms(self) -> float:
        return self.loop.now_ms()

    def call_later(self, delay_ms: float, callback: Callable[[], None]) -> SimTimer:
        return self.loop.call_later(delay_ms, lambda: self.run(callback))

    # ---- gating ----------------------------------------------------------------------------

    def run(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` as this process: dropped when it is dead, held while paused."""
        if not self.alive:
            return
        if self.paused:
            self._deferred.append(callback)
            return
        callback()

    def on_exit(self, callback: Callable[[], None]) -> None:
        """Called once when the process dies (the network resets its connections)."""
        self._on_exit.append(callback)

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        """SIGCONT: what was held runs now, in the order it arrived."""
        if not self.paused:
            return
        self.paused = False
        held, self._deferred = self._deferred, []
        for callback in held:
            self.loop.call_later(0, lambda c=callback: self.run(c))

    def exit(self) -> None:
        if not self.alive:
            return
        self.alive = False
        self.paused = False
        self._deferred.clear()
        callbacks, self._on_exit = self._on_exit, []
        for callback in callbacks:
            callback()

    def __repr__(self) -> str:
        return f"<{self.node}#{self.incarnation}{'' if self.alive else ' dead'}>"
