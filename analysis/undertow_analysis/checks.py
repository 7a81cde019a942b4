"""The checkers: pure functions from history DataFrames to findings DataFrames.

Jepsen's habit, on Spark: nothing here collects or writes; every join and aggregation stays in
the cluster, so a week-long soak is checked by the same code as a two-minute local run.

A record is identified by its value (unique per send). A log position (topic, partition,
offset) is carried as two longs: `tk`, the topic's 64-bit xxhash (`topic_key`), and `pos`,
partition << 40 | offset. Numeric positions keep every per-value aggregation buffer
fixed-width, so Spark hash-aggregates where a struct of strings would make it sort: after
parsing, the aggregations are the job's largest cost. Names come back only for the few
anomalous records (`value_anomalies`). Two topics of one history with the same 64-bit key would
count as one; with a handful of topics the odds are about 1e-19.

The anomaly kinds are the table `anomalies.KINDS`: `classify`, `value_counts` and
`value_anomalies` apply every row of it with a check of one value (`anomalies.VALUE_KINDS`);
the consumer group's checkers are `groups`'.

Long (about 570 lines) because the per-value aggregation is one Spark plan: the checks share
its intermediate DataFrames, and splitting them would hide which joins each one reuses.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import fields
from functools import reduce
from operator import or_

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from undertow_analysis.anomalies import VALUE_KINDS, Kind, Value
from undertow_analysis.grid import CELL_RATIO, Grid

# Event codes: the three outcomes of a send attempt, the two phases of a read, then a
# malformed line of sends.jsonl or reads.jsonl (counted, otherwise ignored).
OK, INFO, FAIL, RUN, DRAIN, BAD_SEND, BAD_READ = 0, 1, 2, 3, 4, 5, 6
OFFSET_BITS = 40
MAX_PARTITION = 2**23 - 1  # partition << OFFSET_BITS must stay a non-negative long
MAX_OFFSET = 2**40 - 1
LATENCY_RATIO = 1.001  # width of a latency bucket: 0.1 %
LATENCY_FLOOR_MS = 0.001


def topic_key(topic: Column) -> Column:
    """The 64-bit key standing for a topic name in positions (see the module docstring)."""
    return F.xxhash64(topic)


def packed_position(partition: Column, offset: Column) -> Column:
    """partition and offset as one long (null if either is): equal iff both are equal."""
    return F.shiftleft(partition.cast("long"), OFFSET_BITS).bitwiseOR(offset)


def events(sends: DataFrame, reads: DataFrame) -> DataFrame:
    """Sends and reads as one narrow table: value, tk, pos, code, t_invoke (sends only) and
    t_complete (a send's completion, a read's time: the report's last read comes from it).

    Both frames carry `malformed` (`History.lines`): a malformed line becomes a row of code
    BAD_SEND or BAD_READ without value or time, which `send_series` counts: counting them on the way
    through the one shuffle is cheaper than an Observation, which would split the scan's
    generated code in two and copy every line once more.
    """
    status = F.col("status")
    send_code = F.when(status == "ok", OK).when(status == "info", INFO).otherwise(FAIL)
    read_code = F.when(F.col("phase") == "drain", DRAIN).otherwise(RUN)

    def narrow(df: DataFrame, code: Column, bad_code: int, t_invoke: Column,
               t_complete: Column) -> DataFrame:
        good = ~F.col("malformed")
        return df.select(F.when(good, F.col("value")).alias("value"),
                         topic_key(F.col("topic")).alias("tk"),
                         packed_position(F.col("partition"), F.col("offset")).alias("pos"),
                         F.when(good, code).otherwise(bad_code).cast("byte").alias("code"),
                         t_invoke.alias("t_invoke"),
                         F.when(good, t_complete).alias("t_complete"))

    return narrow(sends, send_code, BAD_SEND, F.col("t_invoke"), F.col("t_complete")).unionByName(
        narrow(reads, read_code, BAD_READ, F.lit(None).cast("double"), F.col("t")))


def by_value(events: DataFrame) -> DataFrame:
    """The history shuffled once, by value: `positions_by_value`, `inconsistent_offsets` and
    `send_series` all start from this one exchange, and every later per-value step keeps its
    partitioning."""
    return events.repartition("value")


def _every_column(df: DataFrame) -> Column:
    """Always true, but it mentions every column of `df`: a branch that uses it prunes no
    column and pushes no filter below, so its plan under the exchange of `by_value` is the
    same as the other branches' and Spark reuses that exchange instead of parsing again."""
    return F.hash(*df.columns) >= F.lit(-(2**31))


def positions_by_value(by_value: DataFrame) -> DataFrame:
    """One row per (value, tk, pos) that a send or read mentions: n_ok / n_info / n_sends
    (send attempts there; a send that got no offset has a null pos), drained, run_read (0 or
    1), t_invoke (first attempt there)."""
    code = F.col("code")
    return by_value.groupBy("value", "tk", "pos").agg(
        F.count(F.when(code == OK, 1)).alias("n_ok"),
        F.count(F.when(code == INFO, 1)).alias("n_info"),
        F.count(F.when((code <= FAIL) & _every_column(by_value), 1)).alias("n_sends"),
        F.max((code == DRAIN).cast("byte")).alias("drained"),
        F.max((code == RUN).cast("byte")).alias("run_read"),
        F.min("t_invoke").alias("t_invoke"),
        F.min(F.when(code == OK, F.col("t_complete"))).alias("t_acked"),
        F.min(F.when(code == RUN, F.col("t_complete"))).alias("t_read"),
    )


def inconsistent_offsets(by_value: DataFrame) -> DataFrame:
    """Positions (tk, pos) at which reads (any phase) saw two or more different values.

    Values are compared by their 64-bit xxhash; sends group under a null position, so no
    filter (which the optimizer would push below the shared exchange) is needed.
    """
    read = F.col("code").between(RUN, DRAIN)
    value_hash = F.when(read, F.xxhash64("value"))
    return (by_value.groupBy("tk", F.when(read & _every_column(by_value), F.col("pos"))
                             .alias("pos"))
            .agg(F.min(value_hash).alias("_lo"), F.max(value_hash).alias("_hi"))
            .filter(F.col("_lo") != F.col("_hi")).select("tk", "pos"))


POSITIONS = ("acked_at", "drained_at", "drained_last", "run_read_at", "read_at",
             "inconsistent_at")  # the (tk, pos) structs `classify` gives each value
POSITION_TYPE = "struct<tk:bigint,pos:bigint>"


def _at(cond: Column, last: bool = False) -> Column:
    """The first (or last) position (tk, pos) of a value's rows where `cond` holds: numeric
    aggregation buffers, so Spark hash-aggregates."""
    pos = F.when(cond, F.col("pos"))
    if last:
        return F.struct(F.max_by("tk", pos).alias("tk"), F.max(pos).alias("pos"))
    return F.struct(F.min_by("tk", pos).alias("tk"), F.min(pos).alias("pos"))


def value_columns() -> Value:
    """The columns of a value that the anomaly kinds' checks read (`anomalies.Value`)."""
    return Value(**{f.name: F.col(f.name) for f in fields(Value)})


def classify(positions: DataFrame, inconsistent: DataFrame,
             committed: DataFrame | None = None) -> DataFrame:
    """Per value: outcome, t_invoke, t_acked (the first acknowledgement), t_read (the first
    read during the run), n_drained, one boolean column per value check
    (`anomalies.VALUE_KINDS`), and the positions (structs of tk, pos) that explain them.

    `committed`: the consumer group's highest committed position per partition
    (`groups.committed_positions`), or None without a group. It gives each value its
    `committed_at`, by a broadcast join of the aggregated values with those few rows, which
    keeps their partitioning; without a group that column is a null literal and nothing is
    joined.

    outcome: `acked` if any attempt was ok; else `indeterminate` if an attempt timed out (it
    may have been written); else `failed` (every attempt failed definitively); null for a
    value never sent. indeterminate_committed / indeterminate_lost: indeterminate and drained
    / not drained (never loss).
    """
    # Broadcast: inconsistent positions are few, and joining without a shuffle keeps
    # `positions` partitioned by value for the aggregation below. Null-safe keys, so the
    # optimizer infers no not-null filter to push into the other branch only.
    bad = F.broadcast(inconsistent.select(F.col("tk").alias("_tk"), F.col("pos").alias("_pos")))
    marked = positions.join(
        bad, positions["tk"].eqNullSafe(bad["_tk"]) & positions["pos"].eqNullSafe(bad["_pos"]),
        "left",
    ).select(*positions.columns, bad["_pos"].isNotNull().alias("inconsistent"))
    ok_here, drained, run_read = F.col("n_ok") > 0, F.col("drained") == 1, F.col("run_read") == 1
    v = marked.groupBy("value").agg(
        F.sum("n_ok").alias("n_ok"), F.sum("n_info").alias("n_info"),
        F.sum("n_sends").alias("n_sends"),
        F.count(F.when(drained, 1)).alias("n_drained"),
        F.max((ok_here & drained).cast("byte")).alias("placed"),
        F.min("t_invoke").alias("t_invoke"),
        F.min("t_acked").alias("t_acked"),
        F.min("t_read").alias("t_read"),
        _at(ok_here).alias("acked_at"),
        _at(drained).alias("drained_at"),
        _at(drained, last=True).alias("drained_last"),
        _at(run_read).alias("run_read_at"),
        _at(drained | run_read).alias("read_at"),
        _at(F.col("inconsistent")).alias("inconsistent_at"),
    )
    outcome = (F.when(F.col("n_sends") == 0, F.lit(None))
               .when(F.col("n_ok") > 0, "acked")
               .when(F.col("n_info") > 0, "indeterminate")
               .otherwise("failed"))
    v = _with_committed_at(v.withColumn("outcome", outcome), committed)
    indeterminate, is_drained = F.col("outcome") == "indeterminate", F.col("n_drained") > 0
    value = value_columns()
    flags = {
        **{k.name: k.check(value) for k in VALUE_KINDS},
        "indeterminate_committed": indeterminate & is_drained,
        "indeterminate_lost": indeterminate & ~is_drained,
    }
    return v.select(
        "value", "outcome", "n_sends", "t_invoke", "t_acked", "t_read", "n_drained",
        *POSITIONS,
        *[F.coalesce(cond, F.lit(False)).alias(name) for name, cond in flags.items()],
    )


def _with_committed_at(values: DataFrame, committed: DataFrame | None) -> DataFrame:
    """`values` with committed_at: the position of the group's highest commit on the
    partition of each value's first drained position (`classify`)."""
    if committed is None:
        return values.withColumn("committed_at", F.lit(None).cast(POSITION_TYPE))
    c = F.broadcast(committed.select(F.col("tk").alias("_ctk"), F.col("partition").alias("_cp"),
                                     F.col("pos").alias("_cpos")))
    drained = F.col("drained_at")
    on = ((drained["tk"] == c["_ctk"])
          & (F.shiftright(drained["pos"], OFFSET_BITS).cast("int") == c["_cp"]))
    return values.join(c, on, "left").select(
        *values.columns, F.when(c["_cpos"].isNotNull(), F.struct(
            c["_ctk"].alias("tk"), c["_cpos"].alias("pos"))).alias("committed_at"))


def is_anomalous() -> Column:
    """True for a classified value with at least one anomaly kind."""
    return reduce(or_, [F.col(k.name) for k in VALUE_KINDS])


def noteworthy(classified: DataFrame) -> DataFrame:
    """The classified values the report needs one by one: every anomalous value, and every
    value not acknowledged at its only attempt (failed, indeterminate or retried).

    Few even in a lossy run, and with the number of send attempts they give every count
    (`value_counts`), so no count runs over all values: an Observation there would make
    Spark build every value's row, where only these few rows are built now.
    """
    return classified.filter(is_anomalous() | F.col("outcome").isin("failed", "indeterminate")
                             | (F.col("n_sends") > 1))


def value_counts(noteworthy: DataFrame) -> list[Column]:
    """Aggregate columns over the `noteworthy` values: `retries` (send attempts after each
    value's first), failed, indeterminate, and each flag, named as in the report (an anomaly
    kind by its `count`, but for one whose count is not of values: inconsistent_offsets
    counts positions, see `inconsistent_offsets`).

    Every value with more than one attempt or an outcome other than acked is noteworthy, so
    attempted = send attempts - retries and acked = attempted - failed - indeterminate.
    """
    counts = [F.coalesce(F.sum(F.greatest(F.col("n_sends") - 1, F.lit(0))), F.lit(0))
              .alias("retries")]
    counts += [F.count(F.when(F.col("outcome") == o, 1)).alias(o)
               for o in ("failed", "indeterminate")]
    counts += [F.count(F.when(F.col(k.name), 1)).alias(k.count) for k in VALUE_KINDS
               if k.counts_by_value]
    counts += [F.count(F.when(F.col(k), 1)).alias(k)
               for k in ("indeterminate_committed", "indeterminate_lost")]
    return counts


def _named(at: Column, topics: Mapping[int, str]) -> tuple[Column, Column, Column]:
    """topic, partition, offset of a (tk, pos) struct."""
    names = F.create_map(*[x for tk, name in topics.items()
                           for x in (F.lit(tk).cast("long"), F.lit(name))]) \
        if topics else F.create_map().cast("map<bigint,string>")
    pos = at["pos"]
    topic = F.coalesce(F.element_at(names, at["tk"]), F.concat(F.lit("#"), at["tk"]))
    return (F.when(pos.isNotNull(), topic),
            F.shiftright(pos, OFFSET_BITS).cast("int"),
            pos.bitwiseAND(F.lit(MAX_OFFSET)))


def _show(at: Column, topics: Mapping[int, str]) -> Column:
    """A position as 't-0@17'."""
    topic, partition, offset = _named(at, topics)
    return F.concat(topic, F.lit("-"), partition, F.lit("@"), offset)


def _by_kind(kind: Column, of: Callable[[Kind], Column]) -> Column:
    """`of(k)` for the row k of `anomalies.VALUE_KINDS` named `kind`."""
    first, *rest = VALUE_KINDS
    return reduce(lambda chosen, k: chosen.when(kind == k.name, of(k)), rest,
                  F.when(kind == first.name, of(first)))


def _first_known(names: tuple[str, ...]) -> Column:
    """The first of the position columns `names` that is known, else the last."""
    *first, last = names
    return reduce(lambda known, name: F.when(F.col(name)["pos"].isNotNull(), F.col(name))
                  .otherwise(known), reversed(first), F.col(last))


def value_anomalies(anomalous: DataFrame, topics: Mapping[int, str]) -> DataFrame:
    """One row per (anomalous value, kind) in anomalies/'s columns (`anomalies.FINDING`):
    kind, topic, partition, offset, value, t_invoke, t_acked, t_read, committed and t_commit
    (null: `groups.with_first_commit_past` gives them), detail, each kind's position and
    detail as its row of `anomalies.KINDS` says. `topics` maps the topic keys of `anomalous`
    to names (`topic_key`). Values without an anomaly give no row."""
    kinds = F.filter(F.array(*[F.when(F.col(k.name), F.lit(k.name)) for k in VALUE_KINDS]),
                     lambda k: k.isNotNull())
    kind = F.col("kind")
    drained = F.concat(
        F.lit("drained at "), _show(F.col("drained_at"), topics),
        F.when(F.col("n_drained") > 1,
               F.concat(F.lit(" ... "), _show(F.col("drained_last"), topics), F.lit(" ("),
                        F.col("n_drained"), F.lit(" positions)"))).otherwise(F.lit("")))
    position = _by_kind(kind, lambda k: _first_known(k.at))
    detail = _by_kind(kind, lambda k: drained if k.detail is None else F.lit(k.detail))
    topic, partition, offset = _named(F.col("p"), topics)
    return (
        anomalous.filter(F.size(kinds) > 0)
        .select("*", F.explode(kinds).alias("kind"))
        .select("kind", position.alias("p"), "value", "t_invoke", "t_acked", "t_read",
                detail.alias("detail"))
        .select("kind", topic.alias("topic"), partition.alias("partition"),
                offset.alias("offset"), "value", "t_invoke", "t_acked", "t_read",
                F.lit(None).cast("long").alias("committed"),
                F.lit(None).cast("double").alias("t_commit"), "detail")
    )


def fault_windows(faults: DataFrame, run_end: float) -> DataFrame:
    """One row per injected fault: fault, target, role, start (injected), healed (its
    undoing began: null for a history from before `heal` lines, or a run that died first),
    end (recovered: its undoing finished) and recovered.

    The n-th inject of a (fault, target) pairs with its n-th heal and n-th recover; an
    inject without a recover (the run died first) lasts to `run_end`.
    """
    numbered = faults.withColumn(
        "n", F.row_number().over(Window.partitionBy("fault", "target", "action").orderBy("t")))

    def moments(action: str, name: str) -> DataFrame:
        return numbered.filter(F.col("action") == action).select(
            "fault", "target", "n", F.col("t").alias(name))

    injects = numbered.filter(F.col("action") == "inject").select(
        "fault", "target", "role", "n", F.col("t").alias("start"))
    return (injects.join(moments("heal", "healed"), ["fault", "target", "n"], "left")
            .join(moments("recover", "end"), ["fault", "target", "n"], "left")
            .select("fault", "target", F.coalesce("role", F.lit("")).alias("role"), "start",
                    "healed", F.coalesce("end", F.lit(float(run_end))).alias("end"),
                    F.col("end").isNotNull().alias("recovered")))


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


TRUNCATION_BUCKET_BITS = 12
"""Width (as a power of two, in offsets) of the buckets `acked_in_truncations` joins on."""


def truncation_ranges(truncations: DataFrame) -> DataFrame:
    """id, broker, tk, lo, hi (packed positions, hi exclusive), t (their `t_cut`), t_from,
    t_held and t_trunc (when the broker truncated) of the pieces of truncation events
    (`attribution.dropped`), one row per `TRUNCATION_BUCKET_BITS` bucket a piece touches."""
    piece = F.col("piece")
    lo = packed_position(F.col("partition"), piece["lo"])
    hi = packed_position(F.col("partition"), piece["hi"])
    return truncations.select("id", "broker", "topic", "partition", "t",
                              F.explode("pieces").alias("piece")).select(
        "id", "broker", topic_key(F.col("topic")).alias("tk"), lo.alias("lo"), hi.alias("hi"),
        piece["t_cut"].alias("t"), piece["t_from"].alias("t_from"),
        piece["t_held"].alias("t_held"), F.col("t").alias("t_trunc"),
        F.explode(F.sequence(F.shiftright(lo, TRUNCATION_BUCKET_BITS),
                             F.shiftright(hi - 1, TRUNCATION_BUCKET_BITS))).alias("bucket"))


def acked_in_truncations(by_value: DataFrame, ranges: DataFrame) -> DataFrame:
    """id, broker, t_trunc, value, cut_at (struct tk, pos), t_acked, after_cut: per
    truncation (`truncation_ranges`), every send attempt acknowledged at one of its offsets
    from its piece's t_from and before its t_held: the candidates for the records it cut,
    which `truncation_records` narrows to the ones the broker really held. `after_cut`
    marks those acknowledged after the piece's `t_cut` (the start of the epoch after the
    one the broker wrote those offsets in): a deposed leader's acknowledgements in its old
    epoch before it learned of the new one, or the new leader's records. What was
    acknowledged there outside those bounds was never in the broker's log
    (`attribution.dropped`).

    One more reader of `by_value`'s exchange, joined with the (broadcast) buckets of the
    truncations on a numeric key. Nothing here may become a filter below that exchange, which
    would change its plan and parse the history again: the send's outcome folds into the key
    (null unless acknowledged), and the keys compare null-safe, the bounds through coalesce,
    so the optimizer infers no not-null filter either.
    """
    ok = (F.col("code") == OK) & _every_column(by_value)
    acked = by_value.select(
        "value",
        F.when(ok, F.shiftright("pos", TRUNCATION_BUCKET_BITS)).alias("_bucket"),
        F.col("tk").alias("_tk"), F.coalesce(F.col("pos"), F.lit(-1)).alias("_pos"),
        F.coalesce(F.col("t_complete"), F.lit(math.inf)).alias("_t"))
    r = F.broadcast(ranges)
    on = (acked["_bucket"].eqNullSafe(r["bucket"]) & acked["_tk"].eqNullSafe(r["tk"])
          & (acked["_pos"] >= r["lo"]) & (acked["_pos"] < r["hi"])
          & (acked["_t"] >= F.coalesce(r["t_from"], F.lit(-math.inf)))
          & (acked["_t"] < r["t_held"]))
    return acked.join(r, on, "inner").select(
        "id", "broker", "t_trunc", "value",
        F.struct(acked["_tk"].alias("tk"), acked["_pos"].alias("pos")).alias("cut_at"),
        acked["_t"].alias("t_acked"), (acked["_t"] >= r["t"]).alias("after_cut"))


def truncation_records(candidates: DataFrame, noteworthy: DataFrame) -> DataFrame:
    """id, acked, lost, lost_before, kept: per truncation, the acknowledged records it cut,
    and of those the lost ones it is the first to have cut, the lost ones an earlier
    truncation had cut already, and the ones kept elsewhere (drained at another position).

    `candidates` are `acked_in_truncations`' rows and `noteworthy` the classified values of
    the pass (few). At each offset the record the broker held is the last acknowledged there
    before `t_cut`, the start of the epoch after the one it wrote that offset in (an earlier
    one had been cut already; the ones acknowledged in the epochs it missed, as a leader
    killed and back only after the next election misses one, were other leaders' and never
    in its log: `attribution.dropped`), or after it one that is not in the final log at
    that offset: a deposed leader's acknowledgement in its old epoch (the new leader's
    records at those offsets stay there, and the truncated broker never held them: its log
    diverged from theirs there). It was cut unless the final log still has it at that
    offset, which is so for every value not noteworthy (drained where it was acknowledged)
    and for a noteworthy one drained there. A clean run's truncations cut none: their
    offsets were rewritten by the new leader with other records, which `candidates` alone
    would count. Each lost record counts as lost once, at the first truncation that cut it
    (by time, then broker id: the order the report lists them in), so the column adds up to
    the lost records truncations explain.
    """
    fate = noteworthy.select("value", F.col("lost").alias("_lost"),
                             F.col("drained_at").alias("_d1"), F.col("drained_last").alias("_d2"))
    still_there = (F.col("_lost").isNull()
                   | (~F.col("_lost") & (F.col("_d1").eqNullSafe(F.col("cut_at"))
                                         | F.col("_d2").eqNullSafe(F.col("cut_at")))))
    held = (candidates.join(fate, "value", "left")
            .filter(~F.col("after_cut") | ~still_there)
            .groupBy("id", "broker", "t_trunc", "cut_at")
            .agg(F.max_by(F.struct("value", "_lost", "_d1", "_d2"), "t_acked").alias("h"))
            .select("id", "broker", "t_trunc", "cut_at", "h.*"))
    cut = held.filter(~still_there)
    first = F.row_number().over(Window.partitionBy("value").orderBy("t_trunc", "broker")) == 1
    return (cut.withColumn("_first", first).groupBy("id").agg(
        F.count("*").alias("acked"),
        F.count(F.when(F.col("_lost") & F.col("_first"), 1)).alias("lost"),
        F.count(F.when(F.col("_lost") & ~F.col("_first"), 1)).alias("lost_before"),
        F.count(F.when(~F.col("_lost"), 1)).alias("kept")))


TIME, LATENCY, OTHER, CELL = 0, 1, 2, 3  # the kinds of `send_series` rows, in the key's low bits
KIND_BITS = 2
CELL_LATENCY_BITS = 12  # a cell's latency bucket, offset by half this range and clamped
OUTCOME_BITS = 2  # a cell's outcome: its send code, OK, INFO or FAIL
def send_series(by_value: DataFrame, grid: Grid) -> DataFrame:
    """Small tables from the rows of `events`, told apart by `kind`:

    - "time": per bucket of `grid.width` seconds (bucket = floor((t - t_ref) / width)):
      attempted (attempts invoked in it), acked, failed and indeterminate (attempts that
      completed in it, by outcome), first (invoke) and last (completion);
    - "latency": bucket, acked, max_ms: acknowledged attempts by latency, in buckets
      LATENCY_RATIO wide (a histogram, so percentiles need no sort; see
      `report.latency_percentiles`);
    - "cell": column (floor((t_complete - t_ref) / grid.column)), bucket (the latency,
      in buckets CELL_RATIO wide) and the attempts that completed there by outcome (acked,
      failed, indeterminate: one of them non-zero): a 2-D histogram of every attempt's
      latency at its completion, the timeline's latency points and quantile lines;
    - "other": one row for the rest, reads and malformed lines: last (the last read's time),
      bad_sends and bad_reads (malformed lines of sends.jsonl and reads.jsonl).

    All are bounded: by the grid's buckets and columns (`grid.series_grid`), and by the range of
    latencies. Every row gets one long key, its bucket (a cell: column, latency bucket and
    outcome) shifted left past the kind: an attempt is exploded into a time key (two when
    it completed in another bucket than it was invoked in), a cell key and, acknowledged, a
    latency key; a read keeps one. A grouping-sets Expand would multiply every row, reads
    included, under a hash map with several nullable keys; one primitive key halves the
    stage's CPU.
    """
    code = F.col("code")
    send, ok = (code <= FAIL) & _every_column(by_value), code == OK
    ms = (F.col("t_complete") - F.col("t_invoke")) * 1000.0
    floor_ms = F.greatest(ms, F.lit(LATENCY_FLOOR_MS))
    bucket = F.floor(F.log(floor_ms) / math.log(LATENCY_RATIO))
    half = 2 ** (CELL_LATENCY_BITS - 1)
    cell_bucket = F.least(F.greatest(F.floor(F.log(floor_ms) / math.log(CELL_RATIO)),
                                     F.lit(-half)), F.lit(half - 1)) + half

    def key(x: Column, kind: int) -> Column:
        return F.shiftleft(x.cast("long"), KIND_BITS).bitwiseOR(F.lit(kind))

    def at(t: str, width: float) -> Column:
        return F.floor((F.col(t) - grid.t_ref) / width)

    invoked, done = key(at("t_invoke", grid.width), TIME), key(at("t_complete", grid.width), TIME)
    cell = key(F.shiftleft(F.shiftleft(at("t_complete", grid.column), CELL_LATENCY_BITS)
                           .bitwiseOR(cell_bucket), OUTCOME_BITS).bitwiseOR(code.cast("long")),
               CELL)
    times = F.when(invoked == done, F.array(invoked)).otherwise(F.array(invoked, done))
    keys = (F.when(send & ok, F.concat(times, F.array(cell, key(bucket, LATENCY))))
            .when(send, F.concat(times, F.array(cell)))
            .otherwise(F.array(key(F.lit(0), OTHER))))
    rows = by_value.select(F.explode(keys).alias("key"), "code", "t_invoke", "t_complete",
                           invoked.alias("_invoked"), done.alias("_done"))
    kind = F.col("key").bitwiseAND(2**KIND_BITS - 1)
    is_time = kind == TIME
    here = ~is_time | (F.col("key") == F.col("_done"))  # a time row counts its completions
    started = is_time & (F.col("key") == F.col("_invoked"))

    def completed(outcome: int) -> Column:
        return F.count(F.when((code == outcome) & here, 1))

    value = F.shiftright("key", KIND_BITS)
    return rows.groupBy("key").agg(
        F.count(F.when(started, 1)).alias("attempted"),
        completed(OK).alias("acked"),  # ok rows have no OTHER key
        completed(FAIL).alias("failed"),
        completed(INFO).alias("indeterminate"),
        F.max(F.when(kind == LATENCY, ms)).alias("max_ms"),
        F.min(F.when(started, F.col("t_invoke"))).alias("first"),
        F.max("t_complete").alias("last"),
        F.count(F.when(code == BAD_SEND, 1)).alias("bad_sends"),
        F.count(F.when(code == BAD_READ, 1)).alias("bad_reads"),
    ).select(
        F.when(is_time, "time").when(kind == LATENCY, "latency").when(kind == CELL, "cell")
        .otherwise("other").alias("kind"),
        F.when(is_time | (kind == LATENCY), value)
        .when(kind == CELL, F.shiftright(value, OUTCOME_BITS)
              .bitwiseAND(2**CELL_LATENCY_BITS - 1) - half).alias("bucket"),
        F.when(kind == CELL, F.shiftright(value, OUTCOME_BITS + CELL_LATENCY_BITS))
        .alias("column"),
        "attempted", "acked", "failed", "indeterminate", "max_ms", "first", "last",
        "bad_sends", "bad_reads",
    )


def isr_per_bucket(cluster: DataFrame, t0: float, width: float) -> DataFrame:
    """topic, partition, bucket, isr (smallest ISR size sampled), elr (largest number of
    eligible leader replicas sampled, KIP-966; 0 where the samples have none or no `elr`),
    offline (leader -1 sampled), lso_held (every sample with a last stable offset had the
    same one, below the HW: an open transaction held read_committed readers back the whole
    bucket; false without such samples)."""
    elr = F.when(F.col("elr").isNotNull(), F.size("elr"))  # size(null) is -1 to Spark
    lso = F.col("last_stable_offset")
    held = (F.min(lso) == F.max(lso)) & (F.min(F.col("high_watermark") - lso) > 0)
    return cluster.groupBy(
        "topic", "partition", F.floor((F.col("t") - t0) / width).cast("long").alias("bucket"),
    ).agg(F.min(F.size("isr")).alias("isr"), F.coalesce(F.max(elr), F.lit(0)).alias("elr"),
          F.max(F.col("leader") == -1).alias("offline"),
          F.coalesce(held, F.lit(False)).alias("lso_held"))


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
