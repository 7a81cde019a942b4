"""Admin tools over the Kafka protocol: ``topics create`` and ``describe``.

They use only Kafka APIs (CreateTopics, Metadata, ListOffsets), so they work through the
same listeners and proxies as any client.
"""

from __future__ import annotations

import datetime
import sys
from dataclasses import dataclass

from kio.schema.create_topics.v7 import request as create_req
from kio.schema.list_offsets.v7 import request as list_req
from kio.schema.metadata.v12 import request as metadata_req
from kio.static.primitive import i8, i16, i32, i64

from minibroker.cluster.types import ErrorCode
from minibroker.network.client import KafkaConnection


@dataclass(frozen=True)
class PartitionDescription:
    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader_epoch: int
    high_watermark: int | None

    def line(self) -> str:
        hw = "?" if self.high_watermark is None else str(self.high_watermark)
        return (f"Topic: {self.topic} Partition: {self.partition} Leader: {self.leader} "
                f"Replicas: {','.join(map(str, self.replicas))} "
                f"Isr: {','.join(map(str, self.isr))} Epoch: {self.leader_epoch} HW: {hw}")


async def create_topic(bootstrap: tuple[str, int], topic: str, partitions: int,
                       replication_factor: int, config: dict[str, str]) -> int:
    failure = await request_topic(bootstrap, topic, partitions, replication_factor, config)
    if failure is not None:
        print(f"Error creating topic {topic}: {failure}", file=sys.stderr)
        return 1
    print(f"Created topic {topic}.")
    return 0


async def request_topic(bootstrap: tuple[str, int], topic: str, partitions: int,
                        replication_factor: int, config: dict[str, str]) -> str | None:
    """A CreateTopics request at ``bootstrap``: None once the topic is created, else why
    not (``TOPIC_ALREADY_EXISTS: ...``, or the connection's error)."""
    try:
        conn = await KafkaConnection.connect(*bootstrap, client_id="minibroker-tools")
    except OSError as exc:
        return str(exc)
    try:
        response = await conn.request(create_req.CreateTopicsRequest(
            topics=(create_req.CreatableTopic(
                name=topic, num_partitions=i32(partitions),
                replication_factor=i16(replication_factor), assignments=(),
                configs=tuple(create_req.CreatableTopicConfig(name=k, value=v)
                              for k, v in config.items())),),
            timeout=datetime.timedelta(seconds=30)))
    finally:
        conn.close()
    result = response.topics[0]
    if result.error_code != ErrorCode.none:
        return f"{result.error_code.name.upper()}: {result.error_message}"
    return None


async def describe_partitions(bootstrap: tuple[str, int],
                              topic: str | None = None) -> list[PartitionDescription]:
    """Metadata from the bootstrap broker, then each leader's HW (ListOffsets latest)."""
    conn = await KafkaConnection.connect(*bootstrap, client_id="minibroker-tools")
    try:
        metadata = await conn.request(metadata_req.MetadataRequest(
            topics=None if topic is None else (
                metadata_req.MetadataRequestTopic(topic_id=None, name=topic),),
            allow_auto_topic_creation=False, include_topic_authorized_operations=False))
    finally:
        conn.close()
    brokers = {b.node_id: (b.host, b.port) for b in metadata.brokers}
    found = []
    for t in sorted(metadata.topics, key=lambda t: t.name or ""):
        if t.error_code != ErrorCode.none:
            raise LookupError(f"topic {t.name}: {t.error_code.name.upper()}")
        for p in sorted(t.partitions, key=lambda p: p.partition_index):
            found.append((t.name, p))
    descriptions = []
    for name, p in found:
        hw = None
        if p.leader_id in brokers:
            hw = await _high_watermark(brokers[p.leader_id], name, p.partition_index,
                                       p.leader_epoch)
        descriptions.append(PartitionDescription(name, p.partition_index, p.leader_id,
                                                 tuple(p.replica_nodes), tuple(p.isr_nodes),
                                                 p.leader_epoch, hw))
    return descriptions


async def _high_watermark(address: tuple[str, int], topic: str, partition: int,
                          leader_epoch: int) -> int | None:
    try:
        conn = await KafkaConnection.connect(*address, client_id="minibroker-tools")
    except OSError:
        return None
    try:
        response = await conn.request(list_req.ListOffsetsRequest(
            replica_id=i32(-1), isolation_level=i8(0),
            topics=(list_req.ListOffsetsTopic(name=topic, partitions=(
                list_req.ListOffsetsPartition(partition_index=i32(partition),
                                              current_leader_epoch=i32(leader_epoch),
                                              timestamp=i64(-1)),)),)))
    finally:
        conn.close()
    answer = response.topics[0].partitions[0]
    return answer.offset if answer.error_code == ErrorCode.none else None


async def describe(bootstrap: tuple[str, int], topic: str | None) -> int:
    try:
        descriptions = await describe_partitions(bootstrap, topic)
    except (LookupError, OSError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    for description in descriptions:
        print(description.line())
    return 0
