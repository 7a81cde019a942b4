"""The twins of Jepsen's 2024 transaction bug: txn-delayed-endtxn-tv1's schedule with its
producer on transaction version 2 (KIP-890 part 2, the simulator's model of the Java 4.x
client against minibroker's coordinator) is clean, and not because the late EndTxn never
came: it reached the coordinator while a later transaction was open, naming an epoch the
EndTxn before it had bumped, and was fenced. (The version 1 twin's anomalies are checked
with the library, tests/sim/test_sim_verdicts.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from library_sims import library_history, shared_root

from undertow.sim.world import run_simulated
from undertow.spec import load_experiment
from undertow_analysis import late_requests
from undertow_history.checker import check_history

EXPERIMENTS = Path(__file__).parents[2] / "experiments"
FENCED = re.compile(r"EndTxn \(commit\) of undertow-p0 with producer epoch (\d+) fenced: the "
                    r"id is at epoch (\d+), Ongoing \(transaction version 2\)")


def test_on_transaction_version_2_the_late_end_txn_is_fenced_and_nothing_is_read_twice(
        tmp_path: Path) -> None:
    loaded = load_experiment(EXPERIMENTS / "txn-delayed-endtxn-tv2.yaml")
    assert loaded.experiment.spec.workload.transactions is not None
    assert loaded.experiment.spec.workload.transactions.transaction_version == 2
    run_simulated(loaded, tmp_path, seed=1)
    summary = check_history(tmp_path / "history")
    assert summary.verdict == "clean", summary
    late = FENCED.findall((tmp_path / "cluster" / "nodes.log").read_text())
    assert late, "the delayed EndTxn never reached the coordinator: the twins differ in timing"
    assert all(int(named) < int(current) for named, current in late), late


def end_txn_events_and_txns(history: Path) -> tuple[list[dict], list[dict]]:
    events = [json.loads(line) for line in (history / "events.jsonl").open()]
    txns = [json.loads(line) for line in (history / "txns.jsonl").open()]
    return [e for e in events if e["type"] == "end_txn"], txns


@pytest.mark.parametrize(("twin", "reason", "rule"), [("tv1", "decided", "slowest_end"),
                                                       ("tv2", "fenced", "epoch")])
def test_the_late_end_txn_is_paired_with_its_sender_and_the_transaction_it_landed_in(
        tmp_path_factory: pytest.TempPathFactory, twin: str, reason: str, rule: str) -> None:
    """The analysis's pairing (`late_requests.pair`) of the coordinator's `end_txn` events
    with txns.jsonl finds one late EndTxn in each twin: under version 1 it decided the
    transaction it landed in, which the producer then aborted; under version 2 it was fenced.
    Its sender is the transaction whose commit was called while the fault delayed p0's link
    to the coordinator (faults.jsonl's inject and heal), each request before it answered."""
    history = library_history(shared_root(tmp_path_factory), f"txn-delayed-endtxn-{twin}")
    ends, txns = end_txn_events_and_txns(history)
    [late] = late_requests.pair(ends, txns, [])
    assert (late["reason"], late["sent_by_rule"], late["decision"]) == (reason, rule, "commit")
    sender, landed = late["sent_by"], late["landed_in"]
    faults = [json.loads(line) for line in (history / "faults.jsonl").open()]
    inject, heal = (next(f["t"] for f in faults if f["action"] == a) for a in ("inject", "heal"))
    assert inject <= sender["t_end_invoke"] <= heal, (sender, inject, heal)
    assert sender["status"] == "ok" and sender["t_complete"] <= landed["t_begin"] < late["t"]
    assert landed["t_end_invoke"] is None or landed["t_end_invoke"] > late["t"]
    if twin == "tv1":
        assert late["producer_epoch"] == late["txn_epoch"] and landed["status"] == "fail"
        assert late["txn_partitions"]
    else:
        assert late["producer_epoch"] < late["txn_epoch"] and late["txn_partitions"] is None
