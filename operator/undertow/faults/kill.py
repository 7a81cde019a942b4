"""kill: SIGKILL the node (no shutdown, no flush); recovering restarts it."""

from __future__ import annotations

from undertow.faults.base import Fault, Listener
from undertow.platform.base import Platform


class Kill(Fault):
    kind = "kill"

    def __init__(self, platform: Platform, target: str, *, time_limit_s: float,
                 listener: Listener | None = None) -> None:
        super().__init__(platform, platform.check_node(target), time_limit_s=time_limit_s,
                         listener=listener)

    def _inject(self) -> None:
        self.platform.kill(self.target)

    def _recover(self) -> None:
        self.platform.restart(self.target)
