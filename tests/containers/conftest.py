"""Real containers: the three images built by ``scripts/images.sh`` and run by the engine
it picks (Docker, else podman). Every test here is marked ``containers``; they run in ``make
e2e-pods`` (building the images takes minutes on a fresh machine, which ``make test`` does
not spend) and are skipped, with the reason, where no container engine runs (failed in CI:
``tests/tools.py``)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import tools
from container_helpers import REPO, Engine, e2e_marks, mark_folder, probe_engine


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The first test builds the images: minutes on a fresh machine.
    mark_folder(items, Path(__file__).parent,
                *e2e_marks(pytest.mark.containers, pytest.mark.timeout(1800)))


@pytest.fixture(scope="session")
def engine() -> Engine:
    found = probe_engine()
    if isinstance(found, str):
        # .ci/run installs podman (with runc and uidmap): there it must run. The reason
        # names the install command (scripts/container-engine.sh) or why the engine failed.
        tools.unavailable(found)
    return found


@pytest.fixture(scope="session")
def images(engine: Engine) -> Engine:
    """The three images, built (or found up to date in the build cache) once per session."""
    build = subprocess.run([str(REPO / "scripts" / "images.sh")], cwd=REPO, env=engine.env,
                           capture_output=True, text=True, check=False, timeout=1800)
    assert build.returncode == 0, f"scripts/images.sh failed:\n{build.stdout}\n{build.stderr}"
    return engine


@pytest.fixture
def containers(engine: Engine) -> Iterator[list[str]]:
    """Names of containers a test starts; removed afterwards whatever happened, with their
    anonymous volumes (the broker image declares one)."""
    names: list[str] = []
    yield names
    # Killed at once: `rm -f` would first wait podman's 10 s stop timeout for each one
    # whose PID 1 ignores SIGTERM (docker's `rm -f` kills at once already).
    grace = ["-t", "0"] if Path(engine.name).name == "podman" else []
    for name in names:
        engine.run("rm", "-f", "-v", *grace, name, check=False)


