"""The history's one schema: each file's fields, their JSON types, which may be null, and what
they mean.

The runner writes a history, the analysis reads it, docs/history-format.md describes it; all
three take the fields from here, so they cannot drift apart: the runner's `HistoryWriter` opens
the files listed in `FILES`, the analysis builds its Spark schemas from them (`io.spark_schema`),
the doc's field tables are generated from them (`python -m undertow_history.schema
docs/history-format.md`), and tests check the lines a real run writes against `problems`.

Pure Python with no imports beyond the standard library: the runner imports it (the operator
image has no Spark) and so does the analysis (whose image has no runner).

Adding a file (say events.jsonl) takes one `HistoryFile` in `FILES`, its table's two markers in
the doc, a `HistoryWriter` method that appends its records, and, if the analysis reads it, a
`FileSpec` in `io.FILES` naming the fields it parses.

It is long because it is the history's one schema: every file's fields, with their types and
meaning, in one table that the writer, the checks, the analysis and docs/history-format.md all
read.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Kind = Literal["string", "int", "long", "double", "boolean", "object", "array", "map"]
_INT_BITS = {"int": 32, "long": 64}
_DESCRIBED = {"string": "a string", "int": "a 32-bit integer", "long": "a 64-bit integer",
              "double": "a number", "boolean": "true or false", "object": "a JSON object"}


@dataclass(frozen=True)
class JsonType:
    """A field's type as JSON carries it. int and long are both JSON integers: the width says
    which Spark type reads them (a partition fits an int, an offset needs a long)."""

    kind: Kind
    element: JsonType | None = None  # of an array; of a map's values (its keys are strings)

    def __str__(self) -> str:
        if self.kind == "array":
            return f"array of {self.element}"
        if self.kind == "map":
            return f"map of string to {self.element}"
        return self.kind

    def described(self) -> str:
        """The type in words, for error messages."""
        if self.kind in ("array", "map"):
            return f"{'an array' if self.kind == 'array' else 'an object'} of {self.element}s"
        return _DESCRIBED[self.kind]

    def accepts(self, value: Any) -> bool:
        """Whether `value`, as `json.loads` returns it, has this type (null is never one)."""
        if isinstance(value, bool) or self.kind == "boolean":  # to Python, bool is an int
            return isinstance(value, bool) and self.kind == "boolean"
        if self.kind in _INT_BITS:
            half = 2 ** (_INT_BITS[self.kind] - 1)
            return isinstance(value, int) and -half <= value < half
        if self.kind == "array":
            return isinstance(value, list) and all(self.element.accepts(v) for v in value)
        if self.kind == "map":
            return isinstance(value, dict) and all(self.element.accepts(v)
                                                   for v in value.values())
        return isinstance(value, {"double": int | float, "object": dict, "string": str}[self.kind])


STRING, INT, LONG = JsonType("string"), JsonType("int"), JsonType("long")
DOUBLE, BOOLEAN, OBJECT = JsonType("double"), JsonType("boolean"), JsonType("object")


def array_of(element: JsonType) -> JsonType:
    return JsonType("array", element)


def map_of(element: JsonType) -> JsonType:
    """A JSON object with string keys and values of one type."""
    return JsonType("map", element)


@dataclass(frozen=True)
class Field:
    """One field: its name, type, whether it may be null, its allowed values (an enumerated
    string) and what it means (one line of the doc's table)."""

    name: str
    type: JsonType
    doc: str
    nullable: bool = False
    values: tuple[str, ...] = ()

    def problem(self, value: Any) -> str | None:
        """Why `value` cannot be this field's, or None when it can."""
        if value is None:
            return None if self.nullable else f"field '{self.name}' must not be null"
        if not self.type.accepts(value):
            null = " or null" if self.nullable else ""
            return f"field '{self.name}' must be {self.type.described()}{null}"
        if self.values and value not in self.values:
            return f"field '{self.name}' must be one of {', '.join(self.values)}"
        return None


@dataclass(frozen=True)
class HistoryFile:
    """One file of a history directory: JSON Lines (one record a line) unless its name ends
    in .json (one object). A closed file's records hold exactly its fields; an open one's may
    hold more, which nothing reads (meta.json records extra context for people)."""

    filename: str
    fields: tuple[Field, ...]
    closed: bool = True

    @property
    def name(self) -> str:
        """The file's name without its extension: `sends` for sends.jsonl."""
        return self.filename.split(".")[0]

    @property
    def json_lines(self) -> bool:
        return self.filename.endswith(".jsonl")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"{self.filename} has no field {name!r}")

    def problems(self, record: Any, *, partial: bool = False) -> list[str]:
        """What makes `record` (one parsed line, or the object) disagree with the schema: a
        field missing (unless `partial`: then only the fields present are checked), of the
        wrong type, null where it may not be, outside its values, or unknown (closed files)."""
        if not isinstance(record, dict):
            return ["not a JSON object"]
        found = [f"field '{f.name}' is missing" for f in self.fields
                 if f.name not in record and not partial]
        found += [p for f in self.fields if f.name in record
                  if (p := f.problem(record[f.name])) is not None]
        if self.closed:
            found += [f"field '{k}' is not in the schema" for k in record
                      if k not in self.names]
        return found


