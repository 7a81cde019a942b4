"""kill: SIGKILL the node (no shutdown, no flush); recovering restarts it."""

from __future__ import annotations

from undertow.faults.base import Fault


class Kill(Fault):
    kind = "kill"

    def _inject(self) -> None:
        self.platform.kill(self.target)

    def _recover(self) -> None:
        self.platform.restart(self.target)
