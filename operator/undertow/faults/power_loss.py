"""power-loss: the broker loses every write it had not fsynced and dies; recovering restarts it.

What LazyFS's clear-cache does to a real file system, done by the broker's failpoint.
"""

from __future__ import annotations

import contextlib

from undertow.faults.base import Fault, fault_unit
from undertow.platform.base import Platform
from undertow.platform.control import EndpointUnreachable


@fault_unit
class PowerLoss(Fault):
    kind = "power-loss"
    needs_answer = True
    brokers_only = True
    restored = "back and serving"

    def _inject(self) -> None:
        self.platform.require_responsive(self.target, "cut the power of")
        incarnation = self.platform.incarnation(self.target)
        # The broker may exit before it answers; a refusal (HTTP error) is real.
        with contextlib.suppress(EndpointUnreachable):
            self.platform.set_failpoint(self.target, "power-loss")
        if incarnation is not None:
            self.platform.await_exit(self.target, incarnation)

    def _recover(self) -> None:
        self.platform.restart(self.target)

    def effect(self) -> str:
        return "unsynced writes dropped, process exited"

    @classmethod
    def clear(cls, platform: Platform, node: str) -> None:
        platform.release(node)
