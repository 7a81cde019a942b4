"""Plain data types shared by the replication core, the controller and the network layer.

The core (``Partition``, ``ReplicaManager``, ``QuorumController``) speaks only these types;
the network layer translates them to and from Kafka wire messages (kio dataclasses).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from functools import cached_property
from typing import NamedTuple

from kio.schema.errors import ErrorCode

from minibroker.storage.control_records import ControlRecordType
from minibroker.storage.transaction_index import AbortedTxn

__all__ = [
    "UNDEFINED_EPOCH",
    "UNDEFINED_OFFSET",
    "BrokerEndpoint",
    "ErrorCode",
    "FetchPartition",
    "FetchRequestData",
    "FetchResult",
    "LeaderRecoveryState",
    "MetadataImage",
    "NewPartitions",
    "PartitionRegistration",
    "ProduceResult",
    "TopicDeletion",
    "TopicImage",
    "TopicPartition",
    "TxnMarker",
]

UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1
NO_LEADER = -1


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


DEFAULT_LISTENER = "PLAINTEXT"
"""The name of a broker's first listener (``--listen``), Kafka's default listener name."""


@dataclass(frozen=True)
class BrokerEndpoint:
    """A live broker: where it listens and the broker epoch of its registration.

    ``host``/``port`` are its default listener's advertised address; ``listeners`` the
    others', by listener name (KIP-103): a client that connected to listener L is told the
    addresses of L, as Kafka's Metadata answers."""

    broker_id: int
    host: str
    port: int
    broker_epoch: int = -1
    listeners: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    in_controlled_shutdown: bool = False
    """Kafka's ``BrokerRegistration.inControlledShutdown``: a leader does not take it into an
    ISR (``MetadataCache.isBrokerShuttingDown``)."""

    def address(self, listener: str) -> tuple[str, int] | None:
        """Where ``listener`` reaches this broker; None when it has no such listener."""
        if listener == DEFAULT_LISTENER:
            return self.host, self.port
        return self.listeners.get(listener)


class LeaderRecoveryState(IntEnum):
    """KIP-704's ``LeaderRecoveryState`` (Kafka 3.2+, ``org.apache.kafka.metadata``): an
    unclean election marks the partition RECOVERING; it is RECOVERED again once its leader
    says so in an AlterPartition. While RECOVERING the controller refuses an ISR of more
    than the leader (``ReplicationControlManager.validateAlterPartitionData``)."""

    RECOVERED = 0
    RECOVERING = 1


@dataclass(frozen=True)
class PartitionRegistration:
    """The controller's record of one partition (KRaft's PartitionRecord)."""

    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int
    elr: tuple[int, ...] = ()
    """Eligible leader replicas (KIP-966): replicas that left an ISR smaller than
    min.insync.replicas, so hold every committed record; always empty without ELR."""
    last_known_elr: tuple[int, ...] = ()
    """Kafka's LastKnownElr, holding the last known leader once the ISR and the ELR are empty
    (``PartitionChangeBuilder.maybeUpdateLastKnownLeader``)."""
    leader_recovery_state: LeaderRecoveryState = LeaderRecoveryState.RECOVERED
    """KIP-704: RECOVERING from an unclean election until the leader's first AlterPartition."""

    def to_json(self) -> dict:
        return {
            "replicas": list(self.replicas),
            "isr": list(self.isr),
            "leader": self.leader,
            "leader_epoch": self.leader_epoch,
            "partition_epoch": self.partition_epoch,
            "elr": list(self.elr),
            "last_known_elr": list(self.last_known_elr),
            "leader_recovery_state": self.leader_recovery_state.name,
        }

    @classmethod
    def from_json(cls, data: dict) -> PartitionRegistration:
        return cls(
            replicas=tuple(data["replicas"]),
            isr=tuple(data["isr"]),
            leader=data["leader"],
            leader_epoch=data["leader_epoch"],
            partition_epoch=data["partition_epoch"],
            elr=tuple(data.get("elr", ())),  # absent in a state written before ELR
            last_known_elr=tuple(data.get("last_known_elr", ())),
            # absent in a state written before KIP-704's field
            leader_recovery_state=LeaderRecoveryState[
                data.get("leader_recovery_state", LeaderRecoveryState.RECOVERED.name)],
        )


@dataclass(frozen=True)
class TopicImage:
    name: str
    topic_id: str
    config: dict[str, str]
    partitions: dict[int, PartitionRegistration]


