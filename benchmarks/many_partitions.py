"""Thousands of partitions on a 3-broker cluster: created, led, replicated, then stable.

    .venv/bin/python benchmarks/many_partitions.py [--partitions 3000] [--stable-s 300]

One CreateTopics of PARTITIONS partitions at replication factor 3 (a stock client's
AdminClient) against ``minibroker cluster``; then the time until every partition has a
leader and a full ISR in the controller's state, and until one record with acks=all to
every partition is acknowledged (each partition led, its followers fetching); then
STABLE_S seconds of watching: broker fences (the controller's events), the heartbeat
margin (``broker.session.timeout.ms`` minus the longest gap between two heartbeats the
controller received from a broker, over the whole run, creation included), each broker's
RSS and the latency of a Metadata request on a fresh connection. Ends with a round trip
through a stock producer and consumer.

Target (issue: a cluster a hostile or careless client cannot fence): 3,000 partitions
stable for 5 minutes with no fence. The time to lead and replicate every partition is also
given scaled to the reference machine, between the reference loop's time at the start and at
the end (reference.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from ledger import commit, machine_line
from reference import AT, Reference

for folder in ("tests", "tests/minibroker"):  # the test helpers the benchmark shares
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / folder))

from fuzz_cluster import Cluster, Watcher, round_trip, running_cluster  # noqa: E402

SESSION_TIMEOUT_MS = 3000  # minibroker's broker.session.timeout.ms default
TOPIC = "many"


def _settled(cluster: Cluster, partitions: int) -> bool:
    regs = cluster.controller_state()["topics"].get(TOPIC, {}).get("partitions", {})
    return len(regs) == partitions and all(
        r["leader"] >= 0 and len(r["isr"]) == 3 for r in regs.values())


def _wait(condition, timeout: float, what: str) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.5)
    return time.monotonic() - started


def _produce_to_every_partition(cluster: Cluster, partitions: int) -> float:
    started = time.monotonic()
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all",
                         "linger.ms": 50, "message.timeout.ms": 300000})
    errors: list[object] = []
    for p in range(partitions):
        producer.produce(TOPIC, b"x", partition=p, on_delivery=lambda e, _m: errors.append(e))
    left = producer.flush(330)
    failed = [e for e in errors if e is not None]
    if left or failed:
        raise RuntimeError(f"{left} records unacknowledged, {len(failed)} failed: "
                           f"{failed[:3]}")
    return time.monotonic() - started


def _cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User plus system CPU seconds of each process so far (/proc/PID/stat, all threads)."""
    ticks = os.sysconf("SC_CLK_TCK")
    used = {}
    for name, pid in pids.items():
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        used[name] = (int(fields[11]) + int(fields[12])) / ticks
    return used


def _gaps(cluster: Cluster) -> dict[int, float]:
    return {b["id"]: b["max_heartbeat_gap_ms"] for b in cluster.controller_state()["brokers"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=3000)
    parser.add_argument("--stable-s", type=float, default=300.0)
    args = parser.parse_args()
    print(f"commit {commit()}; {machine_line()}; {args.partitions} partitions, RF 3, "
          f"3 brokers", flush=True)
    reference = Reference.measure()
    print(reference.start_line(), flush=True)
    with tempfile.TemporaryDirectory(prefix="undertow-many-") as work, \
            running_cluster(Path(work), 3) as cluster, Watcher(cluster) as watcher:
        started = time.monotonic()
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        (future,) = admin.create_topics([NewTopic(TOPIC, args.partitions, 3)],
                                        request_timeout=120).values()
        future.result(150)
        accepted = time.monotonic() - started
        _wait(lambda: _settled(cluster, args.partitions), 300, "every partition led, ISR 3")
        settled = time.monotonic() - started
        produced = _produce_to_every_partition(cluster, args.partitions)
        print(f"CreateTopics answered in {accepted:.1f} s; every partition led with ISR 3 "
              f"after {settled:.1f} s; one acks=all record to each partition acknowledged "
              f"{produced:.1f} s later", flush=True)
        fences_before = len(cluster.fences())
        cpu_before = _cpu_seconds(watcher.pids)
        window = time.monotonic()
        while time.monotonic() - window < args.stable_s:
            time.sleep(min(30.0, args.stable_s))
            print(f"  {time.monotonic() - window:4.0f} s: fences {len(cluster.fences())}, "
                  f"settled {_settled(cluster, args.partitions)}, heartbeat gaps max (ms) "
                  f"{_gaps(cluster)}", flush=True)
        fences = cluster.fences()
        gaps = _gaps(cluster)
        cpu = {name: (used - cpu_before[name]) / (time.monotonic() - window)
               for name, used in _cpu_seconds(watcher.pids).items()}
        trip = round_trip(cluster)
    w = watcher.watch
    worst = max(gaps.values())
    print(f"{args.partitions} partitions: create {accepted:.1f} s, led and ISR 3 at "
          f"{settled:.1f} s ({reference.duration(settled):.1f} s {AT}); fences during the run "
          f"{len(fences)} "
          f"({len(fences) - fences_before} in the {args.stable_s:.0f} s window); longest "
          f"heartbeat gap {worst:.0f} ms, margin {SESSION_TIMEOUT_MS - worst:.0f} ms of "
          f"{SESSION_TIMEOUT_MS}; CPU while idle (cores) "
          f"{ {k: round(v, 2) for k, v in sorted(cpu.items())} }; peak RSS (MiB) "
          f"{ {k: round(v / 1024) for k, v in sorted(w.peak_rss_kib.items())} }; worst "
          f"Metadata probe (s) { {k: round(v, 2) for k, v in sorted(w.worst_probe_s.items())} }"
          f"; round trip {'ok' if trip is None else trip}")
    print(reference.finish().end_line())
    if fences or trip is not None:
        sys.exit(1)


if __name__ == "__main__":
    main()
