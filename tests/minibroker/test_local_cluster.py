"""``minibroker cluster`` as a user runs it: real processes, real signals, a stock client.

A broker SIGKILLed leaves the others serving (its partitions' leadership moves, a
confluent-kafka producer and consumer go on), the launcher says which node died and how,
and ``minibroker cluster restart`` or ``--restart-after`` brings it back into the ISR. The
controller is restarted the same way. SIGTERM or SIGINT of the launcher alone stops every
node and leaves no process, port or socket behind. Every wait is on the cluster's own state
(the controller's ``/v1/state``, a broker's Metadata) with a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.error import KafkaException
from ports import free_base_port
from processes import stop_group
from procs import living_with_mark
from waits import wait_for

pytestmark = pytest.mark.slow

BROKERS = 3
TOPIC = "orders"
FAST = ("min.insync.replicas=2", "broker.session.timeout.ms=2000",
        "replica.lag.time.max.ms=2000")


def minibroker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "minibroker", "--log-level", "ERROR", *args],
                          capture_output=True, text=True, timeout=30, check=False)


@dataclass
class Launched:
    process: subprocess.Popen[bytes]
    base: int
    data_dir: Path
    log: Path
    mark: str

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{self.base + i}" for i in range(1, BROKERS + 1))

    def ports(self) -> list[int]:
        return [self.base + i for i in range(BROKERS + 1)] + \
            [self.base + 100 + i for i in range(BROKERS + 1)]

    def printed(self) -> str:
        return self.log.read_text(errors="replace")

    def status(self) -> dict[str, int]:
        """Node name ("controller", "broker 2") -> pid, from `minibroker cluster status`."""
        out = minibroker("cluster", "status", "--data-dir", str(self.data_dir))
        assert out.returncode == 0, out.stderr
        pids = {}
        for line in out.stdout.splitlines():
            name, _, rest = line.partition("  ")
            pids[name.strip()] = int(rest.split("pid")[1].split()[0])
        return pids

    def partition(self) -> dict:
        """The controller's own view of TOPIC's partition 0 (leader, isr)."""
        url = f"http://127.0.0.1:{self.base + 100}/v1/state"
        with urllib.request.urlopen(url, timeout=2) as response:
            return json.load(response)["topics"][TOPIC]["partitions"]["0"]

    def leader_seen_by(self, broker_id: int) -> int:
        """Partition 0's leader in the Metadata broker `broker_id` answers a client with."""
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{self.base + broker_id}"})
        try:
            return admin.list_topics(TOPIC, timeout=2).topics[TOPIC].partitions[0].leader
        except KafkaException:  # the broker does not answer: no leader it names
            return -1


@contextlib.contextmanager
def launched(tmp_path: Path, *args: str) -> Iterator[Launched]:
    """`minibroker cluster` with `args`, its topic created and fully replicated; stopped
    with its process group whatever the test did."""
    mark, base, data_dir = uuid.uuid4().hex, free_base_port(BROKERS + 1), tmp_path / "data"
    with (tmp_path / "cluster.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "minibroker", "cluster", "--brokers", str(BROKERS),
             "--base-port", str(base), "--data-dir", str(data_dir), *args,
             *(arg for pair in FAST for arg in ("--config", pair))],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "UNDERTOW_TEST_MARK": mark})
    cluster = Launched(process, base, data_dir, tmp_path / "cluster.log", mark)
    try:
        wait_for(lambda: minibroker(
            "topics", "create", "--bootstrap", f"127.0.0.1:{cluster.base + 1}", "--topic",
            TOPIC, "--partitions", "1", "--replication-factor", str(BROKERS)).returncode == 0,
            45, "the topic to be created", cluster.log)
        wait_for(lambda: len(cluster.partition()["isr"]) == BROKERS, 30, "a full ISR",
                 cluster.log)
        yield cluster
    finally:
        if cluster.process.poll() is None:
            stop_group(cluster.process)


def produce(bootstrap: str, values: list[bytes]) -> None:
    acked: list[bytes] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "message.timeout.ms": 15000})
    for value in values:
        producer.produce(TOPIC, value, partition=0,
                         on_delivery=lambda err, msg: err or acked.append(msg.value()))
    producer.flush(20)
    assert acked == values


