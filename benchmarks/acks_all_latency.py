"""acks=all latency at a steady rate, with and without batched replication, by how many
requests the producer keeps in flight.

    .venv/bin/python benchmarks/acks_all_latency.py [--rate 500] [--seconds 10]

A stock client (confluent-kafka) sends 100-byte records at a fixed rate to one partition
(RF 3, min.insync.replicas 2) of a local 3-broker cluster, once with the brokers' defaults
and once with replica.fetch.min.bytes 1 MiB and replica.fetch.wait.max.ms 500 (the leader
kill experiments' batching), and for each, with max.in.flight.requests.per.connection 1, 5
(the workload's, and the Java producer's default) and librdkafka's default (1,000,000).

What to expect, by Kafka's rules (tests/minibroker/test_fetch_batching.py): with batching a
follower's fetch waits up to replica.fetch.wait.max.ms, and the leader serves one request of a
connection at a time (SocketServer's mute), so each produce request waits about one fetch
wait and a record waits for the requests ahead of it: about in-flight x 500 ms, and a
producer that pipelines without bound falls behind for good.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench_cluster import create_topic, running_cluster
from confluent_kafka import Producer
from ledger import commit, machine_line
from reference import Reference

RECORD = b"x" * 100
BATCHING = {"replica.fetch.min.bytes": "1048576", "replica.fetch.wait.max.ms": "500"}
IN_FLIGHT = (("1", 1), ("5", 5), ("librdkafka's default", None))
DRAIN_S = 40.0
"""How long the producer may take, after the last send, to have its records acknowledged;
what is still unacknowledged then is counted as such."""


def measure(bootstrap: str, topic: str, rate: float, seconds: float,
            in_flight: int | None) -> tuple[int, int, float, float]:
    """(records sent, acknowledged, p50 ms, p99 ms) of one producer at `rate` records/s."""
    latencies: list[float] = []
    config = {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
              "message.timeout.ms": int((seconds + DRAIN_S) * 1000) + 5000,
              "log_level": 0}
    if in_flight is not None:
        config["max.in.flight.requests.per.connection"] = in_flight
    producer = Producer(config)

    def on_delivery(err: object, _msg: object, sent: float) -> None:
        if err is None:
            latencies.append(time.perf_counter() - sent)

    total = int(rate * seconds)
    started = time.perf_counter()
    for i in range(total):
        while time.perf_counter() < started + i / rate:
            producer.poll(0.001)
        sent = time.perf_counter()
        producer.produce(topic, RECORD, on_delivery=lambda err, msg, sent=sent:
                         on_delivery(err, msg, sent))
        producer.poll(0)
    producer.flush(DRAIN_S)
    latencies.sort()
    if not latencies:
        return total, 0, float("nan"), float("nan")
    p99 = latencies[max(int(len(latencies) * 0.99) - 1, 0)]
    return total, len(latencies), statistics.median(latencies) * 1000, p99 * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    print(f"commit {commit()}; {machine_line()}")
    reference = Reference.measure()
    print(reference.start_line(), flush=True)
    print(f"acks=all, RF 3, min.insync.replicas 2, {args.rate:g} records/s of 100 B for "
          f"{args.seconds:g} s, then at most {DRAIN_S:g} s to be acknowledged")
    print(f"{'brokers':<34} {'in flight':<22} {'acknowledged':>14} {'p50':>10} {'p99':>10}")
    for label, config in (("defaults", {}), ("replica.fetch.min.bytes 1 MiB, "
                                              "wait 500 ms", BATCHING)):
        with running_cluster({"min.insync.replicas": "2", **config}) as bootstrap:
            for index, (name, in_flight) in enumerate(IN_FLIGHT):
                topic = f"latency-{index}"
                create_topic(bootstrap, topic)
                sent, acked, p50, p99 = measure(bootstrap, topic, args.rate, args.seconds,
                                                in_flight)
                print(f"{label:<34} {name:<22} {acked:>6,} of {sent:<6,} {p50:>7,.0f} ms "
                      f"{p99:>7,.0f} ms", flush=True)
    print(reference.finish().end_line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
