"""A graceful stop (SIGTERM) of a leader is a controlled shutdown, as in Kafka 4.2: the broker
heartbeats with wantShutDown, the controller moves its leaderships and takes it out of every
ISR (ReplicationControlManager.handleBrokerInControlledShutdown), and only then answers
shouldShutDown and the broker stops. So the partition is never without a leader for longer
than one metadata propagation, where a stop without it (a crash, as far as the controller can
tell) leaves it leaderless until the session timeout.

Leadership is read from the brokers' own metadata (each broker's ``/v1/state``: the role it
plays for the partition), polled through the stop; the controller's view is not what clients
reach."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_broker_processes import ProcessCluster, partition_state, wait_for

SESSION_TIMEOUT_MS = 3000
ONE_PROPAGATION_S = 1.0
"""The longest a partition may be without a leader during a controlled shutdown: the old
and the new leader apply the same metadata change (a long poll answered at once), tens of
milliseconds apart; the rest is margin for a machine shared with other work."""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ProcessCluster]:
    c = ProcessCluster(tmp_path, {"min.insync.replicas": "2", "replica.lag.time.max.ms": "6000",
                                  "broker.session.timeout.ms": str(SESSION_TIMEOUT_MS)})
    try:
        yield c
    finally:
        c.stop()


class LeaderWatch:
    """Polls every broker's own view of the partition (every ~20 ms, on a thread) and keeps,
    for each look, whether some broker said it leads it."""

    def __init__(self, cluster: ProcessCluster) -> None:
        self._cluster = cluster
        self.looks: list[tuple[float, set[int]]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _leaders(self) -> set[int]:
        leaders = set()
        for broker_id in self._cluster.ports:
            try:
                state = self._cluster.broker_state(broker_id)
            except OSError:  # stopped, or stopping: it leads nothing a client can reach
                continue
            if any(p["role"] == "leader" for p in state["partitions"] if p["topic"] == "orders"):
                leaders.add(broker_id)
        return leaders

    def _run(self) -> None:
        while not self._done.is_set():
            self.looks.append((time.monotonic(), self._leaders()))
            self._done.wait(0.02)

    def stop(self) -> None:
        self._done.set()
        self._thread.join(10)

    def longest_leaderless_s(self) -> float:
        """From the last look with a leader before a look without one, to the next look
        with a leader again: the longest such window."""
        longest, last_led = 0.0, None
        for t, leaders in self.looks:
            if leaders:
                if last_led is not None:
                    longest = max(longest, t - last_led)
                last_led = t
        return longest


def test_a_graceful_stop_of_the_leader_leaves_no_window_without_a_leader(
        cluster: ProcessCluster) -> None:
    cluster.create_topic()
    leader = cluster.partition()["leader"]
    wait_for(lambda: partition_state(cluster.broker_state(leader))["role"] == "leader", 20,
             "the leader to lead in its own metadata")
    watch = LeaderWatch(cluster)
    try:
        wait_for(lambda: len(watch.looks) >= 5, 10, "the watch to start")
        terminated = time.monotonic()
        proc = cluster.procs[f"broker-{leader}"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        stopped = time.monotonic()
        wait_for(lambda: watch.looks[-1][0] > stopped + 0.5, 10, "looks after the stop")
    finally:
        watch.stop()
    during = [leaders for t, leaders in watch.looks if t >= terminated]
    moved = [leaders for leaders in during if leaders and leader not in leaders]
    assert moved, f"no other broker led after the stop: {during}"
    # The new leader led before the old one's process was gone, and the gap between the
    # two in the brokers' own metadata is one propagation, not a session timeout.
    assert any(leaders and leader not in leaders for t, leaders in watch.looks
               if t <= stopped), "the leadership moved only after the broker stopped"
    assert watch.longest_leaderless_s() < ONE_PROPAGATION_S, watch.longest_leaderless_s()
    after = cluster.partition()
    assert after["leader"] not in (leader, -1) and leader not in after["isr"]
    # Out of the ISR since before its stop: its controlled shutdown, not its session.
    assert "its controlled shutdown was granted" in (cluster.root / "controller.log").read_text()
