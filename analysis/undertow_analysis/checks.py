"""The checkers: pure functions from history DataFrames to findings DataFrames.

Jepsen's habit, on Spark: nothing here collects or writes; every join and aggregation stays in
the cluster, so a week-long soak is checked by the same code as a two-minute local run.

A record is identified by its value (unique per send). A log position is (topic, partition,
offset): the topic is part of the key everywhere.
"""

from __future__ import annotations

from functools import reduce
from operator import and_

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

POSITION = ("topic", "partition", "offset")

INCONSISTENT = "inconsistent_offset"
# Anomaly kinds (one anomalies/ row per value and kind) and the name of their count.
KINDS = {
    "lost": "lost",
    "misplaced": "misplaced",
    "phantom_read": "phantom_reads",
    INCONSISTENT: "inconsistent_offsets",
    "duplicate": "duplicates",
    "aborted_read": "aborted_reads",
    "unexpected": "unexpected",
}
OUTCOMES = ("acked", "failed", "indeterminate")


SEND, RUN, DRAIN = 0, 1, 2


def _position() -> Column:
    return F.struct(*POSITION)


def _show(position: Column) -> Column:
    """A position as 't-0@17'."""
    return F.concat(position["topic"], F.lit("-"), position["partition"], F.lit("@"),
                    position["offset"])


def events(sends: DataFrame, reads: DataFrame) -> DataFrame:
    """Sends and reads as one table: value, src (SEND, RUN, DRAIN), status, position, t_invoke."""
    return sends.select("value", F.lit(SEND).alias("src"), "status", *POSITION, "t_invoke") \
        .unionByName(reads.select(
            "value", F.when(F.col("phase") == "drain", DRAIN).otherwise(RUN).alias("src"),
            F.lit(None).cast("string").alias("status"), *POSITION,
            F.lit(None).cast("double").alias("t_invoke")))


def positions_by_value(sends: DataFrame, reads: DataFrame) -> DataFrame:
    """One row per (value, position) that a send or read mentions: n_ok / n_info / n_sends
    (send attempts there; a send that got no offset has a null offset), drained, run_read,
    t_invoke (first attempt there).

    The whole history is shuffled once, by value: every later per-value step reuses that
    partitioning, so the checkers cost one shuffle of the history plus small ones.
    """
    status, src = F.col("status"), F.col("src")
    return events(sends, reads).repartition("value").groupBy("value", *POSITION).agg(
        F.count(F.when(status == "ok", 1)).alias("n_ok"),
        F.count(F.when(status == "info", 1)).alias("n_info"),
        F.count(F.when(src == SEND, 1)).alias("n_sends"),
        F.max(src == DRAIN).alias("drained"),
        F.max(src == RUN).alias("run_read"),
        F.min("t_invoke").alias("t_invoke"),
    )


def inconsistent_offsets(positions: DataFrame) -> DataFrame:
    """Positions at which reads (any phase) saw two or more different values: topic,
    partition, offset, n_values."""
    read = F.col("drained") | F.col("run_read")
    # Always true, but it mentions every column of `positions`: the optimizer then prunes
    # nothing here, and `classify`, the other consumer, shares this one scan and shuffle
    # (Spark reuses an exchange only when the plans below it are identical).
    every_column = F.hash(*positions.columns) >= F.lit(-(2**31))
    return (positions.filter(read & every_column).groupBy(*POSITION)
            .agg(F.count("*").alias("n_values")).filter(F.col("n_values") >= 2))


