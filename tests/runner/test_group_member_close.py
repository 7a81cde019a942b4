"""A group member's stop is bounded even when its coordinator never answers.

librdkafka's close commits and sends LeaveGroup through the group's coordinator, and
retries FindCoordinator for as long as none answers (librdkafka#3740): a run whose
`__consumer_offsets` partition stayed offline after its faults sat in its healing phase for
minutes. Here a stock confluent-kafka member, behind links of its own, is cut off from every
broker: `GroupMember.stop` gives up at its bound and says so, and the member closes once its
links heal. Real minibroker processes and proxies; waits on the member's own history.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from planned_faults import planned
from processes import needs_local_minibroker
from seeded_topic import seed_topic

from undertow.faults import Nodes, build_fault
from undertow.platform.base import client_endpoint, wait_for
from undertow.platform.local import LocalPlatform, LocalPlatformConfig
from undertow.runner.group_member import GroupMember, GroupSettings
from undertow.runner.history import HistoryWriter

pytestmark = needs_local_minibroker()

TOPIC = "closing"
FAST = {"replica.lag.time.max.ms": "1000", "broker.session.timeout.ms": "1500",
        "broker.heartbeat.interval.ms": "200", "group.initial.rebalance.delay.ms": "0",
        "offsets.topic.replication.factor": "2", "offsets.topic.num.partitions": "1"}
BOUND_S = 3.0


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[LocalPlatform]:
    config = LocalPlatformConfig(workdir=tmp_path / "cluster", brokers=2, broker_config=FAST,
                                 controller_config=FAST, clients=("c0",))
    with LocalPlatform(config) as cluster:
        seed_topic(cluster, TOPIC)
        yield cluster


def history_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_member_cut_off_from_its_coordinator_stops_within_the_bound(
        platform: LocalPlatform, tmp_path: Path) -> None:
    history = HistoryWriter(tmp_path / "history")
    # Manual commits, none due before the stop: the one it makes as it stops is the first.
    settings = GroupSettings(group_id="closing", commit="manual", commit_interval_ms=600_000,
                             isolation_level="read_committed", static_membership=False,
                             session_timeout_ms=6000)
    member = GroupMember("c0", platform.bootstrap_for("c0"), TOPIC, settings, history)
    member.start()
    try:
        wait_for(lambda: sum(1 for r in history_lines(tmp_path / "history" / "reads.jsonl")
                             if r["consumer"] == "c0") == 20, 30,
                 "c0 to be assigned both partitions and read all 20 records")
        fault = build_fault(planned({"kind": "partition", "target": {"consumer": 0}}),
                            platform, Nodes(client_endpoint("c0")), time_limit_s=60)
        fault.inject()
        try:
            started = time.monotonic()
            assert member.stop(BOUND_S) is False  # its commit and LeaveGroup: no answer
            waited = time.monotonic() - started
            assert BOUND_S <= waited < BOUND_S + 1.0
            assert member.stop(BOUND_S) is False  # a later call does not wait again
            assert time.monotonic() - started < waited + 0.5
        finally:
            fault.recover()
        wait_for(lambda: member.stop(0), 60, "c0 to commit and leave once its links healed")
    finally:
        member.stop(0)
        history.close()
    # The commit it made as it stopped is in its history, with the outcome it finally got.
    commits = [g for g in history_lines(tmp_path / "history" / "groups.jsonl")
               if g["type"] == "commit"]
    assert sorted((g["partition"], g["offset"]) for g in commits) == [(0, 10), (1, 10)], commits
