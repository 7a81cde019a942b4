"""acks=all latency at a steady rate, with and without batched replication, by producer and
how many requests it keeps in flight.

    .venv/bin/python benchmarks/acks_all_latency.py [--rate 500] [--seconds 10]

A stock client sends 100-byte records at a fixed rate to one partition (RF 3,
min.insync.replicas 2) of a local 3-broker cluster, once with the brokers' defaults and once
with replica.fetch.min.bytes 1 MiB and replica.fetch.wait.max.ms 500 (the leader kill
experiments' batching). The clients: confluent-kafka (librdkafka) with
max.in.flight.requests.per.connection 1, 5 (the workload's, and the Java producer's default)
and librdkafka's default (1,000,000); and kafka-python, whose producer is a port of the Java
producer's RecordAccumulator and Sender, with one request in flight, at the Java default
batch.size (16 KiB) and at 1 MiB.

librdkafka builds the next produce request as soon as linger.ms passes, while one is still
in flight (its queue.buffering.backpressure.threshold, at least 1, counts requests built but
not yet sent, apart from max.in.flight), so a record arriving after that rides the request
after next. The Java producer, like kafka-python, keeps appending to the open batch of a
partition until the Sender drains it, which it does only when the request in flight is
answered; but it drains one batch of a partition per request, so batch.size bounds what one
fetch wait can carry.

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
from kafka import KafkaProducer
from ledger import commit, machine_line
from reference import Reference

RECORD = b"x" * 100
BATCHING = {"replica.fetch.min.bytes": "1048576", "replica.fetch.wait.max.ms": "500"}
LIBRDKAFKA = (("1", 1), ("5", 5), ("librdkafka's default", None))
KAFKA_PYTHON = (("1, batch.size 16 KiB", 16384), ("1, batch.size 1 MiB", 1 << 20))
DRAIN_S = 40.0
"""How long the producer may take, after the last send, to have its records acknowledged;
what is still unacknowledged then is counted as such."""


def librdkafka(bootstrap: str, topic: str, rate: float, seconds: float,
               in_flight: int | None) -> tuple[int, list[float]]:
    """(records sent, latencies of the acknowledged) of confluent-kafka at `rate`."""
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
    return total, latencies


def kafka_python(bootstrap: str, topic: str, rate: float, seconds: float,
                 batch_size: int) -> tuple[int, list[float]]:
    """(records sent, latencies of the acknowledged) of kafka-python's producer at `rate`,
    one request in flight (the Java producer's guaranteed order)."""
    latencies: list[float] = []
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5,
                             batch_size=batch_size, max_in_flight_requests_per_connection=1,
                             request_timeout_ms=int(DRAIN_S * 1000),
                             delivery_timeout_ms=int((seconds + DRAIN_S) * 1000) + 5000)
    total = int(rate * seconds)
    started = time.perf_counter()
    for i in range(total):
        delay = started + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        sent = time.perf_counter()
        producer.send(topic, RECORD).add_callback(
            lambda _metadata, sent=sent: latencies.append(time.perf_counter() - sent))
    producer.flush(DRAIN_S)
    producer.close(5)
    return total, latencies


def percentiles(latencies: list[float]) -> tuple[float, float]:
    """(p50 ms, p99 ms); NaN for none."""
    if not latencies:
        return float("nan"), float("nan")
    ordered = sorted(latencies)
    p99 = ordered[max(int(len(ordered) * 0.99) - 1, 0)]
    return statistics.median(ordered) * 1000, p99 * 1000


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
    print(f"{'brokers':<10} {'client':<13} {'in flight':<22} {'acknowledged':>14} "
          f"{'p50':>10} {'p99':>10}")
    runs = [("librdkafka", name, librdkafka, setting) for name, setting in LIBRDKAFKA]
    runs += [("kafka-python", name, kafka_python, setting) for name, setting in KAFKA_PYTHON]
    for label, config in (("defaults", {}), ("batched", BATCHING)):
        with running_cluster({"min.insync.replicas": "2", **config}) as bootstrap:
            for index, (client, name, measure, setting) in enumerate(runs):
                topic = f"latency-{index}"
                create_topic(bootstrap, topic)
                sent, latencies = measure(bootstrap, topic, args.rate, args.seconds, setting)
                p50, p99 = percentiles(latencies)
                print(f"{label:<10} {client:<13} {name:<22} {len(latencies):>6,} of "
                      f"{sent:<6,} {p50:>7,.0f} ms {p99:>7,.0f} ms", flush=True)
    print(reference.finish().end_line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