def consume(bootstrap: str, count: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "check",
                         "enable.auto.commit": False})
    consumer.assign([KafkaTopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(values) < count and time.monotonic() < deadline:
        values += [m.value() for m in consumer.consume(100, 0.5) if not m.error()]
    consumer.close()
    return values


def listens(port: int) -> bool:
    """Whether something accepts connections on the loopback port (a port left in
    TIME_WAIT by the stopped nodes' connections is not one left behind)."""
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def stopped_clean(cluster: Launched, sig: signal.Signals) -> None:
    """Signal the launcher alone (not its group, as a terminal's Ctrl-C would): every node
    stops, and no process, port or control socket is left."""
    os.kill(cluster.process.pid, sig)
    assert cluster.process.wait(30) == 0
    wait_for(lambda: living_with_mark(cluster.mark) == [], 15, "every node to exit")
    assert [port for port in cluster.ports() if listens(port)] == []
    assert not (cluster.data_dir / "cluster.sock").exists()


def test_a_killed_leader_leaves_the_others_serving_until_restart_brings_it_back(
        tmp_path: Path) -> None:
    with launched(tmp_path) as cluster:
        produce(cluster.bootstrap, [b"before-0", b"before-1"])
        leader = cluster.partition()["leader"]
        pids = cluster.status()
        victim = pids[f"broker {leader}"]
        os.kill(victim, signal.SIGKILL)

        wait_for(lambda: f"broker {leader} (pid {victim}) was killed by SIGKILL; the other "
                         f"nodes keep serving; restart it:" in cluster.printed(), 10,
                 "the launcher's line on the kill", cluster.log)
        survivor = next(b for b in range(1, BROKERS + 1) if b != leader)
        wait_for(lambda: cluster.leader_seen_by(survivor) not in (leader, -1), 30,
                 f"a survivor's Metadata to name a leader other than {leader}", cluster.log)
        assert cluster.process.poll() is None
        for pid in pids.values():
            if pid != victim:
                os.kill(pid, 0)  # ProcessLookupError if the launcher took it down
        produce(cluster.bootstrap, [b"after-0", b"after-1"])
        assert consume(cluster.bootstrap, 4) == [b"before-0", b"before-1", b"after-0",
                                                 b"after-1"]
        assert cluster.status()[f"broker {leader}"] == victim  # still down, no restart asked

        running = minibroker("cluster", "restart", str(survivor), "--data-dir",
                             str(cluster.data_dir))
        assert running.returncode == 1 and f"broker {survivor} is running" in running.stderr
        second = subprocess.run(
            [sys.executable, "-m", "minibroker", "cluster", "--base-port",
             str(cluster.base + 50), "--data-dir", str(cluster.data_dir)],
            capture_output=True, text=True, timeout=30, check=False)
        assert second.returncode == 2 and "another minibroker cluster runs" in second.stderr

        restarted = minibroker("cluster", "restart", str(leader), "--data-dir",
                               str(cluster.data_dir))
        assert restarted.returncode == 0, restarted.stderr
        new_pid = cluster.status()[f"broker {leader}"]
        assert restarted.stdout.strip() == f"broker {leader} restarted as asked (pid {new_pid})"
        assert new_pid != victim
        wait_for(lambda: leader in cluster.partition()["isr"]
                 and len(cluster.partition()["isr"]) == BROKERS, 30,
                 f"broker {leader} to rejoin the ISR", cluster.log)
        stopped_clean(cluster, signal.SIGTERM)


def test_restart_after_brings_back_the_controller_and_a_broker_by_itself(
        tmp_path: Path) -> None:
    with launched(tmp_path, "--restart-after", "0.5") as cluster:
        controller = cluster.status()["controller"]
        os.kill(controller, signal.SIGKILL)
        wait_for(lambda: f"controller (pid {controller}) was killed by SIGKILL; the brokers "
                         f"keep serving, but no leader can be elected" in cluster.printed()
                 and "controller restarted after --restart-after" in cluster.printed(), 10,
                 "the controller's kill and restart lines", cluster.log)
        wait_for(lambda: len(cluster.partition()["isr"]) == BROKERS, 30,
                 "the restarted controller to serve a full ISR", cluster.log)

        follower = next(b for b in cluster.partition()["isr"]
                        if b != cluster.partition()["leader"])
        victim = cluster.status()[f"broker {follower}"]
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: f"broker {follower} (pid {victim}) was killed by SIGKILL; the other "
                         f"nodes keep serving; restarting it in 0.5 s" in cluster.printed()
                 and cluster.status()[f"broker {follower}"] != victim, 10,
                 f"broker {follower} to be restarted", cluster.log)
        wait_for(lambda: f"Broker {follower} restarted without a clean shutdown"
                 in cluster.printed(), 20, "the restarted broker to register", cluster.log)
        wait_for(lambda: len(cluster.partition()["isr"]) == BROKERS, 30,
                 f"broker {follower} to rejoin the ISR", cluster.log)
        produce(cluster.bootstrap, [b"after-restarts"])
        stopped_clean(cluster, signal.SIGINT)
