"""disk-full: the broker's log writes fail with ENOSPC; recovering frees the disk.

Kafka treats an I/O error on a log directory as a failed log directory (KIP-112): with its
only directory offline the broker halts, the controller fences it, moves its leaderships
to other ISR members and takes it out of every ISR; it comes back only by a restart, then
catches up from the leaders. Recovering frees the disk and restarts a broker that halted.
The broker frees the disk on its own after the fault's time limit.
"""

from __future__ import annotations

from undertow.faults.base import Fault


class DiskFull(Fault):
    kind = "disk-full"
    brokers_only = True

    def _inject(self) -> None:
        self.platform.fill_disk(self.target, self.time_limit_s)

    def _recover(self) -> None:
        self.platform.clear_disk_full(self.target)
