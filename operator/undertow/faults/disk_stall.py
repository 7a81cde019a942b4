"""disk-stall: the broker's appends and fsyncs block (its failpoint); recovering clears it.

The broker holds the stall for at most the fault's time limit on its own, so a stall
never outlives a runner that could not clear it.
"""

from __future__ import annotations

from undertow.faults.base import Fault


class DiskStall(Fault):
    kind = "disk-stall"
    brokers_only = True

    def _inject(self) -> None:
        self.platform.stall_disk(self.target, self.time_limit_s)

    def _recover(self) -> None:
        self.platform.clear_disk_stall(self.target)
