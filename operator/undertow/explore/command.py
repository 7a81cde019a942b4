"""``undertow explore FILE``: draw, simulate and check many schedules on Spark, shrink each
loss to a minimal experiment, optionally confirm it on real processes, and report.

    explore(loaded, out, runs=1000, master=None)
      -> out/outcomes.jsonl        one line per schedule (seed, schedule, verdict, counts, ...)
      -> out/minimal/*.yaml        one minimal experiment per loss mechanism
      -> out/explore.json, out/explore.html
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from undertow.explore.draw import Schedule, draw, experiment_with
from undertow.explore.robust import MISSES_ALLOWED, VARIANTS, loses_robustly
from undertow.explore.runs import Outcome, dominant, simulate
from undertow.explore.shrink import shrink
from undertow.explore.space import FaultSpace
from undertow.explore.spark import explore_session, in_parallel, outcomes
from undertow.explore.write import write_experiment
from undertow.sim.platform import NOMINAL, Timing
from undertow.sim.run import run_simulated
from undertow.spec import LoadedExperiment
from undertow_history.checker import check_history

log = logging.getLogger("undertow.explore")

SHRINK_BUDGET = 40
"""Candidates one shrink may try (each up to one simulation per timing variant, 0.3-3 s
each)."""
ROBUST_CANDIDATES = 4
"""Lossy schedules of one mechanism tried, in turn, for one that loses under every timing
variant before the simplest is shrunk at nominal timing."""
SHRINK_EARLIEST_MS = 2000
"""No fault is moved before this by shrinking: real clients take a second or so to connect
and send, so a minimal schedule whose fault must come in the workload's first milliseconds
would not replay on real processes (`--confirm`)."""


@dataclass
class Minimal:
    """One loss mechanism's minimal experiment."""

    mechanism: str
    found_seed: int
    found_faults: int
    schedule: Schedule
    faults: int
    path: Path
    sentences: list[str]
    robust: bool
    """Whether it loses under the timing variants (`robust.loses_robustly`), not only the
    nominal timing: only then is it likely to replay on real processes."""
    confirmed: list[str] = field(default_factory=list)
    """The mechanisms (or "clean"/"error") of each confirmation run on real processes."""

    def to_json(self) -> dict[str, Any]:
        reproduced = sum(m == self.mechanism for m in self.confirmed)
        return {"mechanism": self.mechanism, "found_seed": self.found_seed,
                "found_faults": self.found_faults, "faults": self.faults,
                "file": str(self.path), "sentences": self.sentences, "robust": self.robust,
                "confirm_runs": len(self.confirmed), "confirmed": reproduced,
                "confirm_outcomes": self.confirmed}


