"""Faults that overlap on one node, in simulation: a role names only the nodes that can take
the fault now (Chaos Mesh selects running pods), and a due fault whose role has none waits
for one, up to the nemesis's TARGET_WAIT_S, before it is skipped with the reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from undertow.runner.nemesis import TARGET_WAIT_S
from undertow.sim.world import run_simulated
from undertow.spec import load_experiment

SAFE = Path(__file__).parents[2] / "benchmarks" / "experiments" / "explore-safe.yaml"


def run(tmp_path: Path, faults: list[dict[str, Any]], duration: str = "12s"
        ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """explore-safe with ``faults`` in place of its fault space: faults.jsonl, meta.json."""
    cluster, experiment = yaml.safe_load_all(SAFE.read_text())
    spec = experiment["spec"]
    del spec["explore"]
    spec.update(faults=faults, seed=7)
    spec["workload"]["duration"] = duration
    path = tmp_path / "overlap.yaml"
    path.write_text(yaml.safe_dump_all([cluster, experiment]))
    run_simulated(load_experiment(path), tmp_path / "out")
    history = tmp_path / "out" / "history"
    lines = [json.loads(line) for line in (history / "faults.jsonl").read_text().splitlines()]
    return lines, json.loads((history / "meta.json").read_text())


def test_a_fault_on_the_leader_another_fault_killed_hits_the_next_leader(tmp_path: Path) -> None:
    """The killed leader stays the leader in the metadata until the controller fences it
    (broker.session.timeout.ms, 3 s here): the pod deletion due 1 s after the kill waits for
    the next leader instead of failing on a process that is not running."""
    lines, meta = run(tmp_path, [
        {"kind": "kill", "target": {"role": "leader"}, "at": "2s", "duration": "6s"},
        {"kind": "pod-delete", "target": {"role": "leader"}, "at": "3s", "duration": "1s"},
    ])
    assert meta["faults_skipped"] == []
    kill, delete = (next(line for line in lines if line["fault"] == kind
                         and line["action"] == "inject") for kind in ("kill", "pod-delete"))
    assert delete["target"] != kill["target"]
    # Not before the fencing: the session timeout from the killed leader's last heartbeat.
    assert delete["t"] - kill["t"] > 2.0


def test_a_fault_whose_node_stays_unable_is_skipped_after_the_wait(tmp_path: Path) -> None:
    """A second pause of a paused broker cannot be injected (its recovery would end the
    first one's): it waits TARGET_WAIT_S and is skipped, naming the node and why."""
    lines, meta = run(tmp_path, [
        {"kind": "pause", "target": {"broker": 1}, "at": "1s", "duration": "25s"},
        {"kind": "pause", "target": {"broker": 1}, "at": "2s", "duration": "1s"},
    ], duration=f"{TARGET_WAIT_S + 5:g}s")
    assert [(s["index"], s["reason"]) for s in meta["faults_skipped"]] == [
        (1, f"TargetError: no broker 1 can take it right now: broker-1 is paused "
            f"(waited {TARGET_WAIT_S:g} s)")]
    assert [line["action"] for line in lines if line["fault"] == "pause"] == [
        "inject", "heal", "recover"]
