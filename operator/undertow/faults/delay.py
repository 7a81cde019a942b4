"""delay: the packets of a set of directed links arrive late; recovering takes it off.

Chaos Mesh's NetworkChaos `delay` (tc netem's latency, jitter and correlation), over the
same links a partition of the same `network` shape would cut (`partition.CUTS`): every link
of the target both ways (`isolate`, a consumer's own links to every broker included),
between groups (`split`), or the target's packets to `to` (`one-way`). Nothing is dropped:
requests and answers slow down, connections may time out, and messages on different
connections arrive in another order than they were sent, which is how a produce or an
EndTxn of one transaction lands after the next one began (Jepsen's 2024 Kafka analysis).
Each delay holds its links under its own owner name, so overlapping delays heal apart.
"""

from __future__ import annotations

from undertow.faults.base import Nodes, fault_unit
from undertow.faults.partition import LinkFault
from undertow.platform.base import Platform
from undertow.platform.link_delay import LinkDelay


@fault_unit
class Delay(LinkFault):
    kind = "delay"
    restored = "links at full speed again"
    latency: LinkDelay

    def _aim(self, nodes: Nodes) -> str:
        delay = self.spec.delay
        assert delay is not None, "the spec gives every delay its delay"
        self.latency = LinkDelay(delay.latency, delay.jitter, delay.correlation / 100)
        return super()._aim(nodes)

    def _inject(self) -> None:
        self.platform.delay(self.links, self.latency, self.owner)

    def _recover(self) -> None:
        self.platform.undelay(self.owner)

    def effect(self) -> str:
        return f"delaying {', '.join(map(str, sorted(self.links)))} by {self.latency}"

    @classmethod
    def clear(cls, platform: Platform, node: str) -> None:
        platform.clear_delays(node)
