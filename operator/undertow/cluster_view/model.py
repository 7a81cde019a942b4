"""One typed view of a cluster's replication state, parsed once with explicit defaults.

Everything in the runner and the operator that asks "who leads?", "who is in the ISR?",
"is this broker fenced?" reads a `ClusterView`, so the question has one answer. A view is
built by a *source*: `minibroker.view_from_states` reads the controller's and the brokers'
``/v1/state`` documents (everything, broker epochs and per-replica log end offsets
included); `kafka.view_from_admin` reads what any Kafka answers over its protocol
(Metadata and ListOffsets: leader, leader epoch, ISR, replicas, high watermark), leaving
the minibroker-only fields at their "unknown" values.

Unknowns are explicit, never guessed: a broker the controller has not registered is not in
`brokers` and so not live; a high watermark nobody reported is None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

NO_LEADER = -1
"""Kafka's leader id of an offline partition."""


@dataclass(frozen=True)
class BrokerRegistration:
    """A broker as the controller has registered it."""

    broker_id: int
    fenced: bool
    broker_epoch: int | None = None
    """KRaft's broker epoch of the registration; None when the source does not say."""
    rack: str | None = None


@dataclass(frozen=True)
class ReplicaState:
    """One partition replica as the broker that hosts it reports it (its own log, and the
    leader's view of the partition when it leads)."""

    topic: str
    partition: int
    is_leader: bool
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    high_watermark: int
    log_end_offset: int
    last_stable_offset: int | None = None
    """Kafka's `Partition.lastStableOffset`; None when the broker does not say."""


@dataclass(frozen=True)
class BrokerReport:
    """What one broker that answered says of itself."""

    broker_id: int
    broker_epoch: int | None
    replicas: tuple[ReplicaState, ...] = ()


@dataclass(frozen=True)
class PartitionView:
    """One partition: the controller's registration (leader, epoch, ISR, replicas, ELR) with
    the leader's high watermark and each answering replica's log end offset."""

    topic: str
    partition: int
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    replicas: tuple[int, ...]
    high_watermark: int | None = None
    """As the current leader reports it; None when it did not answer (or there is none)."""
    log_end_offsets: Mapping[int, int] = field(default_factory=dict)
    """Broker id -> log end offset, for the replicas that answered."""
    elr: tuple[int, ...] = ()
    """The eligible leader replicas (KIP-966): replicas that left an ISR smaller than
    ``min.insync.replicas`` and hold every record up to the high watermark, electable when
    the ISR is empty. Empty when there are none, or the source does not say."""
    last_known_elr: tuple[int, ...] = ()
    """KIP-966's last known ELR, kept once the ISR and the ELR are both empty (Kafka 4.1+
    keeps the last known leader there). Empty when there is none, or the source does not
    say."""
    last_stable_offset: int | None = None
    """As the current leader reports it (the HW, held back at the first offset of an open
    transaction); None when it did not answer or does not say."""
    leader_recovery_state: str | None = None
    """KIP-704: ``RECOVERING`` after an unclean election until the leader's first ISR change,
    else ``RECOVERED``; None when the source does not say (a Kafka admin client does not)."""

    @property
    def has_leader(self) -> bool:
        return self.leader != NO_LEADER


OFFSETS_TOPIC = "__consumer_offsets"
TRANSACTION_STATE_TOPIC = "__transaction_state"


def offsets_partition(group_id: str, partitions: int) -> int:
    """Kafka's ``GroupMetadataManager.partitionFor``: ``Utils.abs(groupId.hashCode) %
    partitions``, with Java's ``String.hashCode`` (over UTF-16 code units). The transaction
    coordinator's ``TransactionStateManager.partitionFor`` is the same function of a
    transactional id."""
    data = group_id.encode("utf-16-be")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i:i + 2], "big")) & 0xFFFFFFFF
    signed = h - (1 << 32) if h >= 1 << 31 else h
    return (0 if signed == -(1 << 31) else abs(signed)) % partitions  # Kafka's Utils.abs


@dataclass(frozen=True)
class ClusterView:
    """The cluster at one moment: registrations, partitions, topic configs, and the reports
    of the brokers that answered (empty when only the controller was asked)."""

    brokers: Mapping[int, BrokerRegistration]
    controller: int | None
    """The active controller's id where the source names one (Kafka's Metadata does)."""
    partitions: Mapping[tuple[str, int], PartitionView]
    topic_configs: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    reports: Mapping[int, BrokerReport] = field(default_factory=dict)

    @property
    def live_brokers(self) -> frozenset[int]:
        """Registered and unfenced: the brokers Kafka's controller may elect."""
        return frozenset(b.broker_id for b in self.brokers.values() if not b.fenced)

    def is_live(self, broker_id: int) -> bool:
        return broker_id in self.live_brokers

    def topic_partitions(self, topic: str) -> list[PartitionView]:
        """The topic's partitions in partition order (empty: the topic is unknown)."""
        return [p for (t, _), p in sorted(self.partitions.items()) if t == topic]

    def partition(self, topic: str, index: int) -> PartitionView:
        """The partition; KeyError naming it when the metadata does not have it."""
        try:
            return self.partitions[(topic, index)]
        except KeyError:
            raise KeyError(f"partition {topic}-{index} is not in the cluster's metadata") \
                from None

    def min_insync_replicas(self, topic: str, default: int) -> int:
        """The topic's own ``min.insync.replicas`` where it sets one, else ``default``."""
        value = self.topic_configs.get(topic, {}).get("min.insync.replicas")
        try:
            return int(value) if value is not None else default
        except ValueError:
            return default

    def led_by_reports(self) -> dict[tuple[str, int], ReplicaState]:
        """Each partition as the broker that claims its leadership reports it: the ISR a
        leader maintains, read where Strimzi's roller reads it."""
        return {(r.topic, r.partition): r for report in self.reports.values()
                for r in report.replicas if r.is_leader}

    def group_partition(self, group_id: str) -> PartitionView:
        """The partition of ``__consumer_offsets`` that holds ``group_id``'s state, whose
        leader is the group's coordinator; KeyError while the topic does not exist."""
        count = len(self.topic_partitions(OFFSETS_TOPIC))
        if not count:
            raise KeyError(f"{OFFSETS_TOPIC} does not exist yet")
        return self.partition(OFFSETS_TOPIC, offsets_partition(group_id, count))

    def transaction_partition(self, transactional_id: str) -> PartitionView:
        """The partition of ``__transaction_state`` that holds ``transactional_id``'s state,
        whose leader is its transaction coordinator; KeyError while the topic does not
        exist (the first transactional producer makes it)."""
        count = len(self.topic_partitions(TRANSACTION_STATE_TOPIC))
        if not count:
            raise KeyError(f"{TRANSACTION_STATE_TOPIC} does not exist yet")
        return self.partition(TRANSACTION_STATE_TOPIC, offsets_partition(transactional_id, count))

    def healthy(self, topic: str, replication_factor: int) -> bool:
        """Every partition of ``topic`` has a leader and a full ISR."""
        partitions = self.topic_partitions(topic)
        return bool(partitions) and all(
            p.has_leader and len(p.isr) == replication_factor for p in partitions)
