"""The anomaly kinds: one row each in `KINDS`, the one place a kind is defined.

Jepsen's model: an anomaly is one checker plus one entry in one table. A row gives the kind's
name (anomalies/'s `kind`), its count in report.json, what it does to the verdict, its meaning
in report.html, whether (and from when) the loss attribution explains it, and its checker, of
one of two shapes:

- `check`, a function of one value's columns (`Value`): `checks.classify` applies it to every
  value in the one pass over sends and reads, as a flag column of the kind's name; the row
  also gives the position and the detail of the value's anomalies/ rows (`at`, `detail`);
- `checker`, a pure function of one part of the history to its findings, anomalies/ rows
  (`FINDING`), counted one by one: of the consumer group's (`Group`: the members' reads and
  groups.jsonl), or of the transactions' (`Transactions`: txns.jsonl, the transactional sends,
  the `read_committed` reads and the sampled last stable offsets), as its `scope` says. It
  runs only for a history with lines of that part (groups.jsonl for `subscribe` mode,
  txns.jsonl for transactional producers): without them its count is 0 and nothing of it is
  planned.

Everything that lists the kinds derives from the table: the flags and counts of `checks`, the
group findings (`groups.findings`), the verdict, the counts of report.json and the summary,
report.html's help, the kinds `attribution` explains. docs/design.md ("Anomaly kinds") lists
them for users.

No PySpark at import: report.py and html.py read the table in processes without it (the
runner prints the summary). A value check only combines the `Value` columns it is given; a
group checker imports PySpark when it runs.

It is long because it is the Jepsen-style table of every anomaly kind with its checker beside
its row: a new kind is one function and one row here, and the table is read whole by everything
listed above.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


@dataclass(frozen=True)
class Value:
    """One value's columns, as `checks.classify` aggregates them, that a check reads: each
    attribute is the column of its name (`checks.value_columns`). outcome is `acked`,
    `indeterminate`, `failed` or null (never sent); n_drained counts the positions the drain
    read it at; placed is 1 if it was drained where an acknowledgement put it; the rest are
    positions (structs of tk and pos, pos null when there is none): the first acknowledged,
    the first drained, the first read during the run, the first read at all, the first read
    where another value was read too, and committed_at, the highest offset the consumer group
    committed (an acknowledged commit) on the partition of its first drained position (null
    without a group). A value sent in a transaction has its transaction's outcome (the runner
    writes sends.jsonl so): `acked` is committed, `failed` aborted."""

    outcome: Column
    n_drained: Column
    placed: Column
    acked_at: Column
    drained_at: Column
    run_read_at: Column
    read_at: Column
    inconsistent_at: Column
    committed_at: Column


@dataclass(frozen=True)
class Group:
    """The consumer group's history, as a group checker reads it (`groups.group_history`).

    reads: the members' reads (reads.jsonl's run reads with a generation): member,
    generation, topic, partition, offset, value, t, and line, their order in the file;
    actions: groups.jsonl's usable lines (member, generation, type, topic, partition, offset,
    status, t_invoke, t); start: the report's zero (`report.clock_zero`: the workload's
    start), from which details count seconds."""

    reads: DataFrame
    actions: DataFrame
    start: float


@dataclass(frozen=True)
class Transactions:
    """The transactions' history, as a transaction checker reads it
    (`transactions.txn_history`).

    txns: txns.jsonl's usable lines (producer, txn, intent, status, values, t_begin,
    t_end_invoke, t_complete); sends: the usable sends with a `txn` (txn, value, topic,
    partition, offset, status); reads: the records `read_committed` consumers returned (the
    run's with that isolation level, and the drain's): reader (the consumer, with its
    generation in `subscribe` mode), phase, topic, partition, offset, value, t; samples:
    cluster.jsonl's lines with a high watermark and a last stable offset (t, topic,
    partition, high_watermark, last_stable_offset); timeout_s, the producers'
    `transaction.timeout.ms`; start: the report's zero (`report.clock_zero`: the workload's
    start), from which details count seconds; pipeline: a consume-transform-produce
    pipeline's input and output topics, None without one; commits: groups.jsonl's
    acknowledged commits (topic, partition, offset, t)."""

    txns: DataFrame
    sends: DataFrame
    reads: DataFrame
    samples: DataFrame
    timeout_s: float
    start: float
    pipeline: tuple[str, str] | None
    commits: DataFrame


FINDING_TYPES = {"topic": "string", "partition": "int", "offset": "bigint", "value": "string",
                 "t_invoke": "double", "t_acked": "double", "t_read": "double",
                 "committed": "bigint", "t_commit": "double", "detail": "string"}
"""The columns of an anomalies/ row after `kind` (and before `fault`, which the job adds),
with their Spark types: where, which value (null for a committed offset), when it was sent,
acknowledged and first read, the committed offset it concerns and when that commit was
acknowledged (null when none), and what happened in words."""
FINDING = tuple(FINDING_TYPES)


def _acked(v: Value) -> Column:
    return v.outcome == "acked"


def _drained(v: Value) -> Column:
    return v.n_drained > 0


def _known(at: Column) -> Column:
    return at["pos"].isNotNull()


def lost(v: Value) -> Column:
    """Acknowledged, nowhere in the drain. A record of a transaction whose commit was
    acknowledged is acknowledged: its loss is Jepsen's *lost committed write*."""
    return _acked(v) & ~_drained(v)


