"""disk-stall: the broker's appends and fsyncs block (its failpoint); recovering clears it.

The broker holds the stall for at most the fault's time limit on its own, so a stall
never outlives a runner that could not clear it.
"""

from __future__ import annotations

import logging

from undertow.faults.base import Fault, fault_unit
from undertow.platform.base import Platform
from undertow.platform.control import EndpointUnreachable
from undertow.platform.errors import PlatformError

log = logging.getLogger("undertow.faults")

FAILPOINT = "disk-stall"


@fault_unit
class DiskStall(Fault):
    kind = "disk-stall"
    needs_answer = True
    brokers_only = True
    restored = "cleared"

    def _inject(self) -> None:
        self.platform.require_responsive(self.target, "stall the disk of")
        self.platform.set_failpoint(self.target, FAILPOINT, self.time_limit_s)

    def _recover(self) -> None:
        if not self.platform.is_running(self.target):
            return  # the stall died with the process
        if self.platform.is_paused(self.target):
            raise PlatformError(f"cannot clear the disk stall of {self.target} while it is paused")
        try:
            self.platform.clear_failpoint(self.target, FAILPOINT)
        except EndpointUnreachable as exc:
            # Restarting, or its address not back yet: the broker lifts the stall itself
            # when its time limit is up.
            log.warning("could not clear the disk stall of %s: %s", self.target, exc)

    def effect(self) -> str:
        return f"appends and fsyncs block for at most {self.time_limit_s:g}s"

    @classmethod
    def clear(cls, platform: Platform, node: str) -> None:
        platform.clear_failpoint(node, FAILPOINT)
