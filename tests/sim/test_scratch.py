"""Scratch space of the simulations (``sim.files.scratch_dir``): what a killed worker left is
removed by the next one; what a live process or someone else holds stays."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from undertow.sim import files


def test_a_dead_process_s_directory_goes_and_the_others_stay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "scratch_root", lambda: tmp_path)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead = tmp_path / f"undertow-explore-{gone.stdout.strip()}-abc"
    (dead / "cluster").mkdir(parents=True)
    live = tmp_path / f"undertow-explore-{os.getppid()}-def"
    live.mkdir()
    other = tmp_path / "undertow-explore-notapid"
    other.mkdir()

    made = files.scratch_dir("undertow-explore-")

    assert not dead.exists()
    assert live.is_dir() and other.is_dir()
    assert made.parent == tmp_path and made.name.startswith(f"undertow-explore-{os.getpid()}-")
