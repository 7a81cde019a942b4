"""The analysis job's pipeline: history in, report.json + report.html + anomalies/ out.

Only bounded results reach the driver: counts (aggregated from the few noteworthy values the
one pass over the history writes), per-second series for the plots, fault windows, and at most
MAX_LOST_ROWS lost plus MAX_OTHER_ROWS per other kind of example records. The full anomaly list
is written by Spark. `report.build` assembles report.json from them; the command line is
`__main__`, the session's settings are `session`'s.

A history that meta.json marks incomplete (a failure stopped the run: records are missing and
there was no drain) is refused unless asked for; its report then says so first.

It is long because it is the job's one pipeline: it orders the checkers, the explanation and the
report's inputs over one loaded history and runs the independent steps concurrently; each step's
logic lives in its own module.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable, Mapping
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from undertow_analysis import (
    anomalies,
    attribution,
    checks,
    consumption,
    explain,
    groups,
    html,
    late_requests,
    offsets,
    plots,
    prestart,
    report,
    topics,
    transactions,
)
from undertow_analysis.anomalies import FINDING, GROUP_KINDS, TXN_KINDS, Group, Transactions
from undertow_analysis.grid import Grid, series_grid
from undertow_analysis.io import History, child, delete, read_history, write_bytes
from undertow_analysis.session import fresh_lambda_names, keeping_observations, spark_session

VALUE_PART = "value"  # the scratch output's noteworthy values
TRUNCATION_PART = "truncation"  # acknowledged records at the offsets of each truncation
FINDINGS_PART = "findings"  # the group and transaction checkers'; the rest are series rows
FINDING_COLUMNS = tuple(c for c in ("kind", *FINDING)
                        if c not in ("value", "t_invoke", "t_acked", "t_read"))
"""The columns of the checkers' findings in the scratch output that its values lack."""
SERIES_COLUMNS = ("part", "bucket", "column", "attempted", "acked", "failed", "indeterminate",
                  "max_ms", "first", "last", "bad_sends", "bad_reads")
MAX_LOST_ROWS = 1000
MAX_OTHER_ROWS = 20
PLOT_BUCKETS = 2000  # timeline resolution: at most this many points per series
FAULT_BUCKETS = 10_000  # buckets of the fault range join


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
    warm_file: str | None = None,
    jvm_log: Path | None = None,
) -> dict[str, Any]:
    """Check the history at `history_uri`, write the report to `out_uri`, print the one-screen
    summary on stdout, and return report.json's content. An incomplete history raises
    `IncompleteHistory` unless `allow_incomplete`.

    With `wait` (seconds) the history may still be being written (`prestart`): the session
    starts first and, on a local master, warms up on a tiny history shaped like the run's;
    then (`warm_file`, if given, created to say so) the job waits, up to `wait` seconds
    after the call, for the run to close it. Once the summary is printed, the process
    ends at once (`prestart.finish`: the call does not return), while the runner prints the
    verdict; its session is left to stop with it (the JVM stops when its gateway's pipe from
    this process closes). `jvm_log`: where a JVM started here writes its console
    (`session.jvm_console`; None: this process's terminal)."""
    deadline = None if wait is None else time.monotonic() + wait
    spark, created = spark_session(master, conf, planned_sends=planned_sends, jvm_log=jvm_log)
    try:
        if deadline is not None:  # the tiny history of the warm-up is a local directory
            prestart.prepare(spark, history_uri, deadline, analyze=analyze, warm_file=warm_file,
                             warm=(master or "").startswith("local"))
        closed = time.monotonic()
        result = analyze(spark, history_uri, out_uri, allow_incomplete=allow_incomplete)
    finally:
        if created and deadline is None:
            spark.stop()
    print(report.summary_text(result), flush=True)
    if deadline is not None:
        prestart.finish(closed)
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
    fresh_lambda_names(spark)  # the same history's queries compile to the same classes
    with keeping_observations(spark):
        return _analyze(spark, history, out_uri)


