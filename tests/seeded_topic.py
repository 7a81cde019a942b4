"""A topic made on a running local cluster with the `minibroker topics` CLI, and records
produced to it round-robin, for the tests that need something to read."""

from __future__ import annotations

import subprocess

from confluent_kafka import Producer

from undertow.platform.local import LocalPlatform, default_command


def seed_topic(cluster: LocalPlatform, topic: str, *, partitions: int = 2,
               replication_factor: int = 2, records: int = 20) -> None:
    """`topic` with `records` values `v0`, `v1`, ... spread round-robin over its partitions."""
    argv = [*default_command(), "topics", "create", "--bootstrap",
            cluster.bootstrap.split(",")[0], "--topic", topic, "--partitions", str(partitions),
            "--replication-factor", str(replication_factor)]
    assert subprocess.run(argv, capture_output=True, timeout=30).returncode == 0
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    for i in range(records):
        producer.produce(topic, f"v{i}".encode(), partition=i % partitions)
    assert producer.flush(20) == 0
