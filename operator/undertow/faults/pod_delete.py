"""pod-delete: Chaos Mesh's pod-kill. The broker's pod is deleted and replaced at once.

Unlike ``kill`` (SIGKILL in place: same address, same disk), the replacement comes back with
a new address and, when storage is ephemeral, an empty disk under its old broker id, as a
StatefulSet pod whose emptyDir died with it. Nothing can undo a deletion: recovering waits
until the replacement serves, registered with the controller and unfenced.
"""

from __future__ import annotations

from undertow.faults.base import Fault, FaultError, Listener
from undertow.platform.base import Platform


class PodDelete(Fault):
    kind = "pod-delete"

    def __init__(self, platform: Platform, target: str, *, time_limit_s: float,
                 listener: Listener | None = None, grace_period_s: float = 0.0) -> None:
        if grace_period_s < 0:
            raise FaultError(f"pod-delete {target}: grace period must not be negative, "
                             f"got {grace_period_s!r}")
        super().__init__(platform, platform.check_broker(target), time_limit_s=time_limit_s,
                         listener=listener)
        self.grace_period_s = grace_period_s

    def _inject(self) -> None:
        self.platform.delete_pod(self.target, self.grace_period_s)

    def _recover(self) -> None:
        self.platform.await_replacement(self.target)
