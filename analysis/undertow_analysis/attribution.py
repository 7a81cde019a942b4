"""Loss attribution: for each lost, misplaced, phantom or skipped record, the election and the
truncation that removed it, and the Kafka rule behind them (from events.jsonl).

Pure functions from DataFrames to DataFrames, like `checks`: the anomalous records (few) are
joined with the replication events (fewer still: a broadcast), and nothing is collected here.

For a record at offset O of a partition, known to be on its leader at time t (when it was
acknowledged; for a phantom read, when a consumer read it; for a record the consumer group
skipped, when the group's committed offset passed O: the record then at O is the one the
election removed, and the skipped one was written at O after it):

- its *holder* is the broker that led the partition at t (the last `become_leader` at or
  before t), with that leader epoch;
- the *dropping election* is the first `become_leader` after t whose log ended at or below
  O: from then on the partition's log is that broker's, and O is not in it (the controller's
  `leader_election` of that epoch says how the broker was chosen);
- the *cause* says why that broker lacked O: a truncation of its own log between t and the
  election (reason `log_recovery`: a power loss took the unflushed tail; `high_watermark`:
  the pre-KIP-101 rule), an unclean election, (acks=1) it had never fetched O, or (acks=all,
  so it had O as an ISR member) it restarted in between without a power loss: its disk was
  lost. KIP-966's elections keep these causes: an election from the eligible leader
  replicas (`elr`) is clean, and one of the last known leader (`last_known_leader`, the ISR
  and the ELR both empty), which Kafka counts as unclean, is an unclean election here only
  when the broker never had O (no truncation of its own, no restart): a last known leader
  that lost O with its unflushed tail or its disk is a power loss or a lost disk;
- an unclean election (the last known leader's included) made the partition RECOVERING
  (KIP-704) until its new leader's first ISR change: the *recovery* is when that epoch's
  `leader_recovery` events say it began and ended (ended null: still RECOVERING when the run
  ended; both null in a history from before KIP-704's events);
- the *removals* are the truncations by which the other replicas dropped O after the
  election and after t (KIP-101's OffsetForLeaderEpoch, usually on the holder when it
  returns).

A leader the controller has replaced does not know it until the metadata log tells it (a
KRaft broker learns of a new epoch only from there): paused past its session timeout, then
resumed, it still serves the produce requests in its socket buffers as the leader of its old
epoch, and with acks=1 (or acks=all with an ISR of itself, min.insync.replicas=1) it
acknowledges them. Such a record's leader by time has no dropping election: it never had O
in its log. So when no `become_leader` after t dropped O, the leader by time's log ended at
or below O when it became leader, and a truncation after t on another broker B covers O
(from_offset > O >= to_offset) while B's last `become_leader` at or before t was for an
earlier epoch, the record is `deposed_leader`: B in that epoch is its holder (of the
truncating brokers that qualify, the first to truncate), the leader by time is the dropping
election (its `leader_election` came before t), there is no cause, and B's truncation on
learning of the new epoch is among the removals.

A record of a transactional history at or past its partition's *stuck* last stable offset
(the last cluster sample has it below the high watermark: a transaction that nothing ended
holds it there) is `hanging_transaction`, before any of the rules above: it is on the
brokers, but `read_committed` readers, the drain among them, never read past the open
transaction's first batch (Kafka's `Partition.fetchRecords` reads up to
`lastStableOffset`).

The mechanism is the first of these that applies; a record that none explains is
`unexplained`, itself a finding (a bug in the broker or the harness). Records dropped by the
same election from the same holder's epoch form one loss incident.

A duplicate (a value drained at two offsets) is a producer's retry written twice. Its send
began at t_invoke on the partition's leader then and was acknowledged at t_acked: if a
`become_leader` of its partition falls in between, the retry crossed that leader change
(`retry_across_election`: the first attempt's batch was written and replicated, its answer
never came, and the retry went to the new leader); otherwise it retried a request whose
answer came too late (`retry_after_timeout`). Neither is a bug without idempotence, which
alone lets a broker tell a retry from a new record (KIP-98); with it, a duplicate is
`unexplained`. Duplicates of one partition retried across the same leader change, or all
those without one, form one duplicate group.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from undertow_analysis.anomalies import INCIDENT, RETRY, explained_by

_EXPLAINED = explained_by(INCIDENT)
EXPLAINED_KINDS = tuple(k.name for k in _EXPLAINED)
"""The anomaly kinds whose records loss incidents explain (lost, misplaced, phantom_read,
skipped)."""
RETRIED_KINDS = tuple(k.name for k in explained_by(RETRY))
"""The anomaly kinds whose records duplicate groups explain (duplicate)."""

_SUBJECT = ("value", "topic", "partition", "offset", "t", *EXPLAINED_KINDS)


def subjects(anomalies: DataFrame) -> DataFrame:
    """The anomalous records to explain, one row per value: topic, partition, offset, t (the
    time the record was surely on its leader: its kind's `held_at`, the acknowledgement of a
    lost or misplaced record, the read of a phantom one, for a skipped one the commit that
    passed its offset) and a flag per kind it has. Position and time are its row's of the
    first of its kinds in the table's order (where it was acknowledged, if it was)."""
    kind = F.col("kind")
    held = F.coalesce(*[F.when(kind == k.name, F.col(k.held_at)) for k in _EXPLAINED])
    rank = F.coalesce(*[F.when(kind == k.name, F.lit(i)) for i, k in enumerate(_EXPLAINED)])
    where = F.struct("topic", "partition", "offset", held.alias("t"))
    return (anomalies.filter(kind.isin(*EXPLAINED_KINDS) & F.col("offset").isNotNull())
            .groupBy("value")
            .agg(F.min_by(where, rank).alias("_at"),
                 *[F.max(kind == k).alias(k) for k in EXPLAINED_KINDS])
            .select("value", "_at.*", *EXPLAINED_KINDS))


