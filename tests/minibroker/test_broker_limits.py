"""The issue's two reproductions against a real broker process (``minibroker cluster``: a
controller and one broker), watched through the broker's own state and the controller's.

- One request could fence a broker: a Metadata v1 request naming 300,000 empty topics
  (0.57 MiB on the wire) held the broker's event loop for seconds, its heartbeats with it,
  and the controller fenced it. Now the request is refused at its array count
  (``max.request.elements``) before anything is decoded, the loop (which serves requests
  and fetches) answers a probe throughout in well under half the session timeout, and the
  heartbeats (on the lifecycle thread since) are never half a session timeout apart.
- Half-sent frames were held forever: 20 connections each sending 5 MiB of a declared
  100 MiB frame took the broker from 41 to 141 MiB, and stayed. Now the memory pool
  (``queued.max.request.bytes``) keeps most of them unread, the read timeout
  (``socket.request.read.timeout.ms``) closes every one, and the memory goes back.

The in-process tests of each limit are in ``test_network_limits.py``.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fuzz_cluster import running_cluster
from kio.schema.api_versions.v0 import request as api_versions_v0
from kio.schema.metadata.v1 import request as metadata_v1
from waits import wait_for

from minibroker.network.codec import encode_request

SESSION_TIMEOUT_MS = 3000  # minibroker's default broker.session.timeout.ms
READ_TIMEOUT_MS = 2000
STARTUP_TIMEOUT_S = 30
MIB = 1 << 20


@dataclass
class Cluster:
    base: int
    data: Path
    log: Path
    process: subprocess.Popen[bytes]

    @property
    def kafka_port(self) -> int:
        return self.base + 1

    def controller_state(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.base + 100}/v1/state",
                                    timeout=5) as response:
            return json.load(response)

    def broker_registration(self) -> dict:
        (broker,) = self.controller_state()["brokers"]
        return broker

    def fences(self) -> list[dict]:
        """The controller's broker_fenced events (its replication events file)."""
        lines = (self.data / "controller" / "replication-events.jsonl").read_text().splitlines()
        return [event for line in lines if (event := json.loads(line)).get("type")
                == "broker_fenced"]

    def broker_pid(self) -> int:
        """The broker's process: the one started with its data directory."""
        data_dir = str(self.data / "broker-1").encode()
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and data_dir in (proc / "cmdline").read_bytes():
                    return int(proc.name)
            except OSError:
                continue  # gone meanwhile
        raise AssertionError("no broker process")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("limits"), 1, (
            f"broker.session.timeout.ms={SESSION_TIMEOUT_MS}",
            f"socket.request.read.timeout.ms={READ_TIMEOUT_MS}")) as running:
        yield Cluster(running.base, running.data, running.log, running.process)


