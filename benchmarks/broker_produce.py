"""Produce throughput and latency of a local 3-broker minibroker cluster (RF=3) with a stock
client (confluent-kafka), 100-byte records on loopback, for acks=all and acks=1.

    .venv/bin/python benchmarks/broker_produce.py [--records N]

Prints records/s (also scaled to the reference machine, reference.py) and p50/p99
acknowledgement latency per acks setting, between the reference loop's time at the start and
at the end. Target on a 2-core machine: 100,000 records/s with acks=all.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from bench_cluster import create_topic, running_cluster
from confluent_kafka import Producer
from ledger import commit, machine_line
from reference import AT, Reference

RECORD = b"x" * 100


def run(bootstrap: str, topic: str, acks: str, records: int) -> tuple[float, float, float]:
    latencies: list[float] = []
    errors = 0

    def on_delivery(err, _msg, sent=None) -> None:
        nonlocal errors
        if err:
            errors += 1

    producer = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 5,
                         "batch.num.messages": 10000, "queue.buffering.max.messages": 1_000_000})
    started = time.perf_counter()
    for _ in range(records):
        sent = time.perf_counter()
        producer.produce(topic, RECORD, on_delivery=lambda err, msg, sent=sent: (
            latencies.append(time.perf_counter() - sent), on_delivery(err, msg)))
        producer.poll(0)
    producer.flush(120)
    elapsed = time.perf_counter() - started
    if errors:
        print(f"  {errors} delivery errors", file=sys.stderr)
    latencies.sort()
    p99 = latencies[int(len(latencies) * 0.99) - 1]
    return records / elapsed, statistics.median(latencies) * 1000, p99 * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=300_000)
    args = parser.parse_args()
    print(f"commit {commit()}; {machine_line()}")
    reference = Reference.measure()
    print(reference.start_line(), flush=True)
    with running_cluster() as bootstrap:
        for acks in ("all", "1"):
            topic = f"bench-acks-{acks}"
            create_topic(bootstrap, topic)
            rate, p50, p99 = run(bootstrap, topic, acks, args.records)
            print(f"acks={acks:<3} RF=3 {args.records} x 100 B: {rate:,.0f} records/s "
                  f"({reference.rate(rate):,.0f} {AT}), p50 {p50:.1f} ms, p99 {p99:.1f} ms",
                  flush=True)
    print(reference.finish().end_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