def _series(written: DataFrame, history: History, grid: Grid
            ) -> tuple[report.Series, list[tuple[int, int, float]], dict[str, Any]]:
    """The send series on `grid` (invocations and completions per bucket, the latency cells),
    the latency histogram, and the first invoke, the last completion and the last read, from
    the series rows `_write_checked` wrote; the malformed lines of sends and reads go to
    `history`. Bounded by the grid (`grid.series_grid`: at most about 100,000 buckets and 1,000 cell
    columns, each with a few dozen latency cells)."""
    rows = (written.filter(~F.col("part").isin(VALUE_PART, TRUNCATION_PART, FINDINGS_PART))
            .select(*SERIES_COLUMNS).collect())
    other = [r for r in rows if r["part"] == "other"]
    history.count_malformed("sends", sum(r["bad_sends"] for r in other))
    history.count_malformed("reads", sum(r["bad_reads"] for r in other))
    buckets = [r for r in rows if r["part"] == "time"]
    histogram = [(r["bucket"], r["acked"], r["max_ms"]) for r in rows if r["part"] == "latency"]
    cells = sorted((r["column"], r["bucket"], outcome, r[outcome]) for r in rows
                   if r["part"] == "cell" for outcome in report.OUTCOMES if r[outcome])
    times = {"first": min((r["first"] for r in buckets if r["first"] is not None), default=None),
             "last": max((r["last"] for r in buckets), default=None),
             "last_read": max((r["last"] for r in other), default=None)}
    series = report.Series(grid, sorted(
        (r["bucket"], r["attempted"], r["acked"], r["failed"], r["indeterminate"])
        for r in buckets), cells)
    return series, histogram, times


def _grid(history: History) -> Grid:
    """The send series' grid (`grid.series_grid`), counted from the report's zero
    (`report.clock_zero`, so that its buckets start at round times there), for the run's
    span: to meta.json's end, else (an interrupted run) to the last fault or cluster sample;
    unknown without a start."""
    zero = report.clock_zero(history.meta, None)
    end = _end(history, None) if history.meta.get("start") else None
    return series_grid(zero, None if end is None else end - zero)


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
         "healed_s": None if r["healed"] is None else round(r["healed"] - t0, 3),
         "end_s": round(r["end"] - t0, 3)}
        for i, r in enumerate(rows, start=1)
    ]


def _write_checked(written: DataFrame, inconsistent_obs: Observation, scratch: str) -> int:
    """Run every record checker and the send series in one query (`checked`): one parse, one
    shuffle.

    The query writes to `scratch` the noteworthy values (part VALUE_PART), the series rows
    (parts "time", "latency", "cell" and "other", on the grid), when there are truncations
    (events with an `id`) the acknowledged records at their offsets (part TRUNCATION_PART)
    and, with a consumer group or transactions, their checkers' findings (part
    FINDINGS_PART, from scans of their own), all few, and returns the number of inconsistent
    offsets (an Observation of the few positions). Nothing is observed line by line or value
    by value: malformed lines are counted in the series, the other counts come from the
    written rows (`_counts`) and topic names from `topics.topic_names`.
    """
    written.write.mode("overwrite").parquet(scratch)
    return int(inconsistent_obs.get["inconsistent_offsets"])


def checked(history: History, grid: Grid, truncations: DataFrame | None,
            group: Group | None, txns: Transactions | None) -> tuple[DataFrame, Observation]:
    """The rows `_write_checked` writes, and the Observation that counts the inconsistent offsets
    once they are written."""
    inconsistent_obs = Observation("undertow-inconsistent")
    by_value = checks.by_value(checks.events(history.lines("sends"), history.lines("reads")))
    inconsistent = checks.inconsistent_offsets(by_value).observe(
        inconsistent_obs, F.count("*").alias("inconsistent_offsets"))
    committed = None if group is None else groups.committed_positions(group.actions)
    classified = checks.classify(checks.positions_by_value(by_value), inconsistent, committed)
    values = checks.noteworthy(classified).withColumn("part", F.lit(VALUE_PART))
    series = checks.send_series(by_value, grid).withColumnRenamed("kind", "part")
    written = values.unionByName(series, allowMissingColumns=True)
    if truncations is not None:
        cut = checks.acked_in_truncations(by_value, checks.truncation_ranges(truncations))
        written = written.unionByName(cut.withColumn("part", F.lit(TRUNCATION_PART)),
                                      allowMissingColumns=True)
    found = [*([groups.findings(group)] if group is not None else []),
             *([transactions.findings(txns)] if txns is not None else [])]
    for rows in found:
        written = written.unionByName(rows.withColumn("part", F.lit(FINDINGS_PART)),
                                      allowMissingColumns=True)
    return written, inconsistent_obs


