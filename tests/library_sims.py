"""The library's experiments simulated at seed 1, each once per test session whichever test
worker asks first (test_sim_verdicts runs them all; test_checker and test_sim_determinism
read a few): a simulation is 2-12 s of CPU, and make test runs on two cores.

A history is shared through the session's base directory, which pytest-xdist's workers
have in common, under a lock per experiment; its `done` mark is written last, so a
simulation that failed half-way is made again by the next asker."""

from __future__ import annotations

import fcntl
import shutil
from pathlib import Path

import pytest

from undertow.sim.world import run_simulated
from undertow.spec import load_experiment

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory every worker of this test session sees (the workers' base directories
    sit side by side in the session's; without xdist, the session's own)."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if base.name.startswith("popen-gw") else base) / "library-sims"


def library_history(root: Path, name: str) -> Path:
    """The history of experiments/`name`.yaml simulated at seed 1, made now if no worker
    made it yet (safe from several processes at once)."""
    root.mkdir(parents=True, exist_ok=True)
    out = root / name
    with (root / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "done").exists():
            shutil.rmtree(out, ignore_errors=True)
            run_simulated(load_experiment(EXPERIMENTS / f"{name}.yaml"), out, seed=1)
            shutil.rmtree(out / "cluster")  # the simulated disks: half the megabytes
            (out / "done").touch()
    return out / "history"
