"""disk-full: the broker's log writes fail with ENOSPC; recovering frees the disk.

Kafka treats an I/O error on a log directory as a failed log directory (KIP-112): with its
only directory offline the broker halts, the controller fences it, moves its leaderships
to other ISR members and takes it out of every ISR; it comes back only by a restart, then
catches up from the leaders. So the broker's restart is held first (where something would
restart it at once: a pod's container), then the disk fills; recovering frees the disk,
releases the hold and waits until the broker serves again. The broker frees the disk on
its own after the fault's time limit, and the hold ends with it.
"""

from __future__ import annotations

import contextlib

from undertow.faults.base import Fault, fault_unit
from undertow.platform.base import Platform
from undertow.platform.control import EndpointUnreachable
from undertow.platform.errors import PlatformError

FAILPOINT = "disk-full"


@fault_unit
class DiskFull(Fault):
    kind = "disk-full"
    needs_answer = True
    brokers_only = True
    restored = "back and serving"

    def _inject(self) -> None:
        self.platform.require_responsive(self.target, "fill the disk of")
        self.platform.hold_restart(self.target, self.time_limit_s)
        self.platform.set_failpoint(self.target, FAILPOINT, self.time_limit_s)

    def _recover(self) -> None:
        if self.platform.is_running(self.target) and self.platform.is_paused(self.target):
            raise PlatformError(f"cannot free the disk of {self.target} while it is paused")
        self.clear(self.platform, self.target)
        self.platform.await_serving(self.target)

    def effect(self) -> str:
        return (f"log writes fail with ENOSPC for at most {self.time_limit_s:g}s; the broker "
                "halts on its failed log directory and stays down until then")

    @classmethod
    def clear(cls, platform: Platform, node: str) -> None:
        with contextlib.suppress(EndpointUnreachable):  # halted, or halting right now
            platform.clear_failpoint(node, FAILPOINT)
        platform.release(node)
