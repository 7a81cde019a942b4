"""The workload of an experiment: stock Kafka producers, and consumers that read by
partition (`assign`) or as one consumer group (`subscribe`), every send and read recorded."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, WithJsonSchema, model_validator

from .durations import Duration
from .meta import FieldError, SpecModel

__all__ = ["Acks", "ConsumerSpec", "PipelineSpec", "TransactionsSpec", "Workload"]


def _check_acks(value: Any) -> Any:
    if isinstance(value, bool) or value not in (0, 1, "all"):
        raise ValueError(f"invalid acks {value!r}: expected 0, 1 or all")
    return value


Acks = Annotated[
    Literal[0, 1, "all"],
    BeforeValidator(_check_acks),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
            "enum": [0, 1, "all"],
        }
    ),
]


class ConsumerSpec(SpecModel):
    """How the workload's consumers read.

    `assign` (the default): each consumer reads every partition from the earliest offset
    (`assign()`), with no group. `subscribe`: the consumers are the members of one consumer
    group (`subscribe()`, Kafka's classic group protocol): the coordinator assigns them the
    partitions, they commit their progress to `__consumer_offsets` and resume from it after a
    rebalance; the history records every assignment, committed offset returned and commit
    (docs/history-format.md, `groups.jsonl`).
    """

    mode: Literal["assign", "subscribe"] = "assign"
    group_id: str | None = Field(None, min_length=1, max_length=249)
    """subscribe: the group's id (default `undertow`)."""
    group_protocol: Literal["classic", "consumer"] | None = None
    """subscribe: librdkafka's group.protocol. `classic` (the default): JoinGroup and
    SyncGroup, the members assign. `consumer`: Kafka 4's protocol (KIP-848), the coordinator
    assigns and each member reconciles at its own member epoch; the session is the
    coordinator's (the cluster's `group.consumer.session.timeout.ms`), not the member's. Runs
    with the stock client (local processes, pods) and, in simulation, a model of
    librdkafka's member (not yet for a pipeline's members)."""
    commit: Literal["auto", "manual", "transaction"] | None = None
    """subscribe: `auto` (the client commits every `commitInterval`, enable.auto.commit),
    `manual` (the member commits synchronously every `commitInterval`, and when its
    partitions are revoked) or `transaction` (a `pipeline`'s members: the offsets go into
    each transaction, `send_offsets_to_transaction`). Default auto, transaction with a
    pipeline."""
    commit_interval: Duration | None = None
    """subscribe: auto.commit.interval.ms, the manual commit period, or a pipeline member's
    transaction period (Kafka Streams' commit.interval.ms) (default 1s)."""
    isolation_level: Literal["read_committed", "read_uncommitted"] | None = None
    """subscribe: isolation.level (default librdkafka's, read_committed)."""
    static_membership: bool | None = None
    """subscribe: give member cN the group.instance.id `{groupId}-cN` (KIP-345): a member that
    restarts within its session keeps its partitions without a rebalance."""
    session_timeout: Duration | None = None
    """subscribe: session.timeout.ms (default 6s; the brokers' group.min.session.timeout.ms
    and group.max.session.timeout.ms bound it); heartbeats go every third of it, 1s at most."""
    rebalance_every: Duration | None = None
    """subscribe: every this often one member (in turn) leaves the group and joins again,
    which makes the group rebalance at known times; unset: members stay for the whole run."""

    @model_validator(mode="after")
    def _check(self) -> ConsumerSpec:
        group_only = ("group_id", "group_protocol", "commit", "commit_interval",
                      "isolation_level", "static_membership", "session_timeout",
                      "rebalance_every")
        if self.mode == "assign":
            for name in group_only:
                if getattr(self, name) is not None:
                    alias = ConsumerSpec.model_fields[name].alias or name
                    raise FieldError((alias,), "only consumers of mode subscribe take it")
            return self
        self.group_id = self.group_id or "undertow"
        self.group_protocol = self.group_protocol or "classic"
        if self.group_protocol == "consumer":
            if self.session_timeout is not None:
                raise FieldError(("sessionTimeout",), "with groupProtocol consumer the "
                                 "coordinator keeps the session: set the cluster's "
                                 "group.consumer.session.timeout.ms instead")
            if self.static_membership:
                raise FieldError(("staticMembership",), "minibroker does not serve static "
                                 "members of the consumer protocol yet (KIP-848's InstanceId)")
        self.commit = self.commit or "auto"
        self.commit_interval = 1.0 if self.commit_interval is None else self.commit_interval
        self.isolation_level = self.isolation_level or "read_committed"
        self.static_membership = bool(self.static_membership)
        if self.group_protocol == "classic":
            self.session_timeout = (6.0 if self.session_timeout is None
                                    else self.session_timeout)
        for name in ("commit_interval", "session_timeout", "rebalance_every"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise FieldError((ConsumerSpec.model_fields[name].alias or name,),
                                 "must be positive")
        return self


class TransactionsSpec(SpecModel):
    """Transactional producers (KIP-98): each producer is a stock transactional producer
    (`transactional.id` `undertow-pN`) that writes `recordsPerTransaction` records spread
    over the topic's partitions, then commits, or aborts one transaction in every
    1 / `abortRatio`. A transactional record is acknowledged by its transaction's commit:
    sends.jsonl gives each the transaction's outcome, txns.jsonl each transaction
    (docs/history-format.md), and the consumers and the drain read committed."""

    records_per_transaction: Annotated[int, Field(ge=1, le=10_000)] = 10
    abort_ratio: Annotated[float, Field(ge=0.0, le=1.0)] = 0.1
    """The share of transactions ended with an abort, spread evenly (0.1: every tenth)."""
    timeout: Duration = Field("10s", validate_default=True)
    """The producers' transaction.timeout.ms: the coordinator aborts a transaction open
    longer (Kafka's default is 60s; the brokers' transaction.max.timeout.ms bounds it)."""
    transaction_version: Literal[1, 2] = 1
    """The transaction protocol the producers speak (KIP-890's client transaction version).
    1: as librdkafka (confluent-kafka) speaks it against Kafka 3.x and 4.x alike
    (AddPartitionsToTxn, EndTxn v1): a producer keeps its epoch from one transaction to the
    next. 2: as the Java 4.x client speaks it where the cluster has `transaction.version` 2
    (Produce v12 adds partitions, EndTxn v5 bumps the epoch on every transaction). No stock
    client here speaks 2, so such an experiment runs in simulation only."""

    @model_validator(mode="after")
    def _check(self) -> TransactionsSpec:
        if self.timeout < 1:
            raise FieldError(("timeout",), "must be at least 1s (transaction.timeout.ms)")
        return self


class PipelineSpec(SpecModel):
    """A consume-transform-produce pipeline, as Kafka Streams runs one with exactly-once: the
    consumer group's members (`consumer.mode: subscribe`) read the topic read_committed and,
    in one transaction every `consumer.commitInterval`, write one output record per input
    record to `outputTopic` and commit their input offsets with it
    (`send_offsets_to_transaction`). Each member is a process of its own, so that it can be
    SIGKILLed; its replacement reuses its `transactional.id`, and its InitProducerId fences
    the dead one (KIP-98's zombie fencing)."""

    output_topic: str | None = Field(None, min_length=1, max_length=249,
                                     pattern=r"^[a-zA-Z0-9._-]+$")
    """The output topic (default `{topic}-out`), created like the topic: same partitions,
    replication factor and config."""
    kill_every: Duration | None = None
    """Every this often one member (in turn) is SIGKILLed while its transaction is open, and
    a replacement with the same transactional.id starts; unset: members run the whole
    run."""

    @model_validator(mode="after")
    def _check(self) -> PipelineSpec:
        if self.kill_every is not None and self.kill_every <= 0:
            raise FieldError(("killEvery",), "must be positive")
        return self


class Workload(SpecModel):
    """Producers and consumers with a stock Kafka client; every send and read is recorded."""

    producers: Annotated[int, Field(ge=1)] = 1
    consumers: Annotated[int, Field(ge=0)] = 1
    """Consumers reading during the fault phase, the group's members in `subscribe` mode (a
    fresh drain consumer always runs after)."""
    acks: Acks = "all"
    retries: Annotated[int, Field(ge=0)] = 3
    request_timeout: Duration = Field("5s", validate_default=True)
    """The producer's request.timeout.ms."""
    rate: Annotated[int, Field(ge=1)] = 100
    """Records per second per producer."""
    record_size: Annotated[int, Field(ge=16, le=1_048_576)] = 100
    """Record value size in bytes (the unique value, padded)."""
    duration: Duration = Field("30s", validate_default=True)
    """How long the producers run; faults must start before it ends."""
    idempotent: bool = False
    """enable.idempotence: no duplicates from retries. Kafka requires acks=all and retries."""
    consumer: ConsumerSpec = Field(default_factory=ConsumerSpec)
    """How the consumers read: by partition (assign) or as a consumer group (subscribe)."""
    transactions: TransactionsSpec | None = None
    """Make the producers transactional (KIP-98); unset: plain producers."""
    pipeline: PipelineSpec | None = None
    """Make the consumer group a consume-transform-produce pipeline (needs `transactions`
    and `consumer.mode: subscribe`); unset: the members only read."""

    @model_validator(mode="after")
    def _check(self) -> Workload:
        for name in ("request_timeout", "duration"):
            if getattr(self, name) <= 0:
                raise FieldError((Workload.model_fields[name].alias or name,), "must be positive")
        if self.idempotent and self.acks != "all":
            raise FieldError(
                ("idempotent",), f"an idempotent producer needs acks all, not {self.acks}"
            )
        if self.idempotent and self.retries == 0:
            raise FieldError(("idempotent",), "an idempotent producer needs retries > 0")
        if self.transactions is not None:
            if self.acks != "all":
                raise FieldError(("acks",), f"a transactional producer is idempotent and needs "
                                            f"acks all, not {self.acks}")
            if self.retries == 0:
                raise FieldError(("retries",), "a transactional producer needs retries > 0")
            if self.consumer.isolation_level == "read_uncommitted":
                raise FieldError(("consumer", "isolationLevel"),
                                 "with transactions the consumers read committed: a "
                                 "read_uncommitted one returns aborted records, which the "
                                 "checks would count as aborted reads")
        self._check_pipeline()
        if self.consumer.mode == "subscribe" and self.consumers < 1:
            raise FieldError(("consumers",), "a consumer group (consumer.mode subscribe) needs "
                                             "at least one member")
        if self.consumer.rebalance_every is not None and self.consumers < 2:
            raise FieldError(("consumer", "rebalanceEvery"),
                             "needs two members or more: one stays while another rejoins")
        return self

    def _check_pipeline(self) -> None:
        """A pipeline's members are the group's, and transactional; `commit: transaction`
        belongs to a pipeline only."""
        if self.pipeline is None:
            if self.consumer.commit == "transaction":
                raise FieldError(("consumer", "commit"),
                                 "transaction commits belong to a pipeline's members: set "
                                 "workload.pipeline")
            return
        if self.transactions is None:
            raise FieldError(("pipeline",), "a pipeline's members are transactional: set "
                                            "workload.transactions (its timeout is theirs)")
        if self.transactions.transaction_version == 2:
            raise FieldError(("transactions", "transactionVersion"),
                             "a pipeline's members speak transaction version 1 (librdkafka's "
                             "send_offsets_to_transaction); version 2 is modelled for the "
                             "transactional producers only")
        if self.consumer.mode != "subscribe":
            raise FieldError(("consumer", "mode"), "a pipeline's members are a consumer group: "
                                                   "set it to subscribe")
        if self.consumer.commit == "manual":
            raise FieldError(("consumer", "commit"), "a pipeline's members commit their "
                                                     "offsets in their transactions: "
                                                     "transaction (the default)")
        self.consumer.commit = "transaction"  # the default of a pipeline, over auto
        if self.consumer.rebalance_every is not None:
            raise FieldError(("consumer", "rebalanceEvery"),
                             "not with a pipeline: its members are replaced (killEvery)")
