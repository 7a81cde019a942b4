"""partition: drop the packets of a set of directed links; recovering passes them again.

Three shapes, as the experiment spec names them:

- ``isolate``: the target loses its links to every other node, both ways. Clients still
  reach it unless ``clients`` is set (the interesting case: a cut-off leader that still
  takes writes).
- ``split``: links between different groups are cut both ways; links inside a group, and
  of endpoints named in no group (clients, unless listed as ``client``), stay up.
- ``one-way``: the packets ``src`` sends to ``dst`` are dropped; the reverse flows.

Each partition blocks its links under its own owner name, so overlapping partitions heal
independently.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from undertow.faults.base import Fault, FaultError, Listener
from undertow.platform.base import CLIENT, Link, Platform

_owners = itertools.count(1)


class Partition(Fault):
    kind = "partition"

    def __init__(self, platform: Platform, links: Iterable[Link], *, target: str,
                 time_limit_s: float, listener: Listener | None = None) -> None:
        super().__init__(platform, target, time_limit_s=time_limit_s, listener=listener)
        self.links = frozenset(links)
        if not self.links:
            raise FaultError(f"partition {target}: no link to cut")
        for link in self.links:
            for end in (link.src, link.dst):
                if end not in platform.endpoints:
                    raise FaultError(f"partition {target}: unknown endpoint {end!r}; "
                                     f"endpoints are {', '.join(platform.endpoints)}")
        self.owner = f"partition-{next(_owners)} {target}"

    @classmethod
    def isolate(cls, platform: Platform, node: str, *, clients: bool = False,
                time_limit_s: float, listener: Listener | None = None) -> Partition:
        platform.check_node(node)
        peers = [n for n in platform.nodes if n != node] + ([CLIENT] if clients else [])
        links = [link for peer in peers for link in (Link(node, peer), Link(peer, node))]
        return cls(platform, links, target=node, time_limit_s=time_limit_s, listener=listener)

    @classmethod
    def split(cls, platform: Platform, groups: Sequence[Sequence[str]], *,
              time_limit_s: float, listener: Listener | None = None) -> Partition:
        if len(groups) < 2 or not all(groups):
            raise FaultError(f"partition split: needs at least two non-empty groups, got "
                             f"{[list(g) for g in groups]}")
        seen: set[str] = set()
        for group in groups:
            if seen & set(group):
                raise FaultError(f"partition split: {sorted(seen & set(group))} in two groups")
            seen |= set(group)
        links = [Link(a, b)
                 for left, right in itertools.permutations(groups, 2)
                 for a in left for b in right]
        target = "|".join(",".join(group) for group in groups)
        return cls(platform, links, target=target, time_limit_s=time_limit_s,
                   listener=listener)

    @classmethod
    def one_way(cls, platform: Platform, src: str | Sequence[str], dst: str | Sequence[str],
                *, time_limit_s: float, listener: Listener | None = None) -> Partition:
        sources = [src] if isinstance(src, str) else list(src)
        destinations = [dst] if isinstance(dst, str) else list(dst)
        if set(sources) & set(destinations):
            raise FaultError(f"partition one-way: {sorted(set(sources) & set(destinations))} "
                             f"on both sides")
        links = [Link(s, d) for s in sources for d in destinations]
        target = f"{','.join(sources)}->{','.join(destinations)}"
        return cls(platform, links, target=target, time_limit_s=time_limit_s,
                   listener=listener)

    def _inject(self) -> None:
        self.platform.block(self.links, self.owner)

    def _recover(self) -> None:
        self.platform.unblock(self.owner)
