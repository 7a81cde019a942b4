"""Timing variants: a minimal schedule should lose under each, not only at the simulator's
nominal timing, to replay on real processes.

The simulation is exact about order and nominal about time: a broker restarts in 0.25 s,
a link takes 1 ms, a fault lands on its millisecond. Real processes wander from all three
(a loaded machine restarts a broker in a second; the runner injects a fault some
milliseconds late, in another phase of the heartbeats and fetches). A loss that needs one
exact timing is a curiosity of the simulator; one that survives these variants reproduces
(`undertow explore --confirm`). The shrinker keeps an edit only while every variant still
loses by the same mechanism.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from undertow.sim.platform import NOMINAL, Timing

from .draw import Schedule
from .runs import Outcome

__all__ = ["VARIANTS", "Variant", "loses_under_every_variant"]


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


def loses_under_every_variant(trial: Callable[[Schedule, Timing], Outcome],
                              schedule: Schedule, mechanism: str) -> bool:
    """Whether ``trial`` of ``schedule`` loses by ``mechanism`` under every variant (it
    stops at the first that does not: most candidates fail the nominal one already)."""
    return all(trial(v.apply(schedule), v.timing).mechanism == mechanism for v in VARIANTS)
