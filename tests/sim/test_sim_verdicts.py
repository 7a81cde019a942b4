"""Every experiment of the library gives, in simulation, the verdict it expects (and gives on
local processes: benchmarks/RESULTS.md's reliability rows), by the mechanism its comment
names, as the pods tests hold the same for Kubernetes.

The history is checked with the Spark-free checker (``undertow_history.checker``), which
gives the Spark analysis's verdict and counts (``tests/analysis/test_checker.py``). The
simulations run two at a time, one per core, before the tests look at them."""

from __future__ import annotations

import functools
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
from library_sims import library_history, shared_root

from undertow.spec import load_experiment
from undertow_history.checker import Summary, check_history

# Run first (tests/conftest.py). The library's simulations, in the first test's setup, took
# 326 s on two cores shared with two busy processes and two other test workers: past the
# suite's 300 s per test.
pytestmark = [pytest.mark.long, pytest.mark.timeout(900)]

LIBRARY = Path(__file__).parents[2] / "experiments"
EXPERIMENTS = sorted(LIBRARY.glob("*.yaml"))
"""Every experiment of the library (producer-pause-txn too: a producer's pause holds its
client model's host, a node of the virtual loop)."""
MECHANISMS = {
    "acks1-leader-kill": "acks1_before_replication",
    "last-replica-standing-no-elr": "power_loss",
    "pod-delete-ephemeral": "disk_lost",
    "pod-delete-ephemeral-elr": "disk_lost",
    "power-loss-no-fsync": "power_loss",
    "txn-state-rf1-power-loss": "hanging_transaction",
    "unclean-election": "unclean_election",
}
"""The mechanism each lossy experiment's comment names, where records (not offsets) are lost."""
ANOMALIES = {
    "txn-delayed-endtxn-tv1": "aborted_reads",
}
"""The anomaly each experiment that expects anomalies (and no loss) shows, by its count."""


def _simulate(root: Path, path: Path) -> Summary:
    return check_history(library_history(root, path.stem))


@pytest.fixture(scope="module")
def summaries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Summary]:
    """Each experiment's checked history, simulated at seed 1 (`library_sims`: the other
    tests that read one of them take it from here, or make it for this fixture)."""
    simulate = functools.partial(_simulate, shared_root(tmp_path_factory))
    with ProcessPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        return dict(zip([p.stem for p in EXPERIMENTS], pool.map(simulate, EXPERIMENTS),
                        strict=True))


@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
def test_the_simulation_gives_the_expected_verdict(
        path: Path, summaries: dict[str, Summary]) -> None:
    summary = summaries[path.stem]
    assert summary.verdict == load_experiment(path).experiment.spec.expect, summary
    if path.stem in MECHANISMS:
        assert max(summary.mechanisms, key=summary.mechanisms.__getitem__) == \
            MECHANISMS[path.stem], summary.mechanisms
    if path.stem in ANOMALIES:
        assert summary.counts[ANOMALIES[path.stem]] > 0, summary.counts