def of_type(events: DataFrame, *types: str) -> DataFrame:
    return events.filter(F.col("type").isin(*types))


def _same_partition(a: DataFrame, b: DataFrame) -> Column:
    return (a["topic"] == b["e_topic"]) & (a["partition"] == b["e_partition"])


def prefixed(events: DataFrame, columns: tuple[str, ...]) -> DataFrame:
    return F.broadcast(events.select(*[F.col(c).alias(f"e_{c}") for c in columns]))


def stuck_offsets(samples: DataFrame) -> DataFrame:
    """topic, partition, hanging_lso: each partition whose last cluster sample with a high
    watermark and a last stable offset has the LSO below the HW, with that LSO (few rows)."""
    known = samples.filter(F.col("high_watermark").isNotNull()
                           & F.col("last_stable_offset").isNotNull())
    last = F.max_by(F.struct("last_stable_offset", "high_watermark"), "t")
    return (known.groupBy("topic", "partition").agg(last.alias("_last"))
            .filter(F.col("_last.last_stable_offset") < F.col("_last.high_watermark"))
            .select("topic", "partition",
                    F.col("_last.last_stable_offset").alias("hanging_lso")))


def attribute(subjects: DataFrame, events: DataFrame, acks_one: bool,
              stuck: DataFrame | None = None) -> DataFrame:
    """One row per subject: its columns, holder, holder_epoch, dropper, drop_epoch, drop_t,
    dropper_end (the dropping leader's log end offset), deposed (the holder was a deposed
    leader: the dropping election came before t), election (t, kind, reason, isr,
    previous_leader of that epoch's election), cause (reason, t, from_offset, to_offset of
    the dropper's own truncation), restarted (the dropper restarted between the two: it
    registered again, or loaded a log that ends at or below the offset), removals (brokers
    that truncated it after the election and t), removal_t, removal_reason, and mechanism (a
    code of `undertow_history.checker.MECHANISMS`). `acks_one`: the producers used acks=1 (a
    clean election of a replica that never had the record explains it only then). `stuck`:
    a transactional history's `stuck_offsets`, which give hanging_lso (null elsewhere).
    """
    leaders = prefixed(of_type(events, "become_leader", "truncation"),
                       ("topic", "partition", "t", "type", "broker", "leader_epoch",
                        "log_end_offset", "from_offset", "to_offset"))
    s = subjects
    is_leader = leaders["e_type"] == "become_leader"
    before = is_leader & (leaders["e_t"] <= s["t"])
    dropping = is_leader & (leaders["e_t"] > s["t"]) & (leaders["e_log_end_offset"]
                                                        <= s["offset"])
    cut_after = ((leaders["e_type"] == "truncation") & (leaders["e_t"] > s["t"])
                 & (leaders["e_from_offset"] > s["offset"])
                 & (leaders["e_to_offset"] <= s["offset"]))
    leader = F.struct(F.col("e_broker").alias("broker"), F.col("e_leader_epoch").alias("epoch"),
                      F.col("e_t").alias("t"), F.col("e_log_end_offset").alias("end"))
    led = F.struct(F.col("e_t").alias("t"), F.col("e_broker").alias("broker"),
                   F.col("e_leader_epoch").alias("epoch"))
    cut = F.struct(F.col("e_t").alias("t"), F.col("e_broker").alias("broker"))
    grouped = (s.join(leaders, _same_partition(s, leaders), "left")
               .groupBy(*_SUBJECT)
               .agg(F.max_by(leader, F.when(before, F.col("e_t"))).alias("_holder"),
                    F.min_by(leader, F.when(dropping, F.col("e_t"))).alias("_drop"),
                    F.collect_list(F.when(before, led)).alias("_led"),
                    F.collect_list(F.when(cut_after, cut)).alias("_cuts")))
    by_time, deposer = F.col("_holder"), F.col("_deposed")
    deposed = deposer.isNotNull()
    # A deposed leader's record: it is the holder, and the leader by time the dropper.
    drop = F.when(deposed, by_time).otherwise(F.col("_drop"))
    stage1 = (grouped.withColumn("_deposed", _deposed_leader())
              .select(*_SUBJECT,
                      F.when(deposed, deposer["broker"]).otherwise(by_time["broker"])
                      .alias("holder"),
                      F.when(deposed, deposer["epoch"]).otherwise(by_time["epoch"])
                      .alias("holder_epoch"),
                      drop["broker"].alias("dropper"),
                      drop["epoch"].alias("drop_epoch"),
                      drop["t"].alias("drop_t"),
                      drop["end"].alias("dropper_end"),
                      deposed.alias("deposed")))
    changes = prefixed(
        of_type(events, "leader_election", "truncation", "log_recovery", "broker_fenced",
                "leader_recovery"),
        ("topic", "partition", "t", "type", "broker", "leader_epoch", "kind", "reason", "isr",
         "previous_leader", "from_offset", "to_offset", "log_end_offset",
         "leader_recovery_state"))
    a, e = stage1, changes
    covers = (e["e_from_offset"] > a["offset"]) & (e["e_to_offset"] <= a["offset"])
    truncation = e["e_type"] == "truncation"
    between = (e["e_t"] > a["t"]) & (e["e_t"] <= a["drop_t"])
    by_dropper = e["e_broker"] == a["dropper"]
    election_of_drop = (e["e_type"] == "leader_election") & (e["e_leader_epoch"]
                                                            == a["drop_epoch"])
    recovery_of_drop = (e["e_type"] == "leader_recovery") & (e["e_leader_epoch"]
                                                             == a["drop_epoch"])

    def recovery_at(state: str) -> Column:
        return F.min(F.when(recovery_of_drop & (e["e_leader_recovery_state"] == state),
                            F.col("e_t")))

    cause_row = truncation & by_dropper & covers & between
    restart_row = by_dropper & between & (
        ((e["e_type"] == "log_recovery") & (e["e_log_end_offset"] <= a["offset"]))
        | ((e["e_type"] == "broker_fenced") & (e["e_reason"] == "restarted")))
    removal_row = (truncation & covers & (e["e_t"] >= a["drop_t"]) & (e["e_t"] > a["t"])
                   & ~by_dropper)
    election = F.struct(F.col("e_t").alias("t"), F.col("e_kind").alias("kind"),
                        F.col("e_reason").alias("reason"),
                        F.col("e_isr").alias("isr"),
                        F.col("e_previous_leader").alias("previous_leader"))
    cause = F.struct(F.col("e_reason").alias("reason"), F.col("e_t").alias("t"),
                     F.col("e_from_offset").alias("from_offset"),
                     F.col("e_to_offset").alias("to_offset"))
    stage1_columns = stage1.columns
    attributed = (
        a.join(e, _same_partition(a, e) | e["e_topic"].isNull(), "left")  # broker events too
        .groupBy(*stage1_columns)
        .agg(F.max_by(election, F.when(election_of_drop, F.col("e_t"))).alias("election"),
             F.struct(recovery_at("RECOVERING").alias("began"),
                      recovery_at("RECOVERED").alias("ended")).alias("recovery"),
             F.min_by(cause, F.when(cause_row, F.col("e_t"))).alias("cause"),
             F.coalesce(F.max(restart_row), F.lit(False)).alias("restarted"),
             F.array_sort(F.collect_set(F.when(removal_row, F.col("e_broker"))))
             .alias("removals"),
             F.min(F.when(removal_row, F.col("e_t"))).alias("removal_t"),
             F.min_by(F.col("e_reason"), F.when(removal_row, F.col("e_t")))
             .alias("removal_reason"))
    )
    if stuck is None:
        attributed = attributed.withColumn("hanging_lso", F.lit(None).cast("long"))
    else:
        h = F.broadcast(stuck.select(F.col("topic").alias("_h_topic"),
                                     F.col("partition").alias("_h_partition"), "hanging_lso"))
        on = (attributed["topic"] == h["_h_topic"]) & (
            attributed["partition"] == h["_h_partition"]) & (
            attributed["offset"] >= h["hanging_lso"])
        attributed = attributed.join(h, on, "left").drop("_h_topic", "_h_partition")
    return attributed.withColumn("mechanism", _mechanism(acks_one))


