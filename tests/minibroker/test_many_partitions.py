"""A thousand partitions at replication factor 3 on a 3-broker cluster: one CreateTopics,
then a record with acks=all to every partition, and no broker is fenced on the way.

Before metadata deltas, sliced log creation, batched AlterPartition and the heartbeat's own
thread, this cost four fences on a loaded 2-core machine (the brokers' loops were held
creating logs past the session timeout, the followers fell out of every ISR, and the ISR
changes flooded the controller). ``benchmarks/many_partitions.py`` runs the same with
3,000 partitions and five stable minutes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from fuzz_cluster import running_cluster

pytestmark = pytest.mark.long  # run first (tests/conftest.py)

PARTITIONS = 1000
SESSION_TIMEOUT_MS = 3000  # minibroker's default broker.session.timeout.ms


@pytest.mark.slow
def test_a_thousand_partitions_are_created_and_replicated_without_a_fence(
        tmp_path: Path) -> None:
    with running_cluster(tmp_path, 3) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        (future,) = admin.create_topics([NewTopic("many", PARTITIONS, 3)],
                                        request_timeout=60).values()
        future.result(90)
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all",
                             "linger.ms": 50, "message.timeout.ms": 240000})
        errors: list[object] = []
        for partition in range(PARTITIONS):
            producer.produce("many", b"x", partition=partition,
                             on_delivery=lambda error, _m: errors.append(error))
        started = time.monotonic()
        assert producer.flush(250) == 0, f"unacknowledged after {time.monotonic() - started} s"
        assert [e for e in errors if e is not None] == []
        assert cluster.fences() == []
        state = cluster.controller_state()
        regs = state["topics"]["many"]["partitions"].values()
        assert all(len(r["isr"]) == 3 for r in regs)
        gaps = [b["max_heartbeat_gap_ms"] for b in state["brokers"]]
        assert max(gaps) < SESSION_TIMEOUT_MS / 2, gaps
