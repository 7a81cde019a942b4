"""pod-delete: Chaos Mesh's pod-kill. The broker's pod is deleted and replaced at once.

Unlike ``kill`` (SIGKILL in place: same address, same disk), the replacement comes back with
a new address and, when storage is ephemeral, an empty disk under its old broker id, as a
StatefulSet pod whose emptyDir died with it. Nothing can undo a deletion: recovering waits
until the replacement serves, registered with the controller and unfenced. The spec's
``gracePeriod`` is the deletion's (0s: SIGKILL at once, as Chaos Mesh's pod-kill).
"""

from __future__ import annotations

from undertow.faults.base import Fault


class PodDelete(Fault):
    kind = "pod-delete"
    brokers_only = True

    def _inject(self) -> None:
        self.platform.delete_pod(self.target, self.spec.grace_period)

    def _recover(self) -> None:
        self.platform.await_replacement(self.target)
