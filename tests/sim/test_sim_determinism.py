"""The simulation's promise: one experiment and one seed give one history, byte for byte,
whichever process runs it (string hashing differs from process to process), and another
seed of a random schedule gives another history."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from library_sims import library_history, shared_root
from small_experiment import small_experiment

pytestmark = pytest.mark.long  # run first (tests/conftest.py)

RANDOM_FAULTS = """\
    - random:
        kinds: [kill, pause, partition, power-loss]
        targets: [{role: leader}, {role: follower}]
        interval: {min: 500ms, max: 2s}
        duration: {min: 1s, max: 3s}"""

EXPERIMENTS = Path(__file__).parents[2] / "experiments"


def _simulate(experiment: Path, out: Path, seed: int, hash_seed: str) -> dict[str, bytes]:
    subprocess.run(
        [sys.executable, "-m", "undertow", "run", str(experiment), "--platform", "sim",
         "--seed", str(seed), "--out", str(out), "--no-analysis", "--no-progress"],
        check=True, env={**os.environ, "PYTHONHASHSEED": hash_seed}, capture_output=True,
        timeout=120)
    return {p.name: p.read_bytes() for p in sorted((out / "history").iterdir())}


def test_the_same_seed_gives_the_same_history_bytes(tmp_path: Path) -> None:
    experiment = tmp_path / "random.yaml"
    experiment.write_text(small_experiment("random-faults", "12s", RANDOM_FAULTS))
    first = _simulate(experiment, tmp_path / "a", 5, "1")
    second = _simulate(experiment, tmp_path / "b", 5, "2")
    assert sorted(first) == sorted(second)
    for name in first:
        assert first[name] == second[name], f"{name} differs between two runs of seed 5"
    assert first["faults.jsonl"].count(b'"inject"') >= 3
    other = _simulate(experiment, tmp_path / "c", 6, "1")
    assert other["faults.jsonl"] != first["faults.jsonl"]


def test_a_library_experiment_replays_exactly(tmp_path: Path,
                                             tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every fault kind's path through the platform (here a kill with a power loss's
    truncations and an unclean election) replays exactly too: `undertow run --platform sim`
    in a process of its own string hashing gives the bytes of the simulation the library's
    tests made in theirs (`library_sims`, `run_simulated` at seed 1)."""
    shared = library_history(shared_root(tmp_path_factory), "unclean-election")
    first = {p.name: p.read_bytes() for p in sorted(shared.iterdir())}
    own = os.environ.get("PYTHONHASHSEED", "")
    other = str(int(own) + 1) if own.isdigit() else "4"  # unset: each process draws its own
    second = _simulate(EXPERIMENTS / "unclean-election.yaml", tmp_path / "b", 1, other)
    assert first == second
    assert b"unclean" in first["events.jsonl"]


def test_a_consumer_group_replays_exactly(tmp_path: Path,
                                         tmp_path_factory: pytest.TempPathFactory) -> None:
    """The group members' draws (each first consumer's poll phase, from its client host's
    seeded source) replay too: group-coordinator-kill, whose rebalances race a coordinator
    kill, gives the library's bytes in a process of its own string hashing."""
    shared = library_history(shared_root(tmp_path_factory), "group-coordinator-kill")
    first = {p.name: p.read_bytes() for p in sorted(shared.iterdir())}
    own = os.environ.get("PYTHONHASHSEED", "")
    other = str(int(own) + 1) if own.isdigit() else "4"
    second = _simulate(EXPERIMENTS / "group-coordinator-kill.yaml", tmp_path / "b", 1, other)
    assert first == second
    assert first["groups.jsonl"].count(b'"assign"') >= 9
