"""Schedules `undertow explore` found losing where nothing should be lost, each kept after
its fix (tests/sim/regressions/, each file's comment says what it found): in simulation they
give their expected verdict."""

from __future__ import annotations

from pathlib import Path

import pytest

from undertow.sim.world import run_simulated
from undertow.spec import load_experiment
from undertow_history.checker import check_history

REGRESSIONS = sorted((Path(__file__).parent / "regressions").glob("*.yaml"))


@pytest.mark.parametrize("path", REGRESSIONS, ids=lambda p: p.stem)
def test_a_found_schedule_gives_its_expected_verdict(tmp_path: Path, path: Path) -> None:
    loaded = load_experiment(path)
    run_simulated(loaded, tmp_path)
    summary = check_history(tmp_path / "history")
    assert summary.verdict == loaded.experiment.spec.expect, (summary.counts, summary.mechanisms)
