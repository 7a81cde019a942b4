"""The fault space of an experiment: its `explore` block, else its `random` entry, else the
default for its topic."""

from __future__ import annotations

import dataclasses

import pytest
from explore_experiments import WriteExperiment

from undertow.explore.space import FaultSpace
from undertow.spec import LoadedExperiment, TargetSelector, load_experiment

RANDOM = {"random": {"at": "3s", "kinds": ["kill", "pause"],
                     "targets": [{"role": "leader"}, {"broker": 2}],
                     "interval": {"min": "500ms", "max": "3s"},
                     "duration": {"min": "200ms", "max": "2s"}, "count": 5}}


def _roles(space: FaultSpace) -> list[str]:
    return [t.describe() for t in space.targets]


def test_default(acks1: LoadedExperiment) -> None:
    space = FaultSpace.of(acks1)
    assert space == FaultSpace.default_for(acks1.experiment.spec)
    assert space.kinds == ("kill", "pause", "partition", "power-loss", "pod-delete")
    assert _roles(space) == ["leader of p0", "follower of p0", "isr-member of p0"]
    assert space.faults == (1, 4)
    assert space.durations_ms == (1000, 8000)
    assert space.gaps_ms == (500, 10_000)
    assert space.window_ms == (0, 36_000)
    assert space.partition_modes == ("isolate",)


def test_default_of_a_single_replica_has_no_follower(
        write_experiment_file: WriteExperiment) -> None:
    space = FaultSpace.of(load_experiment(write_experiment_file(replication_factor=1)))
    assert _roles(space) == ["leader of p0", "isr-member of p0"]


def test_from_the_explore_block(write_experiment_file: WriteExperiment) -> None:
    path = write_experiment_file(
        duration="20s", faults=[RANDOM],
        explore={"kinds": ["disk-stall"], "targets": [{"broker": 1}],
                 "faults": {"min": 2, "max": 3}, "duration": {"min": "1s", "max": "2s"},
                 "gap": {"min": "250ms", "max": "1s"}})
    space = FaultSpace.of(load_experiment(path))
    assert space.kinds == ("disk-stall",)
    assert _roles(space) == ["broker 1"]
    assert (space.faults, space.durations_ms, space.gaps_ms, space.window_ms) == (
        (2, 3), (1000, 2000), (250, 1000), (0, 20_000))


def test_unset_fields_of_the_block_take_the_defaults(
        write_experiment_file: WriteExperiment) -> None:
    path = write_experiment_file(explore={"faults": {"min": 2, "max": 2}})
    space = FaultSpace.of(load_experiment(path))
    default = FaultSpace.default_for(load_experiment(write_experiment_file()).experiment.spec)
    assert space == dataclasses.replace(default, faults=(2, 2), window_ms=(0, 30_000))


def test_default_kinds_are_those_the_targets_can_take(
        write_experiment_file: WriteExperiment) -> None:
    """The controller takes no power-loss or pod-delete; a consumer only an isolation."""
    controller = FaultSpace.of(load_experiment(write_experiment_file(
        explore={"targets": [{"role": "controller"}]})))
    assert controller.kinds == ("kill", "pause", "partition")
    consumer = FaultSpace.of(load_experiment(write_experiment_file(
        explore={"targets": [{"consumer": 0}, {"role": "leader"}]})))
    assert consumer.kinds == ("kill", "pause", "partition", "power-loss", "pod-delete")
    assert [t.describe() for t in consumer.targets_for("partition")] == ["consumer c0",
                                                                           "leader of p0"]
    assert [t.describe() for t in consumer.targets_for("kill")] == ["leader of p0"]


def test_from_a_random_entry(write_experiment_file: WriteExperiment) -> None:
    space = FaultSpace.of(load_experiment(write_experiment_file(duration="20s",
                                                                faults=[RANDOM])))
    assert space.kinds == ("kill", "pause")
    assert _roles(space) == ["leader of p0", "broker 2"]
    assert (space.faults, space.durations_ms, space.gaps_ms, space.window_ms) == (
        (1, 5), (200, 2000), (500, 3000), (3000, 20_000))


def test_an_uncounted_random_entry_allows_as_many_as_fit(
        write_experiment_file: WriteExperiment) -> None:
    uncounted = {"random": {k: v for k, v in RANDOM["random"].items() if k != "count"}}
    space = FaultSpace.of(load_experiment(write_experiment_file(duration="20s",
                                                                faults=[uncounted])))
    assert space.faults == (1, (20_000 - 3000) // (500 + 200))


@pytest.mark.parametrize(("change", "problem"), [
    ({"faults": (0, 2)}, "at least one fault"),
    ({"faults": (3, 2)}, "not an ordered"),
    ({"durations_ms": (0, 10)}, "lasts at least 1 ms"),
    ({"gaps_ms": (-1, 10)}, "not an ordered"),
    ({"kinds": ()}, "needs kinds"),
    ({"faults": (4, 4), "gaps_ms": (10_000, 10_000)}, "do not all start before 36000 ms"),
    ({"kinds": ("power-loss",), "targets": (TargetSelector(role="controller"),)},
     "no target of the space can take a power-loss"),
])
def test_an_impossible_space_is_refused(acks1: LoadedExperiment, change: dict[str, object],
                                        problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        dataclasses.replace(FaultSpace.of(acks1), **change)  # type: ignore[arg-type]
