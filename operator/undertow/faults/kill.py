"""kill: SIGKILL the node (no shutdown, no flush); recovering restarts it."""

from __future__ import annotations

from undertow.faults.base import Fault, fault_unit
from undertow.platform.base import Platform


@fault_unit
class Kill(Fault):
    kind = "kill"
    restored = "back and serving"

    def _inject(self) -> None:
        self.platform.kill(self.target)

    def _recover(self) -> None:
        self.platform.restart(self.target)

    def effect(self) -> str:
        return "SIGKILL in place; held down until recovered"

    @classmethod
    def clear(cls, platform: Platform, node: str) -> None:
        platform.release(node)
