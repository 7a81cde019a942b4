"""A simulated run closes every file its brokers opened, a killed broker's when it is killed
and the others' when the run ends, as the end of a process does: the log segments are raw
descriptors (``os.open``) that no garbage collection closes, and a worker of ``undertow
explore`` runs a thousand clusters (a 1,000-schedule exploration of a transactional space
ran out of descriptors, EMFILE, before this)."""

from __future__ import annotations

import os
from pathlib import Path

from undertow.sim.world import run_simulated
from undertow.spec import load_experiment

EXPERIMENTS = Path(__file__).parents[2] / "experiments"


def open_under(directory: Path) -> list[str]:
    """This process's descriptors open on files under ``directory``."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile (the listing's own descriptor)
        if target.startswith(str(directory)):
            found.append(target)
    return found


def test_a_simulated_run_with_a_kill_leaves_no_file_open(tmp_path: Path) -> None:
    loaded = load_experiment(EXPERIMENTS / "acksall-leader-kill.yaml")
    assert any(f.kind == "kill" for f in loaded.experiment.spec.faults)
    run_simulated(loaded, tmp_path / "run", seed=1)
    assert open_under(tmp_path) == []
