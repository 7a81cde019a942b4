"""The anomaly kinds: one row each in `KINDS`, the one place a kind is defined.

Jepsen's model: an anomaly is one checker plus one entry in one table. A row gives the kind's
name (anomalies/'s `kind`), its count in report.json, what it does to the verdict, its meaning
in report.html, whether (and from when) the loss attribution explains it, and its checker, of
one of two shapes:

- `check`, a function of one value's columns (`Value`): `checks.classify` applies it to every
  value in the one pass over sends and reads, as a flag column of the kind's name; the row
  also gives the position and the detail of the value's anomalies/ rows (`at`, `detail`);
- `checker`, a pure function of the consumer group's history (`Group`: the members' reads and
  groups.jsonl) to its findings, anomalies/ rows (`FINDING`), counted one by one. It runs only
  for a history with group lines (`subscribe` mode): without them its count is 0 and nothing
  of it is planned.

Everything that lists the kinds derives from the table: the flags and counts of `checks`, the
group findings (`groups.findings`), the verdict, the counts of report.json and the summary,
report.html's help, the kinds `attribution` explains. docs/design.md ("Anomaly kinds") lists
them for users.

No PySpark at import: report.py and html.py read the table in processes without it (the
runner prints the summary). A value check only combines the `Value` columns it is given; a
group checker imports PySpark when it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

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
    without a group)."""

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
    status, t_invoke, t); start: the run's start, from which details count seconds."""

    reads: DataFrame
    actions: DataFrame
    start: float


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
    """Acknowledged, nowhere in the drain."""
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
    """Every send attempt failed definitively, yet it was read."""
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
    checker: Callable[[Group], DataFrame] | None = None
    """A group checker: its findings, anomalies/ rows (`FINDING`), each one counted."""
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
        """A row with both checks or neither, or a value check without a position, fails at
        import."""
        if (self.check is None) == (self.checker is None) or (self.check and not self.at):
            raise ValueError(f"anomaly kind {self.name}: give either a value check with its "
                             f"position (`at`) or a group checker")

    @property
    def counts_by_value(self) -> bool:
        """Its count is of the values `checks.classify` flags (`checks.value_counts`)."""
        return self.check is not None and self.counts_values


KINDS = (
    Kind("lost", "lost", loss=True, check=lost, at=("acked_at",),
         help="acked values missing from the drain",
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
         help="values whose every send failed, yet were read",
         detail="every send attempt failed, yet it was read"),
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
)
COUNTS = tuple(k.count for k in KINDS)
"""The anomaly counts of report.json, in its order."""
VALUE_KINDS = tuple(k for k in KINDS if k.check is not None)
"""The kinds `checks.classify` flags, one column each."""
GROUP_KINDS = tuple(k for k in KINDS if k.checker is not None)
"""The kinds found by a group checker (`groups.findings`)."""


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
