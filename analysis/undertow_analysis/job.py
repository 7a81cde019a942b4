"""The analysis job: history in, report.json + report.html + anomalies/ out.

    python -m undertow_analysis HISTORY --out DIR [--master URL] [--conf KEY=VALUE ...]
                                [--allow-incomplete]
    spark-submit analysis/undertow_analysis/__main__.py HISTORY --out DIR
    python -m undertow_analysis HISTORY --out DIR --wait SECONDS [--planned-sends N]
                                [--lifeline]      (started before the run ends: prestart.py)

Only bounded results reach the driver: counts (aggregated from the few noteworthy values the
one pass over the history writes), per-second series for the plots, fault windows, and at most
MAX_LOST_ROWS lost plus MAX_OTHER_ROWS per other kind of example records. The full anomaly list
is written by Spark.

A history that meta.json marks incomplete (a failure stopped the run: records are missing and
there was no drain) is refused unless asked for; its report then says so first.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from undertow_analysis import attribution, checks, explain, html, plots, prestart, report
from undertow_analysis.io import History, child, delete, read_history, write_bytes

VALUE_PART = "value"  # the scratch output's noteworthy values
TRUNCATION_PART = "truncation"  # acknowledged records per truncation; the rest are series rows
SERIES_COLUMNS = ("part", "second", "bucket", "attempted", "acked", "max_ms", "first", "last",
                  "bad_sends", "bad_reads")
MAX_LOST_ROWS = 1000
MAX_OTHER_ROWS = 20
PLOT_BUCKETS = 2000  # timeline resolution: at most this many points per series
FAULT_BUCKETS = 10_000  # buckets of the fault range join
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
            defaults["spark.driver.extraJavaOptions"] += (
                " -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m")
    return {**defaults, **(conf or {})}


def spark_session(master: str | None, conf: Mapping[str, str] | None = None, *,
                  planned_sends: int | None = None) -> tuple[SparkSession, bool]:
    """The active session if there is one (tests, notebooks, `undertow run`), else a new one.

    Returns (session, created): the caller stops only a session it created. `master` None
    keeps the one spark-submit configured.
    """
    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    builder = SparkSession.builder.appName("undertow-analysis")
    if master:
        builder = builder.master(master)
    for key, value in session_conf(master, conf, planned_sends=planned_sends).items():
        builder = builder.config(key, value)
    return builder.getOrCreate(), True


class IncompleteHistory(ValueError):
    """meta.json says a failure stopped the run: its counts would not be a verdict on the
    system (acknowledged records never drained look lost)."""


def run_analysis(
    history_uri: str,
    out_uri: str,
    master: str | None = "local[*]",
    conf: Mapping[str, str] | None = None,
    *,
    allow_incomplete: bool = False,
    wait: float | None = None,
    planned_sends: int | None = None,
) -> dict[str, Any]:
    """Check the history at `history_uri`, write the report to `out_uri`, print the one-screen
    summary on stdout, and return report.json's content. An incomplete history raises
    `IncompleteHistory` unless `allow_incomplete`.

    With `wait` (seconds) the history may still be being written (`prestart`): the session
    starts first and, on a local master, warms up on a tiny history shaped like the run's;
    then the job waits, up to `wait` seconds after the call, for the run to close it. That
    session is left to stop with this process, while the runner prints the verdict (the JVM
    stops it when its gateway's pipe from this process closes)."""
    deadline = None if wait is None else time.monotonic() + wait
    spark, created = spark_session(master, conf, planned_sends=planned_sends)
    try:
        if deadline is not None:  # the tiny history of the warm-up is a local directory
            prestart.prepare(spark, history_uri, deadline, analyze=analyze,
                             warm=(master or "").startswith("local"))
        result = analyze(spark, history_uri, out_uri, allow_incomplete=allow_incomplete)
    finally:
        if created and deadline is None:
            spark.stop()
    print(report.summary_text(result), flush=True)
    return result


def analyze(spark: SparkSession, history_uri: str, out_uri: str, *,
            allow_incomplete: bool = False) -> dict[str, Any]:
    """run_analysis on a given session, without printing."""
    history = read_history(spark, history_uri)
    if history.meta.get("incomplete") and not allow_incomplete:
        raise IncompleteHistory(
            f"history {history_uri} is incomplete: {history.meta.get('incomplete_reason')}; "
            f"records are missing from then on and there was no drain, so its counts say "
            f"little (analyse it anyway with --allow-incomplete)")
    with _keeping_observations(spark):
        return _analyze(spark, history, out_uri)


def _series(written: DataFrame, history: History
            ) -> tuple[list[tuple[int, int, int]], dict[str, Any]]:
    """(second since t_ref, attempted, acked) for every second with sends, plus the first
    invoke, the last completion, the last read and the latency percentiles, from the series
    rows `_check` wrote; the malformed lines of sends and reads go to `history`. The series
    is bounded by the run's length (a week is 604,800 rows of three numbers)."""
    rows = (written.filter(~F.col("part").isin(VALUE_PART, TRUNCATION_PART))
            .select(*SERIES_COLUMNS).collect())
    other = [r for r in rows if r["part"] == "other"]
    history.count_malformed("sends", sum(r["bad_sends"] for r in other))
    history.count_malformed("reads", sum(r["bad_reads"] for r in other))
    seconds = [r for r in rows if r["part"] == "second"]
    histogram = [(r["bucket"], r["acked"], r["max_ms"]) for r in rows if r["part"] == "latency"]
    times = {"first": min((r["first"] for r in seconds), default=None),
             "last": max((r["last"] for r in seconds), default=None),
             "last_read": max((r["last"] for r in other), default=None),
             **report.latency_percentiles(histogram)}
    return sorted((r["second"], r["attempted"], r["acked"]) for r in seconds), times


def _end(history: History, last_send: float | None) -> float | None:
    """meta.json's end, else (an interrupted run) the last send, fault or cluster sample."""
    if history.meta.get("end") is not None:
        return float(history.meta["end"])
    times = [last_send] + [df.filter(F.col("_reason").isNull()).agg(F.max("t")).first()[0]
                           for df in (history.parsed["faults"], history.parsed["cluster"])
                           if df is not None]
    return max((t for t in times if t is not None), default=None)


def _faults(history: History, t0: float, t_end: float) -> list[dict[str, Any]]:
    windows = checks.fault_windows(history.valid("faults"), t_end)
    rows = windows.orderBy("start", "target").collect()
    return [
        {"id": i, **r.asDict(), "start_s": round(r["start"] - t0, 3),
         "end_s": round(r["end"] - t0, 3)}
        for i, r in enumerate(rows, start=1)
    ]


EMPTY_RELATION_RULE = "org.apache.spark.sql.execution.adaptive.AQEPropagateEmptyRelation"


@contextmanager
def _keeping_observations(spark: SparkSession) -> Iterator[None]:
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


def _check(history: History, t_ref: float, scratch: str, truncations: DataFrame | None
           ) -> int:
    """Run every record checker and the send series in one query: one parse, one shuffle.

    The query writes to `scratch` the noteworthy values (part VALUE_PART), the series rows
    (parts "second", "latency" and "other") and, when there are `truncations` (events with
    an `id`), the acknowledged records each of them cut (part TRUNCATION_PART), all few, and
    returns the number of inconsistent offsets (an Observation of the few positions). Nothing
    is observed line by line or value by value: malformed lines are counted in the series,
    the other counts come from the written rows (`_counts`) and topic names from
    `topic_names`.
    """
    inconsistent_obs = Observation("undertow-inconsistent")
    by_value = checks.by_value(checks.events(history.lines("sends"), history.lines("reads")))
    inconsistent = checks.inconsistent_offsets(by_value).observe(
        inconsistent_obs, F.count("*").alias("inconsistent_offsets"))
    classified = checks.classify(checks.positions_by_value(by_value), inconsistent)
    values = checks.noteworthy(classified).withColumn("part", F.lit(VALUE_PART))
    series = checks.send_series(by_value, t_ref).withColumnRenamed("kind", "part")
    written = values.unionByName(series, allowMissingColumns=True)
    if truncations is not None:
        cut = checks.acked_in_truncations(by_value, checks.truncation_ranges(truncations))
        written = written.unionByName(cut.withColumn("part", F.lit(TRUNCATION_PART)),
                                      allowMissingColumns=True)
    written.write.mode("overwrite").parquet(scratch)
    return int(inconsistent_obs.get["inconsistent_offsets"])


def _counts(values: DataFrame, series: list[tuple[int, int, int]],
            inconsistent_offsets: int) -> dict[str, int]:
    """Every count of the report from the noteworthy values `_check` wrote and the number of
    send attempts in the series (see `checks.value_counts`)."""
    row = values.agg(*checks.value_counts(values)).first().asDict()
    attempted = sum(a for _, a, _ in series) - row.pop("retries")
    counts = {**row, "attempted": attempted, "inconsistent_offsets": inconsistent_offsets,
              "acked": attempted - row["failed"] - row["indeterminate"]}
    return {name: int(counts[name]) for name in report.COUNT_NAMES}


def _anomalous(counts: dict[str, int]) -> bool:
    """Some value has an anomaly (otherwise anomalies/ is empty and nothing needs naming)."""
    return any(counts[k] for k in report.ANOMALY_COUNTS)


def _write_anomalies(spark: SparkSession, values: DataFrame, topics: dict[int, str],
                     faults: list[dict[str, Any]], t0: float, t_end: float, uri: str,
                     scratch: str) -> None:
    """anomalies/: the anomalous ones of the values `_check` wrote, one row per kind, with their
    positions named and the fault active when they were sent.

    The fault intervals reach Spark as a JSON Lines file next to `scratch` rather than as
    Python rows: a soak has thousands, and Python rows would start a Python worker."""
    intervals_uri = scratch + "-intervals.jsonl"
    lines = (json.dumps({"start": s, "end": e, "fault": f}) + "\n"
             for s, e, f in report.fault_intervals(faults))
    write_bytes(spark, intervals_uri, "".join(lines).encode())
    intervals = spark.read.schema("start double, end double, fault string").json(intervals_uri)
    width = max(1.0, (t_end - t0) / FAULT_BUCKETS)
    (checks.with_active_fault(checks.value_anomalies(values, topics), intervals, width)
     .write.mode("overwrite").parquet(uri))


def topic_keys(spark: SparkSession, names: set[str]) -> dict[int, str]:
    """topic_key -> name for a handful of topic names (a one-row query of literals: no Python
    worker)."""
    ordered = sorted(names)
    if not ordered:
        return {}
    keys = spark.range(1).select(*[checks.topic_key(F.lit(n)) for n in ordered]).first()
    return dict(zip(keys, ordered, strict=True))


def topic_names(history: History, values: DataFrame) -> dict[int, str]:
    """topic_key -> name for the topics of the anomalous ones of `values` (the noteworthy ones):
    only they are named in anomalies/.

    The experiment's topic (meta.json) and the sampled ones (cluster.jsonl) name them without
    a pass over sends and reads; only a topic neither knows (say, reads of another topic)
    costs a scan of the topic field of both.
    """
    wanted = {r[0] for r in values.filter(checks.is_anomalous()).select(F.explode(F.array(
        *[F.col(f"{c}.tk") for c in checks.POSITIONS])).alias("tk")).distinct().collect()}
    wanted.discard(None)
    spec_topic = _spec_topic(history.meta)
    sources = (
        lambda: {spec_topic} if spec_topic else set(),
        lambda: _topics_in(history, ("cluster",)),
        lambda: _topics_in(history, ("sends", "reads"), keys=wanted),
    )
    named: dict[int, str] = {}
    for names in sources:
        if not wanted - named.keys():
            break
        named |= topic_keys(history.spark, {n for n in names() if isinstance(n, str)})
    return {tk: name for tk, name in named.items() if tk in wanted}


def _topics_in(history: History, files: Sequence[str], keys: set[int] | None = None) -> set[str]:
    """The distinct topics of `files` (only those with a key in `keys`): a read of the one
    field, malformed lines included, which is harmless for naming."""
    uris = [history.file(name) for name in files if history.parsed[name] is not None]
    if not uris:
        return set()
    topics = history.spark.read.schema("topic string").json(uris).filter(F.col("topic").isNotNull())
    if keys is not None:
        topics = topics.filter(checks.topic_key(F.col("topic")).isin(*keys))
    return {r[0] for r in topics.distinct().collect()}


def _examples(written: DataFrame) -> tuple[list[dict], list[dict]]:
    """The earliest-sent MAX_LOST_ROWS lost records and MAX_OTHER_ROWS of every other kind."""
    order = [F.col("t_invoke").asc_nulls_last(), "value"]
    rank = F.row_number().over(Window.partitionBy("kind").orderBy(*order))
    limit = F.when(F.col("kind") == "lost", MAX_LOST_ROWS).otherwise(MAX_OTHER_ROWS)
    rows = [r.asDict() for r in written.withColumn("_rank", rank).filter(F.col("_rank") <= limit)
            .drop("_rank").orderBy("kind", *order).collect()]
    return [r for r in rows if r["kind"] == "lost"], [r for r in rows if r["kind"] != "lost"]


def _availability(series: list[tuple[int, int, int]], t_ref: float, t0: float,
                  offline: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    summary = report.availability(
        attempted=sum(a for _, a, _ in series), acked=sum(k for _, _, k in series),
        seconds=len(series), available_seconds=sum(1 for *_, k in series if k), offline=offline)
    no_acks = report.no_ack_windows([s for s, _, k in series if not k], t_ref, t0)
    return summary, sorted(no_acks + offline, key=lambda w: (w["start"], w["kind"]))


def _acks_per_bucket(series: list[tuple[int, int, int]], t_ref: float, t0: float,
                     width: float) -> list[tuple[int, int]]:
    buckets: dict[int, int] = {}
    for second, _, acked in series:
        bucket = math.floor((second + t_ref - t0) / width)
        buckets[bucket] = buckets.get(bucket, 0) + acked
    return sorted(buckets.items())


def _cluster(history: History, t0: float, width: float) -> tuple[list[dict], list[dict]]:
    """Offline windows and per-bucket ISR sizes (cluster.jsonl is small next to sends)."""
    cluster = history.valid("cluster")
    offline = [r.asDict() for r in checks.offline_windows(cluster).collect()]
    isr = [r.asDict() for r in checks.isr_per_bucket(cluster, t0, width).collect()]
    return report.offline_windows(offline, t0), isr


def _spec_topic(meta: dict[str, Any]) -> str | None:
    """The experiment's topic (meta.json's spec.topic.name), if meta.json names it."""
    spec = meta.get("spec")
    topic = spec.get("topic") if isinstance(spec, dict) else None
    name = topic.get("name") if isinstance(topic, dict) else None
    return name if isinstance(name, str) else None


def _acks_one(meta: dict[str, Any]) -> bool:
    """The producers used acks=1 (meta.json's spec.workload.acks)."""
    spec = meta.get("spec")
    workload = spec.get("workload") if isinstance(spec, dict) else None
    return isinstance(workload, dict) and str(workload.get("acks")) == "1"


def _explain(history: History, anomalies: DataFrame, counts: dict[str, int],
             acked_cut: dict[int, int], faults: list[dict[str, Any]], t0: float,
             drain_short: list[dict[str, Any]]) -> dict[str, Any]:
    """The loss incidents, the truncations and the duplicates (`attribution`, `explain`);
    none without events.jsonl. A run with nothing to explain (no lost, misplaced or phantom
    record, no duplicate) runs no attribution for it."""
    if history.parsed["events"] is None:
        return explain.WITHOUT_EVENTS
    events = history.usable("events")
    subjects = None
    if any(counts[k] for k in ("lost", "misplaced", "phantom_reads")):
        subjects = attribution.subjects(anomalies)

    def incidents() -> list[dict[str, Any]]:
        if subjects is None:
            return []
        attributed = attribution.attribute(subjects, events, _acks_one(history.meta))
        return [r.asDict(recursive=True) for r in attribution.incidents(attributed).collect()]

    def cuts() -> list[dict[str, Any]]:
        return [{**r.asDict(), "acked": acked_cut.get(r["id"], 0)}
                for r in attribution.truncations(events, subjects).collect()]

    def duplicates() -> list[dict[str, Any]]:
        if not counts["duplicates"]:
            return []
        return [r.asDict() for r in attribution.duplicate_groups(
            anomalies, events, bool(history.meta.get("idempotent"))).collect()]

    found, cut, dups = _concurrently(incidents, cuts, duplicates)
    return explain.explanations(found, cut, faults, t0, drain_short, dups)


def _marks(history: History, t0: float) -> list[dict[str, Any]]:
    """The events the timeline marks: elections, fences, truncations."""
    if history.parsed["events"] is None:
        return []
    return [{**r.asDict(), "t_s": r["t"] - t0} for r in history.valid("events")
            .filter(F.col("type").isin(*plots.EVENT_MARKS))
            .select("t", "type", "kind", "broker", "leader").collect()]


def _concurrently(*calls: Callable[[], Any]) -> list[Any]:
    """The results of independent Spark actions on small data, run from threads at once:
    each is mostly the driver's fixed cost of a job (planning, code generation, scheduling),
    which then overlaps, and their few tasks share the cores."""
    with ThreadPoolExecutor(max_workers=len(calls), thread_name_prefix="undertow-job") as pool:
        return [f.result() for f in [pool.submit(call) for call in calls]]


def _analyze(spark: SparkSession, history: History, out_uri: str) -> dict[str, Any]:
    meta = history.meta
    drain_short = report.drain_shortfalls(meta.get("drain"), _spec_topic(meta))
    t_ref = float(meta.get("start") or 0.0)
    outputs = {name: child(out_uri, name) for name in ("report.json", "report.html", "anomalies")}
    scratch = child(out_uri, "scratch")  # Spark ignores paths named _*
    truncations = None
    if history.parsed["events"] is not None:
        truncations = attribution.dropped(history.usable("events"))
    try:
        inconsistent_offsets = _check(history, t_ref, scratch, truncations)
        written = spark.read.parquet(scratch)
        series, send_times = _series(written, history)
        values = written.filter(F.col("part") == VALUE_PART).drop(*SERIES_COLUMNS, "id")
        acked_cut = {r["id"]: r["acked"] for r in written.filter(
            F.col("part") == TRUNCATION_PART).select("id", "acked").collect()
        } if "id" in written.columns else {}
        counts = _counts(values, series, inconsistent_offsets)
        t0 = float(meta.get("start") or send_times["first"] or 0.0)
        t_end = max(_end(history, send_times["last"]) or t0, t0)
        width = float(max(1, math.ceil((t_end - t0) / PLOT_BUCKETS)))
        anomalous = _anomalous(counts)
        faults, topics, (offline, isr), marks = _concurrently(
            lambda: _faults(history, t0, t_end),
            lambda: topic_names(history, values) if anomalous else {},
            lambda: _cluster(history, t0, width),
            lambda: _marks(history, t0))
        _write_anomalies(spark, values, topics, faults, t0, t_end, outputs["anomalies"],
                         scratch)
    finally:
        delete(spark, scratch)
        delete(spark, scratch + "-intervals.jsonl")
    anomalies = spark.read.parquet(outputs["anomalies"])
    explained, (lost, other) = _concurrently(
        lambda: _explain(history, anomalies, counts, acked_cut, faults, t0, drain_short),
        lambda: _examples(anomalies) if anomalous else ([], []))
    availability, windows = _availability(series, t_ref, t0, offline)
    idempotent = bool(meta.get("idempotent", False))
    verdict = checks.verdict(counts, idempotent)
    first = lost[0] if lost else None
    result: dict[str, Any] = {
        "verdict": verdict,
        "expect": meta.get("expect"),
        "as_expected": verdict == meta.get("expect") if meta.get("expect") else None,
        "counts": counts,
        "latency_ms": {k: send_times[k] for k in ("p50", "p99", "p999")},
        "availability": availability,
        "unavailable_windows": windows,
        "faults": faults,
        "explained": explained,
        "first_loss": first and {**first, "t_rel_s": round(first["t_invoke"] - t0, 3)},
        "malformed": history.malformed(),
        "run": {"start": t0, "end": t_end, "duration_s": round(t_end - t0, 3),
                "last_read": send_times["last_read"]},
        "history": history.uri,
        "experiment": meta.get("experiment"),
        "idempotent": idempotent,
        "incomplete": bool(meta.get("incomplete", False)),
        "incomplete_reason": meta.get("incomplete_reason"),
        "drain_short": drain_short,
        "outputs": {"json": outputs["report.json"], "html": outputs["report.html"],
                    "anomalies": outputs["anomalies"]},
    }
    result = report.clean_json(result)
    png = plots.timeline_png(
        width=width, acks=_acks_per_bucket(series, t_ref, t0, width), isr=isr,
        faults=result["faults"],
        unavailable=result["unavailable_windows"],
        lost_t=[r["t_invoke"] - t0 for r in lost if r["t_invoke"] is not None],
        events=marks)
    write_bytes(spark, outputs["report.json"], report.to_json(result))
    write_bytes(spark, outputs["report.html"],
                html.render(result, timeline_png=png, lost=lost, other=other).encode())
    return result


def _conf(pairs: Sequence[str]) -> dict[str, str]:
    conf = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--conf expects KEY=VALUE, got {pair!r}")
        conf[key] = value
    return conf


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="undertow-analysis",
        description="Check a history for lost acknowledged records and write the loss report.")
    p.add_argument("history", help="history directory (any URI Spark reads: file://, s3a://, "
                                   "hdfs://, or a local path)")
    p.add_argument("--out", required=True, help="output directory for report.json, "
                                                "report.html and anomalies/ (any URI)")
    p.add_argument("--master", default=None,
                   help="Spark master (default local[*]; under spark-submit, its --master)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Spark configuration, repeatable")
    p.add_argument("--allow-incomplete", action="store_true",
                   help="analyse a history that meta.json marks incomplete (a failure stopped "
                        "the run); the report says so")
    p.add_argument("--wait", type=float, metavar="SECONDS",
                   help="start Spark at once and analyse the history when the run writing it "
                        "closes it (meta.json's end set), waiting at most SECONDS")
    p.add_argument("--planned-sends", type=int, metavar="N",
                   help="how many sends the run planned (with --wait): up to "
                        f"{SMALL_RUN_SENDS:,}, the JVM is set up for a small job")
    p.add_argument("--lifeline", action="store_true",
                   help="stdin is a pipe from the process that started this one: exit as soon "
                        "as it closes (that process is gone or gave up the run)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: exit 0 whatever the verdict (the verdict is in the report), 2 on bad
    input, an incomplete history among them unless --allow-incomplete."""
    args = parser().parse_args(argv)
    if args.lifeline:
        prestart.watch_lifeline()
    under_spark_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    master = args.master or (None if under_spark_submit else "local[*]")
    try:
        run_analysis(args.history, args.out, master, _conf(args.conf),
                     allow_incomplete=args.allow_incomplete, wait=args.wait,
                     planned_sends=args.planned_sends)
    except (FileNotFoundError, ValueError, prestart.HistoryNotClosed) as e:
        print(f"undertow analyze: {e}", file=sys.stderr)
        return 2
    return 0
