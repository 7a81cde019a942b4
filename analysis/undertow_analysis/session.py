"""The Spark session of the job and its settings (docs/design.md, "Where the job's time goes,
and the settings that follow")."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from pyspark import SparkContext
from pyspark.sql import SparkSession

from undertow_analysis import class_archive
from undertow_analysis.jvm_lookups import remember_jvm_lookups

SESSION_DEFAULTS = {
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    # Every PySpark call otherwise records its Python call site in the JVM for error
    # messages, about six Py4J round trips each: 9,000 of the 15,000 a small run's job made
    # (2-3 s of its 6-7 s). A failing query still names its operator and its plan.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    # One analysis generates about 210 classes; with Spark's 100 cached, every job compiled
    # them all again (210 compilations after a warm-up; 2 with room for them).
    "spark.sql.codegen.cache.maxEntries": "1000",
    # The compiled classes are cached by their source, and a whole stage's class is named
    # after the stage's number in its plan (GeneratedIteratorForCodegenStage7): the same
    # stage numbered otherwise, in the real history's plan and in the warm-up's, or in the
    # plans of two histories, was compiled again (12 of the 29 compilations left in the
    # first analysis after a warm-up).
    "spark.sql.codegen.useIdInClassName": "false",
}
SMALL_RUN_SENDS = 100_000
"""A run planning at most this many sends is small: its analysis is mostly one-time costs."""


def session_conf(master: str | None, conf: Mapping[str, str] | None = None, *,
                 planned_sends: int | None = None) -> dict[str, str]:
    """The configuration of a session the job creates: its defaults, then `conf`.
    `planned_sends`: how many sends the run to analyse planned, when known before its
    history is (`undertow run`)."""
    defaults = dict(SESSION_DEFAULTS)
    if master and master.startswith("local"):
        # Few shuffle partitions, which adaptive execution coalesces further on small runs.
        # Scan splits stay at Spark's 128 MB: 32 MB splits (four times the map tasks and
        # shuffle blocks) cost 4-5 % of the whole job at 1M, 5M and 20M sends side by side.
        defaults["spark.sql.shuffle.partitions"] = "32"
        # Sort-based serialized shuffle writes: one output stream per map task instead of one
        # per reduce partition concatenated afterwards (scan + shuffle write of 5M sends:
        # about 9 % less CPU side by side).
        defaults["spark.shuffle.sort.bypassMergeThreshold"] = "0"
        # The driver JVM is the executor: the throughput collector has no concurrent threads
        # and cheaper write barriers than G1, which leaves more of a small machine to tasks.
        defaults["spark.driver.extraJavaOptions"] = "-XX:+UseParallelGC"
        if planned_sends is not None and planned_sends <= SMALL_RUN_SENDS:
            # The client compiler alone: a small run's job runs no code long enough to gain
            # from C2, whose compilations took 40 % of the CPU of the warm-up and of the job
            # after it (acksall-leader-kill, 18k sends; a synthetic 100k: 30 %), same times.
            # Without C2 the code cache shrinks to 48 MB, which Spark's generated classes
            # filled after four analyses (the JIT then stops): keep the tiered 240 MB.
            # Its methods are compiled after a tenth of the calls (CompileThresholdScaling):
            # the warm-up's tiny history then has the JIT compile most of what the run's
            # history runs hot, which the first analysis after it compiled instead (about
            # 1.5 s less CPU in that analysis, side by side, for a warm-up no longer).
            defaults["spark.driver.extraJavaOptions"] += (
                " -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
                " -XX:CompileThresholdScaling=0.1")
        # Spark's classes mapped from this environment's archive, if `make install` made one.
        archive = class_archive.java_options()
        if archive:
            defaults["spark.driver.extraJavaOptions"] += " " + archive
    return {**defaults, **(conf or {})}


SPARK_LOG = "spark.log"
"""The file of an output directory (`undertow analyze`'s, `undertow explore`'s) that the
console of the JVM its command started goes to."""
JVM_LOG_TAIL_LINES = 20
"""How much of the JVM's console a failed start quotes."""


class SparkDidNotStart(RuntimeError):
    """The JVM of a new session failed to start; the message quotes the end of its console."""


