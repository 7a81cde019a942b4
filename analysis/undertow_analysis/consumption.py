"""How well the consumer group kept its partitions consumed (`subscribe` runs), per
partition: the time a record waited with no member reading the partition, the records
returned again, and the handovers of the partition between members. The same measures for
the classic protocol and the consumer protocol (KIP-848) make the two comparable on one
page (report.json's `consumption`, the report's "Consumer group" section).

- **Unconsumed.** A stretch of at least `report.UNAVAILABLE_MIN_S` between two first reads
  of records of a partition by the group's members (a record returned again is no progress),
  counted from the later of the earlier read and the acknowledgement of the record read
  next: that record was there to read and nobody read it (a member cut off, fenced,
  rebalancing, or its coordinator gone). A pause of the producers is not one: no record
  waited.
- **Returned again.** Reads of a record (a value at an offset) some member had returned
  before: the at-least-once window of a handover, or a member reading what it no longer
  owns.
- **Handovers.** Each assignment of the partition after its first; its pause is the time
  from the moment no member held it (its last holder's `revoke`) to the `assign`. A member
  that keeps a partition it has lost to another (a member of the consumer protocol cut off
  from its coordinator) makes no pause here: the unconsumed stretch shows it.

Only the few stretches and the per-partition sums are collected; the group's assignment
lines are small (groups.jsonl) and read on the driver.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from undertow_analysis.anomalies import Group

DEFINITION = (
    "Per partition of the group's topic: unconsumed, the stretches of {min:g} s or more in "
    "which an acknowledged record waited with no member reading the partition (from the "
    "later of the previous first read of a record and that record's acknowledgement to its "
    "read); returned "
    "again, reads of a record some member had returned before; handovers, each assignment "
    "of the partition after its first, with the pause since no member held it.")


def unconsumed(group: Group, sends: DataFrame, min_s: float) -> list[dict[str, Any]]:
    """The stretches (topic, partition, start, end) in which a record waited `min_s` or more
    with no member reading its partition, in time order."""
    acks = (sends.filter((F.col("status") == "ok") & F.col("offset").isNotNull())
            .groupBy("topic", "partition", "offset").agg(F.min("t_complete").alias("t_ack")))
    first = Window.partitionBy("topic", "partition", "offset", "value").orderBy("t", "line")
    order = Window.partitionBy("topic", "partition").orderBy("t", "line")
    reads = (group.reads.withColumn("_n", F.row_number().over(first)).filter(F.col("_n") == 1)
             .select("topic", "partition", "offset", "t",
                     F.lag("t").over(order).alias("_previous")))
    gaps = (reads.filter(F.col("t") - F.col("_previous") >= min_s)
            .join(acks, ["topic", "partition", "offset"], "left")
            .select("topic", "partition",
                    F.greatest("_previous", F.coalesce("t_ack", "_previous")).alias("start"),
                    F.col("t").alias("end"))
            .filter(F.col("end") - F.col("start") >= min_s))
    return [r.asDict() for r in gaps.orderBy("start", "topic", "partition").collect()]


def returned_again(group: Group) -> dict[tuple[str, int], int]:
    """Per (topic, partition), the reads of a record returned before."""
    copies = group.reads.groupBy("topic", "partition", "offset", "value").count()
    rows = (copies.filter(F.col("count") > 1).groupBy("topic", "partition")
            .agg(F.sum(F.col("count") - 1).alias("again")).collect())
    return {(r["topic"], r["partition"]): int(r["again"]) for r in rows}


def handovers(actions: list[dict[str, Any]]) -> dict[tuple[str, int], list[float | None]]:
    """Per (topic, partition), each assignment after its first: the seconds since no member
    held it, or None when some member still did (two held it at once)."""
    holders: dict[tuple[str, int], set[str]] = defaultdict(set)
    empty_since: dict[tuple[str, int], float] = {}
    assigned: set[tuple[str, int]] = set()
    found: dict[tuple[str, int], list[float | None]] = defaultdict(list)
    for a in sorted(actions, key=lambda a: (a["t"], a["type"] != "revoke")):
        key = (a["topic"], a["partition"])
        if a["type"] == "revoke":
            holders[key].discard(a["member"])
            if not holders[key]:
                empty_since[key] = a["t"]
            continue
        if key in assigned:
            found[key].append(a["t"] - empty_since[key] if not holders[key] else None)
        assigned.add(key)
        holders[key].add(a["member"])
    return found


def summary(group: Group, sends: DataFrame, topic: str, partitions: list[int],
            min_s: float, protocol: str) -> dict[str, Any]:
    """report.json's `consumption`: the group's protocol, the partitions' totals, the
    definition, one row per partition of `topic` and the unconsumed stretches, in seconds
    since the report's zero."""
    stretches = unconsumed(group, sends, min_s)
    again = returned_again(group)
    actions = [r.asDict() for r in group.actions.filter(F.col("type").isin("assign", "revoke"))
               .select("member", "type", "topic", "partition", "t").collect()]
    handed = handovers(actions)
    rows = []
    for p in partitions:
        key = (topic, p)
        mine = [s["end"] - s["start"] for s in stretches
                if (s["topic"], s["partition"]) == key]
        pauses = [x for x in handed.get(key, []) if x is not None]
        rows.append({
            "topic": topic, "partition": p, "unconsumed_s": round(sum(mine), 3),
            "stretches": len(mine), "longest_s": round(max(mine), 3) if mine else None,
            "returned_again": again.get(key, 0), "handovers": len(handed.get(key, [])),
            "overlapping_handovers": sum(1 for x in handed.get(key, []) if x is None),
            "longest_pause_s": round(max(pauses), 3) if pauses else None})
    pauses = [r["longest_pause_s"] for r in rows if r["longest_pause_s"] is not None]
    longest = [r["longest_s"] for r in rows if r["longest_s"] is not None]
    return {
        "group_protocol": protocol,
        "total": {"unconsumed_s": round(sum(r["unconsumed_s"] for r in rows), 3),
                  "stretches": sum(r["stretches"] for r in rows),
                  "longest_s": max(longest, default=None),
                  "returned_again": sum(r["returned_again"] for r in rows),
                  "handovers": sum(r["handovers"] for r in rows),
                  "overlapping_handovers": sum(r["overlapping_handovers"] for r in rows),
                  "longest_pause_s": max(pauses, default=None)},
        "definition": DEFINITION.format(min=min_s),
        "min_window_s": min_s,
        "partitions": rows,
        "stretches": [{"topic": s["topic"], "partition": s["partition"],
                       "start_s": round(s["start"] - group.start, 3),
                       "end_s": round(s["end"] - group.start, 3),
                       "length_s": round(s["end"] - s["start"], 3)} for s in stretches],
    }