def _counts(written: DataFrame, series: report.Series, inconsistent_offsets: int,
            grouped: bool, transactional: bool) -> dict[str, int]:
    """Every count of the report from the noteworthy values and the checkers' findings
    `_write_checked` wrote (one aggregation over both) and the number of send attempts in the
    series (see `checks.value_counts`); a history without a consumer group (transactions) has
    no group (transaction) finding."""
    rows = written.filter(F.col("part").isin(VALUE_PART, FINDINGS_PART))
    kinds = (GROUP_KINDS if grouped else ()) + (TXN_KINDS if transactional else ())
    found = [F.count(F.when(F.col("kind") == k.name, 1)).alias(k.count) for k in kinds]
    row = {k.count: 0 for k in GROUP_KINDS + TXN_KINDS} | rows.agg(
        *checks.value_counts(rows), *found).first().asDict()
    attempted = series.attempts - row.pop("retries")
    counts = {**row, "attempted": attempted, "inconsistent_offsets": inconsistent_offsets,
              "acked": attempted - row["failed"] - row["indeterminate"]}
    return {name: int(counts[name]) for name in report.COUNT_NAMES}


def _write_anomalies(spark: SparkSession, values: DataFrame, group: Group | None,
                     found: DataFrame | None, names: dict[int, str], faults: list[dict[str, Any]],
                     t0: float, t_end: float, uri: str, scratch: str) -> None:
    """anomalies/: the anomalous ones of the values `_write_checked` wrote, one row per kind,
    with their positions named, and the checkers' findings it wrote (`found`), each with the
    fault active when it was sent (a checker's finding: at its kind's `fault_at`).

    The fault intervals reach Spark as a JSON Lines file next to `scratch` rather than as
    Python rows: a soak has thousands, and Python rows would start a Python worker."""
    intervals_uri = scratch + "-intervals.jsonl"
    lines = (json.dumps({"start": s, "end": e, "fault": f}) + "\n"
             for s, e, f in report.fault_intervals(faults))
    write_bytes(spark, intervals_uri, "".join(lines).encode())
    intervals = spark.read.schema("start double, end double, fault string").json(intervals_uri)
    width = max(1.0, (t_end - t0) / FAULT_BUCKETS)
    rows = checks.value_anomalies(values, names)
    if group is not None:
        rows = groups.with_first_commit_past(rows, group.actions)
    if found is not None:
        rows = rows.unionByName(found)
    (checks.with_active_fault(rows.withColumn("_at", _fault_time()), intervals, width, "_at")
     .drop("_at").write.mode("overwrite").parquet(uri))


def _fault_time() -> Column:
    """The time at which an anomalies/ row names the fault active (its kind's `fault_at`)."""
    return F.coalesce(*[F.when(F.col("kind") == k.name, F.col(k.fault_at))
                        for k in anomalies.KINDS])


def _examples(written: DataFrame) -> tuple[list[dict], list[dict]]:
    """The earliest-sent MAX_LOST_ROWS lost records and MAX_OTHER_ROWS of every other kind."""
    order = [F.col("t_invoke").asc_nulls_last(), F.col("t_read").asc_nulls_last(), "value"]
    rank = F.row_number().over(Window.partitionBy("kind").orderBy(*order))
    limit = F.when(F.col("kind") == "lost", MAX_LOST_ROWS).otherwise(MAX_OTHER_ROWS)
    rows = [r.asDict() for r in written.withColumn("_rank", rank).filter(F.col("_rank") <= limit)
            .drop("_rank").orderBy("kind", *order).collect()]
    return [r for r in rows if r["kind"] == "lost"], [r for r in rows if r["kind"] != "lost"]