def spark_session(master: str | None, conf: Mapping[str, str] | None = None, *,
                  planned_sends: int | None = None, jvm_log: Path | None = None
                  ) -> tuple[SparkSession, bool]:
    """The active session if there is one (tests, notebooks, `undertow run`), else a new one.

    Returns (session, created): the caller stops only a session it created. `master` None
    keeps the one spark-submit configured. `jvm_log`: where the JVM of a new session writes
    its console (`jvm_console`).
    """
    # getActiveSession is per JVM thread: a session made by another thread (a test's
    # fixture, `undertow run`'s pre-started analysis) is not active in this one, though
    # getOrCreate returns it. The process's SparkContext says whether one exists at all.
    active = SparkSession.getActiveSession()
    if active is None and SparkContext._active_spark_context is not None:
        active = SparkSession.builder.getOrCreate()
    if active is not None:
        remember_jvm_lookups(active)
        return active, False
    builder = SparkSession.builder.appName("undertow-analysis")
    if master:
        builder = builder.master(master)
    for key, value in session_conf(master, conf, planned_sends=planned_sends).items():
        builder = builder.config(key, value)
    spark = started(builder, jvm_log)
    remember_jvm_lookups(spark)
    return spark, True


def started(builder: SparkSession.Builder, jvm_log: Path | None) -> SparkSession:
    """``builder.getOrCreate()``, the JVM it may start writing its console to `jvm_log`
    (None: to this process's terminal). A JVM that fails to start is a `SparkDidNotStart`
    quoting the end of that console (where spark-submit says why: no Java, a bad option)."""
    try:
        with jvm_console(jvm_log):
            return builder.getOrCreate()
    except Exception as exc:
        if jvm_log is None or SparkContext._active_spark_context is not None:
            raise
        lines = jvm_log.read_text(errors="replace").splitlines() if jvm_log.exists() else []
        tail = "\n".join(f"  {line}" for line in lines[-JVM_LOG_TAIL_LINES:])
        raise SparkDidNotStart(f"Spark did not start: {exc}\nthe end of its console "
                               f"({jvm_log}):\n{tail or '  (empty)'}") from exc


@contextmanager
def jvm_console(log: Path | None) -> Iterator[None]:
    """Point this process's standard output and error at `log` (appended) while the block
    runs, then back. PySpark starts the session's JVM as a child that inherits both, and the
    JVM prints to them for its whole life: the module system's incubator warning, log4j's
    start-up lines, the hostname and native-library warnings, a truncated plan's warning.
    None of it is the tool's output, and on a terminal it buried the lines that are; started
    inside this block, the JVM writes it all to `log` instead. None: nothing changes."""
    if log is None:
        yield
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    target = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    saved = os.dup(1), os.dup(2)
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (target, *saved):
            os.close(fd)


def fresh_lambda_names(spark: SparkSession) -> None:
    """Number the lambda variables of the queries built next from 1 again.

    PySpark names the variable of every Python lambda of a higher-order function
    (`F.filter`, `F.transform`, `F.exists`) from one counter in the JVM, `x_1`, `x_2`, ...,
    and whole-stage code generation writes that name into the generated source, which is the
    key of Spark's cache of compiled classes. With the counter running on, no query with a
    lambda ever met its compiled classes again: every analysis compiled them anew, the
    warm-up's compilations were of no use to the run's analysis, and they were the largest
    classes of the job (about 3,600 lines each, 0.2-1.3 s to compile). Restarting the count
    where each query is built gives the same query the same names, and so the same source,
    every time. A query's own lambdas stay distinct (the count is restarted between queries,
    never inside one), and variables of two separate lambdas of one query may share a name,
    as in SQL (`filter(a, x -> ...)`, `transform(b, x -> ...)`)."""
    companion = getattr(spark._jvm.org.apache.spark.sql.internal,
                        "UnresolvedNamedLambdaVariable$")
    getattr(companion, "MODULE$").resetIdGenerator()


EMPTY_RELATION_RULE = "org.apache.spark.sql.execution.adaptive.AQEPropagateEmptyRelation"


@contextmanager
def keeping_observations(spark: SparkSession) -> Iterator[None]:
    """Adaptive execution replaces a branch that turned out empty (no inconsistent offsets,
    an empty faults.jsonl) by an empty relation, and an Observation in that branch then never
    reports: keep such branches while the job runs."""
    key = "spark.sql.adaptive.optimizer.excludedRules"
    before = spark.conf.get(key, None)
    spark.conf.set(key, ",".join(r for r in (before, EMPTY_RELATION_RULE) if r))
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)