@dataclass(frozen=True)
class MetadataImage:
    """What a broker knows of the cluster: live (unfenced) brokers and every topic."""

    metadata_offset: int = -1
    brokers: dict[int, BrokerEndpoint] = field(default_factory=dict)
    topics: dict[str, TopicImage] = field(default_factory=dict)
    cluster_id: str = ""

    @cached_property
    def topics_by_id(self) -> dict[uuid.UUID, TopicImage]:
        """Every topic by its id (Kafka's ``TopicsImage.topicsById``), built once per image:
        requests that name topics by id (Fetch v13+, Metadata v10+) look each one up here
        instead of scanning every topic for every id. An image is replaced, never changed,
        so the index cannot go stale."""
        return {uuid.UUID(t.topic_id): t for t in self.topics.values()}

    def to_json(self) -> dict:
        return {
            "metadata_offset": self.metadata_offset,
            "cluster_id": self.cluster_id,
            "brokers": [[b.broker_id, b.host, b.port, b.broker_epoch,
                         {name: list(address) for name, address in b.listeners.items()},
                         b.in_controlled_shutdown]
                        for b in self.brokers.values()],
            "topics": [
                {"name": t.name, "topic_id": t.topic_id, "config": t.config,
                 "partitions": {str(i): reg.to_json() for i, reg in t.partitions.items()}}
                for t in self.topics.values()
            ],
        }

    @classmethod
    def from_json(cls, data: dict) -> MetadataImage:
        return cls(
            metadata_offset=data["metadata_offset"],
            cluster_id=data["cluster_id"],
            brokers={b[0]: BrokerEndpoint(*b[:4], {name: (host, port) for name, (host, port)
                                                   in (b[4] if len(b) > 4 else {}).items()},
                                          len(b) > 5 and b[5])
                     for b in data["brokers"]},
            topics={
                t["name"]: TopicImage(
                    t["name"], t["topic_id"], t["config"],
                    {int(i): PartitionRegistration.from_json(r)
                     for i, r in t["partitions"].items()})
                for t in data["topics"]
            },
        )


@dataclass(frozen=True)
class MetadataDelta:
    """Kafka's MetadataDelta: what changed between two images. ``changes`` is image-shaped:
    every live broker (a short list, always whole), and of each topic that changed its id,
    config and only the partitions whose registration changed. With thousands of partitions
    a broker long-polling for metadata gets the few registrations an ISR change or an
    election touched, not the whole image (Kafka's brokers replay the metadata log's records
    the same way, ``BrokerMetadataListener``). ``deleted_topics``: the topics removed since
    (Kafka's ``TopicsDelta.deletedTopicIds``, from RemoveTopicRecords)."""

    changes: MetadataImage
    deleted_topics: frozenset[str] = frozenset()

    def apply(self, base: MetadataImage) -> MetadataImage:
        """The image after this delta. Topics it does not name are shared with ``base``
        (images are replaced, never changed); a topic it names keeps ``base``'s other
        partitions unless it is a new topic of the same name (another id)."""
        topics = {name: topic for name, topic in base.topics.items()
                  if name not in self.deleted_topics}
        for name, changed in self.changes.topics.items():
            old = topics.get(name)
            partitions = (dict(old.partitions) if old is not None
                          and old.topic_id == changed.topic_id else {})
            partitions.update(changed.partitions)
            topics[name] = TopicImage(name, changed.topic_id, changed.config, partitions)
        return MetadataImage(metadata_offset=self.changes.metadata_offset,
                             brokers=self.changes.brokers, topics=topics,
                             cluster_id=self.changes.cluster_id)

    def to_json(self) -> dict:
        return {"delta": self.changes.to_json(), "deleted_topics": sorted(self.deleted_topics)}

    @classmethod
    def from_json(cls, data: dict) -> MetadataDelta:
        return cls(MetadataImage.from_json(data["delta"]),
                   frozenset(data.get("deleted_topics", ())))


@dataclass(frozen=True)
class TopicDeletion:
    """One topic's answer to a DeleteTopics (Kafka's ``DeletableTopicResult``): the name
    and id as far as known."""

    name: str | None
    topic_id: str | None
    error: ErrorCode
    message: str | None = None


@dataclass(frozen=True)
class NewPartitions:
    """One topic of a CreatePartitions (Kafka's ``CreatePartitionsTopic``): its new total
    partition count and, optionally, the replicas of each new partition."""

    name: str
    count: int
    assignments: tuple[tuple[int, ...], ...] | None = None


@dataclass(frozen=True)
class ProduceResult:
    error: ErrorCode
    base_offset: int = -1
    log_start_offset: int = -1
    error_message: str | None = None


@dataclass(frozen=True)
class TxnMarker:
    """One entry of a WriteTxnMarkers request: end a producer's transaction in these
    partitions (Kafka's ``TxnMarkerEntry``)."""

    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    control_type: ControlRecordType
    partitions: tuple[TopicPartition, ...]
    transaction_version: int = 0
    """The deciding client's (WriteTxnMarkers v2, KIP-890): 2 checks the epoch strictly."""


@dataclass(frozen=True)
class FetchPartition:
    """One partition of a Fetch request.

    ``fetch_offset`` doubles as the follower's log end offset (seed 000).
    """

    tp: TopicPartition
    fetch_offset: int
    current_leader_epoch: int = UNDEFINED_EPOCH
    log_start_offset: int = -1
    max_bytes: int = 1 << 20


@dataclass(frozen=True)
class FetchRequestData:
    replica_id: int  # >= 0 for a follower, -1 for a consumer
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    partitions: list[FetchPartition]
    # 0 = READ_UNCOMMITTED (up to the HW); followers always read to the log end.
    isolation_level: int = 0
    # A follower's broker epoch (Fetch v15's ReplicaState.ReplicaEpoch); -1 when not sent.
    replica_epoch: int = -1

    @property
    def is_from_follower(self) -> bool:
        return self.replica_id >= 0


@dataclass(frozen=True)
class FetchResult:
    error: ErrorCode
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    records: bytes = b""
    # READ_COMMITTED fetches: the aborted transactions among the records (None otherwise).
    aborted_transactions: list[AbortedTxn] | None = None