@dataclass
class Exploration:
    experiment: str
    runs: int
    seconds: float
    master: str
    outcomes: list[Outcome]
    minimal: list[Minimal]

    @property
    def schedules_per_second(self) -> float:
        return self.runs / self.seconds if self.seconds else 0.0

    def losses_by_mechanism(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for o in self.outcomes:
            if o.mechanism is not None:
                found[o.mechanism] = found.get(o.mechanism, 0) + 1
        return dict(sorted(found.items(), key=lambda kv: (-kv[1], kv[0])))

    def to_json(self) -> dict[str, Any]:
        verdicts: dict[str, int] = {}
        for o in self.outcomes:
            verdicts[o.verdict] = verdicts.get(o.verdict, 0) + 1
        return {"experiment": self.experiment, "runs": self.runs, "seconds": self.seconds,
                "schedules_per_second": self.schedules_per_second, "master": self.master,
                "verdicts": verdicts, "losses_by_mechanism": self.losses_by_mechanism(),
                "minimal": [m.to_json() for m in self.minimal]}


def _trial(loaded: LoadedExperiment, schedule: Schedule, seed: int,
           timing: Timing = NOMINAL) -> Outcome:
    return simulate(experiment_with(loaded, schedule), seed, schedule.as_spec_faults(), timing)


def explore(loaded: LoadedExperiment, out: Path, *, runs: int, master: str | None = None,
            first_seed: int = 1, confirm: int = 0, budget: int = SHRINK_BUDGET,
            on_progress: Callable[[str], None] = lambda _line: None) -> Exploration:
    space = FaultSpace.of(loaded)
    spark = explore_session(master)
    out.mkdir(parents=True, exist_ok=True)
    seeds = list(range(first_seed, first_seed + runs))

    def run(seed: int) -> Outcome:
        return _trial(loaded, draw(space, seed), seed)

    on_progress(f"running {runs} schedules on {spark.sparkContext.master} ...")
    started = time.monotonic()
    # Sorted here, not by orderBy: a sort samples its input first, which would run
    # every schedule twice.
    rows = sorted(outcomes(spark, seeds, run).collect(), key=lambda row: row.seed)
    seconds = time.monotonic() - started
    found = [Outcome.from_json(row.asDict()) for row in rows]
    with (out / "outcomes.jsonl").open("w", encoding="utf-8") as f:
        for o in found:
            f.write(json.dumps(o.to_json(), sort_keys=True) + "\n")
    exploration = Exploration(loaded.experiment.metadata.name, runs, seconds,
                              spark.sparkContext.master, found, [])
    on_progress(f"{runs} schedules in {seconds:.0f} s ({exploration.schedules_per_second:.2f}/s)"
                f"; losses by mechanism: {exploration.losses_by_mechanism() or 'none'}")
    exploration.minimal = _minimize(spark, loaded, space, found, out, budget, on_progress)
    if confirm:
        for minimal in exploration.minimal:
            on_progress(f"confirming {minimal.path.name} {confirm} times on local processes")
            minimal.confirmed = [confirm_once(minimal.path, out / "confirm" /
                                               f"{minimal.path.stem}-{i}")
                                 for i in range(confirm)]
    return exploration


def _minimize(spark: Any, loaded: LoadedExperiment, space: FaultSpace, found: list[Outcome],
              out: Path, budget: int, on_progress: Callable[[str], None]) -> list[Minimal]:
    """Shrink one schedule of each mechanism, the mechanisms side by side: the simplest of
    its first `ROBUST_CANDIDATES` (fewest faults, most records lost) that loses under every
    timing variant, shrunk while it still does; else the simplest, at nominal timing."""
    candidates: dict[str, list[Outcome]] = {}
    for o in sorted(found, key=lambda o: (o.faults, -o.lost, o.seed)):
        if o.mechanism is not None and len(candidates.setdefault(o.mechanism, [])) < \
                ROBUST_CANDIDATES:
            candidates[o.mechanism].append(o)
    if not candidates:
        return []
    on_progress(f"shrinking {len(candidates)} mechanism(s): {', '.join(sorted(candidates))}")

    def shrink_one(outcomes: list[Outcome]) -> tuple[Outcome, Schedule, bool]:
        mechanism = outcomes[0].mechanism
        assert mechanism is not None
        for outcome in outcomes:
            seed = outcome.seed

            def fails(candidate: Schedule, seed: int = seed) -> bool:
                return loses_robustly(
                    lambda s, timing: _trial(loaded, s, seed, timing), candidate, mechanism)

            start = replace(draw(space, seed), earliest_ms=SHRINK_EARLIEST_MS)
            if fails(start):
                return outcome, shrink(start, fails, budget), True
        outcome = outcomes[0]
        return outcome, shrink(
            replace(draw(space, outcome.seed), earliest_ms=SHRINK_EARLIEST_MS),
            lambda c: _trial(loaded, c, outcome.seed).mechanism == mechanism, budget), False

    mechanisms = sorted(candidates)
    shrunk = in_parallel(spark, [candidates[m] for m in mechanisms], shrink_one)
    minimal = []
    for mechanism, (origin, schedule, robust) in zip(mechanisms, shrunk, strict=True):
        name = f"{loaded.experiment.metadata.name}-{mechanism.replace('_', '-')}"
        path = out / "minimal" / f"{name}.yaml"
        sentences = _sentences(experiment_with(loaded, schedule), origin.seed,
                               out / "minimal" / f"{name}.run")
        write_experiment(loaded, schedule, path, [
            *_wrapped(f"{name}: found by `undertow explore` from {loaded.source} (seed "
                      f"{origin.seed}, {origin.faults} faults), shrunk to "
                      f"{len(schedule.faults)} while it still lost acknowledged records by "
                      f"{mechanism}" + (" under the simulator's timing variants ("
                                        f"{', '.join(v.name for v in VARIANTS)}; all but at "
                                        f"most {MISSES_ALLOWED})" if robust
                                        else " (at the simulator's nominal timing only: "
                                        "no schedule found lost under its timing variants, "
                                        "so real processes may not reproduce it)")
                      + ". Expect: loss."),
            "",
            "What the analysis said of its simulated run:",
            *[line for sentence in sentences for line in _wrapped(sentence)]])
        minimal.append(Minimal(mechanism, origin.seed, origin.faults, schedule,
                               len(schedule.faults), path, sentences, robust))
        on_progress(f"  {mechanism}: {origin.faults} -> {len(schedule.faults)} fault(s)"
                    f"{'' if robust else ' (nominal timing only)'}: {path}")
    return minimal


def _wrapped(text: str) -> list[str]:
    """A comment's lines: a sentence at most 92 characters a line."""
    return textwrap.wrap(text, 92, break_on_hyphens=False) or [""]


def _sentences(trial: LoadedExperiment, seed: int, work: Path) -> list[str]:
    """The Spark analysis's attribution sentences of one simulated run, whose history and
    report stay in ``work``."""
    from undertow_analysis.job import run_analysis

    shutil.rmtree(work, ignore_errors=True)
    run_simulated(trial, work, seed=seed)
    with contextlib.redirect_stdout(io.StringIO()):  # its one-screen summary
        report = run_analysis(str(work / "history"), str(work))
    return [incident["sentence"] for incident in report["explained"].get("incidents", [])
            if incident.get("sentence")]


def confirm_once(path: Path, out: Path) -> str:
    """One run of a minimal experiment on local processes; its dominant mechanism, "clean",
    or "error"."""
    shutil.rmtree(out, ignore_errors=True)
    done = subprocess.run([sys.executable, "-m", "undertow", "run", str(path), "--out", str(out),
                           "--no-analysis", "--no-progress"], capture_output=True, text=True)
    if done.returncode != 0:
        log.warning("confirmation run of %s failed: %s", path, done.stderr.strip()[-500:])
        return "error"
    summary = check_history(out / "history")
    return dominant(summary.mechanisms) or summary.verdict
