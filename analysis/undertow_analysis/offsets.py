"""Committed offsets lost, explained: what removed an acknowledged write to the consumer
group's `__consumer_offsets` partition (events.jsonl), like `attribution` explains a record.

Pure functions from DataFrames to DataFrames: the committed offsets lost (few anomalies/ rows
of the kinds `anomalies.OFFSETS` explains) are joined with the events of the group's
partition of `__consumer_offsets` (meta.json's `consumer_group.offsets_partition`; fewer
still: a broadcast), and nothing is collected here.

A commit of offset O, acknowledged at t_commit, that the coordinator no longer had at
t_fetch (it returned less) was held by the *holder*: the broker that led the offsets
partition at t_commit (its last `become_leader` at or before it), with that epoch. The
*cause* is the first of these, between t_commit and t_fetch, that removed the holder's tail:

- `power_loss`: the holder lost power (`power_loss`) and came back with the partition cut
  (its `truncation` with reason `log_recovery`): the commit had not been fsynced;
- `disk_lost`: the holder came back with the partition empty (a `log_recovery` to offset 0):
  its disk was lost;
- `unclean_election`: the controller elected a replica outside the ISR leader of the
  partition;
- `high_watermark_truncation`, `coordinator_truncation`: the holder truncated the partition,
  to its high watermark (the pre-KIP-101 rule) or to a new leader's log without the commit;

otherwise the loss is `unexplained`, itself a finding. Lost commits with one holder, epoch
and cause form one incident.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from undertow_analysis.anomalies import OFFSETS, explained_by
from undertow_analysis.attribution import of_type, prefixed

LOST_KINDS = tuple(k.name for k in explained_by(OFFSETS))
"""The anomaly kinds whose rows are committed offsets lost (committed_offset_lost)."""
_LOST = ("topic", "partition", "committed", "t_commit", "returned", "t_fetch")


def _first(cond: Column, *fields: str) -> Column:
    """The first (by time) joined event where `cond` holds, as a struct of `fields`."""
    return F.min_by(F.struct(*[F.col(f"e_{f}").alias(f) for f in fields]),
                    F.when(cond, F.col("e_t")))


def commit_losses(anomalies: DataFrame, events: DataFrame, group: dict[str, Any] | None
                  ) -> DataFrame:
    """Loss incidents of committed offsets: mechanism (a code of `checker.MECHANISMS`),
    holder, holder_epoch, cause (its time t and `CAUSE`: what removed them), commits (how
    many `committed` lines found one lost), first_t and last_t (their acknowledgements), and
    up to 5 examples (t_commit, topic, partition, committed, returned, t_fetch), the first
    acknowledged first. `group` is meta.json's consumer_group (None: the offsets partition
    is unknown, and nothing explains them)."""
    lost = anomalies.filter(F.col("kind").isin(*LOST_KINDS)).select(
        "topic", "partition", "committed", "t_commit", F.col("offset").alias("returned"),
        F.col("t_read").alias("t_fetch"))
    where = (F.col("topic") == F.lit(group["offsets_topic"])) \
        & (F.col("partition") == F.lit(group["offsets_partition"])) \
        if group is not None else F.lit(False)
    ours = events.filter(where | (F.col("topic").isNull() & (F.col("type") == "power_loss")))
    leaders = prefixed(of_type(ours, "become_leader"), ("t", "broker", "leader_epoch"))
    held = (lost.join(leaders, leaders["e_t"] <= lost["t_commit"], "left").groupBy(*_LOST)
            .agg(F.max_by(F.struct(F.col("e_broker").alias("broker"),
                                   F.col("e_leader_epoch").alias("epoch")), "e_t")
                 .alias("_holder"))
            .select(*_LOST, F.col("_holder.broker").alias("holder"),
                    F.col("_holder.epoch").alias("holder_epoch")))
    changes = prefixed(of_type(ours, "power_loss", "log_recovery", "truncation",
                               "leader_election", "become_leader"),
                       ("t", "type", "broker", "leader", "kind", "reason", "isr",
                        "from_offset", "to_offset", "log_end_offset"))
    e, by_holder = changes, changes["e_broker"] == held["holder"]
    after = (e["e_t"] > held["t_commit"]) & (e["e_t"] <= held["t_fetch"])
    truncation = (e["e_type"] == "truncation") & (e["e_from_offset"] > e["e_to_offset"]) \
        & by_holder
    recovery = truncation & (e["e_reason"] == "log_recovery")
    found = (held.join(e, after, "left").groupBy(*held.columns).agg(
        _first((e["e_type"] == "power_loss") & by_holder, "t").alias("_power"),
        _first(recovery, "t", "from_offset", "to_offset").alias("_recovery"),
        _first((e["e_type"] == "log_recovery") & by_holder & (e["e_log_end_offset"] == 0),
               "t", "broker").alias("_empty"),
        _first((e["e_type"] == "leader_election") & (e["e_kind"] == "unclean"),
               "t", "leader", "isr").alias("_unclean"),
        _first(truncation & ~recovery, "t", "from_offset", "to_offset", "reason")
        .alias("_cut"),
        _first((e["e_type"] == "become_leader") & ~by_holder, "t", "broker", "log_end_offset")
        .alias("_elected")))
    mechanism = (F.when(F.col("_power.t").isNotNull() & F.col("_recovery.t").isNotNull(),
                        "power_loss")
                 .when(F.col("_empty.t").isNotNull(), "disk_lost")
                 .when(F.col("_unclean.t").isNotNull(), "unclean_election")
                 .when(F.col("_cut.reason") == "high_watermark", "high_watermark_truncation")
                 .when(F.col("_cut.t").isNotNull(), "coordinator_truncation")
                 .otherwise("unexplained"))

    def cause(m: str, t: Column, **fields: Column) -> Column:
        return F.when(F.col("mechanism") == m, F.struct(t.alias("t"), *[
            fields.get(n, F.lit(None)).cast(kind).alias(n) for n, kind in CAUSE.items()]))

    power, unclean, cut, new = (F.col(c) for c in ("_power", "_unclean", "_cut", "_elected"))
    causes = F.coalesce(
        cause("power_loss", power["t"], broker=F.col("holder"),
              from_offset=F.col("_recovery.from_offset"),
              to_offset=F.col("_recovery.to_offset")),
        cause("disk_lost", F.col("_empty.t"), broker=F.col("_empty.broker"),
              to_offset=F.lit(0)),
        cause("unclean_election", unclean["t"], leader=unclean["leader"], isr=unclean["isr"]),
        *[cause(m, cut["t"], broker=F.col("holder"), from_offset=cut["from_offset"],
                to_offset=cut["to_offset"], reason=cut["reason"], leader=new["broker"],
                leader_t=new["t"], leader_end=new["log_end_offset"])
          for m in ("high_watermark_truncation", "coordinator_truncation")])
    example = F.struct(*[F.col(c) for c in ("t_commit", "topic", "partition", "committed",
                                            "returned", "t_fetch")])
    return (found.withColumn("mechanism", mechanism).withColumn("cause", causes)
            .groupBy("mechanism", "holder", "holder_epoch", "cause")
            .agg(F.count("*").alias("commits"), F.min("t_commit").alias("first_t"),
                 F.max("t_commit").alias("last_t"),
                 F.slice(F.array_sort(F.collect_list(example)), 1, 5).alias("examples")))


CAUSE = {"broker": "int", "leader": "int", "leader_t": "double", "leader_end": "bigint",
         "isr": "array<int>", "from_offset": "bigint", "to_offset": "bigint",
         "reason": "string"}
"""The fields of an incident's cause after its time `t` (null where its mechanism has none):
the broker that lost or truncated the partition; the leader an unclean election chose (and
the ISR it was chosen from) or, before a truncation, the first other broker that became
leader after the commit, when and with which log end offset; the truncation's offsets and
reason."""
