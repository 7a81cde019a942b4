"""One explored schedule: simulate it, check its history, keep the outcome as plain data.

This is what each Spark task runs, once per seed: no Spark inside, no report, the history
deleted once checked (``undertow_history.checker``, which gives the Spark analysis's counts
and verdict), so that thousands of runs fit on a laptop's disk.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass
from typing import Any

from undertow.sim.files import scratch_dir
from undertow.sim.timing import NOMINAL, Timing
from undertow.sim.world import run_simulated
from undertow.spec import LoadedExperiment
from undertow_history.checker import KINDS, check_history

ANOMALY_COUNTS = tuple(k.count for k in KINDS if not k.loss)
"""The counts of the anomaly kinds that lose nothing acknowledged (``aborted_reads``,
``torn_transactions``, ...): what a run whose verdict is `anomalies` is shrunk by."""
IDEMPOTENT_ONLY = frozenset(k.count for k in KINDS if k.only_if_idempotent)
"""Counts that are anomalies only when the producer was idempotent (duplicates)."""


def dominant(counts: dict[str, int]) -> str | None:
    """The key with the largest count (the first by name among equals); None when empty."""
    if not counts:
        return None
    return max(sorted(counts), key=lambda key: counts[key])


def finding(verdict: str, counts: dict[str, int], mechanisms: dict[str, int]) -> str | None:
    """What a run found, as the explorer shrinks and confirms it: the loss mechanism that
    explains most of the lost records; for a verdict of `anomalies`, the anomaly count with
    the most (``aborted_reads``: the counts' names never clash with the mechanisms'), those
    every producer can have before duplicates (an anomaly only when the producer was
    idempotent, which made the verdict then); None when clean."""
    if mechanisms:
        return dominant(mechanisms)
    if verdict != "anomalies":
        return None
    found = {c: counts[c] for c in ANOMALY_COUNTS if counts.get(c)}
    return dominant({c: n for c, n in found.items() if c not in IDEMPOTENT_ONLY}) \
        or dominant(found)


@dataclass(frozen=True)
class Outcome:
    """One simulated run of one schedule: a row of the explorer's results."""

    seed: int
    faults: int
    schedule: str
    """The faults as the experiment file's ``faults:`` list, in JSON."""
    verdict: str
    """``clean``, ``anomalies``, ``loss``, or ``error`` when the simulation failed."""
    lost: int
    counts: dict[str, int]
    mechanisms: dict[str, int]
    """Lost acknowledged records per loss mechanism (the attribution's names)."""
    seconds: float
    """Wall time of the simulation and its check."""
    error: str | None = None
    faults_skipped: int = 0
    """Planned faults the nemesis did not inject: the verdict covers only those that ran."""

    @property
    def mechanism(self) -> str | None:
        """What it is shrunk by (`finding`): the mechanism that explains most of the loss,
        or the anomaly found most."""
        return finding(self.verdict, self.counts, self.mechanisms)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "mechanism": self.mechanism}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        """The inverse of ``to_json`` (a Spark row's dict): ``mechanism`` is derived."""
        return cls(**{k: v for k, v in data.items() if k != "mechanism"})


def simulate(loaded: LoadedExperiment, seed: int, faults: list[dict[str, Any]],
             timing: Timing = NOMINAL) -> Outcome:
    """Run ``loaded`` (whose faults are ``faults``) in simulation with ``seed`` and check it."""
    quiet = logging.getLogger("undertow")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # thousands of runs: a schedule's warnings are its outcome
    started = time.monotonic()
    work = scratch_dir("undertow-explore-")
    schedule = json.dumps(faults, separators=(",", ":"), sort_keys=True)
    try:
        run_simulated(loaded, work, seed=seed, timing=timing)
        summary = check_history(work / "history")
    except Exception as exc:  # one broken schedule is a row, not a failed exploration
        return Outcome(seed, len(faults), schedule, "error", 0, {}, {},
                       time.monotonic() - started, f"{type(exc).__name__}: {exc}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        quiet.setLevel(level)  # a test's process goes on with its own
    return Outcome(seed, len(faults), schedule, summary.verdict, summary.counts.get("lost", 0),
                   dict(summary.counts), dict(summary.mechanisms), time.monotonic() - started,
                   faults_skipped=len(summary.faults_skipped))