# The run's context, written at the start and rewritten at the end.
META = HistoryFile("meta.json", (
    Field("experiment", STRING, "the ChaosExperiment's name"),
    Field("spec", OBJECT, "the experiment spec as run (after defaults); the analysis reads "
                          "`topic.name`"),
    Field("seed", LONG, "seed of the random fault schedule"),
    Field("start", DOUBLE, "when the run started"),
    Field("end", DOUBLE, "when the run ended; null while it is going (or after the runner died)",
          nullable=True),
    Field("idempotent", BOOLEAN, "the producers used `enable.idempotence=true`"),
    Field("expect", STRING, "the verdict the experiment expects",
          values=("clean", "anomalies", "loss")),
    Field("incomplete", BOOLEAN, "true when a failure stopped the run (a history file that "
                                 "could not be written, a part of the runner that failed): "
                                 "records are missing from then on and there was no drain, so "
                                 "the analysis refuses the history unless given "
                                 "`--allow-incomplete`"),
    Field("incomplete_reason", STRING, "the failure that stopped the run, e.g. `history: could "
                                       "not write .../sends.jsonl: [Errno 28] No space left on "
                                       "device`; null when complete", nullable=True),
    Field("consumer_group", OBJECT, "`subscribe` mode: `{\"group_id\", \"offsets_topic\", "
                                    "\"offsets_partition\"}`, the group and the partition of "
                                    "`__consumer_offsets` that holds its state (Kafka's "
                                    "`abs(groupId.hashCode) % offsets.topic.num.partitions`); "
                                    "null for `assign` mode", nullable=True),
    Field("transactions", OBJECT, "transactional producers (`workload.transactions`): "
                                  "`{\"timeout_s\"}`, their `transaction.timeout.ms` in "
                                  "seconds, which the hanging-transaction check reads; null "
                                  "without transactions", nullable=True),
    Field("pipeline", OBJECT, "a consume-transform-produce pipeline (`workload.pipeline`): "
                              "`{\"input_topic\", \"output_topic\", \"members\", "
                              "\"drain\"}`, the drain of the output topic as `drain` gives "
                              "the topic's (null until it ran); the duplicate- and "
                              "missing-output checks read the output topic's drain against "
                              "the input topic's; null without a pipeline", nullable=True),
    Field("faults_skipped", array_of(OBJECT), "the planned faults the nemesis did not inject, "
                                              "each `{\"index\", \"kind\", \"reason\"}` "
                                              "(a target that never came back in time, an "
                                              "injection that failed): the run did not test "
                                              "its whole schedule, which `undertow run`, the "
                                              "report and the operator's status say; `[]` "
                                              "when every fault ran"),
    Field("consumers_not_closed", array_of(STRING),
          "the run's consumers (`c0`, ...) that had not committed and left their group "
          "within a minute of being stopped after the faults (librdkafka's close waits as long "
          "as the group's coordinator does not answer, as when its `__consumer_offsets` "
          "partition stayed offline): the drain went ahead without them, and a commit they "
          "made as they closed has no `groups.jsonl` line; `[]` when every one closed"),
), closed=False)

