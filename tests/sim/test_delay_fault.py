"""A `delay` fault in a simulated run: the leader's links slowed by 300 ms both ways for 4 s
make every acks=all produce answered in that window take at least the delay (its request
reaches the leader late, or the followers' fetches do), the faults.jsonl lines are the
usual inject/heal/recover, the run loses nothing, and sends after the heal are fast again.
A delay aimed at one producer (`{producer: 0}`) slows that producer's requests and answers
alone. The broker's own code decides all of it; the simulator only holds the packets."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from undertow.sim.world import run_simulated
from undertow.spec import load_experiment
from undertow_history.checker import check_history

SAFE = Path(__file__).parents[2] / "benchmarks" / "experiments" / "explore-safe.yaml"
LATENCY_S = 0.3


def delayed_run(tmp_path: Path, target: dict[str, int | str], producers: int = 1
                ) -> tuple[Path, float, float, list[dict]]:
    """A 10 s simulated run of explore-safe with one 300 ± 50 ms delay on `target` from 3 s
    to 7 s: its history, when the delay was injected and healed, and its sends."""
    cluster, experiment = yaml.safe_load_all(SAFE.read_text())
    spec = experiment["spec"]
    del spec["explore"]
    spec["workload"].update(duration="10s", producers=producers)
    spec.update(seed=3, faults=[{
        "kind": "delay", "target": target, "at": "3s", "duration": "4s",
        "delay": {"latency": f"{LATENCY_S * 1000:g}ms", "jitter": "50ms",
                  "correlation": 25}}])
    path = tmp_path / "delay.yaml"
    path.write_text(yaml.safe_dump_all([cluster, experiment]))
    run_simulated(load_experiment(path), tmp_path / "out")

    history = tmp_path / "out" / "history"
    faults = [json.loads(line) for line in (history / "faults.jsonl").read_text().splitlines()]
    assert [f["action"] for f in faults] == ["inject", "heal", "recover"]
    sends = [json.loads(line) for line in (history / "sends.jsonl").read_text().splitlines()]
    return history, faults[0]["t"], faults[1]["t"], sends


def test_a_delayed_leader_slows_every_acknowledgement_and_loses_nothing(tmp_path: Path) -> None:
    history, injected, healed, sends = delayed_run(tmp_path, {"role": "leader"})
    during = [s for s in sends if s["status"] == "ok"
              and injected + 0.5 < s["t_invoke"] and s["t_complete"] < healed]
    after = [s for s in sends if s["status"] == "ok" and s["t_invoke"] > healed + 1]
    assert len(during) >= 10 and len(after) > 100
    # 300 ms less at most 50 ms of jitter, on the way in or on the followers' fetch.
    assert min(s["t_complete"] - s["t_invoke"] for s in during) >= LATENCY_S - 0.05
    assert max(s["t_complete"] - s["t_invoke"] for s in after) < LATENCY_S - 0.05
    summary = check_history(history)
    assert summary.verdict == "clean", (summary.counts, summary.mechanisms)


def test_a_delayed_producer_alone_waits(tmp_path: Path) -> None:
    """p0's links to every broker slowed 300 ± 50 ms each way: each of its sends in the
    window takes a delayed request and a delayed answer, at least twice the delay less the
    jitter; p1's, through links of its own, stay as fast as before."""
    history, injected, healed, sends = delayed_run(tmp_path, {"producer": 0}, producers=2)
    faults = [json.loads(line) for line in (history / "faults.jsonl").read_text().splitlines()]
    assert faults[0]["target"] == "client-p0" and faults[0]["role"] == "producer p0"

    def window(producer: str) -> list[float]:
        return [s["t_complete"] - s["t_invoke"] for s in sends
                if s["producer"] == producer and s["status"] == "ok"
                and injected + 0.7 < s["t_invoke"] and s["t_complete"] < healed]

    slow, fast = window("p0"), window("p1")
    assert len(slow) >= 10 and len(fast) > 100
    assert min(slow) >= 2 * (LATENCY_S - 0.05), min(slow)
    assert max(fast) < LATENCY_S - 0.05, max(fast)
    assert check_history(history).verdict == "clean"