def _cluster(history: History, t0: float, width: float) -> tuple[list[dict], list[dict]]:
    """Offline windows' rows and per-bucket ISR sizes (cluster.jsonl is small next to sends)."""
    cluster = history.valid("cluster")
    offline = [r.asDict() for r in checks.offline_windows(cluster).collect()]
    isr = [r.asDict() for r in checks.isr_per_bucket(cluster, t0, width).collect()]
    return offline, isr


def _truncation_records(written: DataFrame, values: DataFrame,
                        stuck: DataFrame | None) -> dict[int, dict[str, int]]:
    """Per truncation id, the acknowledged records it cut and their fate
    (`checks.truncation_records`); nothing without truncations. A record lost behind a
    hanging transaction (`stuck`: `attribution.stuck_offsets`) is on the other replicas:
    no truncation took it."""
    if "cut_at" not in written.columns:
        return {}
    candidates = written.filter(F.col("part") == TRUNCATION_PART).select(
        "id", "broker", "t_trunc", "value", "cut_at", "t_acked", "after_cut")
    if stuck is not None:
        h = F.broadcast(stuck.select(
            checks.topic_key(F.col("topic")).alias("_h_tk"),
            checks.packed_position(F.col("partition"), F.lit(0)).alias("_h_lo"),
            checks.packed_position(F.col("partition"), F.col("hanging_lso")).alias("_h_pos")))
        at = F.col("acked_at")
        behind = ((at["tk"] == h["_h_tk"]) & (at["pos"] >= h["_h_pos"])
                  & (at["pos"] < h["_h_lo"] + (1 << checks.OFFSET_BITS)))
        values = values.join(h, behind, "left_anti")
    return {r["id"]: {k: r[k] for k in ("acked", "lost", "lost_before", "kept")}
            for r in checks.truncation_records(candidates, values).collect()}


def _acks_one(meta: dict[str, Any]) -> bool:
    """The producers used acks=1 (meta.json's spec.workload.acks)."""
    spec = meta.get("spec")
    workload = spec.get("workload") if isinstance(spec, dict) else None
    return isinstance(workload, dict) and str(workload.get("acks")) == "1"


def _explain(history: History, anomaly_rows: DataFrame, counts: dict[str, int],
             cut_records: dict[int, dict[str, int]], faults: list[dict[str, Any]], t0: float,
             drain_short: list[dict[str, Any]], cuts: Callable[[], list[dict[str, Any]]],
             stuck: DataFrame | None) -> dict[str, Any]:
    """The loss incidents (of records and of committed offsets), the truncations and the
    duplicates (`attribution`, `offsets`, `explain`) of `anomaly_rows` (anomalies/); none
    without events.jsonl. A run with nothing to explain (no anomaly of a kind explained by
    an incident, none by a retry, no committed offset lost) runs no attribution for it.
    `cuts`: the rows of the truncations (`attribution.truncations`), collected while the
    checks ran (`_start_early`); `stuck`: a transactional history's stuck last stable
    offsets (`attribution.stuck_offsets`), None elsewhere."""
    if history.parsed["events"] is None:
        return explain.WITHOUT_EVENTS
    events = history.usable("events")
    spark = events.sparkSession
    # Each query is built here, one after the other, with its lambdas numbered from 1
    # (`fresh_lambda_names`), and only collected in threads: built in the threads, their
    # lambdas' names, and so their generated classes, would change from one analysis to
    # the next with the threads' order.
    queries: list[DataFrame | None] = []
    for wanted, build in (
            (_to_explain(counts, anomalies.INCIDENT), lambda: attribution.incidents(
                attribution.attribute(
                    attribution.subjects(anomaly_rows), events, _acks_one(history.meta),
                    stuck))),
            (_to_explain(counts, anomalies.RETRY), lambda: attribution.duplicate_groups(
                anomaly_rows, events, bool(history.meta.get("idempotent")))),
            (_to_explain(counts, anomalies.OFFSETS), lambda: offsets.commit_losses(
                anomaly_rows, events, groups.consumer_group(history.meta)))):
        fresh_lambda_names(spark)
        queries.append(build() if wanted else None)
    # A transactional history's EndTxn requests, each paired with the client's transactions.
    txn_queries = late_requests.queries(events, history.usable("txns"), anomaly_rows) \
        if history.has_lines("txns") else (None, None, None)
    found, dups, lost_commits, cut_rows, ends, txns, txn_anomalies = _concurrently(
        *(functools.partial(_rows, query, recursive=nested)
          for query, nested in zip(queries, (True, False, True), strict=True)), cuts,
        *(functools.partial(_rows, query, recursive=False) for query in txn_queries))
    none = dict.fromkeys(("acked", "lost", "lost_before", "kept"), 0)
    cut = [{**r, **cut_records.get(r["id"], none)} for r in cut_rows]
    return explain.explanations(found, cut, faults, t0, drain_short, dups, lost_commits,
                                groups.consumer_group(history.meta),
                                late_requests.pair(ends, txns, txn_anomalies))


