"""Schedules as Spark tasks: each seed's schedule is drawn, simulated and checked inside a
task, and the outcomes come back as a DataFrame.

``local[*]`` uses every core of this machine; any other master (a standalone cluster, Spark
on Kubernetes) spreads the same tasks over its executors, which need Undertow installed
(``pip install`` of this repository). Python workers are reused from task to task
(``spark.python.worker.reuse``), so the broker's and the runner's modules are imported once
per core, not once per schedule.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from undertow.explore.runs import Outcome

OUTCOME_COLUMNS = ("seed", "faults", "schedule", "verdict", "lost", "counts", "mechanisms",
                   "mechanism", "seconds", "error")
OUTCOME_SCHEMA = (
    "seed long, faults int, schedule string, verdict string, lost long, "
    "counts map<string,long>, mechanisms map<string,long>, mechanism string, "
    "seconds double, error string")
TASKS_PER_CORE = 4
"""Seeds are cut into this many tasks per core: a slow schedule holds one core, not all."""


def explore_session(master: str | None) -> SparkSession:
    """The explorer's session (the active one if any: tests, notebooks)."""
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if (master or "local").startswith("local"):
        # The workers are this machine's: the Python running Undertow, not the PATH's.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return (SparkSession.builder.appName("undertow-explore")
            .master(master or "local[*]")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.python.worker.reuse", "true")
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate())


def _row(outcome: Outcome) -> tuple[Any, ...]:
    """The outcome in ``OUTCOME_SCHEMA``'s column order (a schema matches by position)."""
    data = outcome.to_json()
    return tuple(data[column] for column in OUTCOME_COLUMNS)


def outcomes(spark: SparkSession, seeds: list[int],
             run: Callable[[int], Outcome]) -> DataFrame:
    """``run(seed)`` for every seed, in Spark tasks; one row per seed (``OUTCOME_SCHEMA``).

    Nothing caches the rows: an action that reads its input twice (a sort samples it
    first) runs every schedule twice, so callers collect once and sort in Python."""
    sc = spark.sparkContext
    slices = max(1, min(len(seeds), sc.defaultParallelism * TASKS_PER_CORE))

    def run_all(batch: Iterable[int]) -> Iterator[tuple[Any, ...]]:
        for seed in batch:
            yield _row(run(seed))

    rdd = sc.parallelize(seeds, slices).mapPartitions(run_all)
    return spark.createDataFrame(rdd, OUTCOME_SCHEMA)


def in_parallel(spark: SparkSession, items: list[Any], work: Callable[[Any], Any]) -> list[Any]:
    """``work(item)`` for every item, one task each (the shrinks of several mechanisms run
    side by side); results in the order of ``items``."""
    if not items:
        return []
    done = spark.sparkContext.parallelize(list(enumerate(items)), len(items)).map(
        lambda pair: (pair[0], work(pair[1]))).collect()
    return [result for _, result in sorted(done, key=lambda pair: pair[0])]
