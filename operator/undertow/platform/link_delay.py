"""What a `delay` fault does to a link's packets, drawn the way tc netem draws it.

One definition for every platform that delays in user space (the local proxies, the
simulator's network): each packet (a proxied chunk, a simulated write) arrives
`latency` late, plus a jitter drawn uniformly within `jitter` either way and, with a
`correlation`, partly the previous packet's jitter (netem's `get_crandom`: next = (1 - c)
* fresh + c * last). A connection's bytes never overtake each other, as TCP reassembles
what netem reorders: a packet leaves no earlier than the one before it on its connection.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class LinkDelay:
    """A `delay` fault's `delay` block, in seconds and a 0-1 correlation."""

    latency_s: float
    jitter_s: float = 0.0
    correlation: float = 0.0

    def __str__(self) -> str:
        jitter = f" ± {self.jitter_s * 1000:g} ms" if self.jitter_s else ""
        tied = f", {self.correlation:.0%} correlated" if self.correlation and self.jitter_s \
            else ""
        return f"{self.latency_s * 1000:g} ms{jitter}{tied}"


class DelayDraw:
    """The delays of one link's packets, one after another (netem draws per queue, so
    the correlation runs over the link's packets, whichever connection they belong to)."""

    def __init__(self, delay: LinkDelay, rng: random.Random) -> None:
        self.delay = delay
        self._rng = rng
        self._last = 0.0

    def draw(self) -> float:
        """The next packet's delay in seconds; the caller keeps a connection in order."""
        d = self.delay
        if not d.jitter_s:
            return d.latency_s
        fresh = self._rng.uniform(-1.0, 1.0)
        self._last = (1.0 - d.correlation) * fresh + d.correlation * self._last
        return max(0.0, d.latency_s + d.jitter_s * self._last)
