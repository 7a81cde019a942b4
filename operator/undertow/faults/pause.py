"""pause: freeze the node (SIGSTOP), as a long GC pause would; recovering resumes it."""

from __future__ import annotations

from undertow.faults.base import Fault, Listener
from undertow.platform.base import Platform


class Pause(Fault):
    kind = "pause"

    def __init__(self, platform: Platform, target: str, *, time_limit_s: float,
                 listener: Listener | None = None) -> None:
        super().__init__(platform, platform.check_node(target), time_limit_s=time_limit_s,
                         listener=listener)

    def _inject(self) -> None:
        self.platform.pause(self.target)

    def _recover(self) -> None:
        self.platform.resume(self.target)
