"""Minimal experiments as files: two documents under a comment, loading back to the
schedule's faults, `expect: loss` and the schedule's seed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from explore_experiments import EXPERIMENTS, WriteExperiment

from undertow.explore.draw import FixedFault, Schedule, draw
from undertow.explore.space import FaultSpace
from undertow.explore.write import minimal_name, write_experiment
from undertow.spec import (
    LoadedExperiment,
    SpecError,
    TargetSelector,
    load_documents,
    load_experiment,
    plan,
)

SCHEDULE = Schedule((
    FixedFault("kill", TargetSelector(role="leader"), 4000, 4000),
    FixedFault("partition", TargetSelector(role="follower", mode="all"), 5500, 1250,
               network="isolate"),
    FixedFault("pod-delete", TargetSelector(broker=1), 9000, 1000, grace_period_ms=0),
), seed=17)


def _planned(loaded: LoadedExperiment) -> list[tuple[object, ...]]:
    return [(p.kind, p.target, p.at, p.duration, p.network.mode if p.network else None,
             p.grace_period) for p in plan(loaded.experiment, 0)]


def test_the_file_loads_back_to_the_schedule(acks1: LoadedExperiment, tmp_path: Path) -> None:
    path = write_experiment(acks1, SCHEDULE, tmp_path / "minimal" / "acks1-minimal.yaml",
                            ["acks1-minimal: found by undertow explore. Expect: loss.", "",
                             "What the analysis said:", "The leader died with records."])
    text = path.read_text()
    assert text.startswith(
        "# acks1-minimal: found by undertow explore. Expect: loss.\n#\n"
        "# What the analysis said:\n# The leader died with records.\napiVersion: ")
    assert [d.resource.kind for d in load_documents([path])] == ["BrokerCluster",
                                                                  "ChaosExperiment"]
    loaded = load_experiment(path)
    spec = loaded.experiment.spec
    assert (spec.expect, spec.seed) == ("loss", 17)
    assert loaded.experiment.metadata.name == "acks1-leader-kill-acks1-minimal"
    assert spec.cluster.ref == loaded.cluster.metadata.name == loaded.experiment.metadata.name
    assert _planned(loaded) == [
        ("kill", TargetSelector(role="leader"), 4.0, 4.0, None, 0.0),
        ("partition", TargetSelector(role="follower", mode="all"), 5.5, 1.25, "isolate", 0.0),
        ("pod-delete", TargetSelector(broker=1), 9.0, 1.0, None, 0.0),
    ]
    assert "target: {role: follower, mode: all}" in text, "selectors as the files write them"


def test_a_schedule_that_found_anomalies_expects_them(acks1: LoadedExperiment,
                                                      tmp_path: Path) -> None:
    path = write_experiment(acks1, SCHEDULE, tmp_path / "acks1-aborted-reads.yaml",
                            ["acks1-aborted-reads: Expect: anomalies."], expect="anomalies")
    assert load_experiment(path).experiment.spec.expect == "anomalies"


@pytest.mark.parametrize("path", sorted(EXPERIMENTS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_experiment_written_with_a_drawn_schedule(path: Path, tmp_path: Path) -> None:
    """Everything but the faults, the seed, the names and the expectation is the original's."""
    original = load_experiment(path)
    schedule = draw(FaultSpace.of(original), 11)
    written = load_experiment(write_experiment(original, schedule, tmp_path / "m.yaml", ["m"]))
    assert _planned(written) == [
        (f.kind, f.target, f.at_ms / 1000, f.duration_ms / 1000, f.network, 0.0)
        for f in schedule.faults]
    assert written.cluster.spec == original.cluster.spec
    ignored = {"faults": [], "seed": None, "expect": "loss", "cluster": original.experiment.spec
               .cluster}
    assert (written.experiment.spec.model_copy(update=ignored)
            == original.experiment.spec.model_copy(update=ignored))


def test_an_inline_cluster_becomes_a_document(tmp_path: Path) -> None:
    original = load_experiment(Path(__file__).parents[1] / "runner" / "data" / "spec-random.yaml")
    assert original.experiment.spec.cluster.inline is not None
    path = write_experiment(original, SCHEDULE, tmp_path / "random.yaml", ["from random"])
    assert [d["kind"] for d in yaml.safe_load_all(path.read_text())] == ["BrokerCluster",
                                                                          "ChaosExperiment"]
    written = load_experiment(path)
    assert written.experiment.spec.cluster.ref == "random-minimal"
    assert written.cluster.spec == original.cluster.spec
    assert len(plan(written.experiment, 99)) == 3


def test_a_schedule_that_does_not_fit_is_not_written(
        write_experiment_file: WriteExperiment, tmp_path: Path) -> None:
    loaded = load_experiment(write_experiment_file(replication_factor=1))
    path = tmp_path / "out" / "never.yaml"
    with pytest.raises(SpecError, match="no follower can exist"):
        write_experiment(loaded, SCHEDULE, path, [])
    assert not path.exists()


@pytest.mark.parametrize(("original", "suffix", "name"), [
    ("acks1-leader-kill", "unclean_election", "acks1-leader-kill-unclean-election"),
    ("acks1-leader-kill", "acks1-leader-kill-unclean-election",
     "acks1-leader-kill-unclean-election"),
    ("acks1-leader-kill", "acks1-leader-kill", "acks1-leader-kill-minimal"),
    ("acks1-leader-kill", "--", "acks1-leader-kill-minimal"),
    ("a" * 63, "acks1-before-replication", "a" * 38 + "-acks1-before-replication"),
    ("x", "Y" * 80, "x-" + "y" * 61),
])
def test_minimal_names(original: str, suffix: str, name: str) -> None:
    assert minimal_name(original, suffix) == name
    assert len(name) <= 63 and name != original
