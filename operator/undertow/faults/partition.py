"""partition: drop the packets of a set of directed links; recovering passes them again.

Three shapes, as the spec's ``network.mode`` names them (``spec.faults.NetworkFault``):

- ``isolate``: the target loses its links to every other node, both ways. Clients still
  reach it (the interesting case: a cut-off leader that still takes writes). A consumer's
  endpoint as the target (``client_endpoint``) loses its links to every broker: a group
  member cut off from the cluster.
- ``split``: links between different groups are cut both ways; links inside a group, of
  nodes named in no group, and of the clients stay up.
- ``one-way``: the packets the target sends to the ``to`` nodes are dropped; the reverse
  flows.

Each partition blocks its links under its own owner name, so overlapping partitions heal
independently.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from undertow.faults.base import Fault, FaultError, Nodes, fault_unit
from undertow.platform.base import Link, Platform
from undertow.spec.faults import PartitionMode

_owners = itertools.count(1)

Cut = Callable[[Platform, Nodes], tuple[str, list[Link]]]
"""One shape: the target's name for ``faults.jsonl`` and the links to block."""


def _isolate(platform: Platform, nodes: Nodes) -> tuple[str, list[Link]]:
    assert nodes.target is not None, "the spec gives an isolating partition a target"
    node = nodes.target
    # A consumer's own links go to the brokers only (clients never reach the controller).
    peers = [n for n in (platform.nodes if node in platform.nodes else platform.brokers)
             if n != node]
    return node, [link for peer in peers for link in (Link(node, peer), Link(peer, node))]


def _split(_platform: Platform, nodes: Nodes) -> tuple[str, list[Link]]:
    # The spec's groups are disjoint selectors, but two of them may resolve to the same
    # broker now (the leader and an isr-member): only the live cluster can tell.
    seen: set[str] = set()
    for group in nodes.groups:
        if seen & set(group):
            raise FaultError(f"partition split: {sorted(seen & set(group))} in two groups")
        seen |= set(group)
    links = [Link(a, b)
             for left, right in itertools.permutations(nodes.groups, 2)
             for a in left for b in right]
    return "|".join(",".join(group) for group in nodes.groups), links


def _one_way(_platform: Platform, nodes: Nodes) -> tuple[str, list[Link]]:
    assert nodes.target is not None, "the spec gives a one-way partition a target"
    if nodes.target in nodes.to:
        raise FaultError(f"partition one-way: {nodes.target!r} on both sides")
    return (f"{nodes.target}->{','.join(nodes.to)}",
            [Link(nodes.target, far) for far in nodes.to])


CUTS: dict[PartitionMode, Cut] = {"isolate": _isolate, "split": _split, "one-way": _one_way}


class LinkFault(Fault):
    """A fault on the directed links a `network` shape names (partition, delay), each held
    under its own owner name so that overlapping ones heal apart."""

    links: frozenset[Link]
    owner: str

    @classmethod
    def unable(cls, platform: Platform, node: str) -> str | None:
        if node in platform.client_endpoints:
            return None  # a consumer's own links, which are there whatever its process does
        return super().unable(platform, node)

    def _aim(self, nodes: Nodes) -> str:
        assert self.spec.network is not None, f"the spec gives every {self.kind} its network"
        target, links = CUTS[self.spec.network.mode](self.platform, nodes)
        for node in sorted({end for link in links for end in (link.src, link.dst)}):
            self.platform.check_endpoint(node)
        if not links:
            raise FaultError(f"{self.kind} {target}: no link to act on")
        self.links = frozenset(links)
        self.owner = f"{self.kind}-{next(_owners)} {target}"
        return target


@fault_unit
class Partition(LinkFault):
    kind = "partition"
    restored = "links pass again"

    def _inject(self) -> None:
        self.platform.block(self.links, self.owner)

    def _recover(self) -> None:
        self.platform.unblock(self.owner)

    def effect(self) -> str:
        return f"dropping {', '.join(map(str, sorted(self.links)))}"

    @classmethod
    def clear(cls, platform: Platform, node: str) -> None:
        platform.clear_blocks(node)
