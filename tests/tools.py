"""The tools a test machine must have, and what a test does when one is missing.

``.ci/run`` installs Chromium (chromium-headless-shell), kcat and podman and exports
``CI=true``. There, a test that needs one of them and does not find it fails: a skip would
pass CI with the test never run. Elsewhere it skips, its message naming the install command.
Every test that needs such a tool asks for it here (``tests/test_tools.py`` holds the rule).
"""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

CI_VARIABLE = "CI"
"""Set (to anything but empty, 0, false or no) where a missing tool fails its tests: by
``.ci/run``, and by most CI services themselves."""


def in_ci() -> bool:
    return os.environ.get(CI_VARIABLE, "").strip().lower() not in ("", "0", "false", "no")


def unavailable(reason: str) -> NoReturn:
    """Fail in CI, skip elsewhere: ``reason`` says what is missing and how to install it."""
    if in_ci():
        pytest.fail(f"{reason}; {CI_VARIABLE}={os.environ[CI_VARIABLE]}, where every tool "
                    f".ci/run installs must be present", pytrace=False)
    pytest.skip(reason)


def require_tool(*names: str, install: str) -> str:
    """The path of the first of ``names`` on PATH; if none is there, fails in CI and skips
    elsewhere, the message naming ``install`` (the command that installs it)."""
    for name in names:
        path = shutil.which(name)
        if path is not None:
            return path
    unavailable(f"{' or '.join(names)} is not installed ({install})")


def chromium() -> str:
    """Headless Chromium, to lay a page out as a browser does."""
    return require_tool("chromium-headless-shell", "chromium",
                        install="apt-get install -y chromium-headless-shell")


def kcat() -> str:
    """kcat, the librdkafka command-line client."""
    return require_tool("kcat", install="apt-get install -y kcat")


def podman() -> str:
    """podman, the engine of the image and pod tests (``kube play`` is podman's alone)."""
    return require_tool("podman", install="apt-get install -y podman runc uidmap")