def _start_early(pool: ThreadPoolExecutor, history: History, cuts: DataFrame | None,
                 group: Group | None) -> dict[str, Callable[[], Any]]:
    """Start, in `pool`, the parts of the report that need the history alone, while the
    one pass over sends and reads (`_write_checked`) runs: the fault windows, the cluster's rows,
    the timeline's marks, the truncations' rows (`cuts`, built by the caller) and the
    count of the group lines. Each is mostly a job's fixed cost on the driver (planning,
    code generation, scheduling), which the pass's tasks leave room for. Returns a wait for
    each result, by name; the fault windows, the cluster's rows and the marks only when
    meta.json alone gives the clock's zero and the run's end (`_clock_from_meta`), else the
    caller computes them once the pass gave the first and last sends."""
    started = {}
    if cuts is not None:
        started["cuts"] = pool.submit(_rows, cuts, recursive=False)
    started["group lines"] = pool.submit(_count_group_lines, history, group)
    clock = _clock_from_meta(history.meta)
    if clock is not None:
        t0, t_end = clock
        width = float(max(1, math.ceil((t_end - t0) / PLOT_BUCKETS)))
        started["faults"] = pool.submit(_faults, history, t0, t_end)
        started["cluster"] = pool.submit(_cluster, history, t0, width)
        started["marks"] = pool.submit(_marks, history, t0)
    return {name: future.result for name, future in started.items()}


def _consumption(history: History, group: Group) -> dict[str, Any]:
    """report.json's `consumption` (`consumption.summary`) of the experiment's topic, every
    partition of it (the spec's count; without one, those the group held)."""
    name = topics.spec_topic(history.meta)
    spec = history.meta.get("spec")
    topic = spec.get("topic") if isinstance(spec, dict) else None
    count = topic.get("partitions") if isinstance(topic, dict) else None
    held = group.actions.filter(F.col("type") == "assign").select("topic", "partition") \
        .distinct().collect()
    if name is None:
        name = held[0]["topic"] if held else ""
    partitions = (list(range(count)) if isinstance(count, int) and not isinstance(count, bool)
                  else sorted({r["partition"] for r in held if r["topic"] == name}))
    workload = spec.get("workload") if isinstance(spec, dict) else None
    consumer = workload.get("consumer") if isinstance(workload, dict) else None
    protocol = consumer.get("groupProtocol") if isinstance(consumer, dict) else None
    return consumption.summary(group, history.usable("sends"), name, partitions,
                               report.UNAVAILABLE_MIN_S, protocol or "classic")


