"""The consumer group's history (`subscribe` mode), as the group checks read it.

A run whose consumers are members of one consumer group writes groups.jsonl (each partition
assigned and revoked, each committed offset the coordinator returned, each commit and its
outcome) and gives its members' reads a generation. The checks of `anomalies.GROUP_KINDS`
are pure functions of those (`anomalies.Group`); `skipped`, a value check, reads each value's
`committed_at`, which `committed_positions` gives `checks.classify`. A history without group
lines (an `assign`-mode run, or one from before groups) plans none of it: its counts are 0 at
no cost.

Everything here joins small tables (groups.jsonl, the anomalous rows) or reads the members'
reads once, shuffled by partition so that every group checker's window reuses that one
exchange; nothing is collected.
"""

from __future__ import annotations

from functools import reduce
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from undertow_analysis import checks
from undertow_analysis.anomalies import FINDING, GROUP_KINDS, Group
from undertow_analysis.io import History
from undertow_analysis.report import clock_zero

MEMBER_READ = ("consumer", "generation", "topic", "partition", "offset", "value", "t")


def consumer_group(meta: dict[str, Any]) -> dict[str, Any] | None:
    """meta.json's `consumer_group` (group_id, offsets_topic, offsets_partition), or None for
    an `assign`-mode run; one of another shape is a clear error."""
    group = meta.get("consumer_group")
    if group is None:
        return None
    if not (isinstance(group, dict) and isinstance(group.get("group_id"), str)
            and isinstance(group.get("offsets_topic"), str)
            and isinstance(group.get("offsets_partition"), int)
            and not isinstance(group.get("offsets_partition"), bool)):
        raise ValueError(f"meta.json's consumer_group must be {{group_id: string, "
                         f"offsets_topic: string, offsets_partition: int}}, got {group!r}")
    return group


def group_history(history: History) -> Group | None:
    """The consumer group's history, or None when groups.jsonl has no line.

    The members' reads are the run reads with a generation, in the order of the file, shuffled
    by (topic, partition): each group checker's window partitions by a superset of those, so
    they all read that one exchange, and the file is parsed once more only for them. Every
    column is known to be non-null, so that no join infers a filter to push below it."""
    if not history.has_lines("groups"):
        return None
    known = reduce(Column.__and__, [F.col(c).isNotNull() for c in MEMBER_READ])
    reads = (history.in_order("reads").filter((F.col("phase") == "run") & known)
             .select(F.col("consumer").alias("member"), *MEMBER_READ[1:], "line")
             .repartition("topic", "partition"))
    return Group(reads=reads, actions=history.usable("groups"),
                 start=clock_zero(history.meta, None))


def _ok_commits(actions: DataFrame) -> DataFrame:
    return actions.filter((F.col("type") == "commit") & (F.col("status") == "ok")
                          & F.col("offset").isNotNull())


def committed_positions(actions: DataFrame) -> DataFrame:
    """tk, partition, pos: per partition, the highest offset an ok commit gave, as a position
    (`checks.packed_position`): what `classify` gives a value as `committed_at`."""
    return (_ok_commits(actions).groupBy("topic", "partition").agg(F.max("offset").alias("o"))
            .select(checks.topic_key(F.col("topic")).alias("tk"), "partition",
                    checks.packed_position(F.col("partition"), F.col("o")).alias("pos")))


def findings(group: Group) -> DataFrame:
    """Every group checker's rows (`anomalies.GROUP_KINDS`) with their kind first: anomalies/'s
    columns but the fault."""
    return reduce(DataFrame.unionByName, [
        k.checker(group).select(F.lit(k.name).alias("kind"), *FINDING) for k in GROUP_KINDS])


def with_first_commit_past(rows: DataFrame, actions: DataFrame) -> DataFrame:
    """anomalies/ rows of values (`checks.value_anomalies`) with committed and t_commit: the
    first ok commit of their partition past their offset (a skipped record's is when the
    group's committed offset passed it), null when none. Few rows against a small table."""
    commits = F.broadcast(_ok_commits(actions).select(
        F.col("topic").alias("_topic"), F.col("partition").alias("_partition"),
        F.col("offset").alias("_offset"), F.col("t").alias("_t")))
    past = ((rows["topic"] == commits["_topic"]) & (rows["partition"] == commits["_partition"])
            & (commits["_offset"] > rows["offset"]))
    first = F.min_by(F.struct("_offset", "_t"), "_t")
    others = [c for c in rows.columns if c not in ("committed", "t_commit")]
    return (rows.join(commits, past, "left").groupBy(*others).agg(first.alias("_first"))
            .select(*others, F.col("_first._offset").alias("committed"),
                    F.col("_first._t").alias("t_commit"))
            .select(*rows.columns))
