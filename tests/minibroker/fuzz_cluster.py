"""The cluster a fuzzing campaign runs against, and what watches it: ``minibroker
cluster`` in its own process group, the topics the fuzzer may name (with records to read),
a watcher thread that once a second reads each process's RSS and scheduling from /proc and
times a Metadata request on a fresh connection to each broker, and the closing round trip
through a stock client (confluent-kafka's Producer, then its Consumer).

The probe matters because a broker's one event loop also sends its heartbeats: a late
answer is a heartbeat at risk. The kernel's schedstat tells why it was late: a loop that
waited for a CPU was starved by the machine, one that ran was held by its own work.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.metadata.v1 import request as metadata_v1
from kio.schema.metadata.v12 import request as metadata_v12
from ports import free_base_port
from schema_fuzz import Pools

from minibroker.network.codec import ApiKey, decode_response, encode_request, response_schema

STARTUP_TIMEOUT_S = 60
PROBE_TIMEOUT_S = 10.0
_SIZE = struct.Struct(">i")


# -- the cluster ----------------------------------------------------------------------------

@dataclass
class Cluster:
    """``minibroker cluster``: a controller on ``base``, broker i on ``base + i``."""

    base: int
    brokers: int
    data: Path
    log: Path
    process: subprocess.Popen[bytes]

    def port(self, broker: int) -> int:
        return self.base + broker

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{self.port(i)}" for i in range(1, self.brokers + 1))

    def controller_state(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.base + 100}/v1/state",
                                    timeout=5) as response:
            return json.load(response)

    def fences(self) -> list[dict]:
        """The controller's broker_fenced events (its replication events file)."""
        path = self.data / "controller" / "replication-events.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return [event for line in lines if (event := json.loads(line)).get("type")
                == "broker_fenced"]

    def pids(self) -> dict[str, int]:
        """The controller's and each broker's process, by the data directory in its
        command line."""
        found: dict[str, int] = {}
        names = {str(self.data / "controller"): "controller",
                 **{str(self.data / f"broker-{i}"): f"broker-{i}"
                    for i in range(1, self.brokers + 1)}}
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"--data-dir" in argv:
                data_dir = argv[argv.index(b"--data-dir") + 1].decode()
                if data_dir in names:
                    found[names[data_dir]] = int(proc.name)
        return found


@contextlib.contextmanager
def running_cluster(workdir: Path, brokers: int, config: tuple[str, ...] = ()
                    ) -> Iterator[Cluster]:
    """A cluster in its own process group, each broker unfenced, stopped on exit."""
    base = free_base_port(brokers + 1)
    log = workdir / "cluster.log"
    overrides = [arg for pair in (f"offsets.topic.replication.factor={min(brokers, 3)}",
                                  "offsets.topic.num.partitions=3", *config)
                 for arg in ("--config", pair)]
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "minibroker", "cluster", "--brokers", str(brokers),
             "--base-port", str(base), "--data-dir", str(workdir / "data"), *overrides],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    cluster = Cluster(base, brokers, workdir / "data", log, process)
    try:
        _wait(lambda: process.poll() is not None or _all_unfenced(cluster),
              STARTUP_TIMEOUT_S, "every broker to be unfenced")
        if process.poll() is not None:
            raise RuntimeError(f"the cluster exited: {log.read_text()[-3000:]}")
        yield cluster
    finally:
        _stop_group(process)


def _all_unfenced(cluster: Cluster) -> bool:
    try:
        brokers = cluster.controller_state()["brokers"]
    except OSError:
        return False
    return len(brokers) == cluster.brokers and not any(b["fenced"] for b in brokers)


