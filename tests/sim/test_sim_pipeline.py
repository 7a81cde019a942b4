"""The consume-transform-produce pipeline in simulation (`sim/pipeline.py`): members killed
mid-transaction in turn fall silent at once and leave their transaction `fail` with
MEMBER_DIED; their replacements fence them, read again from the committed offsets, and the
output holds exactly one committed record per input record below the committed offsets."""

from __future__ import annotations

import json
from pathlib import Path

from small_experiment import small_experiment

from undertow.sim.world import run_simulated
from undertow.spec import load_experiment
from undertow_history import schema
from undertow_history.checker import check_history


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_killed_members_fall_silent_and_their_replacements_leave_no_duplicate(
        tmp_path: Path) -> None:
    experiment = tmp_path / "pipe.yaml"
    experiment.write_text(small_experiment("pipe", "10s", "    []", workload={
        "consumers": 2, "retries": 3,
        "consumer": "{mode: subscribe, commitInterval: 300ms, sessionTimeout: 2s}",
        "transactions": "{recordsPerTransaction: 5, abortRatio: 0.2}",
        "pipeline": "{killEvery: 2500ms}"}))
    run_simulated(load_experiment(experiment), tmp_path / "out", seed=5)
    history = tmp_path / "out" / "history"
    written = {f: lines(history / f.filename) for f in schema.FILES if f.json_lines}
    for file, records in written.items():
        assert [p for r in records for p in file.problems(r)] == [], file.filename

    kills = {}
    for fault in written[schema.FAULTS]:
        kills.setdefault(fault["action"], []).append(fault)
    assert len(kills["inject"]) >= 3 and len(kills["recover"]) >= len(kills["inject"]) - 1
    killed_at = {f["role"].split()[2].rstrip(","): f["t"] for f in kills["inject"]}
    member_txns = [t for t in written[schema.TXNS] if t["producer"].startswith("c")]
    died = [t for t in member_txns if t["error"] == "MEMBER_DIED"]
    assert died and {t["producer"] for t in died} <= set(killed_at)
    # A killed process is silent: nothing of it happens after its kill (no read, no group
    # action, no transaction ended) but what its death left.
    assert all(t["t_complete"] <= killed_at[t["producer"]] for t in member_txns
               if t["producer"] in killed_at and t["error"] != "MEMBER_DIED")
    assert not [r for r in written[schema.READS]
                if r["consumer"] in killed_at and r["t"] > killed_at[r["consumer"]]]
    assert not [g for g in written[schema.GROUPS]
                if g["member"] in killed_at and g["t"] > killed_at[g["member"]]]
    summary = check_history(history)
    assert (summary.verdict, {k: n for k, n in summary.counts.items() if n}) == ("clean", {})
    outputs = [r["value"] for r in written[schema.READS]
               if r["phase"] == "drain" and r["topic"] == "t-out"]
    assert outputs and not {v for t in died for v in t["values"]} & set(outputs)
    commits = [g for g in written[schema.GROUPS] if g["type"] == "commit"]
    assert commits and {g["status"] for g in commits} == {"ok"}