def _deposed_leader() -> Column:
    """The deposed leader that acknowledged the record (the module docstring's rule), as
    (t, broker, epoch) of its first truncation after t and its epoch; null when a
    `become_leader` after t dropped the record, when the leader by time's log reached past
    the offset, or when no truncating broker qualifies. Over the subject's `_holder` (the
    leader by time), `_drop`, `_led` (every `become_leader` at or before t, as t, broker,
    epoch) and `_cuts` (the truncations after t that cover the offset, as t, broker)."""
    by_time = F.col("_holder")

    def epoch_led(broker: Column) -> Column:  # the epoch of its last become_leader by t
        return F.array_max(F.filter("_led", lambda led: led["broker"] == broker))["epoch"]

    cuts = F.transform("_cuts", lambda c: F.struct(
        c["t"].alias("t"), c["broker"].alias("broker"), epoch_led(c["broker"]).alias("epoch")))
    qualify = F.filter(cuts, lambda c: (c["broker"] != by_time["broker"])
                       & (c["epoch"] < by_time["epoch"]))
    return F.when(F.col("_drop").isNull() & (by_time["end"] <= F.col("offset")),
                  F.array_min(qualify))


def _mechanism(acks_one: bool) -> Column:
    """The first rule that explains the record (see the module docstring)."""
    cause = F.col("cause.reason")
    kind = F.col("election.kind")
    return (F.when(F.col("hanging_lso").isNotNull(), "hanging_transaction")
            .when(F.col("dropper").isNull(), "unexplained")
            .when(F.col("deposed"), "deposed_leader")
            .when(cause == "log_recovery", "power_loss")
            .when(cause == "high_watermark", "high_watermark_truncation")
            .when(kind == "unclean", "unclean_election")
            .when((kind == "last_known_leader") & F.col("cause").isNull() & ~F.col("restarted"),
                  "unclean_election")
            .when(F.lit(acks_one) & F.col("cause").isNull(), "acks1_before_replication")
            .when(F.col("restarted"), "disk_lost")
            .otherwise("unexplained"))


