"""power-loss: the broker loses every write it had not fsynced and dies; recovering restarts it.

What LazyFS's clear-cache does to a real file system, done by the broker's failpoint.
"""

from __future__ import annotations

from undertow.faults.base import Fault


class PowerLoss(Fault):
    kind = "power-loss"
    brokers_only = True

    def _inject(self) -> None:
        self.platform.power_loss(self.target)

    def _recover(self) -> None:
        self.platform.restart(self.target)
