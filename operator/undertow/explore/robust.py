"""Timing variants: a minimal schedule should lose under each, not only at the simulator's
nominal timing, to replay on real processes.

The simulation is exact about order and nominal about time: a broker restarts in 0.25 s,
a link takes 1 ms, a fault lands on its millisecond. Real processes wander from all three
(a loaded machine restarts a broker in a second; the runner injects a fault some
milliseconds late, in another phase of the heartbeats and fetches). A loss that needs one
exact timing is a curiosity of the simulator; one that survives these variants reproduces
(`undertow explore --confirm`). The shrinker keeps an edit only while the nominal timing
and all variants but at most one still lose by the same mechanism: some mechanisms live in
a window as wide as one variant's change (two pod deletions must come within a restart of
each other to lose both disks; 300 ms more between them and the first broker is back), and
real processes do not wander in every direction at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from undertow.sim.timing import NOMINAL, Timing

from .draw import Schedule
from .runs import Outcome

__all__ = ["MISSES_ALLOWED", "VARIANTS", "Variant", "loses_robustly"]


@dataclass(frozen=True)
class Variant:
    name: str
    timing: Timing = NOMINAL
    shift_ms: int = 0
    """Every fault this much later: another phase of the periodic work (the controller's
    100 ms tick, heartbeats, fetches, linger) when the faults land."""
    spread_ms: int = 0
    """Fault i (from 0, in order of start) this much later again, i times: the gaps between
    faults wider (or, below 0, narrower). On real processes the controller fences a killed
    broker a session timeout after its last heartbeat, which came up to
    `broker.heartbeat.interval.ms` (250 ms) before the kill, at its next 100 ms tick: two
    kills 100 ms apart may be fenced in either order, or in one tick. A loss that needs
    one order, or two ticks, does not survive 300 ms either way."""

    def apply(self, schedule: Schedule) -> Schedule:
        if not (self.shift_ms or self.spread_ms):
            return schedule
        return schedule.with_faults(tuple(
            replace(f, at_ms=max(0, f.at_ms + self.shift_ms + i * self.spread_ms))
            for i, f in enumerate(schedule.faults)))


VARIANTS = (
    Variant("nominal"),
    Variant("restarts take 1 s", Timing(start_delay_ms=1000.0)),
    Variant("links take 3 ms", Timing(latency_ms=3.0)),
    Variant("faults 137 ms later", shift_ms=137),
    Variant("gaps 300 ms narrower", spread_ms=-300),
    Variant("gaps 300 ms wider", spread_ms=300),
)


MISSES_ALLOWED = 1
"""Variants besides the nominal one that may fail to lose."""


def loses_robustly(trial: Callable[[Schedule, Timing], Outcome], schedule: Schedule,
                   mechanism: str) -> bool:
    """Whether ``trial`` of ``schedule`` loses by ``mechanism`` at the nominal timing and
    under every variant but at most `MISSES_ALLOWED` (it stops as soon as the answer is
    known: most candidates fail the nominal one already)."""
    misses = 0
    for variant in VARIANTS:
        if trial(variant.apply(schedule), variant.timing).mechanism != mechanism:
            if variant.timing == NOMINAL and not (variant.shift_ms or variant.spread_ms):
                return False
            misses += 1
            if misses > MISSES_ALLOWED:
                return False
    return True
