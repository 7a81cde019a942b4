"""A run that cannot fit on its file system is refused before anything starts, with both
figures; the estimate grows with every factor of the workload."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from small_disk import mounted_tmpfs

from undertow.runner.preflight import estimate
from undertow.spec import load_experiment

REPO = Path(__file__).resolve().parents[2]
ACKS1 = REPO / "experiments" / "acks1-leader-kill.yaml"


def spec_with(**workload: object):
    spec = load_experiment(ACKS1).experiment.spec
    return spec.model_copy(update={"workload": spec.workload.model_copy(update=workload)})


def test_the_estimate_grows_with_rate_size_duration_and_replicas() -> None:
    base = estimate(spec_with())
    assert estimate(spec_with(rate=500)).brokers == pytest.approx(2 * base.brokers, rel=0.01)
    assert estimate(spec_with(duration=72.0)).total == pytest.approx(2 * base.total, rel=0.01)
    assert estimate(spec_with(record_size=2048)).brokers > 10 * base.brokers
    assert estimate(spec_with(consumers=3)).history > base.history
    # acks1-leader-kill used 14.2 MB (logs and history) on 2026-11-25: within 1.5x of it.
    assert 14.2e6 < base.total < 1.5 * 14.2e6


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "small", "8m") as mount:
        yield mount


def test_a_run_that_cannot_fit_is_refused_before_anything_starts(small_tmpfs: Path) -> None:
    out = small_tmpfs / "run"
    done = subprocess.run([sys.executable, "-m", "undertow", "run", str(ACKS1), "--out",
                           str(out), "--no-progress"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"undertow: {out}: ") and "MiB free, but the run needs about" in line
    assert "for the brokers' logs" in line and "for the history" in line
    assert not any(small_tmpfs.iterdir()), "nothing may be created before the refusal"
