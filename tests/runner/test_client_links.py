"""A workload client with links of its own (Kafka's named listeners, KIP-103, behind proxies
of its own): every connection it makes takes them, a partition that isolates it cuts it
alone off every broker, a delay on them slows its requests alone, and a replaced broker's
listeners all move to its new address.

Real minibroker processes and real confluent-kafka consumers and producers; every effect is
read from the proxies' own counters and the clients' own progress, with bounded waits.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from planned_faults import planned
from processes import needs_local_minibroker
from seeded_topic import seed_topic

from undertow.faults import Nodes, build_fault
from undertow.platform.base import CLIENT, Link, client_endpoint, wait_for
from undertow.platform.local import LocalPlatform, LocalPlatformConfig

pytestmark = needs_local_minibroker()

TOPIC = "links"
FAST = {"replica.lag.time.max.ms": "1000", "broker.session.timeout.ms": "1500",
        "broker.heartbeat.interval.ms": "200"}


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlatform]:
    config = LocalPlatformConfig(workdir=tmp_path_factory.mktemp("links"), brokers=2,
                                 broker_config=FAST, controller_config=FAST,
                                 clients=("c0", "c1", "p0"))
    with LocalPlatform(config) as cluster:
        seed_topic(cluster, TOPIC)
        yield cluster


def reader(platform: LocalPlatform, consumer: str, group: str, **config: object) -> Consumer:
    """An assign-mode consumer of both partitions, connecting as workload consumer
    ``consumer`` does."""
    c = Consumer({"bootstrap.servers": platform.bootstrap_for(consumer), "group.id": group,
                  "enable.auto.commit": False, "log_level": 0, **config})
    c.assign([KafkaTopicPartition(TOPIC, p, 0) for p in range(2)])
    return c


def read_every_record(c: Consumer, what: str, timeout_s: float = 20) -> None:
    got: list[int] = []
    try:
        wait_for(lambda: got.append(read_more(c)) or sum(got) >= 20, timeout_s, what,
                 interval=0)
    finally:
        c.close()


def read_more(consumer: Consumer) -> int:
    return sum(1 for m in consumer.consume(100, 0.2) if not m.error())


def accepted(platform: LocalPlatform, src: str) -> int:
    """Connections the proxies of ``src``'s links to the brokers accepted."""
    proxies = platform.proxies
    assert proxies is not None
    return sum(proxies.accepted_count(Link(src, broker)) for broker in platform.brokers)


def test_each_consumer_gets_its_own_addresses_and_keeps_to_them(platform: LocalPlatform) -> None:
    c1 = platform.bootstrap_for("c1")
    assert len({platform.bootstrap, platform.bootstrap_for("c0"), c1}) == 3
    assert platform.bootstrap_for("c9") == platform.bootstrap  # no links of its own
    before_client = accepted(platform, CLIENT)
    before_c0 = accepted(platform, client_endpoint("c0"))
    read_every_record(reader(platform, "c1", "links-c1"), "c1 to read every record")
    # Metadata (and the group's coordinator) named c1's own listener on every broker.
    assert all(platform.proxies.accepted_count(Link(client_endpoint("c1"), b)) > 0
               for b in platform.brokers)
    assert accepted(platform, CLIENT) == before_client
    assert accepted(platform, client_endpoint("c0")) == before_c0


def test_an_isolated_consumer_alone_is_cut_off(platform: LocalPlatform) -> None:
    fault = build_fault(planned({"kind": "partition", "target": {"consumer": 1}}), platform,
                        Nodes(client_endpoint("c1")), time_limit_s=60)
    assert fault.describe() == {"fault": "partition", "target": "client-c1"}
    fault.inject()
    try:
        assert platform.blocked_links == {
            link for b in platform.brokers
            for link in (Link(client_endpoint("c1"), b), Link(b, client_endpoint("c1")))}
        # Everyone else reads on, while c1, in that time and two seconds more, reads nothing.
        stranded = reader(platform, "c1", "links-cut")
        read_every_record(reader(platform, "c0", "links-c0"),
                          "c0 to read every record while c1 is cut off")
        assert sum(read_more(stranded) for _ in range(10)) == 0
    finally:
        fault.recover()
    assert not platform.blocked_links
    read_every_record(stranded, "c1 to read every record once healed", 30)


