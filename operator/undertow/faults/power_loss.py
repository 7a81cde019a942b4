"""power-loss: the broker loses every write it had not fsynced and dies; recovering restarts it.

What LazyFS's clear-cache does to a real file system, done by the broker's failpoint.
"""

from __future__ import annotations

from undertow.faults.base import Fault, Listener
from undertow.platform.base import Platform


class PowerLoss(Fault):
    kind = "power-loss"

    def __init__(self, platform: Platform, target: str, *, time_limit_s: float,
                 listener: Listener | None = None) -> None:
        super().__init__(platform, platform.check_broker(target), time_limit_s=time_limit_s,
                         listener=listener)

    def _inject(self) -> None:
        self.platform.power_loss(self.target)

    def _recover(self) -> None:
        self.platform.restart(self.target)