INCIDENT_KEY = ("topic", "partition", "mechanism", "holder", "holder_epoch", "dropper",
                "drop_epoch", "drop_t", "dropper_end", "election", "recovery", "cause",
                "restarted", "hanging_lso")


def incidents(attributed: DataFrame) -> DataFrame:
    """Loss incidents: the records one election dropped from one holder's epoch, by the same
    mechanism (an unexplained record is an incident of its own partition and kind of
    anomaly): the key's columns, first and last offset, first_t and last_t (acknowledged,
    read or passed by a commit), the records, those lost, misplaced, read before they were
    gone (phantom_read; those never acknowledged: phantom_only) and skipped by the consumer
    group (written at offsets its committed offset had passed), removals (every broker that
    truncated one of them after the election), removal_t, removal_reason and up to 5
    example values."""
    return (attributed.groupBy(*INCIDENT_KEY)
            .agg(F.min("offset").alias("first_offset"), F.max("offset").alias("last_offset"),
                 F.min("t").alias("first_t"), F.max("t").alias("last_t"),
                 F.count("*").alias("records"),
                 *[F.count(F.when(F.col(k), 1)).alias(k) for k in EXPLAINED_KINDS],
                 F.count(F.when(F.col("phantom_read") & ~F.col("lost") & ~F.col("misplaced"), 1))
                 .alias("phantom_only"),
                 F.array_sort(F.array_distinct(F.flatten(F.collect_list("removals"))))
                 .alias("removals"),
                 F.min("removal_t").alias("removal_t"),
                 F.min_by("removal_reason", "removal_t").alias("removal_reason"),
                 F.slice(F.array_sort(F.collect_set("value")), 1, 5).alias("examples")))