def _stop_group(process: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


# -- what the fuzzer may name ---------------------------------------------------------------

POOL_TOPICS = ("fuzz-0", "fuzz-1", "fuzz-2")


POOL_RECORDS = 100  # of POOL_RECORD_BYTES each, in every partition of the pool's topics
POOL_RECORD_BYTES = 1000


def prepare_pools(cluster: Cluster) -> Pools:
    """Create the pool's topics (3 partitions, every broker a replica), put 100 KB of
    records in each partition, and read the topics' ids. With records to read, a fetch that
    names a partition thousands of times shows what it costs (a broker once answered each
    copy: 200 KB became 1.8 GB)."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    futures = admin.create_topics([NewTopic(name, 3, cluster.brokers) for name in POOL_TOPICS],
                                  request_timeout=20)
    for future in futures.values():
        future.result(30)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all",
                         "linger.ms": 20})
    for name in POOL_TOPICS:
        for partition in range(3):
            for _ in range(POOL_RECORDS):
                producer.produce(name, b"r" * POOL_RECORD_BYTES, partition=partition)
    if producer.flush(60) != 0:
        raise RuntimeError("the pool's records were not all acknowledged")
    ids = _topic_ids(cluster, POOL_TOPICS)
    return Pools(topics=(*POOL_TOPICS, "__consumer_offsets"), topic_ids=tuple(ids.values()))


def _topic_ids(cluster: Cluster, names: tuple[str, ...]) -> dict[str, object]:
    request = metadata_v12.MetadataRequest(
        topics=tuple(metadata_v12.MetadataRequestTopic(topic_id=None, name=name)
                     for name in names),
        allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    with socket.create_connection(("127.0.0.1", cluster.port(1)), timeout=10) as sock:
        sock.sendall(encode_request(request, 1, "fuzz-setup"))
        frame = _read_frame(sock)
    _, response = decode_response(frame, response_schema(ApiKey.METADATA, 12))
    return {t.name: t.topic_id for t in response.topics if t.topic_id is not None}


def _read_frame(sock: socket.socket) -> bytes:
    (size,) = _SIZE.unpack(_read_exactly(sock, 4))
    return _read_exactly(sock, size)


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed by the broker")
        data += chunk
    return bytes(data)


# -- the watcher ----------------------------------------------------------------------------

_PROBE = encode_request(metadata_v1.MetadataRequest(topics=()), 1, "fuzz-probe")


def probe(port: int, timeout: float = PROBE_TIMEOUT_S) -> float:
    """Seconds from connecting to a Metadata answer, on a fresh connection."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(_PROBE)
        _read_frame(sock)
    return time.monotonic() - started


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def schedstat(pid: int) -> tuple[float, float]:
    """(seconds run, seconds waited for a CPU) of ``pid``'s main thread since it started:
    /proc/<pid>/schedstat, in nanoseconds. Zeros for a process that is gone."""
    try:
        ran, waited, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    except (OSError, ValueError):
        return 0.0, 0.0
    return int(ran) / 1e9, int(waited) / 1e9


@dataclass
class Watch:
    """What the watcher saw, once a second."""

    peak_rss_kib: dict[str, int] = field(default_factory=dict)
    last_rss_kib: dict[str, int] = field(default_factory=dict)
    worst_probe_s: dict[str, float] = field(default_factory=dict)
    # For each broker's worst probe, what its event loop's thread did meanwhile (the
    # kernel's schedstat): seconds waiting for a CPU (the machine's load) and seconds run
    # (the broker's own work, its other connections' requests among it).
    worst_probe_sched: dict[str, tuple[float, float]] = field(default_factory=dict)
    probe_failures: list[str] = field(default_factory=list)
    exited: dict[str, float] = field(default_factory=dict)  # process -> seconds into the run
    samples: int = 0
    # process -> (wall clock, seconds run, seconds waited for a CPU) at each sample
    sched: dict[str, list[tuple[float, float, float]]] = field(
        default_factory=lambda: defaultdict(list))

    def sched_between(self, name: str, start: float, end: float) -> tuple[float, float]:
        """(seconds waited for a CPU, seconds run) by ``name``'s event loop thread between
        the samples nearest before ``start`` and nearest after ``end``, wall clock."""
        samples = self.sched.get(name, [])
        first = max((s for s in samples if s[0] <= start), default=None)
        last = min((s for s in samples if s[0] >= end), default=None)
        if first is None or last is None:
            return 0.0, 0.0
        return last[2] - first[2], last[1] - first[1]


class Watcher:
    def __init__(self, cluster: Cluster, interval: float = 1.0) -> None:
        self.cluster = cluster
        self.pids = cluster.pids()
        self.watch = Watch()
        self._interval = interval
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="fuzz-watcher", daemon=True)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(60)
        self.sample()  # the last state, after the fuzzing

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample()

    def sample(self) -> None:
        w = self.watch
        w.samples += 1
        for name, pid in self.pids.items():
            rss = rss_kib(pid)
            if rss is None:
                w.exited.setdefault(name, time.monotonic() - self._started)
                continue
            w.last_rss_kib[name] = rss
            w.peak_rss_kib[name] = max(w.peak_rss_kib.get(name, 0), rss)
            w.sched[name].append((time.time(), *schedstat(pid)))
        for broker in range(1, self.cluster.brokers + 1):
            name = f"broker-{broker}"
            if name in w.exited:
                continue
            before = schedstat(self.pids.get(name, 0))
            try:
                took = probe(self.cluster.port(broker))
            except OSError as exc:
                w.probe_failures.append(f"{name} at {time.monotonic() - self._started:.0f} s: "
                                        f"{exc!r}")
                took = PROBE_TIMEOUT_S
            after = schedstat(self.pids.get(name, 0))
            if took > w.worst_probe_s.get(name, 0.0):
                w.worst_probe_s[name] = took
                w.worst_probe_sched[name] = (after[1] - before[1], after[0] - before[0])


# -- the round trip -------------------------------------------------------------------------

def round_trip(cluster: Cluster, records: int = 100, timeout: float = 60.0) -> str | None:
    """Produce ``records`` with acks=all to a new topic (every broker a replica) with a stock
    client and consume them back; None if every record came back in order, else what went
    wrong."""
    topic = f"roundtrip-{random.randrange(1 << 30)}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    deadline = time.monotonic() + timeout
    while True:
        (future,) = admin.create_topics([NewTopic(topic, 1, cluster.brokers)],
                                        request_timeout=10).values()
        try:
            future.result(15)
            break
        except KafkaException as exc:
            if time.monotonic() > deadline:
                return f"creating {topic}: {exc}"
            time.sleep(0.5)
    values = [f"after-fuzz-{i}".encode() for i in range(records)]
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all",
                         "linger.ms": 5, "message.timeout.ms": int(timeout * 1000)})
    errors: list[object] = []
    for value in values:
        producer.produce(topic, value, partition=0,
                         on_delivery=lambda err, _msg: errors.append(err))
    if producer.flush(timeout) != 0:
        return "the producer's records were not all acknowledged"
    if any(errors):
        return f"delivery errors: {[e for e in errors if e][:3]}"
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap,
                         "group.id": f"{topic}-reader", "enable.auto.commit": False})
    read: list[bytes] = []
    try:
        consumer.assign([CkTopicPartition(topic, 0, OFFSET_BEGINNING)])
        while len(read) < records and time.monotonic() < deadline:
            for message in consumer.consume(records, 0.5):
                if message.error() is not None:
                    return f"consumer error: {message.error()}"
                read.append(message.value())
    finally:
        consumer.close()
    return None if read == values else f"read {len(read)} of {records} records back"
