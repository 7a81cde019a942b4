"""The Kafka-protocol source of a `ClusterView`, and topic creation: what any Kafka answers.

A stock admin client (confluent-kafka) asks DescribeCluster (brokers, racks, the
controller), DescribeTopics (leader, ISR, replicas) and ListOffsets ``latest`` (the high
watermark, and the leader epoch it was read in). Kafka's metadata lists live brokers only
(KRaft leaves fenced ones out), so every broker listed is unfenced; broker epochs and
per-replica log end offsets are not in the protocol's answers and stay unknown. KIP-966's
eligible leader replicas and last known ELR are in Kafka's DescribeTopicPartitions answer
(and the Java admin client's ``TopicPartitionInfo``), but confluent-kafka's
``TopicPartitionInfo`` (2.16) has only id, leader, replicas and ISR: they stay empty.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from confluent_kafka import KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from undertow.cluster_view.model import NO_LEADER, BrokerRegistration, ClusterView, PartitionView


class KafkaAdminError(RuntimeError):
    """The cluster refused or did not answer an admin request."""


def admin_client(bootstrap: str) -> AdminClient:
    """A client for a cluster whose brokers die: metadata refreshed every second, so that a
    request bound for "the controller" (a KRaft broker names any live broker) finds a
    live one soon after a kill; librdkafka's own logs kept to errors, callers report."""
    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 3,
                        "topic.metadata.refresh.interval.ms": 1000})


def view_from_admin(admin: AdminClient, topics: Iterable[str] | None = None,
                    timeout_s: float = 10.0) -> ClusterView:
    """The view of ``topics`` (None: every topic but Kafka's internal ones) as the
    cluster's Kafka protocol describes them."""
    try:
        cluster = admin.describe_cluster(request_timeout=timeout_s).result()
        if topics is None:
            listed = admin.list_topics(timeout=timeout_s).topics
            topics = sorted(t for t in listed if not t.startswith("__"))
        described = (admin.describe_topics(TopicCollection(list(topics)),
                                           request_timeout=timeout_s) if topics else {})
        partitions: dict[tuple[str, int], PartitionView] = {}
        for future in described.values():
            description = future.result()
            for info in description.partitions:
                partitions[(description.name, info.id)] = PartitionView(
                    topic=description.name, partition=info.id,
                    leader=info.leader.id if info.leader is not None else NO_LEADER,
                    leader_epoch=-1, isr=tuple(n.id for n in info.isr),
                    replicas=tuple(n.id for n in info.replicas))
        latest = _latest_offsets(admin, [p for p in partitions.values() if p.has_leader],
                                 timeout_s)
    except KafkaException as exc:
        raise KafkaAdminError(str(exc.args[0] if exc.args else exc)) from exc
    for key, (high_watermark, leader_epoch) in latest.items():
        p = partitions[key]
        partitions[key] = PartitionView(
            topic=p.topic, partition=p.partition, leader=p.leader, leader_epoch=leader_epoch,
            isr=p.isr, replicas=p.replicas, high_watermark=high_watermark)
    brokers = {n.id: BrokerRegistration(broker_id=n.id, fenced=False, rack=n.rack)
               for n in cluster.nodes}
    return ClusterView(brokers=brokers,
                       controller=cluster.controller.id if cluster.controller else None,
                       partitions=partitions)


def _latest_offsets(admin: AdminClient, partitions: list[PartitionView], timeout_s: float
                    ) -> dict[tuple[str, int], tuple[int, int]]:
    """(high watermark, leader epoch) per partition, from ListOffsets ``latest``."""
    if not partitions:
        return {}
    asked = {TopicPartition(p.topic, p.partition): OffsetSpec.latest() for p in partitions}
    answers = {}
    for tp, future in admin.list_offsets(asked, request_timeout=timeout_s).items():
        result = future.result()
        epoch = result.leader_epoch if result.leader_epoch is not None else -1
        answers[(tp.topic, tp.partition)] = (result.offset, epoch)
    return answers


def create_topic(admin: AdminClient, name: str, partitions: int, replication_factor: int,
                 config: Mapping[str, str], timeout_s: float = 15.0) -> None:
    """CreateTopics, as any Kafka serves it; an existing topic counts as created (a retry
    after a lost answer must not fail the run)."""
    new = NewTopic(name, partitions, replication_factor, config=dict(config))
    future = admin.create_topics([new], request_timeout=timeout_s)[name]
    try:
        future.result()
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return
        raise KafkaAdminError(f"CreateTopics {name}: {error or exc}") from exc

