"""Fixtures of the explorer's tests: experiment files written on demand, and
acks1-leader-kill loaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from explore_experiments import EXPERIMENTS, WriteExperiment, experiment_docs

from undertow.spec import LoadedExperiment, load_experiment


@pytest.fixture
def write_experiment_file(tmp_path: Path) -> WriteExperiment:
    """`write_experiment_file(**experiment_docs keywords) -> path`, one file per call."""
    count = 0

    def write(**kwargs: Any) -> Path:
        nonlocal count
        count += 1
        path = tmp_path / f"experiment-{count}.yaml"
        path.write_text(yaml.safe_dump_all(experiment_docs(**kwargs), sort_keys=False))
        return path

    return write


@pytest.fixture
def acks1() -> LoadedExperiment:
    return load_experiment(EXPERIMENTS / "acks1-leader-kill.yaml")
