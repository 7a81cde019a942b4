"""pause: freeze the node (SIGSTOP), as a long GC pause would; recovering resumes it.

A producer's pause (`target: {producer: N}`) freezes that client's own process
(``Platform.pause_client``: the runner runs a producer a schedule pauses as a process of its
own, `runner.producer_process`; in simulation its client model's host, a node of the
virtual loop): every timer of its librdkafka stops with it, while the kernel still
delivers what it had written and buffers the brokers' answers; on SIGCONT its request and
message timeouts have run out all at once, as after a client's GC pause.
"""

from __future__ import annotations

from undertow.faults.base import Fault, FaultError, Nodes, fault_unit
from undertow.platform.base import Platform, client_of


@fault_unit
class Pause(Fault):
    kind = "pause"
    restored = "SIGCONT"
    cleared_first = True
    needs_answer = True
    hits_client_processes = True
    client: bool
    """The target is a workload client's process, not a node."""

    @classmethod
    def unable(cls, platform: Platform, node: str) -> str | None:
        if client_of(node) is None:
            return super().unable(platform, node)
        if node not in platform.client_processes:
            return "has no process of its own"
        if not platform.is_client_running(node):
            return "is not running"
        return "is paused" if platform.is_client_paused(node) else None

    def _aim(self, nodes: Nodes) -> str:
        self.client = nodes.target is not None and client_of(nodes.target) is not None
        if self.client:
            assert nodes.target is not None
            if nodes.target not in self.platform.client_processes:
                raise FaultError(f"pause {nodes.target}: it has no process of its own")
            return nodes.target
        return super()._aim(nodes)

    def _inject(self) -> None:
        if self.client:
            self.platform.pause_client(self.target)
        else:
            self.platform.pause(self.target)

    def _recover(self) -> None:
        if self.client:
            self.platform.resume_client(self.target)
        else:
            self.platform.resume(self.target)

    def effect(self) -> str:
        return "SIGSTOP"

    @classmethod
    def clear(cls, platform: Platform, node: str) -> None:
        if client_of(node) is None:
            platform.resume(node)
        else:
            platform.resume_client(node)
