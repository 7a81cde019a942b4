"""`run_experiment`, the runner of every platform, on `SimulatedPlatform`: minibroker's own
servers (Kafka listener and API handlers, fetcher and fetch sessions, controller) in virtual
time, the workload's client models speaking the Kafka protocol to them
(`sim/simulated_world.py`).

Leader kills under acks=1 with followers that batch their fetches lose the acknowledged
tail, each record explained by acks=1 before replication; the same schedule under acks=all
loses nothing; the same seed gives the same history, byte for byte. The produce handler's
acks=all wait is what keeps the second clean: answered as acks=1 there (tried by hand), the
acks=all run loses records."""

from __future__ import annotations

from pathlib import Path

import pytest
from small_experiment import small_experiment

from undertow.platform.simulated import SimulatedPlatform
from undertow.runner.run import run_experiment
from undertow.spec import load_experiment
from undertow_history.checker import check_history

pytestmark = pytest.mark.long  # run first (tests/conftest.py)

KILLS = """\
    - kind: kill
      target: {role: leader}
      at: 2s
      duration: 4s
    - kind: kill
      target: {role: leader}
      at: 9s
      duration: 4s"""
CONFIG = {"min.insync.replicas": 1, "replica.lag.time.max.ms": 6000,
          "broker.session.timeout.ms": 3000, "replica.fetch.min.bytes": 1048576,
          "replica.fetch.wait.max.ms": 500}
"""acks1-leader-kill's cluster: each follower fetch waits 500 ms at the leader."""


def run(tmp_path: Path, name: str, acks: str, expect: str, seed: int = 1) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"{name}.yaml"
    path.write_text(small_experiment(
        name, "15s", KILLS, config=CONFIG, partitions=1, expect=expect,
        workload={"producers": 2, "rate": 250, "acks": acks, "retries": 3}))
    loaded = load_experiment(path)
    cluster = loaded.cluster.spec
    out = tmp_path / name
    platform = SimulatedPlatform(out / "cluster", cluster.brokers,
                                 cluster.config.as_overrides(), ephemeral_storage=False,
                                 seed=seed)
    run_experiment(loaded, platform, out, seed=seed)
    return out / "history"


def test_acks1_leader_kills_lose_the_tail_only_the_leader_had(tmp_path: Path) -> None:
    history = run(tmp_path / "a", "acks1", "1", "loss")
    summary = check_history(history)
    assert summary.verdict == "loss", summary
    assert summary.counts["lost"] > 0 and summary.failed == 0
    assert summary.mechanisms == {"acks1_before_replication": summary.counts["lost"]}
    # The events came from the brokers' own events logs: both elections, the truncations.
    events = (history / "events.jsonl").read_text()
    assert events.count('"leader_election"') >= 2 and '"truncation"' in events
    again = run(tmp_path / "b", "acks1", "1", "loss")
    for name in ("sends.jsonl", "reads.jsonl", "events.jsonl", "cluster.jsonl",
                 "faults.jsonl"):
        assert (history / name).read_bytes() == (again / name).read_bytes(), name


def test_acks_all_under_the_same_kills_loses_nothing(tmp_path: Path) -> None:
    summary = check_history(run(tmp_path, "acksall", "all", "clean"))
    assert summary.verdict == "clean", summary
    assert summary.acked > 3000
