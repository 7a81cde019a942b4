"""minibroker's configuration defaults: scaled-down Kafka timings in Kafka's order."""

from __future__ import annotations

from minibroker.config import resolve


def test_default_timings_keep_kafkas_order() -> None:
    """Kafka fences a silent broker (broker.session.timeout.ms, 9 s) well before a leader
    drops a lagging follower (replica.lag.time.max.ms, 30 s), and checks preferred leaders
    far less often still (300 s). With the opposite order a leader shrinks the ISR around a
    dead broker before the controller has fenced it, and preferred-leader elections undo
    failovers during a run."""
    heartbeat = resolve("broker.heartbeat.interval.ms", {})
    session = resolve("broker.session.timeout.ms", {})
    lag = resolve("replica.lag.time.max.ms", {})
    imbalance = resolve("leader.imbalance.check.interval.ms", {})
    assert heartbeat * 4 <= session < lag < imbalance
    assert lag >= 3 * session  # Kafka's ratio, 30 s over 9 s
    assert imbalance >= 60_000  # longer than the experiments' runs
