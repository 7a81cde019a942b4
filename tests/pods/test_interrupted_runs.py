"""A killed ``make e2e-pods`` leaves pods, volumes and a network behind; the next run removes
them, and only them (``interrupted_runs``)."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator

import pytest
import tools
from interrupted_runs import (
    OWNER_LABEL,
    owner_alive,
    process_token,
    reap_interrupted_runs,
    this_owner,
)
from podman_api import podman


def gone_owner() -> str:
    """The owner token of a process that has ended."""
    child = subprocess.Popen(["sleep", "30"])
    token = process_token(child.pid)
    child.kill()
    child.wait()
    assert token is not None
    return token


def test_an_owner_is_alive_while_its_process_is_and_not_after() -> None:
    assert owner_alive(this_owner())
    assert not owner_alive(gone_owner())
    assert not owner_alive("")
    # The same PID with another start time is another process.
    pid, _, started = this_owner().partition("-")
    assert not owner_alive(f"{pid}-{int(started) + 1}")


@pytest.fixture
def names() -> Iterator[dict[str, str]]:
    tools.podman()
    suffix = uuid.uuid4().hex[:6]
    made = {k: f"ut-reap-{k}-{suffix}" for k in (
        "net", "dead", "live", "unowned", "unowned_named", "volume")}
    yield made
    for key in ("dead", "live", "unowned", "unowned_named"):
        podman("pod", "rm", "-f", "-t", "0", made[key], check=False)
    podman("volume", "rm", "-f", made["volume"], check=False)
    podman("network", "rm", "-f", made["net"], check=False)


def pod(name: str, owner: str | None, *args: str) -> None:
    labels = ["--label", f"{OWNER_LABEL}={owner}"] if owner else []
    podman("pod", "create", "--name", name, *labels, *args)


def test_what_a_dead_run_left_is_removed_and_a_live_runs_is_kept(
        names: dict[str, str]) -> None:
    dead, live = gone_owner(), this_owner()
    podman("network", "create", "--internal", "--label", f"{OWNER_LABEL}={dead}",
           names["net"])
    pod(names["dead"], dead, "--network", names["net"], "-v", f"{names['volume']}:/data")
    pod(names["live"], live)
    pod(names["unowned"], None)
    pod(names["unowned_named"], None)

    removed = reap_interrupted_runs([names["unowned_named"]])

    assert set(removed) == {f"pod {names['dead']}", f"pod {names['unowned_named']}",
                            f"volume {names['volume']}", f"network {names['net']}"}, removed
    left = podman("pod", "ps", "--format", "{{.Name}}").stdout.split()
    assert names["live"] in left and names["unowned"] in left
    assert names["dead"] not in left and names["unowned_named"] not in left
    assert podman("volume", "exists", names["volume"], check=False).returncode == 1
    assert podman("network", "exists", names["net"], check=False).returncode == 1


def test_a_pod_name_a_live_run_holds_is_refused_by_name(names: dict[str, str]) -> None:
    pod(names["live"], this_owner())
    with pytest.raises(AssertionError, match=f"pod {names['live']} belongs to an e2e run"):
        reap_interrupted_runs([names["live"]])
    assert names["live"] in podman("pod", "ps", "--format", "{{.Name}}").stdout.split()