def classify(positions: DataFrame, inconsistent: DataFrame) -> DataFrame:
    """Per value: outcome, t_invoke, one boolean column per anomaly kind, and the positions
    that explain them.

    outcome: `acked` if any attempt was ok; else `failed` if every attempt failed
    definitively; else `indeterminate` (an attempt timed out: it may have been written); null
    for a value never sent. lost: acked, nowhere in the drain. misplaced: acked and drained,
    but never at a position an acknowledgement gave. phantom_read: read during the run,
    nowhere in the drain. inconsistent_offset: read at a position where another value was
    read too. duplicate: drained at two or more positions. aborted_read: every attempt
    failed, yet read. unexpected: read, never sent. indeterminate_committed /
    indeterminate_lost: indeterminate and drained / not drained (never loss).
    """
    # Broadcast: inconsistent positions are few, and joining without a shuffle keeps
    # `positions` partitioned by value for the aggregation below.
    # Null-safe keys, so the optimizer infers no not-null filter to push into this branch only.
    bad = F.broadcast(inconsistent.select(*[F.col(c).alias(f"_{c}") for c in POSITION]))
    marked = positions.join(
        bad, reduce(and_, [positions[c].eqNullSafe(bad[f"_{c}"]) for c in POSITION]), "left"
    ).select(*positions.columns, bad["_offset"].isNotNull().alias("inconsistent"))
    here = _position()
    ok_here, drained, run_read = F.col("n_ok") > 0, F.col("drained"), F.col("run_read")
    v = marked.groupBy("value").agg(
        F.sum("n_ok").alias("n_ok"), F.sum("n_info").alias("n_info"),
        F.sum("n_sends").alias("n_sends"),
        F.count(F.when(drained, 1)).alias("n_drained"),
        F.max(ok_here & drained).alias("placed"),
        F.min("t_invoke").alias("t_invoke"),
        F.min(F.when(ok_here, here)).alias("acked_at"),
        F.min(F.when(drained, here)).alias("drained_at"),
        F.max(F.when(drained, here)).alias("drained_last"),
        F.min(F.when(run_read, here)).alias("run_read_at"),
        F.min(F.when(drained | run_read, here)).alias("read_at"),
        F.min(F.when(F.col("inconsistent"), here)).alias("inconsistent_at"),
    )
    outcome = (F.when(F.col("n_sends") == 0, F.lit(None))
               .when(F.col("n_ok") > 0, "acked")
               .when(F.col("n_info") > 0, "indeterminate")
               .otherwise("failed"))
    v = v.withColumn("outcome", outcome)
    acked, is_drained = F.col("outcome") == "acked", F.col("n_drained") > 0
    indeterminate = F.col("outcome") == "indeterminate"
    flags = {
        "lost": acked & ~is_drained,
        "misplaced": acked & is_drained & ~F.col("placed"),
        "phantom_read": F.col("run_read_at").isNotNull() & ~is_drained,
        "inconsistent_offset": F.col("inconsistent_at").isNotNull(),
        "duplicate": F.col("n_drained") > 1,
        "aborted_read": (F.col("outcome") == "failed") & F.col("read_at").isNotNull(),
        "unexpected": F.col("outcome").isNull() & F.col("read_at").isNotNull(),
        "indeterminate_committed": indeterminate & is_drained,
        "indeterminate_lost": indeterminate & ~is_drained,
    }
    return v.select(
        "value", "outcome", "t_invoke", "n_drained", "acked_at", "drained_at", "drained_last",
        "run_read_at", "read_at", "inconsistent_at",
        *[F.coalesce(cond, F.lit(False)).alias(name) for name, cond in flags.items()],
    )


def value_counts(classified: DataFrame) -> list[Column]:
    """Aggregate columns counting each outcome and flag of `classify`, named as in the report
    (inconsistent_offsets counts positions: see `inconsistent_offsets`)."""
    counts = [F.count("outcome").alias("attempted")]
    counts += [F.count(F.when(F.col("outcome") == o, 1)).alias(o) for o in OUTCOMES]
    counts += [F.count(F.when(F.col(k), 1)).alias(name) for k, name in KINDS.items()
               if k != INCONSISTENT]
    counts += [F.count(F.when(F.col(k), 1)).alias(k)
               for k in ("indeterminate_committed", "indeterminate_lost")]
    return counts


def value_anomalies(classified: DataFrame) -> DataFrame:
    """One row per (anomalous value, kind): kind, topic, partition, offset, value, t_invoke,
    detail. The position is the one the acknowledgement gave (lost, misplaced, duplicate of an
    acked record), the inconsistent one, or where a read found the record."""
    kinds = F.filter(F.array(*[F.when(F.col(k), F.lit(k)) for k in KINDS]),
                     lambda k: k.isNotNull())
    kind = F.col("kind")
    position = (
        F.when(kind.isin("lost", "misplaced"), F.col("acked_at"))
        .when(kind == "duplicate", F.coalesce("acked_at", "drained_at"))
        .when(kind == "phantom_read", F.col("run_read_at"))
        .when(kind == INCONSISTENT, F.col("inconsistent_at"))
        .otherwise(F.col("read_at"))
    )
    drained = F.concat(
        F.lit("drained at "), _show(F.col("drained_at")),
        F.when(F.col("n_drained") > 1,
               F.concat(F.lit(" ... "), _show(F.col("drained_last")), F.lit(" ("),
                        F.col("n_drained"), F.lit(" positions)"))).otherwise(F.lit("")))
    detail = (
        F.when(kind == "lost", F.lit("acknowledged, missing from the drain"))
        .when(kind.isin("misplaced", "duplicate"), drained)
        .when(kind == "phantom_read", F.lit("read during the run, missing from the drain"))
        .when(kind == INCONSISTENT, F.lit("another value was read at this offset"))
        .when(kind == "aborted_read", F.lit("every send attempt failed, yet it was read"))
        .otherwise(F.lit("read, but never sent"))
    )
    return (
        classified.filter(F.size(kinds) > 0)
        .select("*", F.explode(kinds).alias("kind"))
        .select("kind", position.alias("p"), "value", "t_invoke", detail.alias("detail"))
        .select("kind", "p.*", "value", "t_invoke", "detail")
    )


