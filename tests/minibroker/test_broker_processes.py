"""Real processes, real sockets, real signals: failover and recovery of a minibroker cluster,
observed through the brokers' own state (``/v1/state``) with bounded waits."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from ports import free_port
from waits import wait_for

TOKEN = "test-token"
TOPIC = "orders"


def get_json(port: int, path: str = "/v1/state") -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
        return json.load(response)


def post(port: int, path: str, body: dict, method: str = "POST") -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method=method,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return response.status
    except (ConnectionError, urllib.error.URLError):
        return -1  # power loss: the broker died before answering


class ProcessCluster:
    """A controller and three brokers, each its own OS process with its own data dir."""

    def __init__(self, root: Path, config: dict[str, str]) -> None:
        self.root = root
        self.config = [arg for k, v in config.items() for arg in ("--config", f"{k}={v}")]
        self.controller_port, self.controller_http = free_port(), free_port()
        self.ports = {i: (free_port(), free_port()) for i in (1, 2, 3)}
        self.procs: dict[str, subprocess.Popen] = {}
        env = {**os.environ, "MINIBROKER_FAILPOINT_TOKEN": TOKEN,
               "MINIBROKER_CONTROLLER_SECRET": secrets.token_hex(32)}
        self.env = env
        self._spawn("controller", ["controller", "--listen", f"127.0.0.1:{self.controller_port}",
                                   "--data-dir", str(root / "controller"), "--metrics-port",
                                   str(self.controller_http), *self.config])
        for broker_id in self.ports:
            self.start(broker_id)

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - lives with the process
        self.procs[name] = subprocess.Popen([sys.executable, "-m", "minibroker", *args],
                                            stdout=log, stderr=log, env=self.env)

    def start(self, broker_id: int) -> None:
        kafka, http = self.ports[broker_id]
        self._spawn(f"broker-{broker_id}", [
            "broker", "--id", str(broker_id), "--listen", f"127.0.0.1:{kafka}",
            "--controller", f"127.0.0.1:{self.controller_port}",
            "--data-dir", str(self.root / f"broker-{broker_id}"), "--metrics-port", str(http),
            *self.config])

    def kill(self, broker_id: int) -> None:
        proc = self.procs[f"broker-{broker_id}"]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{kafka}" for kafka, _ in self.ports.values())

    def partition(self, index: int = 0) -> dict:
        return get_json(self.controller_http)["topics"][TOPIC]["partitions"][str(index)]

    def broker_state(self, broker_id: int) -> dict:
        return get_json(self.ports[broker_id][1])

    def create_topic(self, partitions: int = 1) -> None:
        kafka = self.ports[1][0]
        wait_for(lambda: subprocess.run(
            [sys.executable, "-m", "minibroker", "--log-level", "ERROR", "topics", "create",
             "--bootstrap", f"127.0.0.1:{kafka}", "--topic", TOPIC, "--partitions",
             str(partitions), "--replication-factor", "3"], capture_output=True,
            env=self.env).returncode == 0, 30, "the topic to be created")
        wait_for(lambda: len(self.partition()["isr"]) == 3, 30, "a full ISR")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait(10)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ProcessCluster]:
    c = ProcessCluster(tmp_path, {"min.insync.replicas": "2", "replica.lag.time.max.ms": "2000",
                                  "broker.session.timeout.ms": "2000"})
    try:
        yield c
    finally:
        c.stop()


class Workload:
    """A confluent-kafka producer sending unique values with acks=all, recording acks."""

    def __init__(self, bootstrap: str) -> None:
        self.acked: dict[bytes, int] = {}
        self._stop = threading.Event()
        self._producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                   "linger.ms": 2, "message.timeout.ms": 10000,
                                   "retries": 0})
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        seq = 0

        def on_delivery(err, msg) -> None:
            if err is None:
                self.acked[msg.value()] = msg.offset()

        while not self._stop.is_set():
            self._producer.produce(TOPIC, f"p0-{seq}".encode(), partition=0,
                                   on_delivery=on_delivery)
            seq += 1
            self._producer.poll(0.002)
        self._producer.flush(15)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def drain(bootstrap: str, end: int) -> dict[int, bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "drain",
                         "enable.auto.commit": False})
    consumer.assign([KafkaTopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
    records: dict[int, bytes] = {}
    deadline = time.monotonic() + 30
    while len(records) < end and time.monotonic() < deadline:
        for message in consumer.consume(1000, 0.5):
            if not message.error():
                records[message.offset()] = message.value()
    consumer.close()
    return records


def test_kill_the_leader_under_acks_all_loses_nothing(cluster: ProcessCluster) -> None:
    cluster.create_topic()
    workload = Workload(cluster.bootstrap)
    wait_for(lambda: len(workload.acked) > 500, 30, "acknowledged writes")
    before = cluster.partition()
    cluster.kill(before["leader"])
    # The controller fences the dead leader and elects another ISR member.
    wait_for(lambda: cluster.partition()["leader"] not in (before["leader"], -1), 20,
             "a new leader")
    after = cluster.partition()
    assert after["leader_epoch"] > before["leader_epoch"]
    assert before["leader"] not in after["isr"]
    acked_at_failover = len(workload.acked)
    wait_for(lambda: len(workload.acked) > acked_at_failover + 500, 30, "writes to resume")
    cluster.start(before["leader"])
    wait_for(lambda: len(cluster.partition()["isr"]) == 3, 30, "the old leader to rejoin")
    workload.stop()

    new_leader = cluster.partition()["leader"]
    hw = next(p for p in cluster.broker_state(new_leader)["partitions"]
              if p["topic"] == TOPIC)["high_watermark"]
    records = drain(cluster.bootstrap, hw)
    lost = {v: o for v, o in workload.acked.items() if records.get(o) != v}
    assert not lost, f"{len(lost)} acknowledged records lost or misplaced"
    # Every replica converged to the same log end.
    wait_for(lambda: converged(cluster), 20, "replicas to converge")


def test_power_loss_drops_unsynced_writes_and_the_broker_recovers(
        cluster: ProcessCluster) -> None:
    cluster.create_topic()
    workload = Workload(cluster.bootstrap)
    wait_for(lambda: len(workload.acked) > 300, 30, "acknowledged writes")
    follower = next(b for b in cluster.partition()["isr"] if b != cluster.partition()["leader"])
    leo_before = next(p for p in cluster.broker_state(follower)["partitions"])["log_end_offset"]
    assert leo_before > 0
    post(cluster.ports[follower][1], "/v1/failpoints/power-loss", {})
    assert cluster.procs[f"broker-{follower}"].wait(10) == 137
    # Nothing was fsynced: the follower's log is gone, its checkpoints survive.
    cluster.start(follower)
    wait_for(lambda: follower in cluster.partition()["isr"]
             and len(cluster.partition()["isr"]) == 3, 30, "the follower to rejoin the ISR")
    log_text = (cluster.root / f"broker-{follower}.log").read_text()
    assert "log end offset 0" in log_text
    workload.stop()
    wait_for(lambda: converged(cluster), 20, "replicas to converge")


def partition_state(state: dict) -> dict:
    """The test topic's partition in a broker's ``/v1/state``."""
    return next(p for p in state["partitions"] if p["topic"] == TOPIC)


def converged(cluster: ProcessCluster) -> bool:
    """Every broker holds the test topic's partition, all at one log end offset (a broker
    that does not list it yet, as it loads it, is not there yet)."""
    ends = set()
    for broker_id in (1, 2, 3):
        partitions = [p for p in cluster.broker_state(broker_id)["partitions"]
                      if p["topic"] == TOPIC]
        if not partitions:
            return False
        ends.add(partitions[0]["log_end_offset"])
    return len(ends) == 1


def test_disk_stall_on_the_leader_stops_acknowledgements_until_it_heals(
        cluster: ProcessCluster) -> None:
    """acks=all: Kafka answers a produce once the ISR holds it (DelayedProduce), and a
    leader whose disk is stalled appends nothing. So while the stall lasts, exactly the
    records already in the leader's log get acknowledged, however many more the producer
    sends. The stall heals itself only long after the test (it is cleared explicitly), and
    every observation is bracketed by ``/v1/state`` reads that show it still on: nothing
    depends on how long anything takes."""
    cluster.create_topic()
    workload = Workload(cluster.bootstrap)
    wait_for(lambda: len(workload.acked) > 100, 30, "acknowledged writes")
    leader = cluster.partition()["leader"]
    http = cluster.ports[leader][1]
    assert post(http, "/v1/failpoints/disk-stall", {"duration_ms": 300_000}) == 200
    stalled = cluster.broker_state(leader)
    assert stalled["disk_stalled"]
    stalled_end = partition_state(stalled)["log_end_offset"]  # appended before the stall
    # Writes sent during the stall reached the leader and wait there, unanswered ...
    wait_for(lambda: cluster.broker_state(leader)["appends_held_by_stall"] > 0, 30,
             "a produce request held by the stall")
    # ... while everything appended before it is replicated and acknowledged.
    wait_for(lambda: len(workload.acked) >= stalled_end, 30,
             "the writes appended before the stall to be acknowledged")
    acked = dict(workload.acked)
    still = cluster.broker_state(leader)
    assert still["disk_stalled"] and still["appends_held_by_stall"] > 0
    assert partition_state(still)["log_end_offset"] == stalled_end
    assert sorted(acked.values()) == list(range(stalled_end)), (
        f"{len(acked)} writes acknowledged by a leader stalled at log end offset "
        f"{stalled_end}, at offsets {sorted(set(acked.values()) - set(range(stalled_end)))}")

    assert post(http, "/v1/failpoints/disk-stall", {}, method="DELETE") == 200
    assert not cluster.broker_state(leader)["disk_stalled"]
    wait_for(lambda: max(dict(workload.acked).values()) >= stalled_end, 30,
             "the held writes to be acknowledged")
    workload.stop()


def test_failpoints_require_the_token(cluster: ProcessCluster) -> None:
    port = cluster.ports[1][1]
    wait_for(lambda: cluster.broker_state(1)["broker_id"] == 1, 20, "broker 1's endpoint")
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/failpoints/power-loss",
                                     data=b"{}", method="POST",
                                     headers={"Authorization": "Bearer wrong"})
    with pytest.raises(urllib.error.HTTPError) as excinfo:
        urllib.request.urlopen(request, timeout=2)
    assert excinfo.value.code == 401
    assert cluster.procs["broker-1"].poll() is None