# One line per send attempt, written when it completes.
SENDS = HistoryFile("sends.jsonl", (
    Field("producer", STRING, "producer id: `p0`, `p1`, ..."),
    Field("value", STRING, "the record value, unique per send: `{producer}-{seq}`, e.g. `p0-17`. "
                           "A retried send writes one line per attempt with the same value"),
    Field("topic", STRING, "the topic it was sent to"),
    Field("partition", INT, "the partition it was sent to; null if never assigned",
          nullable=True),
    Field("status", STRING, "`ok`: acknowledged, with its offset. `fail`: definitely not "
                            "written (the broker refused the only attempt, and the partition's "
                            "leader epoch did not change while the send was out). `info`: "
                            "indeterminate (timed out, disconnected, an error after retries or "
                            "during a leader change; `error` keeps what the client said). A "
                            "send in a transaction (`txn`) takes its transaction's outcome, "
                            "since a transactional write is acknowledged by its commit: `ok` "
                            "committed (the offset is the produce acknowledgement's), `fail` "
                            "aborted (never visible to `read_committed`), `info` a commit "
                            "whose outcome is unknown; its line is written when the "
                            "transaction ends", values=("ok", "fail", "info")),
    Field("offset", LONG, "the offset the acknowledgement gave (`ok` only; null with "
                          "`acks: 0`, where no acknowledgement comes back)", nullable=True),
    Field("error", STRING, "Kafka error name, e.g. `NOT_ENOUGH_REPLICAS`, `REQUEST_TIMED_OUT`, "
                           "`_MSG_TIMED_OUT`; null for `ok`", nullable=True),
    Field("t_invoke", DOUBLE, "when the send was called"),
    Field("t_complete", DOUBLE, "when its outcome was known"),
    Field("txn", STRING, "the transaction it was sent in, as txns.jsonl names it (`p0-t3`: "
                         "producer p0's fourth); null outside a transaction, and in a history "
                         "from before transactions", nullable=True),
))

# One line per record a consumer returned.
READS = HistoryFile("reads.jsonl", (
    Field("consumer", STRING, "consumer id: `c0`, `c1`, ... during the run, `drain` after it"),
    Field("phase", STRING, "`run`: a consumer reading during the fault phase. `drain`: the "
                           "fresh consumer that reads every partition from its log start to "
                           "its end after healing", values=("run", "drain")),
    Field("topic", STRING, "the record's topic"),
    Field("partition", INT, "the record's partition"),
    Field("offset", LONG, "the record's offset"),
    Field("value", STRING, "the record value, as sent"),
    Field("t", DOUBLE, "when the consumer returned it"),
    Field("generation", INT, "`subscribe` mode: the consumer group's generation the member "
                             "was in when it returned the record; null for `assign` mode and "
                             "the drain", nullable=True),
    Field("isolation", STRING, "the consumer's `isolation.level`: `read_committed` returns "
                               "only committed transactional records, up to the last stable "
                               "offset; null in a history from before the field",
          nullable=True, values=("read_committed", "read_uncommitted")),
))

# Transactional producers (`workload.transactions`): one line per transaction, when it ended.
TXNS = HistoryFile("txns.jsonl", (
    Field("producer", STRING, "the producer that ran it: `p0`, `p1`, ...; a pipeline "
                              "member's process: `c0.0`, `c0.1` (member c0's first and "
                              "second process)"),
    Field("txn", STRING, "the transaction's name, which its sends' `txn` gives: "
                         "`{producer}-t{n}`, n counting from 0"),
    Field("transactional_id", STRING, "the producer's `transactional.id`"),
    Field("intent", STRING, "what the workload chose to end it with", values=("commit", "abort")),
    Field("status", STRING, "`ok`: committed (the coordinator acknowledged EndTxn commit). "
                            "`fail`: aborted, as intended or after a send or the commit failed "
                            "(the coordinator acknowledged EndTxn abort, or it timed the "
                            "transaction out). `info`: indeterminate (the commit timed out, or "
                            "the producer failed fatally while it was out): its records may "
                            "or may not become visible", values=("ok", "fail", "info")),
    Field("error", STRING, "the Kafka error that decided a `fail` or an `info`, e.g. "
                           "`_TIMED_OUT`, `INVALID_PRODUCER_EPOCH`, or `MEMBER_DIED` (a "
                           "pipeline member's process died with it open: `fail` when it had "
                           "not called the commit, `info` when it had); null for a plain "
                           "commit or abort", nullable=True),
    Field("values", array_of(STRING), "the values sent in it, in order (each has its line in "
                                      "sends.jsonl)"),
    Field("t_begin", DOUBLE, "when `begin_transaction` was called"),
    Field("t_end_invoke", DOUBLE, "when the commit or abort was first called (EndTxn); "
                                  "null when the producer failed before it", nullable=True),
    Field("t_complete", DOUBLE, "when its outcome was known"),
    Field("offsets", map_of(LONG), "a pipeline member's: input partition (as a string) to the "
                                   "offset committed with it (`send_offsets_to_transaction`, "
                                   "the next one to read); null for a producer's, and in a "
                                   "history from before the field", nullable=True),
))