def fault_windows(faults: DataFrame, run_end: float) -> DataFrame:
    """One row per injected fault: fault, target, role, start, end, recovered.

    The n-th inject of a (fault, target) pairs with its n-th recover; an inject without a
    recover (the run died first) lasts to `run_end`.
    """
    numbered = faults.withColumn(
        "n", F.row_number().over(Window.partitionBy("fault", "target", "action").orderBy("t")))
    injects = numbered.filter(F.col("action") == "inject").select(
        "fault", "target", "role", "n", F.col("t").alias("start"))
    recovers = numbered.filter(F.col("action") == "recover").select(
        "fault", "target", "n", F.col("t").alias("end"))
    return injects.join(recovers, ["fault", "target", "n"], "left").select(
        "fault", "target", F.coalesce("role", F.lit("")).alias("role"), "start",
        F.coalesce("end", F.lit(float(run_end))).alias("end"),
        F.col("end").isNotNull().alias("recovered"),
    )


def with_active_fault(df: DataFrame, intervals: DataFrame, width: float,
                      t_col: str = "t_invoke") -> DataFrame:
    """Add `fault`: the label of the interval of `intervals` (start, end, fault; disjoint)
    that contains `t_col`, or null.

    A range join, made an equi-join on `width`-second buckets: each interval is exploded into
    the buckets it touches, and the (small) interval table is broadcast.
    """
    buckets = intervals.select(
        F.explode(F.sequence(F.floor(F.col("start") / width).cast("long"),
                             F.floor(F.col("end") / width).cast("long"))).alias("_bucket"),
        F.col("start").alias("_start"), F.col("end").alias("_end"), F.col("fault"),
    )
    t = F.col(t_col)
    keyed = df.withColumn("_bucket", F.floor(t / width).cast("long"))
    cond = ((keyed["_bucket"] == buckets["_bucket"]) & (t >= buckets["_start"])
            & (t < buckets["_end"]))
    return keyed.join(F.broadcast(buckets), cond, "left").select(*df.columns, "fault")


def latency_ms() -> list[Column]:
    """Aggregate columns p50, p99, p999 of t_complete - t_invoke over acknowledged attempts,
    in ms: nearest-rank percentiles (percentile_approx, rank error 1e-4: exact on small runs).
    """
    ms = F.when(F.col("status") == "ok", (F.col("t_complete") - F.col("t_invoke")) * 1000.0)
    p = F.percentile_approx(ms, [0.5, 0.99, 0.999], 10_000)
    return [p[i].alias(name) for i, name in enumerate(("p50", "p99", "p999"))]


def sends_per_second(sends: DataFrame, t0: float) -> DataFrame:
    """second (since t0), attempted, acked: send attempts invoked in that second and how many
    of those were acknowledged; seconds without attempts have no row."""
    return sends.groupBy(F.floor(F.col("t_invoke") - t0).cast("long").alias("second")).agg(
        F.count("*").alias("attempted"), F.count(F.when(F.col("status") == "ok", 1)).alias("acked"))


def isr_per_bucket(cluster: DataFrame, t0: float, width: float) -> DataFrame:
    """topic, partition, bucket, isr (smallest ISR size sampled), offline (leader -1 sampled)."""
    return cluster.groupBy(
        "topic", "partition", F.floor((F.col("t") - t0) / width).cast("long").alias("bucket"),
    ).agg(F.min(F.size("isr")).alias("isr"), F.max(F.col("leader") == -1).alias("offline"))


def offline_windows(cluster: DataFrame) -> DataFrame:
    """topic, partition, start, end: maximal runs of samples with leader -1.

    A run ends at the first later sample with a leader, or at the partition's last sample.
    """
    tp = Window.partitionBy("topic", "partition").orderBy("t")
    offline = F.col("leader") == -1
    changes = (
        cluster.select("topic", "partition", "t", offline.alias("offline"),
                       F.lag(offline).over(tp).alias("was"),
                       F.max("t").over(Window.partitionBy("topic", "partition")).alias("last"))
        .filter(F.col("was").isNull() | (F.col("offline") != F.col("was")))
    )
    return (
        changes.withColumn("next", F.lead("t").over(tp))
        .filter("offline")
        .select("topic", "partition", F.col("t").alias("start"),
                F.coalesce("next", "last").alias("end"))
    )


def verdict(counts: dict[str, int], idempotent: bool) -> str:
    """`loss` if an acknowledged record is gone or moved, or a read was later contradicted;
    `anomalies` for reads of records never (successfully) sent, or duplicates despite an
    idempotent producer; otherwise `clean`."""
    if sum(counts[k] for k in ("lost", "misplaced", "phantom_reads", "inconsistent_offsets")):
        return "loss"
    if counts["aborted_reads"] + counts["unexpected"] or (idempotent and counts["duplicates"]):
        return "anomalies"
    return "clean"