class LoopProbe:
    """ApiVersions on one connection every 20 ms, timing each answer: the broker's event
    loop serves it, as it serves every request and its followers' fetches, so an answer
    late by X means all of those waited up to X."""

    def __init__(self, port: int) -> None:
        self.samples: list[tuple[float, float]] = []  # (sent at, seconds to the answer)
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        request = encode_request(api_versions_v0.ApiVersionsRequest(), 1, "probe")
        while not self._stop.is_set():
            sent = time.monotonic()
            self._sock.sendall(request)
            size = struct.unpack(">i", _read_exactly(self._sock, 4))[0]
            _read_exactly(self._sock, size)
            self.samples.append((sent, time.monotonic() - sent))
            self._stop.wait(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self._sock.close()

    def worst_since(self, since: float) -> float:
        return max(took for sent, took in self.samples if sent >= since)


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed by the broker")
        data += chunk
    return data


def answer_or_close(sock: socket.socket, timeout: float) -> bytes | None:
    """The broker's answer on ``sock``, or None when it closes the connection instead."""
    sock.settimeout(timeout)
    try:
        size = struct.unpack(">i", _read_exactly(sock, 4))[0]
        return _read_exactly(sock, size)
    except TimeoutError:
        raise
    except OSError:  # closed (ConnectionError), or reset with our bytes unread
        return None


def closed_by_broker(sock: socket.socket, timeout: float) -> bool:
    """Whether the broker closes ``sock`` within ``timeout`` (sent bytes are not read)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except (ConnectionResetError, BrokenPipeError):
        pass
    except TimeoutError:
        return False
    return True


@pytest.mark.slow
def test_a_300000_name_metadata_neither_fences_the_broker_nor_delays_its_heartbeats(
        cluster: Cluster) -> None:
    registered = cluster.broker_registration()
    fences = len(cluster.fences())
    probe = LoopProbe(cluster.kafka_port)
    try:
        wait_for(lambda: len(probe.samples) >= 5, 10, "the probe's first answers")
        frame = encode_request(metadata_v1.MetadataRequest(topics=tuple(
            metadata_v1.MetadataRequestTopic(name="") for _ in range(300_000))), 7, "big")
        assert len(frame) > 0.57 * MIB
        # Three at once: unbounded, their work held the loop past the session timeout on
        # any machine (one alone took 1.2 to 4.6 s).
        sent = time.monotonic()
        senders = [socket.create_connection(("127.0.0.1", cluster.kafka_port))
                   for _ in range(3)]
        for sender in senders:
            sender.sendall(frame)
        refused = [answer_or_close(sender, 30) is None for sender in senders]
        for sender in senders:
            sender.close()
        # A whole session timeout later, a fence would have happened.
        wait_for(lambda: probe.samples[-1][0] > sent + SESSION_TIMEOUT_MS / 1000, 30,
                 "a session timeout of probing")
        worst = probe.worst_since(sent)
    finally:
        probe.stop()
    assert worst < SESSION_TIMEOUT_MS / 1000 / 2, f"the event loop stalled {worst:.2f} s"
    assert refused == [True] * 3
    assert cluster.fences()[fences:] == []
    now = cluster.broker_registration()
    assert (now["broker_epoch"], now["fenced"]) == (registered["broker_epoch"], False)
    assert now["max_heartbeat_gap_ms"] < SESSION_TIMEOUT_MS / 2, now
    assert cluster.log.read_text().count("METADATA v1 request over max.request.elements") == 3


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


@pytest.mark.slow
def test_twenty_half_sent_100_mib_frames_are_closed_at_the_read_timeout_and_memory_returns(
        cluster: Cluster) -> None:
    pid = cluster.broker_pid()
    before = rss_mib(pid)
    peak = [before]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            peak.append(rss_mib(pid))
            sampling.wait(0.02)

    def send_half(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):  # closed by the broker before all was read
            sock.sendall(struct.pack(">i", 100 * MIB) + bytes(5 * MIB))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.monotonic()
    socks = [socket.create_connection(("127.0.0.1", cluster.kafka_port)) for _ in range(20)]
    senders = [threading.Thread(target=send_half, args=(s,), daemon=True) for s in socks]
    for sender in senders:
        sender.start()
    try:
        for sock in socks:
            assert closed_by_broker(sock, READ_TIMEOUT_MS / 1000 + 15)
        closed_after = time.monotonic() - started
    finally:
        for sock in socks:
            sock.close()
        for sender in senders:
            sender.join(10)
    # Back within 10 MiB of before, once the closed connections' memory is trimmed.
    wait_for(lambda: rss_mib(pid) <= before + 10, 10, "the broker's memory to come back")
    sampling.set()
    sampler.join(10)
    assert closed_after < READ_TIMEOUT_MS / 1000 + 5, closed_after
    # Never near the 100 MiB sent: most frames wait for memory, unread.
    assert max(peak) < before + 50, (before, max(peak))
    # Each closed by the read timeout: some with what they had sent in, the rest while
    # still waiting for memory.
    assert cluster.log.read_text().count(f"{READ_TIMEOUT_MS} ms after its first byte "
                                         "(socket.request.read.timeout.ms)") == 20
