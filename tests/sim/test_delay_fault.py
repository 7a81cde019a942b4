"""A `delay` fault in a simulated run: the leader's links slowed by 300 ms both ways for 4 s
make every acks=all produce answered in that window take at least the delay (its request
reaches the leader late, or the followers' fetches do), the faults.jsonl lines are the
usual inject/heal/recover, the run loses nothing, and sends after the heal are fast again.
The broker's own code decides all of it; the simulator only holds the packets."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from undertow.sim.world import run_simulated
from undertow.spec import load_experiment
from undertow_history.checker import check_history

SAFE = Path(__file__).parents[2] / "benchmarks" / "experiments" / "explore-safe.yaml"
LATENCY_S = 0.3


def test_a_delayed_leader_slows_every_acknowledgement_and_loses_nothing(tmp_path: Path) -> None:
    cluster, experiment = yaml.safe_load_all(SAFE.read_text())
    spec = experiment["spec"]
    del spec["explore"]
    spec["workload"]["duration"] = "10s"
    spec.update(seed=3, faults=[{
        "kind": "delay", "target": {"role": "leader"}, "at": "3s", "duration": "4s",
        "delay": {"latency": f"{LATENCY_S * 1000:g}ms", "jitter": "50ms",
                  "correlation": 25}}])
    path = tmp_path / "delay.yaml"
    path.write_text(yaml.safe_dump_all([cluster, experiment]))
    run_simulated(load_experiment(path), tmp_path / "out")

    history = tmp_path / "out" / "history"
    faults = [json.loads(line) for line in (history / "faults.jsonl").read_text().splitlines()]
    assert [f["action"] for f in faults] == ["inject", "heal", "recover"]
    injected, healed = faults[0]["t"], faults[1]["t"]
    sends = [json.loads(line) for line in (history / "sends.jsonl").read_text().splitlines()]
    during = [s for s in sends if s["status"] == "ok"
              and injected + 0.5 < s["t_invoke"] and s["t_complete"] < healed]
    after = [s for s in sends if s["status"] == "ok" and s["t_invoke"] > healed + 1]
    assert len(during) >= 10 and len(after) > 100
    # 300 ms less at most 50 ms of jitter, on the way in or on the followers' fetch.
    assert min(s["t_complete"] - s["t_invoke"] for s in during) >= LATENCY_S - 0.05
    assert max(s["t_complete"] - s["t_invoke"] for s in after) < LATENCY_S - 0.05
    summary = check_history(history)
    assert summary.verdict == "clean", (summary.counts, summary.mechanisms)
