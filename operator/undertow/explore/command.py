"""``undertow explore FILE``: draw, simulate and check many schedules on Spark, shrink each
loss to a minimal experiment, optionally confirm it on real processes, and report.

    explore(loaded, out, runs=1000, master=None)
      -> out/outcomes.jsonl        one line per schedule (seed, schedule, verdict, counts, ...)
      -> out/minimal/*.yaml        one minimal experiment per loss mechanism
      -> out/explore.json, out/explore.html

While it shrinks, each kept edit is a line of progress (`progress`). Ctrl-C (SIGINT) raises
`Interrupted` once the best schedule of each mechanism so far is written to
``out/minimal/``, its comment saying how far its shrink got: minutes of shrinking are not
lost to a user who cannot wait for the rest.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from undertow.explore.draw import Schedule, draw, experiment_with
from undertow.explore.progress import Best, Board, Listener, Sender, step_event
from undertow.explore.robust import MISSES_ALLOWED, VARIANTS, loses_robustly
from undertow.explore.runs import ANOMALY_COUNTS, Outcome, finding, simulate
from undertow.explore.shrink import shrink
from undertow.explore.space import FaultSpace
from undertow.explore.spark import explore_session, in_parallel, interruptibly, outcomes
from undertow.explore.write import write_experiment
from undertow.sim.timing import NOMINAL, Timing
from undertow.sim.world import run_simulated
from undertow.spec import LoadedExperiment
from undertow_analysis.session import SPARK_LOG
from undertow_history.checker import check_history

log = logging.getLogger("undertow.explore")

SHRINK_BUDGET = 40
"""Candidates one shrink may try (each up to one simulation per timing variant, 0.3-3 s
each)."""
ROBUST_CANDIDATES = 4
"""Lossy schedules of one mechanism tried, in turn, for one that loses under every timing
variant before the simplest is shrunk at nominal timing."""
CONFIRM_STOP_S = 60
"""How long a confirmation run stopped by Ctrl-C may take to heal and stop its cluster."""
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
    shrunk: bool = True
    """False for the best schedule so far of a shrink Ctrl-C stopped."""

    def to_json(self) -> dict[str, Any]:
        reproduced = sum(m == self.mechanism for m in self.confirmed)
        return {"mechanism": self.mechanism, "found_seed": self.found_seed,
                "found_faults": self.found_faults, "faults": self.faults, "shrunk": self.shrunk,
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
                "faults_skipped": sorted(o.seed for o in self.outcomes if o.faults_skipped),
                "minimal": [m.to_json() for m in self.minimal]}


class Interrupted(Exception):
    """Ctrl-C (SIGINT) stopped `explore` while `stage`. `exploration` is what it had found
    (None while the schedules ran: their outcomes come back all at once), with the minimal
    experiments written, each `Minimal.shrunk` or not."""

    def __init__(self, stage: str, exploration: Exploration | None = None) -> None:
        super().__init__(f"interrupted while {stage}")
        self.stage = stage
        self.exploration = exploration


def _trial(loaded: LoadedExperiment, schedule: Schedule, seed: int,
           timing: Timing = NOMINAL) -> Outcome:
    return simulate(experiment_with(loaded, schedule), seed, schedule.as_spec_faults(), timing)


def explore(loaded: LoadedExperiment, out: Path, *, runs: int, master: str | None = None,
            first_seed: int = 1, confirm: int = 0, budget: int = SHRINK_BUDGET,
            on_progress: Callable[[str], None] = lambda _line: None) -> Exploration:
    space = FaultSpace.of(loaded)
    out.mkdir(parents=True, exist_ok=True)
    spark = explore_session(master, out / SPARK_LOG)
    seeds = list(range(first_seed, first_seed + runs))

    def run(seed: int) -> Outcome:
        return _trial(loaded, draw(space, seed), seed)

    on_progress(f"running {runs} schedules on {spark.sparkContext.master} ...")
    started = time.monotonic()
    # Sorted here, not by orderBy: a sort samples its input first, which would run
    # every schedule twice.
    try:
        rows = sorted(interruptibly(spark, lambda: outcomes(spark, seeds, run).collect()),
                      key=lambda row: row.seed)
    except KeyboardInterrupt:
        raise Interrupted(f"running {runs} schedules") from None
    seconds = time.monotonic() - started
    found = [Outcome.from_json(row.asDict()) for row in rows]
    with (out / "outcomes.jsonl").open("w", encoding="utf-8") as f:
        for o in found:
            f.write(json.dumps(o.to_json(), sort_keys=True) + "\n")
    exploration = Exploration(loaded.experiment.metadata.name, runs, seconds,
                              spark.sparkContext.master, found, [])
    on_progress(f"{runs} schedules in {seconds:.0f} s ({exploration.schedules_per_second:.2f}/s)"
                f"; losses by mechanism: {exploration.losses_by_mechanism() or 'none'}")
    try:
        _minimize(spark, loaded, space, found, out, budget, on_progress, exploration.minimal)
    except KeyboardInterrupt:
        raise Interrupted("shrinking", exploration) from None
    try:
        for minimal in exploration.minimal if confirm else []:
            on_progress(f"confirming {minimal.path.name} {confirm} times on local processes")
            minimal.confirmed = [confirm_once(minimal.path, out / "confirm" /
                                               f"{minimal.path.stem}-{i}")
                                 for i in range(confirm)]
    except KeyboardInterrupt:
        raise Interrupted("confirming", exploration) from None
    return exploration


def _minimize(spark: Any, loaded: LoadedExperiment, space: FaultSpace, found: list[Outcome],
              out: Path, budget: int, on_progress: Callable[[str], None],
              minimal: list[Minimal]) -> None:
    """Shrink one schedule of each mechanism, the mechanisms side by side, and append each
    one's `Minimal` to ``minimal``: the simplest of its first `ROBUST_CANDIDATES` (fewest
    faults, most records lost) that loses under every timing variant, shrunk while it still
    does; else the simplest, at nominal timing. On Ctrl-C, the best schedule so far of each
    mechanism not written yet is written (`Minimal.shrunk` False) before
    `KeyboardInterrupt` goes on."""
    candidates: dict[str, list[Outcome]] = {}
    for o in sorted(found, key=lambda o: (o.faults, -o.lost, o.seed)):
        if o.mechanism is not None and len(candidates.setdefault(o.mechanism, [])) < \
                ROBUST_CANDIDATES:
            candidates[o.mechanism].append(o)
    if not candidates:
        return
    mechanisms = sorted(candidates)
    on_progress(f"shrinking {len(mechanisms)} mechanism(s): {', '.join(mechanisms)} (at most "
                f"{budget} tries each, a line for each edit kept; Ctrl-C keeps the best "
                f"schedules so far)")
    board = Board({m: Best(candidates[m][0].seed, candidates[m][0].faults,
                           _shrink_start(space, candidates[m][0].seed), budget=budget)
                   for m in mechanisms}, on_progress)
    try:
        with Listener(spark, board) as sender, board.ticking():
            shrunk = interruptibly(spark, lambda: in_parallel(
                spark, [candidates[m] for m in mechanisms],
                partial(_shrink_one, loaded, space, budget, sender)))
        for mechanism, (seed, schedule, robust) in zip(mechanisms, shrunk, strict=True):
            board.best[mechanism] = replace(board.best[mechanism], seed=seed, robust=robust,
                                            schedule=schedule, finished=True)
        for mechanism in mechanisms:
            best = board.best[mechanism]
            name = _minimal_name(loaded, mechanism)
            sentences = _sentences(spark, experiment_with(loaded, best.schedule), best.seed,
                                   out / "minimal" / f"{name}.run")
            minimal.append(_write_minimal(loaded, out, mechanism, best, sentences))
            on_progress(f"  {mechanism}: {best.found_faults} -> {minimal[-1].faults} fault(s)"
                        f"{'' if best.robust else ' (nominal timing only)'}: "
                        f"{minimal[-1].path}")
    except KeyboardInterrupt:
        written = {m.mechanism for m in minimal}
        minimal += [_write_minimal(loaded, out, mechanism, best, None)
                    for mechanism, best in board.snapshot().items() if mechanism not in written]
        raise


def _shrink_start(space: FaultSpace, seed: int) -> Schedule:
    """The schedule of ``seed`` as a shrink starts from it: no fault to be moved before
    `SHRINK_EARLIEST_MS`."""
    return replace(draw(space, seed), earliest_ms=SHRINK_EARLIEST_MS)


def _shrink_one(loaded: LoadedExperiment, space: FaultSpace, budget: int, sender: Sender,
                outcomes: list[Outcome]) -> tuple[int, Schedule, bool]:
    """One mechanism's shrink, in a Spark task: (the seed shrunk, the schedule it gave,
    whether it lost under the timing variants). Each step is sent to the driver as it is
    kept, and each simulation as it ends (`progress`)."""
    mechanism = outcomes[0].mechanism
    assert mechanism is not None

    def tell(event: str, **fields: Any) -> None:
        sender.send({"mechanism": mechanism, "event": event, **fields})

    def trial(schedule: Schedule, seed: int, timing: Timing = NOMINAL) -> Outcome:
        outcome = _trial(loaded, schedule, seed, timing)
        tell("simulated")
        return outcome

    def shrunk(seed: int, start: Schedule, still_fails: Callable[[Schedule], bool],
               robust: bool) -> tuple[int, Schedule, bool]:
        tell("start", seed=seed, robust=robust, schedule=start.to_json())
        schedule = shrink(start, still_fails, budget,
                          lambda step: sender.send(step_event(mechanism, step)))
        tell("done", schedule=schedule.to_json())
        return seed, schedule, robust

    try:
        for outcome in outcomes:
            seed = outcome.seed

            def fails(candidate: Schedule, seed: int = seed) -> bool:
                return loses_robustly(lambda s, timing: trial(s, seed, timing), candidate,
                                      mechanism)

            start = _shrink_start(space, seed)
            tell("checking", seed=seed, faults=len(start.faults))
            if fails(start):
                return shrunk(seed, start, fails, True)
        seed = outcomes[0].seed
        return shrunk(seed, _shrink_start(space, seed),
                      lambda c: trial(c, seed).mechanism == mechanism, False)
    finally:
        sender.close()


def _minimal_name(loaded: LoadedExperiment, mechanism: str) -> str:
    return f"{loaded.experiment.metadata.name}-{mechanism.replace('_', '-')}"


def _write_minimal(loaded: LoadedExperiment, out: Path, mechanism: str, best: Best,
                   sentences: list[str] | None) -> Minimal:
    """``out/minimal/NAME.yaml`` for ``best``, its comment saying what it shows and how far
    its shrink got: all the way, or stopped by Ctrl-C (``sentences`` None: the analysis
    did not explain its run either)."""
    name = _minimal_name(loaded, mechanism)
    path = out / "minimal" / f"{name}.yaml"
    faults = len(best.schedule.faults)
    expect = "anomalies" if mechanism in ANOMALY_COUNTS else "loss"
    what = (f"gave {mechanism.replace('_', ' ')} (a verdict of anomalies: nothing acknowledged "
            "lost)" if expect == "anomalies"
            else f"lost acknowledged records by {mechanism}")
    found = (f"{name}: found by `undertow explore` from {loaded.source} (seed {best.seed}, "
             f"{best.found_faults} faults), ")
    if best.finished:
        found += f"shrunk to {faults} while it still {what}"
    else:
        found += ("NOT FULLY SHRUNK: explore was stopped (Ctrl-C) "
                  + (f"while shrinking it, at {faults} fault(s) (its last edit kept at try "
                     f"{best.tries} of at most {best.budget})" if best.tries else
                     "before its shrink kept any edit")
                  + f". It {what}")
    if best.robust:
        found += (f" under the simulator's timing variants ({', '.join(v.name for v in VARIANTS)}"
                  f"; all but at most {MISSES_ALLOWED})")
    elif best.robust is None:
        found += (" at the simulator's nominal timing (its shrink had not yet tried it under "
                  "the timing variants, so real processes may not reproduce it)")
    else:
        found += (" (at the simulator's nominal timing only: no schedule found lost under its "
                  "timing variants, so real processes may not reproduce it)")
    comment = _wrapped(found + f". Expect: {expect}.")
    if sentences is None:
        comment += ["", "The analysis did not explain its simulated run: explore was stopped "
                        "first."]
    else:
        comment += ["", "What the analysis said of its simulated run:",
                    *[line for sentence in sentences for line in _wrapped(sentence)]]
    write_experiment(loaded, best.schedule, path, comment, expect=expect)
    return Minimal(mechanism, best.seed, best.found_faults, best.schedule, faults, path,
                   sentences or [], bool(best.robust), shrunk=best.finished)


def _wrapped(text: str) -> list[str]:
    """A comment's lines: a sentence at most 92 characters a line."""
    return textwrap.wrap(text, 92, break_on_hyphens=False) or [""]