def misplaced(v: Value) -> Column:
    """Acknowledged and drained, but never at a position an acknowledgement gave (an acks=0
    send gets none, so it is never misplaced)."""
    return _acked(v) & _drained(v) & (v.placed == 0) & _known(v.acked_at)


def phantom_read(v: Value) -> Column:
    """Read during the run, nowhere in the drain."""
    return _known(v.run_read_at) & ~_drained(v)


def inconsistent_offset(v: Value) -> Column:
    """Read at a position where another value was read too (`checks.inconsistent_offsets`)."""
    return _known(v.inconsistent_at)


def duplicate(v: Value) -> Column:
    """Drained at two or more positions."""
    return v.n_drained > 1


def aborted_read(v: Value) -> Column:
    """Every send attempt failed definitively, or its transaction aborted, yet it was read
    (a transactional workload's consumers and drain read committed: they must never see an
    aborted record)."""
    return (v.outcome == "failed") & _known(v.read_at)


def unexpected(v: Value) -> Column:
    """Read, never sent."""
    return v.outcome.isNull() & _known(v.read_at)


def skipped(v: Value) -> Column:
    """Drained, never returned to a member of the consumer group (never read during the run),
    yet below an offset the group committed on its partition: the group's committed offset
    passed it (the position compared is its first drained one)."""
    return (_drained(v) & ~_known(v.run_read_at)
            & (v.drained_at["pos"] < v.committed_at["pos"]))