# Consumer groups (`workload.consumer.mode: subscribe`): one line per group action of a member.
GROUPS = HistoryFile("groups.jsonl", (
    Field("member", STRING, "the member's name in the workload: `c0`, `c1`, ..."),
    Field("member_id", STRING, "the member id the coordinator gave it, when the action "
                               "happened; null before its first join", nullable=True),
    Field("generation", INT, "the group generation the action belongs to; null when unknown",
          nullable=True),
    Field("type", STRING, "`assign`: the member got the partition in this generation. "
                          "`revoke`: it gave the partition up (or lost it). `committed`: when "
                          "assigned, the offset the coordinator returned for the partition "
                          "(OffsetFetch). `commit`: the member committed an offset",
          values=("assign", "revoke", "committed", "commit")),
    Field("topic", STRING, "the partition's topic"),
    Field("partition", INT, "the partition"),
    Field("offset", LONG, "`committed`: the offset returned (null: none committed). `commit`: "
                          "the offset committed, the next one to read as Kafka commits; null "
                          "for `assign` and `revoke`", nullable=True),
    Field("status", STRING, "`commit` only. `ok`: the coordinator acknowledged it. `fail`: "
                            "refused, definitely not written (`ILLEGAL_GENERATION`, "
                            "`UNKNOWN_MEMBER_ID`, `REBALANCE_IN_PROGRESS`, "
                            "`FENCED_INSTANCE_ID`). `info`: indeterminate (a timeout, a "
                            "disconnection, `COORDINATOR_NOT_AVAILABLE`, `NOT_COORDINATOR`, any "
                            "other error)", nullable=True, values=("ok", "fail", "info")),
    Field("error", STRING, "`commit`: the Kafka error name of a `fail` or `info`",
          nullable=True),
    Field("t_invoke", DOUBLE, "`commit`: when it was called; null for an auto-commit, which "
                              "the client's timer makes", nullable=True),
    Field("t", DOUBLE, "when it happened (`commit`: when its outcome was known)"),
))

# One line per fault action.
FAULTS = HistoryFile("faults.jsonl", (
    Field("fault", STRING, "the fault kind: `kill`, `pause`, `partition`, `disk-stall`, ... "
                           "(docs/faults.md)"),
    Field("target", STRING, "the process (`broker-N`, `controller`); for a split partition "
                            "its groups (`broker-0|broker-1,broker-2`), for a one-way one its "
                            "direction (`broker-0->broker-1`)"),
    Field("role", STRING, "how the target was chosen when the fault was injected, e.g. "
                          "`leader of t-0`"),
    Field("action", STRING, "`inject`: the fault took effect. `heal`: its undoing began (its "
                            "duration ran out, or the run stopped). `recover`: the undoing "
                            "finished (a killed or paused process back and serving, a link "
                            "passing again); older histories have no `heal`",
          values=("inject", "heal", "recover")),
    Field("t", DOUBLE, "when the action took effect"),
))

