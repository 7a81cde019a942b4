"""Which partition of a coordinator's topic a key lives in, as every Kafka client and broker
computes it: ``Utils.abs(key.hashCode) % partitions`` (``GroupMetadataManager.partitionFor``,
``TransactionStateManager.partitionFor``), with Java's ``String.hashCode``. A different
hash would send clients to a broker that does not coordinate their group or transaction."""

from __future__ import annotations

from collections.abc import Mapping

from minibroker.cluster.types import MetadataImage
from minibroker.config import resolve

__all__ = ["java_string_hash", "partition_count", "partition_for"]


def java_string_hash(value: str) -> int:
    """Java's ``String.hashCode``: over UTF-16 code units, as a signed 32-bit int."""
    data = value.encode("utf-16-be")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i:i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_for(key: str, partitions: int) -> int:
    """``Utils.abs(key.hashCode) % partitions`` (Kafka's abs maps MIN_VALUE to 0)."""
    h = java_string_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def partition_count(image: MetadataImage, topic: str, config: Mapping[str, str],
                    count_config: str) -> int:
    """The coordinator topic's partition count once it exists, else ``count_config``
    (``offsets.topic.num.partitions``...): Kafka reads the same two at startup."""
    found = image.topics.get(topic)
    if found is not None and found.partitions:
        return len(found.partitions)
    return int(resolve(count_config, config))
