"""The twins of Jepsen's 2024 transaction bug: txn-delayed-endtxn-tv1's schedule with its
producer on transaction version 2 (KIP-890 part 2, the simulator's model of the Java 4.x
client against minibroker's coordinator) is clean, and not because the late EndTxn never
came: it reached the coordinator while a later transaction was open, naming an epoch the
EndTxn before it had bumped, and was fenced. (The version 1 twin's anomalies are checked
with the library, tests/sim/test_sim_verdicts.py.)"""

from __future__ import annotations

import re
from pathlib import Path

from undertow.sim.world import run_simulated
from undertow.spec import load_experiment
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