_MEMBERSHIP = ("become_leader", "become_follower")
"""The events by which a broker takes part in a leader epoch (`dropped`)."""
_HELD_PIECE = "struct<lo:bigint,hi:bigint,t_cut:double,t_held:double,t_from:double>"
"""A run of offsets of a truncation that the broker wrote in one epoch (`dropped`)."""


def dropped(events: DataFrame) -> DataFrame:
    """The truncation events that dropped offsets, each with its `id` and `pieces`: its
    offsets [to_offset, from_offset) in runs (lo, hi; hi exclusive) that the truncating broker
    B wrote in one leader epoch, each with t_cut, t_held and t_from. At each offset of a
    piece B cut the last record acknowledged there from t_from (null: any time) to t_cut, or
    one it acknowledged itself after t_cut as a deposed leader, before t_held
    (`checks.truncation_records` picks it).

    Which epoch: B's log end when it became leader or follower of an epoch, or after it
    truncated, is where it began to write in that epoch; so of those moves before the epoch
    E it truncated for (the event's leader_epoch), the last epoch whose move left its log
    ending at or below an offset is the one B wrote that offset in. A follower's fetch names
    its leader epoch and a leader of another epoch refuses it (FENCED_LEADER_EPOCH, KIP-320),
    so B wrote nothing of an epoch it never learned of, and an epoch it followed without
    fetching (back from a kill just before the next election) left its log where it was.

    t_cut is the start (the first `become_leader`) of the first epoch after that one: what
    was acknowledged at the piece's offsets later was the next leaders' (a leader killed and
    back only after the next election too truncates for that later epoch, and the records
    the next leader acknowledged there are often still there). If B led the epoch, it wrote
    the piece itself, from its `become_leader` (t_from), and a leader replaced while alive
    (paused, or by a preferred election) still appends as the leader of its old epoch until
    the metadata log tells it of a newer one, its acknowledgements reaching the producers
    after that: t_held is the truncation. Unless it restarted after t_cut (a
    `log_recovery`): the controller replaced it because it was dead, and it acknowledged
    nothing after t_cut (t_held is t_cut, as for a follower, which acknowledges nothing).
    Offsets no move places: t_cut is the start of E, t_held the truncation. A power loss
    cuts what was written before it, whatever the epoch: one piece, t_cut and t_held the
    truncation itself."""
    cuts = (of_type(events, "truncation").filter(F.col("from_offset") > F.col("to_offset"))
            .withColumn("id", F.xxhash64("node", "t", "topic", "partition", "from_offset",
                                         "to_offset")))
    # Per partition, its replicas' moves, truncations and restarts: few, broadcast.
    moves = F.broadcast(of_type(events, *_MEMBERSHIP, "truncation", "log_recovery").groupBy(
        F.col("topic").alias("h_topic"), F.col("partition").alias("h_partition")).agg(
        F.collect_list(F.struct("t", "type", "broker", "leader_epoch", "log_end_offset",
                                "to_offset")).alias("_moves")))
    on = (cuts["topic"] == moves["h_topic"]) & (cuts["partition"] == moves["h_partition"])
    t = F.col("t")
    whole = F.array(F.struct(F.col("to_offset").alias("lo"), F.col("from_offset").alias("hi"),
                             t.alias("t_cut"), t.alias("t_held"),
                             F.lit(None).cast("double").alias("t_from")))
    pieces = F.when(F.col("reason") == "log_recovery", whole).otherwise(
        F.transform(_epoch_pieces(), _timed))
    return (cuts.join(moves, on, "left")
            .select(*cuts.columns, pieces.cast(f"array<{_HELD_PIECE}>").alias("pieces")))


