"""A fixed single-core reference, measured with every benchmark figure in the same run, so
that a figure can be read against the machine that gave it.

The shared machines these benchmarks run on differ by a factor of 3-4 from day to day: on
2026-11-28 `undertow explore` on explore-safe ran 0.73-0.88 schedules/s, at HEAD and at an
older commit alike, where RESULTS.md had 3.1/s for that older commit. A figure alone cannot
say whether the code or the machine changed. So each benchmark times a fixed pure-Python
loop on one core (ITERATIONS iterations of an integer sum) at the start and at the end of its
run, prints both beside its figures and writes both into the JSON rows it records:

- a run's figures are comparable only if the machine's speed held, the end's loop within
  HELD of the start's; the end line says whether it did;
- a normalised figure (marked AT) scales a figure to a machine whose loop takes REFERENCE_S
  seconds, the loop's time here on 2026-11-28: a rate times loop seconds / REFERENCE_S, a
  duration times REFERENCE_S / loop seconds. Normalised figures use the start's loop, known
  when the figure is printed, so every line of a run is scaled alike.

One helper for every script, so that every figure carries the same reference, measured the
same way.
"""

from __future__ import annotations

import os
import platform
import threading
import time
from dataclasses import dataclass

ITERATIONS = 10_000_000
"""The loop's length: about 1.5 s on the 2-core shared machine, long enough that the
timer's resolution does not matter, short enough to run twice in any benchmark."""
REPEATS = 5
"""The loop runs as this many equal shares and the fastest share counts (times REPEATS): one
preemption or one burst of another process's work then spoils one share, not the reading."""
REFERENCE_S = 1.47
"""The loop's seconds on the machine of 2026-11-28 that normalised figures are scaled to."""
HELD = 0.15
"""How far the end's loop may differ from the start's, relative, for the run to count as run
at one machine speed: a run across a larger change (these machines drift by 10-25 % within an
hour, more between hours) measured two machines, and its figures are neither's."""
AT = f"@{REFERENCE_S:g}s"
"""The mark of a normalised figure, in the scripts' lines and column heads."""

# Two threads timing the loop at once would share the GIL and each read a slower machine
# (experiment_reliability.py measures around runs in a thread pool).
_LOCK = threading.Lock()


def _sum_loop(iterations: int) -> int:
    """The reference's work: plain bytecode on one core, no allocation the collector tracks,
    nothing a library could speed up, so it follows the interpreter's speed on this CPU."""
    total = 0
    for i in range(iterations):
        total += i
    return total


def loop_seconds(iterations: int = ITERATIONS, repeats: int = REPEATS) -> float:
    """Seconds of `iterations` iterations of the loop: the fastest of `repeats` shares,
    scaled to the whole (the best share is the machine's speed with the least
    interference)."""
    share = max(iterations // repeats, 1)
    best = float("inf")
    with _LOCK:
        for _ in range(repeats):
            started = time.perf_counter()
            _sum_loop(share)
            best = min(best, time.perf_counter() - started)
    return best * iterations / share


@dataclass(frozen=True)
class Reading:
    """One timing of the loop, with what explains a slow one: the 1-minute load average
    (other work sharing the cores) and the number of CPUs it shares."""

    loop_s: float
    load: float
    cpus: int

    @classmethod
    def take(cls, iterations: int = ITERATIONS, repeats: int = REPEATS) -> Reading:
        """Time the loop now (about ITERATIONS' worth of work: 1-2 s)."""
        return cls(loop_s=loop_seconds(iterations, repeats), load=os.getloadavg()[0],
                   cpus=os.cpu_count() or 1)

    def fields(self) -> dict[str, float]:
        return {"loop_s": round(self.loop_s, 3), "load": round(self.load, 2)}


@dataclass
class Reference:
    """The readings of one run, at its start and (once `finish` is called) at its end.
    `iterations` other than ITERATIONS only in tests, which cannot wait for the full loop."""

    start: Reading
    end: Reading | None = None
    iterations: int = ITERATIONS

    @classmethod
    def measure(cls, iterations: int = ITERATIONS) -> Reference:
        """The start's reading; call at the start of the run, before the work measured."""
        return cls(Reading.take(iterations), iterations=iterations)

    def finish(self) -> Reference:
        """Take the end's reading (after the work measured); returns self, to print."""
        self.end = Reading.take(self.iterations)
        return self

    def drift(self) -> float | None:
        """The end's loop time relative to the start's (+0.20: the machine ran 20 % slower
        at the end); None before `finish`."""
        return None if self.end is None else self.end.loop_s / self.start.loop_s - 1

    def held(self) -> bool | None:
        """Whether the machine's speed held over the run (None before `finish`)."""
        drift = self.drift()
        return None if drift is None else abs(drift) <= HELD

    def rate(self, per_second: float) -> float:
        """A rate (more is faster) as on a machine whose loop takes REFERENCE_S seconds."""
        return per_second * self.start.loop_s / REFERENCE_S

    def duration(self, seconds: float) -> float:
        """A duration (less is faster) as on a machine whose loop takes REFERENCE_S seconds."""
        return seconds * REFERENCE_S / self.start.loop_s

    def start_line(self) -> str:
        """The line a benchmark prints before its figures."""
        s = self.start
        return (f"reference: a {self.iterations / 1e6:g}M-iteration Python loop takes "
                f"{s.loop_s:.2f} s at the start (load {s.load:.2f}, {s.cpus} CPUs, Python "
                f"{platform.python_version()}); figures marked {AT} are scaled to a machine "
                f"where it takes {REFERENCE_S:g} s")

    def end_line(self) -> str:
        """The line a benchmark prints after its figures: both readings and whether the
        machine's speed held, hence whether the figures are comparable."""
        s, e, drift = self.start, self.end, self.drift()
        if e is None or drift is None:
            return f"reference: {s.loop_s:.2f} s at the start; no reading at the end"
        verdict = (f"the machine's speed held ({drift:+.0%})" if self.held() else
                   f"the machine's speed did NOT hold ({drift:+.0%}, more than {HELD:.0%}): "
                   f"this run's figures are not comparable")
        return (f"reference: {s.loop_s:.2f} s at the start (load {s.load:.2f}), {e.loop_s:.2f} s "
                f"at the end (load {e.load:.2f}), {s.cpus} CPUs: {verdict}")

    def record(self) -> dict[str, object]:
        """The readings for a JSON row (key "reference"): enough to normalise the row's
        figures again later, and to drop it if the machine's speed did not hold."""
        drift = self.drift()
        return {"iterations": self.iterations, "python": platform.python_version(),
                "cpus": self.start.cpus, "start": self.start.fields(),
                "end": None if self.end is None else self.end.fields(),
                "drift": None if drift is None else round(drift, 3), "held": self.held(),
                "reference_s": REFERENCE_S}


def brief(record: dict) -> str:
    """A row's readings (`Reference.record`) in a few words, for a line per run: the
    scripts that keep a row a run print from the row, which is all the ledger keeps."""
    start, end = record["start"]["loop_s"], (record["end"] or {}).get("loop_s")
    if end is None:
        return f"reference {start:.2f} s"
    return f"reference {start:.2f}-{end:.2f} s, {'held' if record['held'] else 'NOT held'}"
