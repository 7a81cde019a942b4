"""Schedules as Spark tasks: each seed's schedule is drawn, simulated and checked inside a
task, and the outcomes come back as a DataFrame.

``local[*]`` uses every core of this machine; any other master (a standalone cluster, Spark
on Kubernetes) spreads the same tasks over its executors, which need Undertow installed
(``pip install`` of this repository). Python workers are reused from task to task
(``spark.python.worker.reuse``), so the broker's and the runner's modules are imported once
per core, not once per schedule.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from pyspark.sql import DataFrame, SparkSession

from undertow.explore.runs import Outcome
from undertow_analysis import class_archive
from undertow_analysis.session import started

OUTCOME_COLUMNS = ("seed", "faults", "schedule", "verdict", "lost", "counts", "mechanisms",
                   "mechanism", "seconds", "error", "faults_skipped")
OUTCOME_SCHEMA = (
    "seed long, faults int, schedule string, verdict string, lost long, "
    "counts map<string,long>, mechanisms map<string,long>, mechanism string, "
    "seconds double, error string, faults_skipped int")
T = TypeVar("T")
PR_SET_PDEATHSIG = 1
"""``<linux/prctl.h>``: the signal a process gets when its parent exits."""
TASKS_PER_CORE = 4
"""Seeds are cut into this many tasks per core: a slow schedule holds one core, not all."""
LOCAL_NETWORK_TIMEOUT = "3600s"
"""``spark.network.timeout`` for a local master. Its default (120 s) declares the executor
lost when its heartbeats stop, and a local executor is this very JVM: a laptop's suspend or
a ``kill -STOP`` of the exploration for two minutes would otherwise fail every task on
resume. On a real cluster the default stays, so a dead executor is still noticed."""


def explore_session(master: str | None, jvm_log: Path | None = None) -> SparkSession:
    """The explorer's session (the active one if any: tests, notebooks); the JVM of a new one
    writes its console to `jvm_log` (`undertow_analysis.session.jvm_console`)."""
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if (master or "local").startswith("local"):
        # The workers are this machine's: the Python running Undertow, not the PATH's.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName("undertow-explore").master(master or "local[*]")
    for key, value in session_config(master).items():
        builder = builder.config(key, value)
    return started(builder, jvm_log)


def session_config(master: str | None) -> dict[str, str]:
    """The explorer's Spark settings for ``master`` (``None`` is ``local[*]``)."""
    config = {"spark.ui.showConsoleProgress": "false",
              "spark.python.worker.reuse": "true",
              "spark.sql.session.timeZone": "UTC"}
    if (master or "local").startswith("local"):
        config["spark.network.timeout"] = LOCAL_NETWORK_TIMEOUT
        archive = class_archive.java_options()  # Spark's classes mapped, if `make install` ran
        if archive:
            config["spark.driver.extraJavaOptions"] = archive
    return config


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
        as_a_task_of_the_driver()
        for seed in batch:
            yield _row(run(seed))

    rdd = sc.parallelize(seeds, slices).mapPartitions(run_all)
    return spark.createDataFrame(rdd, OUTCOME_SCHEMA)


def in_parallel(spark: SparkSession, items: list[Any], work: Callable[[Any], Any]) -> list[Any]:
    """``work(item)`` for every item, one task each (the shrinks of several mechanisms run
    side by side); results in the order of ``items``."""
    if not items:
        return []

    def run(pair: tuple[int, Any]) -> tuple[int, Any]:
        as_a_task_of_the_driver()
        return pair[0], work(pair[1])

    done = spark.sparkContext.parallelize(list(enumerate(items)), len(items)).map(
        run).collect()
    return [result for _, result in sorted(done, key=lambda pair: pair[0])]


def as_a_task_of_the_driver() -> None:
    """Make this Spark task's Python worker the driver's to stop, not the terminal's.

    Ignore SIGINT: Ctrl-C at a terminal signals the whole foreground process group, and
    PySpark's daemon gives each worker it forks Python's own SIGINT handler back: the task
    would die of KeyboardInterrupt and Spark log it, while the driver is cancelling the jobs
    anyway (`interruptibly`).

    Die with the daemon that forked this worker (Linux's ``PR_SET_PDEATHSIG``): the daemon
    tells its workers to stop with a SIGHUP when Spark closes it, but a daemon killed outright
    tells nobody, and a worker in the middle of a shrink went on simulating schedules, a core
    busy for minutes, after `undertow explore` had exited on Ctrl-C."""
    with contextlib.suppress(ValueError):  # not the worker's main thread: none reach it
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()


def die_with_parent() -> None:
    """SIGKILL this process when its parent exits (Linux; elsewhere nothing)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def interruptibly(spark: SparkSession, work: Callable[[], T]) -> T:
    """``work()`` (which runs Spark jobs) in a thread of its own while this one waits, so
    that Ctrl-C (SIGINT) ends the wait at once with `KeyboardInterrupt` and cancels the jobs
    (PySpark's SIGINT handler does; this does too, for a session created where that handler
    could not be installed). Interrupted inside a Py4J call instead, the main thread would
    leave py4j's "KeyboardInterrupt while sending command" and its traceback on stderr."""
    outcome: list[tuple[bool, Any]] = []
    thread = threading.Thread(target=lambda: outcome.append(_call(work)), daemon=True,
                              name="undertow-explore-jobs")
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.2)
    except KeyboardInterrupt:
        spark.sparkContext.setLogLevel("ERROR")  # not a WARN per killed task
        spark.sparkContext.cancelAllJobs()
        raise
    [(ok, value)] = outcome
    if not ok:
        raise value
    return value


def _call(work: Callable[[], T]) -> tuple[bool, Any]:
    """(True, result) or (False, the exception raised)."""
    try:
        return True, work()
    except BaseException as exc:  # handed to the waiting thread, which raises it
        return False, exc