def _sentences(spark: Any, trial: LoadedExperiment, seed: int, work: Path) -> list[str]:
    """The Spark analysis's attribution sentences of one simulated run, whose history and
    report stay in ``work``."""
    from undertow_analysis.job import run_analysis

    shutil.rmtree(work, ignore_errors=True)
    run_simulated(trial, work, seed=seed)
    # Its one-screen summary is not ours to print. The analysis waits in a thread of its own
    # (`interruptibly`) but sys.stdout is every thread's: Ctrl-C leaves this block, which
    # gives the interrupted explore its stdout back.
    with contextlib.redirect_stdout(io.StringIO()):
        report = interruptibly(spark, lambda: run_analysis(str(work / "history"), str(work)))
    explained = report["explained"]
    sentences = [incident["sentence"] for incident in explained.get("incidents", [])
                 if incident.get("sentence")]
    # A late EndTxn that ended a later transaction explains that transaction's anomalies.
    sentences += [late["sentence"] for late in explained.get("late_requests", [])
                  if late["reason"] == "decided"]
    if not sentences and report["verdict"] == "anomalies":
        # The attribution explains lost records and late EndTxns; other anomalies have none.
        found = [f"{report['counts'][c]:,} {c.replace('_', ' ')}" for c in ANOMALY_COUNTS
                 if report["counts"].get(c)]
        sentences = [f"No acknowledged record lost; the anomalies: {', '.join(found)} "
                     f"(report.json; the rows in {work.name}/anomalies)."]
    return sentences


def confirm_once(path: Path, out: Path) -> str:
    """One run of a minimal experiment on local processes: what it found (`finding`: its
    dominant mechanism, or anomaly), "clean", or "error"."""
    shutil.rmtree(out, ignore_errors=True)
    # A session of its own: Ctrl-C at the terminal reaches explore alone, which passes it on
    # once (a second SIGINT could cut the run's own clean-up short).
    with subprocess.Popen([sys.executable, "-m", "undertow", "run", str(path), "--out",
                           str(out), "--no-analysis", "--no-progress"], text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          start_new_session=True) as run:
        try:
            _stdout, stderr = run.communicate()
        except KeyboardInterrupt:
            # `undertow run` heals every fault and stops its cluster on SIGINT: wait for
            # that, rather than SIGKILL it as subprocess.run would and leave brokers running.
            run.send_signal(signal.SIGINT)
            try:
                run.communicate(timeout=CONFIRM_STOP_S)
            except subprocess.TimeoutExpired:
                run.kill()
            raise
    if run.returncode != 0:
        log.warning("confirmation run of %s failed: %s", path, stderr.strip()[-500:])
        return "error"
    summary = check_history(out / "history")
    return finding(summary.verdict, summary.counts, summary.mechanisms) or summary.verdict
