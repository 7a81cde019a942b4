"""``make e2e-pods``: experiments end to end on the operator's pods under podman. Slow
(minutes), so only run when asked: ``UNDERTOW_E2E_PODS=1`` (the make target sets it);
where podman is missing or does not run, skipped with the reason, or failed in CI
(``tests/tools.py``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import tools
from container_helpers import REPO, Engine, e2e_marks, mark_folder, probe_engine


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_folder(items, Path(__file__).parent,
                *e2e_marks(pytest.mark.pods, pytest.mark.timeout(1800)))


@pytest.fixture(scope="session")
def pod_images() -> Engine:
    """The three images, built for podman (``kube play`` is podman's alone)."""
    tools.podman()
    os.environ["ENGINE"] = "podman"
    try:
        found = probe_engine()
    finally:
        os.environ.pop("ENGINE")
    if isinstance(found, str):
        tools.unavailable(f"podman does not run here: {found}")
    build = subprocess.run([str(REPO / "scripts" / "images.sh")], cwd=REPO,
                           env={**found.env, "ENGINE": "podman"}, capture_output=True,
                           text=True, check=False, timeout=1800)
    assert build.returncode == 0, f"scripts/images.sh failed:\n{build.stdout}\n{build.stderr}"
    return found
