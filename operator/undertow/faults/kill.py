"""kill: SIGKILL the node (no shutdown, no flush); recovering restarts it.

With the spec's ``gracePeriod`` (above 0s), SIGTERM first and SIGKILL only if the process
has not exited after it: a clean shutdown in place, as a rolling restart stops a broker
(it flushes its logs). Either way the node stays down until recovered, as a kill does.
"""

from __future__ import annotations

from undertow.faults.base import Fault, fault_unit
from undertow.platform.base import Platform


@fault_unit
class Kill(Fault):
    kind = "kill"
    restored = "back and serving"

    def _inject(self) -> None:
        self.platform.kill(self.target, self.spec.grace_period)

    def _recover(self) -> None:
        self.platform.restart(self.target)

    def effect(self) -> str:
        if self.spec.grace_period > 0:
            return (f"SIGTERM, SIGKILL after {self.spec.grace_period:g}s (a clean shutdown) "
                    "in place; held down until recovered")
        return "SIGKILL in place; held down until recovered"

    @classmethod
    def clear(cls, platform: Platform, node: str) -> None:
        platform.release(node)