# The cluster's own state, sampled about every 250 ms: one line per partition and sample.
CLUSTER = HistoryFile("cluster.jsonl", (
    Field("t", DOUBLE, "when the sample was taken"),
    Field("topic", STRING, "the partition's topic"),
    Field("partition", INT, "the partition"),
    Field("leader", INT, "the leader's broker id; -1 while the partition is offline"),
    Field("leader_epoch", INT, "the partition's leader epoch"),
    Field("isr", array_of(INT), "the in-sync replicas' broker ids"),
    Field("high_watermark", LONG, "the leader's HW; null when the leader did not answer",
          nullable=True),
    Field("log_end_offsets", map_of(LONG), "broker id (as a string) to that replica's LEO, for "
                                           "the replicas that answered"),
    Field("elr", array_of(INT), "the eligible leader replicas' broker ids (KIP-966: replicas "
                                "that left an ISR smaller than `min.insync.replicas` and still "
                                "hold every record up to the high watermark, electable when "
                                "the ISR is empty); empty when the cluster keeps none or "
                                "does not say (a Kafka admin client does not); null in a "
                                "history from before the field", nullable=True),
    Field("last_known_elr", array_of(INT), "the last known eligible leader replicas "
                                           "(KIP-966), kept for recovery once the ISR and the "
                                           "ELR are both empty (Kafka 4.1+ keeps the last "
                                           "known leader there); empty when none or unknown, "
                                           "null in a history from before the field",
          nullable=True),
    Field("leader_recovery_state", STRING, "KIP-704: `RECOVERING` from an unclean election "
                                           "(the ISR held to the leader alone) until the "
                                           "leader's first ISR change, `RECOVERED` otherwise; "
                                           "null when the source does not say (a Kafka admin "
                                           "client does not) or in a history from before the "
                                           "field", nullable=True),
    Field("last_stable_offset", LONG, "the leader's last stable offset (LSO: the HW, held back "
                                      "at the first offset of a transaction still open, which "
                                      "`read_committed` consumers do not read past); null when "
                                      "the leader did not answer or does not say, or in a "
                                      "history from before the field", nullable=True),
))

# The brokers' and the controller's replication state changes, as they logged them: one line
# per event, collected from each node's `/v1/events` during the run (a history without this
# file analyses as before, without explanations). Each type fills the fields it names and
# leaves the others null.
EVENT_TYPES = ("become_leader", "become_follower", "truncation", "isr_change",
               "leader_election", "broker_fenced", "broker_unfenced", "power_loss",
               "log_recovery", "coordinator_load", "coordinator_unload", "group_rebalance",
               "group_stable", "group_empty", "group_member_removed", "elr_change", "end_txn",
               "leader_recovery")
