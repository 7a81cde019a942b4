"""``make demo``: a local 3-broker cluster, a stock Kafka client producing with acks=all and
consuming from the beginning, then the ``describe`` table. Waits on the cluster's own state
(leaders and full ISRs), never on fixed sleeps."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition

from minibroker.local_cluster import die_with_parent
from minibroker.tools import describe_partitions

TOPIC = "orders"
PARTITIONS = 3
RECORDS = 10_000


def free_base_port(span: int = 110) -> int:
    """A base port whose whole range (listeners and metrics ports) is free."""
    for base in range(20000, 60000, 200):
        try:
            for port in (base, base + 1, base + 2, base + 3, base + 100, base + 103):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no free port range of {span}")


async def wait_for_full_isr(bootstrap: tuple[str, int], timeout_s: float = 30.0,
                            topic: str = TOPIC) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            parts = await describe_partitions(bootstrap, topic)
            if parts and all(p.leader >= 0 and len(p.isr) == len(p.replicas) for p in parts):
                return
        except (OSError, LookupError):
            pass
        await asyncio.sleep(0.2)
    raise TimeoutError(f"{topic} did not get leaders and full ISRs within {timeout_s} s")


def main() -> int:
    base = free_base_port()
    bootstrap = f"127.0.0.1:{base + 1}"
    with tempfile.TemporaryDirectory(prefix="minibroker-demo-") as data_dir:
        cluster = subprocess.Popen(
            [sys.executable, "-m", "minibroker", "cluster",
             "--brokers", "3", "--base-port", str(base), "--data-dir", data_dir,
             "--config", "min.insync.replicas=2"],
            preexec_fn=die_with_parent, env={**os.environ, "MINIBROKER_LOG_LEVEL": "WARNING"})
        try:
            return run_demo(bootstrap, Path(data_dir))
        finally:
            cluster.terminate()
            cluster.wait(15)


def run_demo(bootstrap: str, _data_dir: Path) -> int:
    host, port = bootstrap.split(":")
    for _ in range(100):
        if subprocess.run([sys.executable, "-m", "minibroker", "--log-level", "ERROR", "topics",
                           "create", "--bootstrap", bootstrap, "--topic", TOPIC, "--partitions",
                           str(PARTITIONS), "--replication-factor", "3"],
                          capture_output=True).returncode == 0:
            break
        time.sleep(0.2)
    asyncio.run(wait_for_full_isr((host, int(port))))

    acked: list[tuple[int, int]] = []
    errors: list[str] = []

    def on_delivery(err, msg) -> None:
        (errors.append(str(err)) if err else acked.append((msg.partition(), msg.offset())))

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    started = time.monotonic()
    for i in range(RECORDS):
        producer.produce(TOPIC, value=f"p0-{i}".encode(), on_delivery=on_delivery)
        producer.poll(0)
    producer.flush(30)
    elapsed = time.monotonic() - started
    print(f"Produced {len(acked)} records with acks=all in {elapsed:.2f} s "
          f"({len(acked) / elapsed:,.0f} records/s), {len(errors)} errors")

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "demo",
                         "enable.auto.commit": False})
    consumer.assign([KafkaTopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    seen: set[tuple[int, int]] = set()
    deadline = time.monotonic() + 30
    while len(seen) < len(acked) and time.monotonic() < deadline:
        for message in consumer.consume(1000, 1.0):
            if not message.error():
                seen.add((message.partition(), message.offset()))
    consumer.close()
    missing = set(acked) - seen
    print(f"Consumed {len(seen)} records from the beginning; "
          f"{len(missing)} acknowledged records missing")
    print()
    for line in asyncio.run(describe_partitions((host, int(port)), TOPIC)):
        print(line.line())
    return 0 if not missing and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
