"""pause: freeze the node (SIGSTOP), as a long GC pause would; recovering resumes it."""

from __future__ import annotations

from undertow.faults.base import Fault


class Pause(Fault):
    kind = "pause"

    def _inject(self) -> None:
        self.platform.pause(self.target)

    def _recover(self) -> None:
        self.platform.resume(self.target)
