"""`undertow explore` end to end on a small lossy experiment, in Spark tasks: every schedule
runs and is checked, the same seeds give the same outcomes, a loss is shrunk to a minimal
experiment file that loads and replays the loss, and the summary adds up; then one small cell
of `--matrix`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from explore_experiments import TINY_ACKS1, TINY_CLUSTER

from undertow.cli import _explore_summary
from undertow.explore.command import Exploration, _sentences, explore
from undertow.explore.draw import draw, experiment_with
from undertow.explore.matrix import (
    TRANSACTIONAL,
    Configuration,
    cell_of,
    markdown_table,
    run_matrix,
    wilson,
)
from undertow.explore.report import write_report
from undertow.explore.runs import Outcome, simulate
from undertow.explore.space import FaultSpace
from undertow.explore.spark import explore_session
from undertow.sim.world import run_simulated
from undertow.spec import load_experiment
from undertow_history.checker import check_history

pytestmark = pytest.mark.long  # run first (tests/conftest.py)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("explore") / "tiny.yaml"
    path.write_text(yaml.safe_dump_all([TINY_CLUSTER, TINY_ACKS1], sort_keys=False))
    return path


def test_explore_finds_shrinks_and_reports_the_loss(tiny: Path, tmp_path: Path) -> None:
    loaded = load_experiment(tiny)
    explore_session("local[2]")
    found = explore(loaded, tmp_path / "a", runs=3, budget=3)
    assert [o.seed for o in found.outcomes] == [1, 2, 3]
    assert all(o.error is None for o in found.outcomes), found.outcomes
    lossy = [o for o in found.outcomes if o.verdict == "loss"]
    assert lossy and all(o.mechanism == "acks1_before_replication" for o in lossy)
    lines = (tmp_path / "a" / "outcomes.jsonl").read_text().splitlines()
    assert [json.loads(line)["seed"] for line in lines] == [1, 2, 3]
    # A task's outcome is the simulation's: the same seed, run here, gives the same counts.
    first = found.outcomes[0]
    again = simulate(experiment_with(loaded, draw(FaultSpace.of(loaded), 1)), 1,
                     json.loads(first.schedule))
    assert (again.schedule, again.verdict, again.counts) == \
        (first.schedule, first.verdict, first.counts)

    [minimal] = found.minimal
    assert minimal.mechanism == "acks1_before_replication"
    assert minimal.faults <= minimal.found_faults and minimal.sentences and minimal.robust
    replay = load_experiment(minimal.path)
    assert replay.experiment.spec.expect == "loss"
    run_simulated(replay, tmp_path / "replay")
    assert check_history(tmp_path / "replay" / "history").mechanisms.keys() == \
        {"acks1_before_replication"}

    summary = found.to_json()
    assert sum(summary["verdicts"].values()) == summary["runs"] == 3
    assert sum(summary["losses_by_mechanism"].values()) == len(lossy)
    _, html = write_report(summary, tmp_path / "a")
    assert "acks1_before_replication" in html.read_text()


def test_a_matrix_cell_counts_its_schedules(tiny: Path) -> None:
    loaded = load_experiment(tiny)
    safe = Configuration(acks="all", min_insync_replicas=2, replication_factor=3, unclean=False,
                         fsync=False, rules="current")
    risky = Configuration(acks=1, min_insync_replicas=1, replication_factor=2, unclean=False,
                          fsync=False, rules="current")
    cells = run_matrix(explore_session("local[2]"), loaded, 2, [safe, risky],
                       {"crash": ("kill",)})
    assert [(c.configuration, c.runs, c.errors) for c in cells] == [(safe, 2, 0), (risky, 2, 0)]
    assert cells[0].losses == 0 and cells[1].losses == 2
    assert cells[1].mechanism == "acks1_before_replication"
    table = markdown_table(cells)
    assert "100% [" in table and "| acks=all RF=3 minISR=2" in table
    assert "| acks=1 RF=2 minISR=1" in table


def test_the_matrix_has_a_transactional_row(tiny: Path) -> None:
    """The transactional configuration's schedules run transactional producers, whose
    records crashes do not lose."""
    loaded = load_experiment(tiny)
    trial = TRANSACTIONAL.apply(loaded)
    assert trial.experiment.spec.workload.transactions is not None
    assert trial.cluster.spec.config.transaction_state_log_replication_factor == 3
    [cell] = run_matrix(explore_session("local[2]"), loaded, 2, [TRANSACTIONAL],
                        {"crash": ("kill",)})
    assert (cell.runs, cell.errors, cell.losses) == (2, 0, 0)
    assert "acks=all RF=3 minISR=2 unclean=off fsync=never rules=current transactions" in \
        markdown_table([cell])


def test_the_wilson_interval_is_sound_at_the_edges() -> None:
    assert wilson(0, 20)[0] == 0.0 and 0.1 < wilson(0, 20)[1] < 0.2
    assert wilson(20, 20)[1] == 1.0 and 0.8 < wilson(20, 20)[0] < 0.9
    low, high = wilson(5, 10)
    assert low < 0.5 < high and high - low < 0.7


def test_a_loss_with_no_lost_record_is_labelled_by_its_anomaly_kinds() -> None:
    config = Configuration(acks="all", min_insync_replicas=2, replication_factor=2,
                           unclean=True, fsync=False, rules="legacy")

    def outcome(verdict: str, counts: dict[str, int], mechanisms: dict[str, int]) -> Outcome:
        return Outcome(1, 1, "[]", verdict, counts.get("lost", 0), counts, mechanisms, 0.1)

    cell = cell_of(config, "network", [
        outcome("loss", {"lost": 0, "misplaced": 1}, {}),
        outcome("loss", {"lost": 3}, {"unclean_election": 3}),
        outcome("clean", {"lost": 0, "duplicates": 2}, {}),
        outcome("anomalies", {"lost": 0, "aborted_reads": 4}, {})])
    assert cell.mechanisms == {"misplaced": 1, "unclean_election": 1}
    assert cell.losses == 2


def test_anomalies_without_a_loss_are_shrunk_by_the_anomaly_found_most() -> None:
    """A schedule whose verdict is `anomalies` (aborted reads of a delayed EndTxn, say) is
    shrunk and confirmed by its anomaly count's name, which no loss mechanism shares;
    duplicates, an anomaly only with an idempotent producer, come after the others."""
    def outcome(verdict: str, counts: dict[str, int], mechanisms: dict[str, int]) -> Outcome:
        return Outcome(1, 1, "[]", verdict, counts.get("lost", 0), counts, mechanisms, 0.1)

    assert outcome("anomalies", {"aborted_reads": 6, "reads_past_lso": 6}, {}).mechanism == \
        "aborted_reads"
    assert outcome("anomalies", {"duplicates": 9, "torn_transactions": 1}, {}).mechanism == \
        "torn_transactions"
    assert outcome("anomalies", {"duplicates": 9}, {}).mechanism == "duplicates"
    assert outcome("loss", {"lost": 3, "aborted_reads": 9}, {"power_loss": 3}).mechanism == \
        "power_loss"
    assert outcome("clean", {"duplicates": 2}, {}).mechanism is None


def test_schedules_with_a_fault_not_injected_are_named_in_the_summary(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A clean schedule whose nemesis skipped a fault did not test that fault: the
    exploration lists its seed in explore.json, explore.html and on stdout."""
    outcomes = [Outcome(seed, 2, "[]", "clean", 0, {}, {}, 0.1, faults_skipped=skipped)
                for seed, skipped in ((1, 0), (2, 1), (3, 0), (4, 2))]
    summary = Exploration("e", 4, 1.0, "local[1]", outcomes, []).to_json()
    assert summary["faults_skipped"] == [2, 4]
    assert Outcome.from_json(outcomes[1].to_json()) == outcomes[1]
    _json, html = write_report(summary, tmp_path)
    line = "2 schedule(s) had a planned fault not injected, so their verdicts cover only the " \
           "faults that ran (seeds 2, 4)."
    assert line in html.read_text()
    _explore_summary(summary, tmp_path)
    assert f"  {line}" in capsys.readouterr().out.splitlines()
    quiet = Exploration("e", 1, 1.0, "local[1]", outcomes[:1], []).to_json()
    _explore_summary(quiet, tmp_path / "quiet")
    assert "not injected" not in capsys.readouterr().out


def test_a_minimal_schedule_of_aborted_reads_is_explained_by_its_late_end_txn(
        tmp_path: Path) -> None:
    """The sentences a minimal experiment's comment and explore.html give (`_sentences`:
    the Spark analysis of its simulated run): for the delayed EndTxn under transaction
    version 1, which transaction's EndTxn landed in which, not only the anomalies' counts."""
    loaded = load_experiment(Path(__file__).parents[2] / "experiments"
                             / "txn-delayed-endtxn-tv1.yaml")
    spark = explore_session("local[2]")
    [sentence] = _sentences(spark, loaded, 1, tmp_path / "minimal.run")
    assert sentence.startswith("EndTxn (commit) with producer id ")
    assert "committed it early" in sentence and "It was most likely p0-t" in sentence