def _commit_before(actions: DataFrame, line_type: str) -> DataFrame:
    """The `line_type` lines of groups.jsonl, each with `past`: the highest offset an ok
    commit of its partition gave before it (a struct of offset, t and t_invoke, null when
    none). A commit that completed at the line's time does not count."""
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    ok = (F.col("type") == "commit") & (F.col("status") == "ok") & F.col("offset").isNotNull()
    before = (Window.partitionBy("topic", "partition").orderBy("t", ok)
              .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    past = F.max(F.when(ok, F.struct("offset", "t", "t_invoke"))).over(before)
    return (actions.filter(ok | (F.col("type") == line_type))
            .select("*", past.alias("past")).filter(F.col("type") == line_type))


def committed_offset_lost(g: Group) -> DataFrame:
    """A `committed` line, the offset C the coordinator returned for a partition (or none),
    while an ok commit of that partition with an offset above C had completed before it: an
    acknowledged write to __consumer_offsets was lost. One row per `committed` line: offset C,
    committed the highest offset acknowledged before it (t_commit and t_acked when, t_invoke
    when that commit was called), t_read the line's time."""
    from pyspark.sql import functions as F

    past, returned, t = F.col("past"), F.col("offset"), F.col("t")
    lost = past.isNotNull() & (returned.isNull() | (past["offset"] > returned))
    detail = F.format_string(
        "%s (generation %s) was given %s by the coordinator at +%.1f s, though %d had been "
        "acknowledged as committed at +%.1f s", "member", _text(F.col("generation")),
        F.coalesce(returned.cast("string"), F.lit("no committed offset")), t - g.start,
        past["offset"], past["t"] - g.start)
    return _finding(_commit_before(g.actions, "committed").filter(lost), value=None,
                    t_invoke=past["t_invoke"], t_acked=past["t"], t_read=t,
                    committed=past["offset"], t_commit=past["t"], detail=detail)


def redelivered_past_commit(g: Group) -> DataFrame:
    """A member returned a record (a value at a position) that a member had returned before,
    and an ok commit of its partition past its offset had completed before the reading
    member's last `assign` of the partition before this read: outside the at-least-once
    window of a rebalance, which re-delivers only from the last committed offset. One row
    per such read: committed and t_commit that commit, t_read the read."""
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    first = Window.partitionBy("topic", "partition", "offset", "value").orderBy("t", "line")
    again = (g.reads.select("*", F.row_number().over(first).alias("_n"),
                            F.first("member").over(first).alias("_first"))
             .filter(F.col("_n") > 1).drop("_n"))
    assigns = F.broadcast(_commit_before(g.actions, "assign").select(
        F.col("member").alias("_member"), F.col("topic").alias("_topic"),
        F.col("partition").alias("_partition"), F.col("t").alias("_assigned"),
        F.col("past").alias("_past")))
    before = ((again["member"] == assigns["_member"]) & (again["topic"] == assigns["_topic"])
              & (again["partition"] == assigns["_partition"])
              & (assigns["_assigned"] <= again["t"]))
    last = F.max_by(F.struct("_assigned", "_past"), "_assigned")
    found = (again.join(assigns, before).groupBy(*again.columns).agg(last.alias("_assign"))
             .filter(F.col("_assign._past.offset") > F.col("offset")))
    past, t = F.col("_assign._past"), F.col("t")
    detail = F.format_string(
        "%s (generation %s) returned it again at +%.1f s (%s had returned it first); %d had "
        "been acknowledged as committed at +%.1f s, before %s was assigned %s-%d at +%.1f s",
        "member", _text(F.col("generation")), t - g.start, "_first", past["offset"],
        past["t"] - g.start, "member", "topic", "partition",
        F.col("_assign._assigned") - g.start)
    return _finding(found, t_read=t, committed=past["offset"], t_commit=past["t"],
                    detail=detail)


def non_monotonic_poll(g: Group) -> DataFrame:
    """Within one member, generation and partition, a read at an offset not above the
    previous read's (in the order of reads.jsonl). One row per such read, t_read its time."""
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    order = Window.partitionBy("member", "generation", "topic", "partition").orderBy("line")
    reads = (g.reads.select("*", F.lag("offset").over(order).alias("_previous"))
             .filter(F.col("offset") <= F.col("_previous")))
    detail = F.format_string("%s (generation %s) returned offset %d at +%.1f s after offset %d",
                             "member", _text(F.col("generation")), "offset",
                             F.col("t") - g.start, "_previous")
    return _finding(reads, t_read=F.col("t"), detail=detail)


def read_past_lso(tx: Transactions) -> DataFrame:
    """A `read_committed` consumer returned, during the run, a record of a transaction before
    that transaction's commit was called: no marker could have been written yet, so the
    record was above the partition's last stable offset (Kafka's `Partition.fetchRecords`
    reads `read_committed` up to `lastStableOffset`). One row per such read: t_read the
    read, t_commit when the commit (EndTxn) was called."""
    from pyspark.sql import functions as F

    txns = F.broadcast(tx.txns.filter(F.col("t_end_invoke").isNotNull()).select(
        F.col("txn").alias("_txn"), "t_end_invoke"))
    sent = tx.sends.select("txn", "value").distinct()
    found = (tx.reads.filter(F.col("phase") == "run").join(sent, "value")
             .join(txns, F.col("txn") == F.col("_txn"))
             .filter(F.col("t") < F.col("t_end_invoke")))
    detail = F.format_string(
        "%s returned it at +%.1f s, %.1f s before the commit of %s was called (+%.1f s)",
        "reader", F.col("t") - tx.start, F.col("t_end_invoke") - F.col("t"), "txn",
        F.col("t_end_invoke") - tx.start)
    return _finding(found, t_read=F.col("t"), t_commit=F.col("t_end_invoke"), detail=detail)


def torn_transaction(tx: Transactions) -> DataFrame:
    """A committed transaction only partly visible: a `read_committed` reader (a run consumer,
    in one generation for a group member, or the drain) returned some of its records, and in
    a partition where it holds another acknowledged at offset o, read both at or below o and
    above o, but never that record. One row per such transaction (its first missing record by
    partition and offset): t_commit when its commit was acknowledged."""
    from pyspark.sql import functions as F

    committed = F.broadcast(tx.txns.filter(F.col("status") == "ok").select(
        "txn", F.col("t_complete").alias("_t_commit")))
    records = (tx.sends.filter((F.col("status") == "ok") & F.col("offset").isNotNull())
               .join(committed, "txn")
               .select("txn", "value", "topic", "partition", "offset", "_t_commit"))
    reads = tx.reads.select("reader", "topic", "partition", "offset", "value")
    seen = (reads.join(records.select("txn", "value"), "value").groupBy("reader", "txn")
            .agg(F.count("*").alias("_n")))
    span = reads.groupBy("reader", "topic", "partition").agg(
        F.min("offset").alias("_lo"), F.max("offset").alias("_hi"))
    missing = (seen.join(records, "txn").join(span, ["reader", "topic", "partition"])
               .filter((F.col("_lo") <= F.col("offset")) & (F.col("offset") < F.col("_hi")))
               .join(reads.select("reader", "value"), ["reader", "value"], "left_anti"))
    first = F.min(F.struct("partition", "offset", "topic", "value", "reader", "_n", "_hi",
                           "_t_commit"))
    torn = missing.groupBy("txn").agg(first.alias("_m")).select("txn", "_m.*")
    detail = F.format_string(
        "%s returned %d records of committed transaction %s, and read %s-%d up to offset %d "
        "without its record at offset %d", "reader", "_n", "txn", "topic", "partition", "_hi",
        "offset")
    return _finding(torn, t_commit=F.col("_t_commit"), detail=detail)


HANGING_GRACE_S = 15.0
"""Past `transaction.timeout.ms`, how long the LSO may stay behind an open transaction before
it counts as hanging: the coordinator looks for expired transactions every
`transaction.abort.timed.out.transaction.cleanup.interval.ms` (10 s by default,
`TransactionStateManager.timedOutTransactions`), then writes the abort markers."""
SAMPLE_GAP_S = 1.0
"""The most one interval between two cluster samples adds to a stuck LSO's time: a longer gap
(the leader did not answer) is an outage, not time the LSO was seen stuck."""


def hanging_transaction(tx: Transactions) -> DataFrame:
    """A partition's last stable offset seen stuck below its high watermark, at one offset,
    for longer than `transaction.timeout.ms` plus HANGING_GRACE_S: an open transaction that
    nothing ended, which holds every `read_committed` consumer back (a liveness finding).
    One row per stretch: offset the stuck LSO, t_read when it was first seen there."""
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    order = Window.partitionBy("topic", "partition").orderBy("t")
    lso, hw = F.col("last_stable_offset"), F.col("high_watermark")
    stuck = lso < hw
    before = F.lag(F.struct(lso.alias("lso"), stuck.alias("stuck"), F.col("t").alias("t")))
    samples = tx.samples.select("*", before.over(order).alias("_prev"))
    held_on = stuck & F.coalesce(F.col("_prev.stuck") & (F.col("_prev.lso") == lso),
                                 F.lit(False))
    stretch = F.sum((~held_on).cast("int")).over(
        order.rowsBetween(Window.unboundedPreceding, Window.currentRow))
    seen = F.when(held_on, F.least(F.col("t") - F.col("_prev.t"), F.lit(SAMPLE_GAP_S)))
    runs = (samples.select("*", stretch.alias("_stretch"), seen.alias("_seen"))
            .filter(stuck).groupBy("topic", "partition", "_stretch")
            .agg(F.min("t").alias("_from"), F.max("t").alias("_to"),
                 F.coalesce(F.sum("_seen"), F.lit(0.0)).alias("_held"),
                 F.first(lso).alias("offset"), F.max(hw).alias("_hw"))
            .filter(F.col("_held") > tx.timeout_s + HANGING_GRACE_S))
    detail = F.format_string(
        "the last stable offset stayed at %d, below the high watermark (%d), for %.1f s from "
        "+%.1f s: longer than transaction.timeout.ms (%.1f s) and %.0f s more", "offset",
        "_hw", "_held", F.col("_from") - tx.start, F.lit(tx.timeout_s),
        F.lit(HANGING_GRACE_S))
    return _finding(runs, t_read=F.col("_from"), detail=detail)


OUTPUT_SEPARATOR = "/"
"""A pipeline's output value is `{input value}/{transaction}` (`runner.pipeline_member`)."""


def _pipeline_drains(tx: Transactions) -> tuple[DataFrame, DataFrame]:
    """The drain's reads of the pipeline's input topic, and of its output topic with each
    output's `input` value; both empty without a pipeline."""
    from pyspark.sql import functions as F

    input_topic, output_topic = tx.pipeline or ("", "")
    drained = tx.reads.filter((F.col("phase") == "drain") & F.lit(tx.pipeline is not None))
    inputs = drained.filter(F.col("topic") == input_topic)
    outputs = drained.filter(F.col("topic") == output_topic).select(
        "*", F.regexp_extract("value", f"^(.*){OUTPUT_SEPARATOR}[^{OUTPUT_SEPARATOR}]*$", 1)
        .alias("input"))
    return inputs, outputs


def duplicate_output(tx: Transactions) -> DataFrame:
    """The pipeline's output topic, drained `read_committed`, holds the result of one input
    record more than once: two transactions that both committed transformed it, which
    exactly-once forbids (the second should have been fenced, or have read past the first's
    committed offsets). One row per such input: value the input, where the last copy lies,
    t_commit when the transaction that wrote it committed."""
    from pyspark.sql import functions as F

    _, outputs = _pipeline_drains(tx)
    committed = F.broadcast(tx.txns.select("txn", F.col("t_complete").alias("_t")))
    copies = (outputs.filter(F.col("input") != "").groupBy("input").agg(
        F.count_distinct("partition", "offset").alias("_n"),
        F.min(F.struct("partition", "offset", "value")).alias("_a"),
        F.max(F.struct("partition", "offset", "value", "topic")).alias("_b"))
        .filter(F.col("_n") > 1))
    last = copies.join(tx.sends.select(F.col("value").alias("_value"), "txn"),
                       F.col("_b.value") == F.col("_value"), "left").join(committed, "txn",
                                                                          "left")
    detail = F.format_string(
        "input %s was transformed into %d committed output records: %s at %s-%d offset %d "
        "and %s at offset %d", "input", "_n", "_a.value", "_b.topic", "_a.partition",
        "_a.offset", "_b.value", "_b.offset")
    return _finding(last, topic=F.col("_b.topic"), partition=F.col("_b.partition"),
                    offset=F.col("_b.offset"), value=F.col("input"), t_commit=F.col("_t"),
                    detail=detail)


def missing_output(tx: Transactions) -> DataFrame:
    """An input record below an offset the pipeline's group committed (an acknowledged commit,
    the offsets committed with a transaction) has no record in the drained output topic: the
    offsets committed without the output they stand for. One row per such input record:
    committed the offset, t_commit when it was committed."""
    from pyspark.sql import functions as F

    inputs, outputs = _pipeline_drains(tx)
    committed = F.broadcast(tx.commits.filter(F.col("topic") == (tx.pipeline or ("",))[0])
                            .groupBy("partition").agg(
        F.max_by(F.struct("offset", "t"), "offset").alias("_c")))
    missing = (inputs.join(committed, "partition").filter(F.col("offset") < F.col("_c.offset"))
               .join(outputs.select(F.col("input").alias("value")).distinct(), "value",
                     "left_anti"))
    detail = F.format_string(
        "the pipeline's group committed %s-%d up to offset %d at +%.1f s, past this record, "
        "and its output topic holds no record of it", "topic", "partition", "_c.offset",
        F.col("_c.t") - tx.start)
    return _finding(missing, committed=F.col("_c.offset"), t_commit=F.col("_c.t"),
                    detail=detail)


def _finding(rows: DataFrame, **columns: Column | None) -> DataFrame:
    """`rows` as findings (`FINDING`): each column as given (None: null), else the row's own
    of that name (where, which value), else null."""
    from pyspark.sql import functions as F

    def column(name: str) -> Column:
        given = columns.get(name, F.col(name) if name in rows.columns else None)
        return F.lit(None) if given is None else given

    return rows.select(*[column(n).cast(kind).alias(n) for n, kind in FINDING_TYPES.items()])


def _text(column: Column) -> Column:
    """A nullable column as text, `?` for null (format_string would write `null`)."""
    from pyspark.sql import functions as F

    return F.coalesce(column.cast("string"), F.lit("?"))


GROUP, TRANSACTIONS = "group", "transactions"
"""A checker's scope: the part of the history it is a function of (`Group`, `Transactions`)."""
INCIDENT, RETRY, OFFSETS = "incident", "retry", "offsets"
"""How the attribution explains a kind's anomalies: records in loss incidents
(`attribution.incidents`), producer retries in duplicate groups
(`attribution.duplicate_groups`), or committed offsets lost from the group's
__consumer_offsets partition (`offsets.commit_losses`)."""


@dataclass(frozen=True)
class Kind:
    """One anomaly kind (see the module docstring)."""

    name: str
    """anomalies/'s `kind` and, for a value check, `checks.classify`'s flag column."""
    count: str
    """Its count in report.json (the table's order is the counts' order)."""
    loss: bool
    """Any makes the verdict `loss`; otherwise any makes it `anomalies`."""
    help: str
    """What the count counts (report.html)."""
    check: Callable[[Value], Column] | None = None
    """A value check: true for a value with this anomaly."""
    at: tuple[str, ...] = ()
    """A value check's position in anomalies/: the first of these (`checks.POSITIONS`) that
    is known, else the last."""
    detail: str | None = None
    """A value check's detail in anomalies/; None: the positions it was drained at."""
    checker: Callable[[Any], DataFrame] | None = None
    """A checker of one part of the history (`scope`): its findings, anomalies/ rows
    (`FINDING`), each one counted."""
    scope: str = GROUP
    """A checker's: GROUP (it takes a `Group`) or TRANSACTIONS (a `Transactions`)."""
    explained_by: str | None = None
    """INCIDENT, RETRY, OFFSETS, or None: the attribution does not explain it."""
    held_at: str = "t_acked"
    """INCIDENT: the anomalies/ time at which the record was surely on its partition's leader,
    from which the attribution looks for what removed it."""
    fault_at: str = "t_invoke"
    """The anomalies/ time at which its rows name the fault active."""
    only_if_idempotent: bool = False
    """An anomaly only when the producer was idempotent (the broker should have recognised
    the retry, KIP-98); otherwise it makes no verdict."""
    counts_values: bool = True
    """A value check's count. False: the count is of what its own checker finds, not of
    values (positions, for inconsistent_offset: `checks.inconsistent_offsets`). A group
    checker's count is always of its rows."""

    def __post_init__(self) -> None:
        """A row with both checks or neither, a value check without a position, or a checker
        of no known scope, fails at import."""
        if ((self.check is None) == (self.checker is None) or (self.check and not self.at)
                or self.scope not in (GROUP, TRANSACTIONS)):
            raise ValueError(f"anomaly kind {self.name}: give either a value check with its "
                             f"position (`at`) or a group checker")

    @property
    def counts_by_value(self) -> bool:
        """Its count is of the values `checks.classify` flags (`checks.value_counts`)."""
        return self.check is not None and self.counts_values


KINDS = (
    Kind("lost", "lost", loss=True, check=lost, at=("acked_at",),
         help="acked values (a transaction's: committed) missing from the drain",
         detail="acknowledged, missing from the drain", explained_by=INCIDENT),
    Kind("misplaced", "misplaced", loss=True, check=misplaced, at=("acked_at",),
         help="acked values drained, but not where their acknowledgement put them",
         detail=None, explained_by=INCIDENT),
    Kind("phantom_read", "phantom_reads", loss=True, check=phantom_read, at=("run_read_at",),
         help="values read during the run, missing from the drain",
         detail="read during the run, missing from the drain", explained_by=INCIDENT,
         held_at="t_read"),
    Kind("inconsistent_offset", "inconsistent_offsets", loss=True, check=inconsistent_offset,
         at=("inconsistent_at",), help="positions at which reads saw two or more values",
         detail="another value was read at this offset", counts_values=False),
    Kind("duplicate", "duplicates", loss=False, check=duplicate,
         at=("acked_at", "drained_at"), help="values drained at more than one position",
         detail=None, explained_by=RETRY, only_if_idempotent=True),
    Kind("aborted_read", "aborted_reads", loss=False, check=aborted_read, at=("read_at",),
         help="values whose every send failed, or whose transaction aborted, yet were read",
         detail="every send attempt failed or its transaction aborted, yet it was read"),
    Kind("unexpected", "unexpected", loss=False, check=unexpected, at=("read_at",),
         help="values read but never sent", detail="read, but never sent"),
    Kind("skipped", "skipped", loss=True, check=skipped, at=("drained_at",),
         help="values drained, never returned to a group member, below an offset the "
              "group committed",
         detail="drained, never returned to a group member, below an offset the group "
                "committed", explained_by=INCIDENT, held_at="t_commit"),
    Kind("committed_offset_lost", "committed_offsets_lost", loss=True,
         checker=committed_offset_lost,
         help="committed offsets the coordinator returned below one acknowledged before",
         explained_by=OFFSETS, fault_at="t_read"),
    Kind("redelivered_past_commit", "redelivered_past_commit", loss=False,
         checker=redelivered_past_commit,
         help="records returned again below an offset committed before the member's "
              "assignment", fault_at="t_read"),
    Kind("non_monotonic_poll", "non_monotonic_polls", loss=False, checker=non_monotonic_poll,
         help="reads at an offset not above the previous one of their member, generation "
              "and partition", fault_at="t_read"),
    Kind("read_past_lso", "reads_past_lso", loss=False, checker=read_past_lso,
         scope=TRANSACTIONS, help="records a read_committed consumer returned before their "
                                  "transaction's commit was called", fault_at="t_read"),
    Kind("torn_transaction", "torn_transactions", loss=False, checker=torn_transaction,
         scope=TRANSACTIONS, help="committed transactions a read_committed reader saw only "
                                  "part of", fault_at="t_commit"),
    Kind("hanging_transaction", "hanging_transactions", loss=False,
         checker=hanging_transaction, scope=TRANSACTIONS,
         help="stretches in which a partition's last stable offset stayed stuck behind an "
              "open transaction past transaction.timeout.ms", fault_at="t_read"),
    Kind("duplicate_output", "duplicate_outputs", loss=False, checker=duplicate_output,
         scope=TRANSACTIONS, help="input records whose result a pipeline's committed output "
                                  "holds more than once", fault_at="t_commit"),
    Kind("missing_output", "missing_outputs", loss=True, checker=missing_output,
         scope=TRANSACTIONS, help="input records below an offset a pipeline committed, with "
                                  "no record in its committed output", fault_at="t_commit"),
)
COUNTS = tuple(k.count for k in KINDS)
"""The anomaly counts of report.json, in its order."""
VALUE_KINDS = tuple(k for k in KINDS if k.check is not None)
"""The kinds `checks.classify` flags, one column each."""
GROUP_KINDS = tuple(k for k in KINDS if k.checker is not None and k.scope == GROUP)
"""The kinds found by a group checker (`groups.findings`)."""
TXN_KINDS = tuple(k for k in KINDS if k.checker is not None and k.scope == TRANSACTIONS)
"""The kinds found by a transaction checker (`transactions.findings`)."""


def explained_by(how: str) -> tuple[Kind, ...]:
    """The kinds the attribution explains `how` (INCIDENT, RETRY or OFFSETS)."""
    return tuple(k for k in KINDS if k.explained_by == how)


def verdict(counts: Mapping[str, int], idempotent: bool) -> str:
    """`loss` if a kind that is loss has a count (an acknowledged record gone or moved, a read
    later contradicted, a record or an acknowledged commit the consumer group lost);
    `anomalies` if another has (reads of records never successfully sent, duplicates despite
    an idempotent producer, a consumer group re-delivering or going back); otherwise `clean`."""
    found = [k for k in KINDS if counts[k.count] and (idempotent or not k.only_if_idempotent)]
    if any(k.loss for k in found):
        return "loss"
    return "anomalies" if found else "clean"