ELECTION_KINDS = ("clean", "unclean", "preferred", "offline", "elr", "last_known_leader")
EVENTS = HistoryFile("events.jsonl", (
    Field("t", DOUBLE, "when the node logged it"),
    Field("node", STRING, "the process that logged it: `broker-N` or `controller`"),
    Field("type", STRING, "what changed: a replica became leader or follower; a log was "
                          "truncated; a leader changed its ISR; the controller elected a "
                          "leader (or found none), fenced or unfenced a broker; a broker lost "
                          "power (with its log end offsets just before); a restarted broker "
                          "loaded its log. A broker's group coordinator: it loaded the groups "
                          "of a `__consumer_offsets` partition it now leads, or unloaded them; "
                          "a group began a rebalance, completed a generation (every member "
                          "synced) or was left empty; a member left, or was removed when its "
                          "session expired or it did not rejoin in time. The controller "
                          "changed a partition's eligible leader replicas (KIP-966: "
                          "`elr_change`), or its leader recovery state (KIP-704: "
                          "`leader_recovery`). A broker's transaction coordinator answered an "
                          "EndTxn, or aborted a transaction itself (`end_txn`)",
          values=EVENT_TYPES),
    Field("topic", STRING, "the partition's topic; null for broker events", nullable=True),
    Field("partition", INT, "the partition; null for broker events", nullable=True),
    Field("leader_epoch", INT, "the partition's leader epoch after the change (for a "
                               "truncation: the epoch of the leader the broker follows)",
          nullable=True),
    Field("broker", INT, "the broker the event is about: the one that became leader or "
                         "follower, truncated, was fenced, lost power or recovered; "
                         "`elr_change`: the broker whose change caused it (null: none did); "
                         "`leader_recovery`: the leader that was elected or said it had "
                         "recovered",
          nullable=True),
    Field("leader", INT, "`become_follower`: the leader followed. `leader_election`: the new "
                         "leader, -1 when none could be elected. `leader_recovery`: the "
                         "partition's leader", nullable=True),
    Field("previous_leader", INT, "`leader_election`: the leader before it (-1: none)",
          nullable=True),
    Field("kind", STRING, "`leader_election`: `clean` (an ISR member), `unclean` (a replica "
                          "outside the ISR, `unclean.leader.election.enable`), `preferred` "
                          "(the auto leader rebalance), `offline` (no live ISR member), `elr` "
                          "(the ISR was empty: a member of the eligible leader replicas, "
                          "KIP-966; clean to Kafka), `last_known_leader` (the ISR and the ELR "
                          "were both empty: the partition's last known leader, elected again "
                          "as soon as it was unfenced; KIP-966's recovery in Kafka 4.1+, "
                          "which Kafka counts as unclean and marks the partition RECOVERING)",
          nullable=True, values=ELECTION_KINDS),
    Field("reason", STRING, "why, as a code. `truncation`: `offset_for_leader_epoch`, "
                            "`high_watermark` (pre-KIP-101 mode), `out_of_range`, "
                            "`log_recovery` (what a power loss took). `isr_change`: `lag`, "
                            "`caught_up`, `fenced`, `unclean_shutdown` (a broker registered "
                            "again without a clean shutdown, KAFKA-15586), "
                            "`controlled_shutdown` (a broker asked to shut down, "
                            "handleBrokerInControlledShutdown). "
                            "`leader_election`: `leader_fenced`, `broker_unfenced`, "
                            "`preferred`, `unclean_shutdown`, `controlled_shutdown` (the "
                            "leader is in controlled shutdown). `elr_change`: `isr_below_min` "
                            "(replicas that left an ISR smaller than min.insync.replicas "
                            "joined the ELR), `unclean_shutdown` (a broker registered again "
                            "without a clean shutdown and was removed from the ISR and the "
                            "ELR, KAFKA-15586/KAFKA-18106), `elected` (an ELR member was "
                            "elected and became the ISR), `isr_at_min` (the ISR reached "
                            "min.insync.replicas again: ELR cleared), `unclean_election` "
                            "(cleared by an unclean election), `min_isr_changed` (cleared "
                            "when min.insync.replicas changed). `broker_fenced`: "
                            "`session_expired`, `restarted`, `controlled_shutdown` (its "
                            "controlled shutdown was granted). `group_rebalance`: "
                            "`member_joined`, `member_left`, `session_expired`, "
                            "`metadata_changed`, `leader_rejoined`, `sync_failed`. "
                            "`group_member_removed`: `left`, `session_expired`, "
                            "`rebalance_timeout`. `end_txn`: `decided` (it ended the Ongoing "
                            "transaction), `timed_out` (the coordinator's own abort, with a "
                            "fenced epoch), `retry` (a decision already taken: NONE, nothing "
                            "changed), `fenced` (PRODUCER_FENCED: an older epoch), "
                            "`invalid_state` (INVALID_TXN_STATE)", nullable=True),
    Field("detail", STRING, "the same in words, as the node logged it", nullable=True),
    Field("from_offset", LONG, "`truncation`: the log end offset before", nullable=True),
    Field("to_offset", LONG, "`truncation`: the log end offset after", nullable=True),
    Field("log_end_offset", LONG, "the replica's LEO at the change (`become_leader`, "
                                  "`become_follower`, `power_loss`, `log_recovery`); "
                                  "`coordinator_load`: the offset the groups were loaded to",
          nullable=True),
    Field("high_watermark", LONG, "the replica's HW at the change (`become_leader`, "
                                  "`become_follower`)", nullable=True),
    Field("isr", array_of(INT), "`become_leader`, `isr_change`: the ISR after. "
                                "`leader_election`: the ISR the leader was chosen from",
          nullable=True),
    Field("old_isr", array_of(INT), "`isr_change`: the ISR before", nullable=True),
    Field("elr", array_of(INT), "`elr_change`: the eligible leader replicas after (KIP-966)",
          nullable=True),
    Field("old_elr", array_of(INT), "`elr_change`: the eligible leader replicas before",
          nullable=True),
    Field("last_known_elr", array_of(INT), "`elr_change`: the last known eligible leader "
                                           "replicas after", nullable=True),
    Field("leader_recovery_state", STRING, "`leader_recovery`: the partition's state after "
                                           "(KIP-704): `RECOVERING` (an unclean election) or "
                                           "`RECOVERED` (its leader said so in the "
                                           "AlterPartition that grew the ISR)",
          nullable=True),
    Field("broker_epoch", LONG, "`broker_fenced`, `broker_unfenced`: the broker's "
                                "registration epoch", nullable=True),
    Field("group", STRING, "the group of a `group_*` event; `coordinator_load`: null (its "
                           "`detail` names the groups loaded)", nullable=True),
    Field("generation", INT, "`group_rebalance`: the generation it began from; `group_stable`, "
                             "`group_empty`: the generation completed; "
                             "`group_member_removed`: the group's generation then",
          nullable=True),
    Field("members", array_of(STRING), "`group_stable`: the member ids of the generation",
          nullable=True),
    Field("member", STRING, "`group_rebalance`: the member id that caused it, if one did; "
                            "`group_member_removed`: the member id removed", nullable=True),
    Field("transactional_id", STRING, "`end_txn`: the request's transactional id",
          nullable=True),
    Field("producer_id", LONG, "`end_txn`: the request's producer id", nullable=True),
    Field("producer_epoch", INT, "`end_txn`: the request's producer epoch (the coordinator's "
                                 "fenced epoch for its own abort)", nullable=True),
    Field("decision", STRING, "`end_txn`: what the request asked, `commit` or `abort`",
          nullable=True),
    Field("txn_state", STRING, "`end_txn`: the transaction's state at the coordinator when "
                               "the request came (`Ongoing`, `CompleteCommit`, ...)",
          nullable=True),
    Field("txn_epoch", INT, "`end_txn`: the transactional id's producer epoch at the "
                            "coordinator then (transaction version 2 bumps it at every "
                            "EndTxn)", nullable=True),
    Field("transaction_version", INT, "`end_txn`: the transaction version it ran under (the "
                                      "client's, from its EndTxn version: 2 from v5)",
          nullable=True),
    Field("txn_partitions", array_of(STRING), "`end_txn` `decided` or `timed_out`: the "
                                              "partitions the decision ended "
                                              "(`topic-partition`)", nullable=True),
))