def test_a_replaced_broker_moves_every_listener(platform: LocalPlatform) -> None:
    victim = platform.brokers[0]
    fault = build_fault(planned({"kind": "pod-delete", "target": {"broker": 0}}), platform,
                        Nodes(victim), time_limit_s=60)
    fault.inject()
    fault.recover()
    read_every_record(reader(platform, "c1", "links-after"),
                      "c1 to read every record through the replaced broker's new listener", 30)


def producer(platform: LocalPlatform, client: str) -> Producer:
    """An acks=all producer connecting as workload producer ``client`` does."""
    return Producer({"bootstrap.servers": platform.bootstrap_for(client), "acks": "all",
                     "linger.ms": 0, "message.timeout.ms": 10000, "log_level": 0})


def send_latencies(p: Producer, n: int) -> list[float]:
    """Seconds from produce() to each acknowledgement, one record at a time."""
    return [send_one(p, i) for i in range(n)]


def send_one(p: Producer, i: int) -> float:
    done: list[float] = []
    started = time.monotonic()
    p.produce(TOPIC, f"lat-{i}".encode(), partition=i % 2,
              on_delivery=lambda err, _msg: None if err else done.append(time.monotonic()))
    wait_for(lambda: p.poll(0.05) >= 0 and bool(done), 15, f"send {i} acknowledged",
             interval=0)
    return done[0] - started


def test_a_delayed_producer_alone_waits_for_the_delay(platform: LocalPlatform) -> None:
    """A `delay` of 200 ms on p0's links to every broker, both ways: each send of p0 waits
    for a delayed request and a delayed answer, 400 ms, within 20 %; a producer through the
    shared client links is as fast as before."""
    p0, other = producer(platform, "p0"), Producer(
        {"bootstrap.servers": platform.bootstrap, "acks": "all", "linger.ms": 0,
         "log_level": 0})
    base = statistics.median(send_latencies(p0, 10))
    fault = build_fault(planned({"kind": "delay", "target": {"producer": 0},
                                 "delay": {"latency": "200ms"}}),
                        platform, Nodes(client_endpoint("p0")), time_limit_s=60)
    assert fault.describe() == {"fault": "delay", "target": "client-p0"}
    fault.inject()
    try:
        slowed = statistics.median(send_latencies(p0, 10)) - base
        unaffected = statistics.median(send_latencies(other, 10))
    finally:
        fault.recover()
    assert not platform.delayed_links
    assert 0.32 <= slowed <= 0.48, (base, slowed)
    assert unaffected < 0.1, unaffected
    assert statistics.median(send_latencies(p0, 5)) < 0.1


def test_an_isolated_producer_alone_is_cut_off(platform: LocalPlatform) -> None:
    """A partition isolating p0: its sends wait unanswered while another producer's are
    acknowledged, and go through once it heals."""
    p0 = producer(platform, "p0")
    send_latencies(p0, 2)  # connected and warm
    fault = build_fault(planned({"kind": "partition", "target": {"producer": 0}}), platform,
                        Nodes(client_endpoint("p0")), time_limit_s=60)
    fault.inject()
    acked: list[bool] = []
    try:
        p0.produce(TOPIC, b"cut", partition=0,
                   on_delivery=lambda err, _msg: acked.append(err is None))
        other = Producer({"bootstrap.servers": platform.bootstrap, "acks": "all",
                          "log_level": 0})
        assert max(send_latencies(other, 5)) < 1.0
        p0.poll(2.0)
        assert not acked, "p0 was answered through a cut link"
    finally:
        fault.recover()
    wait_for(lambda: p0.poll(0.1) >= 0 and acked == [True], 15,
             "p0's send acknowledged once healed", interval=0)