def _clock_from_meta(meta: dict[str, Any]) -> tuple[float, float] | None:
    """The report's zero and the run's end (t0, t_end) as `_analyze` computes them, when
    meta.json alone gives them (its workload_start or start, and its end): they do not
    depend on the first and last sends then."""
    known = [meta.get(k) for k in ("workload_start", "start")]
    if meta.get("end") is None or not any(
            isinstance(v, int | float) and not isinstance(v, bool) for v in known):
        return None
    t0 = report.clock_zero(meta, None)
    return t0, max(float(meta["end"]), t0)


def _rows(query: DataFrame | None, *, recursive: bool) -> list[dict[str, Any]]:
    """The rows of `query` as dicts (`recursive`: nested rows too); none for a query not
    wanted."""
    return [] if query is None else [r.asDict(recursive=recursive) for r in query.collect()]


def _to_explain(counts: dict[str, int], how: str) -> bool:
    """Some record is of an anomaly kind the attribution explains `how` (`Kind.explained_by`)."""
    return any(counts[k.count] for k in anomalies.explained_by(how))


def _marks(history: History, t0: float) -> list[dict[str, Any]]:
    """The events the timeline marks: elections, fences, truncations, the consumer group's
    rebalances and generations, and its coordinator's moves; of the internal topics
    (__consumer_offsets), only the events of the group's own partition."""
    if history.parsed["events"] is None:
        return []
    group = groups.consumer_group(history.meta)
    internal = (F.col("type") == "coordinator_load") | F.coalesce(
        F.col("topic").startswith("__"), F.lit(False))
    ours = (F.lit(False) if group is None else
            (F.col("topic") == group["offsets_topic"])
            & (F.col("partition") == group["offsets_partition"]))
    return [{**r.asDict(), "t_s": r["t"] - t0} for r in history.valid("events")
            .filter(F.col("type").isin(*plots.EVENT_MARKS) & (~internal | ours))
            .select("t", "type", "kind", "broker", "leader", "group", "generation",
                    "leader_recovery_state").collect()]


def _brokers(meta: dict[str, Any]) -> int | None:
    """The cluster's number of brokers (meta.json's cluster.brokers), if it says."""
    cluster = meta.get("cluster")
    brokers = cluster.get("brokers") if isinstance(cluster, dict) else None
    return brokers if isinstance(brokers, int) and not isinstance(brokers, bool) else None


def _count_group_lines(history: History, group: Group | None) -> None:
    """Count the malformed lines of groups.jsonl, which the group checks read with `usable`
    (nothing to count without a group)."""
    if group is not None:
        history.valid("groups").agg(F.count("*")).collect()


def _concurrently(*calls: Callable[[], Any]) -> list[Any]:
    """The results of independent Spark actions on small data, run from threads at once:
    each is mostly the driver's fixed cost of a job (planning, code generation, scheduling),
    which then overlaps, and their few tasks share the cores."""
    with ThreadPoolExecutor(max_workers=len(calls), thread_name_prefix="undertow-job") as pool:
        return [f.result() for f in [pool.submit(call) for call in calls]]