def _own_moves() -> Column:
    """The truncating broker's moves (`dropped`'s `_moves`) up to its truncation."""
    return F.filter(F.coalesce("_moves", F.array()),
                    lambda m: (m["broker"] == F.col("broker")) & (m["t"] <= F.col("t")))


def _epoch_pieces() -> Column:
    """The truncation's offsets in runs written in one epoch (`dropped`), as lo, hi and
    epoch (null where no move places them)."""
    lo, hi, epoch = F.col("to_offset"), F.col("from_offset"), F.col("leader_epoch")
    starts_at = F.filter(
        F.transform(F.filter(_own_moves(), lambda m: (m["leader_epoch"] < epoch)
                             & (m["type"] != "log_recovery")),
                    lambda m: F.struct(m["leader_epoch"].alias("epoch"),
                                       F.coalesce(m["to_offset"], m["log_end_offset"])
                                       .alias("offset"))),
        lambda s: s["offset"].isNotNull())
    inside = F.transform(F.filter(starts_at, lambda s: (s["offset"] > lo) & (s["offset"] < hi)),
                         lambda s: s["offset"])
    bounds = F.array_sort(F.array_distinct(F.concat(F.array(lo), inside)))
    ends = F.concat(F.slice(bounds, 2, F.size(bounds)), F.array(hi))
    return F.zip_with(bounds, ends, lambda a, b: F.struct(
        a.alias("lo"), b.alias("hi"),
        F.array_max(F.transform(F.filter(starts_at, lambda s: s["offset"] <= a),
                                lambda s: s["epoch"])).alias("epoch")))


