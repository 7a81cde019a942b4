"""pod-delete: Chaos Mesh's pod-kill. The broker's pod is deleted and replaced at once.

Unlike ``kill`` (SIGKILL in place: same address, same disk), the replacement comes back with
a new address and, when storage is ephemeral, an empty disk under its old broker id, as a
StatefulSet pod whose emptyDir died with it. Nothing can undo a deletion: recovering waits
until the replacement serves, registered with the controller and unfenced (starting it
again if it exited on its own meanwhile, the StatefulSet's job). The spec's
``gracePeriod`` is the deletion's (0s: SIGKILL at once, as Chaos Mesh's pod-kill).
"""

from __future__ import annotations

from undertow.faults.base import Fault, fault_unit
from undertow.platform.base import Platform


@fault_unit
class PodDelete(Fault):
    kind = "pod-delete"
    brokers_only = True
    restored = "replaced, registered and unfenced"

    def _inject(self) -> None:
        self.platform.delete_pod(self.target, self.spec.grace_period)

    def _recover(self) -> None:
        self.platform.restart(self.target)
        self.platform.await_registered(self.target)

    def effect(self) -> str:
        return (f"pod deleted (grace {self.spec.grace_period:g}s); the StatefulSet "
                "replaces it")

    @classmethod
    def clear(cls, platform: Platform, node: str) -> None:
        platform.release(node)
