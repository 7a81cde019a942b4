"""`BrokerCluster`: the brokers an experiment runs against, as Kubernetes (or the local
platform) should start them.

Broker ids are `0 .. brokers-1`, the StatefulSet ordinals, so `broker: 2` in a fault
target means pod `<name>-broker-2` on Kubernetes and process `broker-2` locally.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from minibroker.config import ConfigError, check_consumer_group_timeouts

from .meta import (
    API_VERSION,
    Conditions,
    FieldError,
    ObjectMeta,
    Quantity,
    SpecModel,
    StatusModel,
    field_aliases,
)

__all__ = [
    "DEFAULT_IMAGE",
    "BrokerCluster",
    "BrokerClusterSpec",
    "BrokerClusterStatus",
    "BrokerConfig",
    "Resources",
    "Storage",
    "TopicConfig",
]

DEFAULT_IMAGE = "undertow/minibroker:0.1.0"

PositiveInt = Annotated[int, Field(ge=1)]
TruncationMode = Literal["leader-epoch", "high-watermark"]
MinIsrRule = Literal["strict", "legacy"]


class TopicConfig(SpecModel):
    """Topic-level overrides, keyed by Kafka's dotted names; every key is optional.

    These are the settings whose unsafe values the experiments demonstrate: a small
    `min.insync.replicas`, unclean election, HW truncation (pre-KIP-101) and no fsync.
    """

    min_insync_replicas: PositiveInt | None = Field(None, alias="min.insync.replicas")
    """acks=all writes need at least this many ISR members (NOT_ENOUGH_REPLICAS otherwise)."""
    unclean_leader_election_enable: bool | None = Field(
        None, alias="unclean.leader.election.enable"
    )
    """Elect an out-of-sync replica when no ISR member is alive: available, may lose data."""
    replication_truncation_mode: TruncationMode | None = Field(
        None, alias="replication.truncation.mode"
    )
    """How a follower truncates: leader-epoch (KIP-101/KIP-279) or high-watermark (pre-KIP-101)."""
    high_watermark_min_isr_rule: MinIsrRule | None = Field(
        None, alias="high.watermark.min.isr.rule"
    )
    """strict (default; Kafka 3.7+, KAFKA-15583): the high watermark advances only while the
    ISR has at least min(min.insync.replicas, replicas) members, so records acked with acks=1
    by a leader alone stay invisible to consumers; legacy (Kafka 0.9 to 3.6): it advances
    whatever the ISR size."""
    log_flush_interval_messages: PositiveInt | None = Field(
        None, alias="log.flush.interval.messages"
    )
    """fsync after this many messages; unset: never on the produce path (Kafka's default)."""
    log_flush_interval_ms: PositiveInt | None = Field(None, alias="log.flush.interval.ms")
    """fsync when this many ms passed since the last flush; unset: never."""

    @classmethod
    def unknown_key_message(cls, key: object, known: list[str]) -> str:
        if key in field_aliases(BrokerConfig):
            return f"{key!r} is a broker config, not a topic config; set it in the BrokerCluster"
        return f"unknown config key {key!r}; known keys: {', '.join(known)}"

    def as_overrides(self) -> dict[str, str]:
        """`KEY=VALUE` strings as minibroker's `--config` and Kafka's configs take them."""
        values = self.model_dump(by_alias=True, exclude_none=True)
        return {key: str(v).lower() if isinstance(v, bool) else str(v) for key, v in values.items()}


class BrokerConfig(TopicConfig):
    """Broker configuration: the topic-level keys as cluster defaults plus broker-only keys.

    Defaults are minibroker's (Kafka's, with timeouts scaled down in Kafka's order: replica
    lag 10 s over a 3 s session); experiments set `replica.lag.time.max.ms` and
    `broker.session.timeout.ms` low, in the same order, so that a fault shows up in the
    controller and in the ISR within a few seconds.
    """

    eligible_leader_replicas_version: Literal[0, 1] | None = Field(
        None, alias="eligible.leader.replicas.version")
    """The controller's rule set. 1 (default; Kafka 4.1+, KIP-966): replicas that leave an ISR
    below min.insync.replicas stay eligible leaders (the ELR), clean shutdowns are told from
    unclean ones, and the last known leader leads again when the ISR and the ELR are empty.
    0: Kafka 3.7 to 4.0's rules (the ISR keeps its last member). Kafka sets it as a feature
    level (kafka-features.sh), minibroker as a cluster config."""
    transaction_version: Literal[0, 1, 2] | None = Field(None, alias="transaction.version")
    """The finalized feature `transaction.version` (KIP-890). 2 (default; Kafka 4.0+): a
    producer that speaks it bumps its epoch on every transaction. 1 and 0: Kafka 3.x's
    protocol for every client (0 also writes `__transaction_state` in its first format).
    Kafka sets it as a feature level, minibroker as a cluster config."""
    replica_lag_time_max_ms: PositiveInt | None = Field(None, alias="replica.lag.time.max.ms")
    """A follower not caught up for this long leaves the ISR (Kafka: 30000)."""
    broker_session_timeout_ms: PositiveInt | None = Field(None, alias="broker.session.timeout.ms")
    """A broker silent this long is fenced by the controller (Kafka: 9000)."""
    broker_heartbeat_interval_ms: PositiveInt | None = Field(
        None, alias="broker.heartbeat.interval.ms"
    )
    """Heartbeat period to the controller; must stay below the session timeout."""
    leader_imbalance_check_interval_ms: PositiveInt | None = Field(
        None, alias="leader.imbalance.check.interval.ms"
    )
    """How often the controller moves leadership back to each partition's preferred replica
    once it is in sync (auto.leader.rebalance.enable; Kafka: 300000, minibroker: 60000)."""
    replica_fetch_wait_max_ms: PositiveInt | None = Field(None, alias="replica.fetch.wait.max.ms")
    """How long a follower's fetch waits on the leader for new data."""
    replica_fetch_min_bytes: PositiveInt | None = Field(None, alias="replica.fetch.min.bytes")
    """A follower's fetch waits on the leader (up to replica.fetch.wait.max.ms) until this
    many bytes are there (Kafka's default: 1). Larger values batch replication and widen
    the window of acknowledged records only the leader has."""
    replica_high_watermark_checkpoint_interval_ms: PositiveInt | None = Field(
        None, alias="replica.high.watermark.checkpoint.interval.ms"
    )
    """How often high watermarks reach `replication-offset-checkpoint` (Kafka: 5000)."""
    segment_bytes: PositiveInt | None = Field(None, alias="segment.bytes")
    """Log segment size."""
    offsets_topic_replication_factor: PositiveInt | None = Field(
        None, alias="offsets.topic.replication.factor")
    """Replicas of each `__consumer_offsets` partition, where consumer groups keep their
    committed offsets (Kafka: 3; created when a group is first used)."""
    offsets_topic_num_partitions: PositiveInt | None = Field(
        None, alias="offsets.topic.num.partitions")
    """Partitions of `__consumer_offsets`; a group lives in one of them, whose leader is
    its coordinator."""
    offsets_commit_required_acks: Literal[-1, 1] | None = Field(
        None, alias="offsets.commit.required.acks")
    """The acks an OffsetCommit is appended with: -1 (all the ISR, the default) or 1 (the
    coordinator alone; Kafka up to 3.9, removed in 4.0)."""
    group_initial_rebalance_delay_ms: Annotated[int, Field(ge=0)] | None = Field(
        None, alias="group.initial.rebalance.delay.ms")
    """How long the first rebalance of an empty group waits for more members to join."""
    group_min_session_timeout_ms: PositiveInt | None = Field(
        None, alias="group.min.session.timeout.ms")
    """The shortest session timeout a group member may ask for."""
    group_max_session_timeout_ms: PositiveInt | None = Field(
        None, alias="group.max.session.timeout.ms")
    """The longest session timeout a group member may ask for."""
    group_consumer_session_timeout_ms: PositiveInt | None = Field(
        None, alias="group.consumer.session.timeout.ms")
    """A consumer protocol member (KIP-848) silent this long is fenced (Kafka: 45000)."""
    group_consumer_heartbeat_interval_ms: PositiveInt | None = Field(
        None, alias="group.consumer.heartbeat.interval.ms")
    """The heartbeat interval the coordinator gives consumer protocol members (Kafka:
    5000)."""
    group_consumer_min_session_timeout_ms: PositiveInt | None = Field(
        None, alias="group.consumer.min.session.timeout.ms")
    """The lowest `group.consumer.session.timeout.ms` may be set to (Kafka: 45000)."""
    group_consumer_max_session_timeout_ms: PositiveInt | None = Field(
        None, alias="group.consumer.max.session.timeout.ms")
    """The highest `group.consumer.session.timeout.ms` may be set to (Kafka: 60000)."""
    group_consumer_min_heartbeat_interval_ms: PositiveInt | None = Field(
        None, alias="group.consumer.min.heartbeat.interval.ms")
    """The lowest `group.consumer.heartbeat.interval.ms` may be set to (Kafka: 5000)."""
    group_consumer_max_heartbeat_interval_ms: PositiveInt | None = Field(
        None, alias="group.consumer.max.heartbeat.interval.ms")
    """The highest `group.consumer.heartbeat.interval.ms` may be set to (Kafka: 15000)."""

    transaction_state_log_replication_factor: PositiveInt | None = Field(
        None, alias="transaction.state.log.replication.factor")
    """Replicas of each `__transaction_state` partition, where transaction coordinators keep
    each transactional id's state (Kafka: 3; created on the first FindCoordinator for a
    transactional id)."""
    transaction_state_log_min_isr: PositiveInt | None = Field(
        None, alias="transaction.state.log.min.isr")
    """min.insync.replicas of `__transaction_state` (Kafka: 2)."""
    transaction_state_log_num_partitions: PositiveInt | None = Field(
        None, alias="transaction.state.log.num.partitions")
    """Partitions of `__transaction_state`; a transactional id lives in one of them, whose
    leader is its coordinator (Kafka: 50, minibroker: 10)."""
    transaction_abort_timed_out_transaction_cleanup_interval_ms: PositiveInt | None = Field(
        None, alias="transaction.abort.timed.out.transaction.cleanup.interval.ms")
    """How often a coordinator aborts the transactions open past their timeout (Kafka:
    10000)."""
    transaction_partition_verification_enable: bool | None = Field(
        None, alias="transaction.partition.verification.enable")
    """KIP-890 part 1 (Kafka 3.6+, default true): a leader asks the coordinator whether a
    partition is in the transaction before the first transactional write to it; false
    matches Kafka up to 3.5."""

    @model_validator(mode="after")
    def _check_consumer_group_timeouts(self) -> BrokerConfig:
        """The brokers' own rules (Kafka's GroupCoordinatorConfig), before anything starts."""
        set_ = {field.alias: str(getattr(self, name))
                for name, field in type(self).model_fields.items()
                if field.alias and field.alias.startswith("group.consumer.")
                and getattr(self, name) is not None}
        try:
            check_consumer_group_timeouts(set_)
        except ConfigError as exc:
            raise FieldError((), str(exc)) from None
        return self

    @classmethod
    def unknown_key_message(cls, key: object, known: list[str]) -> str:
        return f"unknown broker config key {key!r}; known keys: {', '.join(known)}"


class Storage(SpecModel):
    """Where broker logs live. `ephemeral`: an emptyDir (or a temp dir locally)."""

    type: Literal["ephemeral", "persistent"] = "ephemeral"
    size: Quantity = "1Gi"
    """Volume size (the PersistentVolumeClaim's request, or the emptyDir's sizeLimit)."""


class Resources(SpecModel):
    """Kubernetes compute resources of each broker container."""

    requests: dict[str, Quantity] | None = None
    limits: dict[str, Quantity] | None = None


class BrokerClusterSpec(SpecModel):
    """The desired cluster: one minibroker controller plus `brokers` brokers."""

    brokers: PositiveInt
    """Number of brokers (StatefulSet replicas); ids are 0 .. brokers-1."""
    config: BrokerConfig = Field(default_factory=BrokerConfig)
    """Broker configuration with Kafka's dotted key names."""
    image: str = Field(DEFAULT_IMAGE, min_length=1)
    """Broker image (Kubernetes only; the local platform runs the installed minibroker).
    Left at its default, the operator's broker image, which the chart's images.registry
    prefixes."""
    storage: Storage = Field(default_factory=Storage)
    resources: Resources | None = None


class BrokerClusterStatus(StatusModel):
    """Observed state, written by the operator."""

    ready_brokers: int | None = None
    """Brokers registered with the controller and unfenced."""
    conditions: Conditions | None = None
    observed_generation: int | None = None


class BrokerCluster(SpecModel):
    """A set of minibroker brokers (`kubectl get ubc`)."""

    api_version: Literal[API_VERSION]  # type: ignore[valid-type]
    kind: Literal["BrokerCluster"]
    metadata: ObjectMeta
    spec: BrokerClusterSpec
    status: BrokerClusterStatus | None = None