def _analyze(spark: SparkSession, history: History, out_uri: str) -> dict[str, Any]:
    meta = history.meta
    drain_short = report.drain_shortfalls(meta.get("drain"), topics.spec_topic(meta))
    outputs = {name: child(out_uri, name) for name in ("report.json", "report.html", "anomalies")}
    scratch = child(out_uri, "scratch")  # Spark ignores paths named _*
    truncations = attribution.dropped(history.usable("events")) \
        if history.parsed["events"] is not None else None
    groups.consumer_group(meta)  # a consumer_group of another shape is bad input, said first
    group = groups.group_history(history)
    txns = transactions.txn_history(history)
    grid = _grid(history)
    # Every query is built in this thread, one after the other, each with its lambdas
    # numbered from 1 (`fresh_lambda_names`); only their actions run in the pool's: the main
    # pass, the parts `_start_early` starts, and the truncations' records.
    with ThreadPoolExecutor(max_workers=7, thread_name_prefix="undertow-job") as pool:
        readers = [pool.submit(_write_checked,
                               *checked(history, grid, truncations, group, txns), scratch)]
        try:
            cuts = None
            if truncations is not None:
                fresh_lambda_names(spark)  # a query of its own (`_explain`)
                cuts = attribution.truncations(history.usable("events"))
            early = _start_early(pool, history, cuts, group)
            inconsistent_offsets = readers[0].result()
            written = spark.read.parquet(scratch)
            series, latency, send_times = _series(written, history, grid)
            values = written.filter(F.col("part") == VALUE_PART).drop(
                *SERIES_COLUMNS, "id", "broker", "t_trunc", "cut_at", "after_cut",
                *FINDING_COLUMNS)
            found = written.filter(F.col("part") == FINDINGS_PART).select("kind", *FINDING) \
                if group is not None or txns is not None else None
            counts = _counts(written, series, inconsistent_offsets, group is not None,
                             txns is not None)
            t0 = report.clock_zero(meta, send_times["first"])
            t_end = max(_end(history, send_times["last"]) or t0, t0)
            width = float(max(1, math.ceil((t_end - t0) / PLOT_BUCKETS)))
            # Without an anomaly anomalies/ is empty, and nothing needs naming.
            anomalous = any(counts[name] for name in anomalies.COUNTS)
            stuck = attribution.stuck_offsets(history.usable("cluster")) \
                if txns is not None else None
            readers.append(pool.submit(_truncation_records, written, values, stuck))
            faults, names, (offline, isr), marks = _concurrently(
                early.get("faults", lambda: _faults(history, t0, t_end)),
                lambda: topics.topic_names(history, values) if anomalous else {},
                early.get("cluster", lambda: _cluster(history, t0, width)),
                early.get("marks", lambda: _marks(history, t0)))
            _write_anomalies(spark, values, group, found, names, faults, t0, t_end,
                             outputs["anomalies"], scratch)
            cut_records = readers[1].result()
        finally:
            # Whatever failed, the main pass and the truncations' records end before the
            # scratch they write and read is deleted.
            futures.wait(readers)
            delete(spark, scratch)
            delete(spark, scratch + "-intervals.jsonl")
        anomaly_rows = spark.read.parquet(outputs["anomalies"])

        def reported() -> tuple[dict[str, Any], list[dict], list[dict], bytes]:
            """The report but its explanations, with the earliest lost records and the
            timeline, drawn while the explanations are queried."""
            for wait in early.values():
                wait()  # the group lines' count, which `history.malformed` needs
            lost, other = _examples(anomaly_rows) if anomalous else ([], [])
            consumed = None if group is None else _consumption(history, group)
            result = report.build(
                meta, history=history.uri, outputs=outputs, counts=counts, series=series,
                latency=latency, t0=t0, t_end=t_end, last_read=send_times["last_read"],
                faults=faults, offline=offline, first_lost=lost[0] if lost else None,
                malformed=history.malformed(), drain_short=drain_short, consumption=consumed)
            png = plots.timeline_png(
                series=series, t0=t0, t_end=t_end, clock=result.get("clock"), isr=isr,
                isr_width=width, faults=result["faults"],
                unavailable=result["unavailable_windows"],
                lost_t=[r["t_acked"] - t0 for r in lost if r["t_acked"] is not None],
                events=marks, brokers=_brokers(meta),
                unconsumed=[(s["start_s"], s["end_s"])
                            for s in (consumed or {}).get("stretches", [])])
            return result, lost, other, png

        explained, (result, lost, other, png) = _concurrently(
            lambda: _explain(history, anomaly_rows, counts, cut_records, faults, t0,
                             drain_short, early.get("cuts", lambda: _rows(cuts, recursive=False)),
                             stuck),
            reported)
    result = report.explained(result, explained)
    write_bytes(spark, outputs["report.json"], report.to_json(result))
    write_bytes(spark, outputs["report.html"],
                html.render(result, timeline_png=png, lost=lost, other=other).encode())
    return result