def _timed(piece: Column) -> Column:
    """A piece of `_epoch_pieces` with its t_cut, t_held and t_from (`dropped`)."""
    t, epoch, written = F.col("t"), F.col("leader_epoch"), piece["epoch"]
    own = _own_moves()
    later = F.filter(F.coalesce("_moves", F.array()), lambda m: (m["type"] == "become_leader")
                     & (m["leader_epoch"] > F.coalesce(written, epoch - 1))
                     & (m["leader_epoch"] <= epoch))
    t_cut = F.least(F.coalesce(F.array_min(F.transform(later, lambda m: m["t"])), t), t)
    led_at = F.array_min(F.transform(
        F.filter(own, lambda m: (m["type"] == "become_leader") & (m["leader_epoch"] == written)),
        lambda m: m["t"]))
    restarted = F.exists(own, lambda m: (m["type"] == "log_recovery") & (m["t"] > t_cut))
    t_held = F.when(written.isNotNull() & (led_at.isNull() | restarted), t_cut).otherwise(t)
    return F.struct(piece["lo"].alias("lo"), piece["hi"].alias("hi"), t_cut.alias("t_cut"),
                    t_held.alias("t_held"), led_at.alias("t_from"))


def truncations(events: DataFrame) -> DataFrame:
    """Every truncation that dropped offsets (`dropped`): id, node, broker, topic,
    partition, t, leader_epoch, from_offset, to_offset, reason. (The records each cut, and
    their fate, come from the one pass over the sends: `checks.truncation_records`.)"""
    return dropped(events).select("id", "node", "broker", "topic", "partition", "t",
                                  "leader_epoch", "from_offset", "to_offset", "reason")


RETRY_WINDOW_S = 120.0
"""How long after its first attempt a duplicate never acknowledged may have been retried
(the producers' delivery timeout is far below it)."""
DUPLICATE_KEY = ("topic", "partition", "mechanism", "holder", "holder_epoch", "new_leader",
                 "new_epoch", "change_t")


def duplicate_groups(anomalies: DataFrame, events: DataFrame, idempotent: bool) -> DataFrame:
    """Duplicate groups (see the module docstring): the key's columns (holder: the leader when
    the send began; new_leader, new_epoch, change_t: the first leader change during it, null
    when none), duplicates, first_offset, last_offset, first_t (first send), last_t and up
    to 5 example values."""
    leaders = prefixed(of_type(events, "become_leader"),
                        ("topic", "partition", "t", "broker", "leader_epoch"))
    dups = anomalies.filter(F.col("kind").isin(*RETRIED_KINDS)).select(
        "value", "topic", "partition", "offset", "t_invoke",
        F.coalesce("t_acked", F.col("t_invoke") + RETRY_WINDOW_S).alias("t_done"))
    leader = F.struct(F.col("e_broker").alias("broker"), F.col("e_leader_epoch").alias("epoch"),
                      F.col("e_t").alias("t"))
    before = leaders["e_t"] <= dups["t_invoke"]
    during = (leaders["e_t"] > dups["t_invoke"]) & (leaders["e_t"] <= dups["t_done"])
    per_value = (
        dups.join(leaders, _same_partition(dups, leaders), "left")
        .groupBy("value", "topic", "partition", "offset", "t_invoke")
        .agg(F.max_by(leader, F.when(before, F.col("e_t"))).alias("_holder"),
             F.min_by(leader, F.when(during, F.col("e_t"))).alias("_change"))
        .select("value", "topic", "partition", "offset", "t_invoke",
                F.col("_holder.broker").alias("holder"),
                F.col("_holder.epoch").alias("holder_epoch"),
                F.col("_change.broker").alias("new_leader"),
                F.col("_change.epoch").alias("new_epoch"),
                F.col("_change.t").alias("change_t")))
    mechanism = (F.when(F.lit(idempotent), "unexplained")
                 .when(F.col("change_t").isNotNull(), "retry_across_election")
                 .otherwise("retry_after_timeout"))
    return (per_value.withColumn("mechanism", mechanism).groupBy(*DUPLICATE_KEY)
            .agg(F.count("*").alias("duplicates"),
                 F.min("offset").alias("first_offset"), F.max("offset").alias("last_offset"),
                 F.min("t_invoke").alias("first_t"), F.max("t_invoke").alias("last_t"),
                 F.slice(F.array_sort(F.collect_set("value")), 1, 5).alias("examples")))