FILES: tuple[HistoryFile, ...] = (META, SENDS, READS, GROUPS, TXNS, FAULTS, CLUSTER, EVENTS)


# ---- docs/history-format.md's field tables ----------------------------------------------------

_TABLE = re.compile(r"(?P<start><!-- fields of (?P<file>\S+) [^>]*-->\n).*?"
                    r"(?P<end><!-- end of fields -->)", re.DOTALL)


def markdown_table(file: HistoryFile) -> str:
    """The doc's table of `file`'s fields: name, type (with its values), nullable, meaning."""
    rows = ["| field | type | null | meaning |", "|---|---|---|---|"]
    for f in file.fields:
        kind = str(f.type) + (f" ({', '.join(f'`{v}`' for v in f.values)})" if f.values else "")
        doc = f.doc.replace("|", "\\|")  # a pipe, even in a code span, would end the cell
        rows.append(f"| `{f.name}` | {kind} | {'yes' if f.nullable else 'no'} | {doc} |")
    return "\n".join(rows) + "\n"


def render_doc(text: str) -> str:
    """`text` with every generated table replaced by the schema's; raises ValueError when a
    file has no table (or two) or a table names no file of the schema."""
    by_filename = {f.filename: f for f in FILES}
    seen = [m["file"] for m in _TABLE.finditer(text)]
    unknown = [name for name in seen if name not in by_filename]
    missing = [f.filename for f in FILES if seen.count(f.filename) != 1]
    if unknown or missing:
        raise ValueError(f"tables of files not in the schema: {unknown}; files without exactly "
                         f"one table: {missing} (add a line '<!-- fields of FILENAME "
                         f"(generated) -->' and one '<!-- end of fields -->')")
    return _TABLE.sub(
        lambda m: m["start"] + markdown_table(by_filename[m["file"]]) + m["end"], text)


def main(argv: Sequence[str]) -> int:
    """`python -m undertow_history.schema DOC...`: regenerate the tables in place."""
    for path in map(Path, argv):
        path.write_text(render_doc(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
