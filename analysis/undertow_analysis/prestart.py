"""The analysis started before its history is written (issue 21, "time to verdict").

    python -m undertow_analysis HISTORY --out DIR --wait SECONDS [--lifeline]

`undertow run` starts this process when a run starts, so that what every analysis pays
before it reads a line (the JVM's start, about 7 s; the first job's class loading, JIT and
code generation, several seconds more) is paid while the experiment runs, not while its
user waits for a verdict. The process creates the Spark session at once, warms it up
(`warmup`), then waits for the run to close the history, which it does last (meta.json's
`end` set by `HistoryWriter.finish`), and analyses it exactly as `undertow analyze` would:
the analysis stays a step of its own, which `undertow analyze` can redo at any time.

It never outlives the run it waits for. The wait is bounded (`--wait`: the runner knows how
long a run can take); past it the history is reported as never closed. With `--lifeline`
its stdin is a pipe from the process that started it, which never writes to it: end of file
means that process is gone (killed, even by SIGKILL: the kernel closes its end) or gave up
the run (it failed or was interrupted), and this process exits at once. Its JVM follows it:
PySpark's gateway exits when its own stdin, a pipe from this process, closes.

Once the history is closed the process is the only thing the user waits for: it takes back
the ordinary priority the runner lowered for the warm-up (`full_priority`), and once the
summary is printed it exits at once (`finish`), without Python's shutdown.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from undertow_analysis import warmup
from undertow_analysis.io import read_meta

POLL_S = 0.1
"""How often meta.json is read while waiting: a small file, read without a Spark job."""
EXIT_ABANDONED = 3
"""Exit status when the lifeline closed: the run this process waited for is gone."""


class HistoryNotClosed(TimeoutError):
    """The run did not close its history in the time it was given: it hangs, or it died
    without the lifeline that would have said so."""


def watch_lifeline(fd: int = 0) -> None:
    """Exit at once (EXIT_ABANDONED) when `fd` reaches end of file, from a daemon thread, so
    that neither the session's start nor a Spark job delays it."""

    def watch() -> None:
        while os.read(fd, 4096):  # nothing is ever written; whatever is, is ignored
            pass
        print("undertow analyze: the run is gone (its lifeline closed); stopping",
              file=sys.stderr, flush=True)
        os._exit(EXIT_ABANDONED)

    threading.Thread(target=watch, name="undertow-lifeline", daemon=True).start()


def prepare(spark: SparkSession, history_uri: str, deadline: float, *, warm: bool,
            analyze: Callable[[SparkSession, str, str], Any],
            warm_file: str | None = None) -> None:
    """On a new session: warm it up (`warmup`, when `warm`) with `analyze`, create
    `warm_file` (the runner starts its workload then: the warm-up takes none of the CPU the
    experiment's timings rely on), then wait until the run closed the history
    (`wait_until_closed`). Says on stderr how long each took. A failed warm-up is said and
    passed over: the real analysis reports its own errors."""
    _say("Spark session ready")
    keep_jvm_objects(spark)
    started = time.monotonic()
    if warm:
        try:
            warmup.warm_up(spark, run_meta(spark, history_uri), analyze)
            _say(f"warmed up in {time.monotonic() - started:.1f} s")
        except Exception as exc:  # only a head start: the analysis itself says what is wrong
            _say(f"warm-up failed ({type(exc).__name__}: {exc}); going on without it")
    if warm_file is not None:
        Path(warm_file).touch()
    waited = time.monotonic()
    wait_until_closed(spark, history_uri, deadline)
    _say(f"history closed after {time.monotonic() - waited:.1f} s of waiting; "
         f"{full_priority()}")


def keep_jvm_objects(spark: SparkSession) -> None:
    """Stop telling the JVM about each Py4J object Python drops.

    Py4J releases the JVM object behind every Python proxy that is garbage collected, one
    round trip each, in whichever thread drops it: 3,600 of the 12,500 round trips of one
    analysis of a small run, about 1 s of the driver's time. This process analyses one
    history and ends at once (`finish`), its JVM with it, so what the JVM holds for the
    objects of one warm-up and one analysis (plans and columns, a few MB) is never worth
    a round trip."""
    spark.sparkContext._gateway._gateway_client.gateway_property.enable_memory_management = \
        False


def full_priority() -> str:
    """Set this process group (this process and its JVM, every thread) back to niceness 0,
    and say how it went.

    The runner starts the analysis at a lower priority (`NICENESS` of
    `undertow.runner.analysis_process`) so that its warm-up yields to the brokers starting
    beside it. Once the history is closed nothing of the experiment is left to protect,
    and the verdict is what the user waits for: at niceness 10 beside a busy neighbour at
    0, the analysis got about a tenth of the CPU the neighbour got. Lowering a niceness
    needs the privilege to (CAP_SYS_NICE, or an RLIMIT_NICE that allows it); without it the
    analysis goes on at the niceness it has."""
    try:
        before = os.getpriority(os.PRIO_PGRP, 0)
        if before > 0:
            os.setpriority(os.PRIO_PGRP, 0, 0)  # every thread of every process of the group
            return f"niceness {before} -> 0"
        return f"niceness {before}"
    except OSError as exc:
        return f"niceness stays (not permitted to lower it: {exc.strerror})"


def finish(started: float) -> None:
    """End the process now that the summary is printed (`started`: when the history was
    found closed, time.monotonic()), saying how long the analysis took.

    An ordinary exit costs 1-1.5 s more on a 2-core machine: Python's shutdown releases
    every Py4J object the job created, one round trip to the JVM each, and the runner,
    which waits for this process's exit to read the report, would print the verdict that
    much later. Every output is complete by then (report.json and report.html are closed,
    the summary flushed), and the JVM exits on its own when its stdin, a pipe from this
    process, closes."""
    _say(f"analysed in {time.monotonic() - started:.1f} s; exiting")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _say(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} undertow analyze: {text}", file=sys.stderr, flush=True)


def run_meta(spark: SparkSession, history_uri: str) -> dict | None:
    """meta.json as the run wrote it so far, or None before the run wrote it."""
    try:
        return read_meta(spark, history_uri)
    except FileNotFoundError:
        return None


def wait_until_closed(spark: SparkSession, history_uri: str, deadline: float) -> None:
    """Return once meta.json has its `end` (the run closed the history: every line is
    written), or raise `HistoryNotClosed` at `deadline` (time.monotonic())."""
    while True:
        meta = run_meta(spark, history_uri)
        if meta is not None and meta.get("end") is not None:
            return
        if time.monotonic() >= deadline:
            state = "no meta.json" if meta is None else "meta.json's end is still null"
            raise HistoryNotClosed(
                f"history {history_uri} was not closed in the time given (--wait): {state}; "
                f"the run that writes it has not finished (analyse it later with "
                f"`undertow analyze`)")
        time.sleep(POLL_S)
