"""pause: freeze the node (SIGSTOP), as a long GC pause would; recovering resumes it."""

from __future__ import annotations

from undertow.faults.base import Fault, fault_unit
from undertow.platform.base import Platform


@fault_unit
class Pause(Fault):
    kind = "pause"
    restored = "SIGCONT"
    cleared_first = True
    needs_answer = True

    def _inject(self) -> None:
        self.platform.pause(self.target)

    def _recover(self) -> None:
        self.platform.resume(self.target)

    def effect(self) -> str:
        return "SIGSTOP"

    @classmethod
    def clear(cls, platform: Platform, node: str) -> None:
        platform.resume(node)
