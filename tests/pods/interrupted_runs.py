"""What an interrupted ``make e2e-pods`` left behind, found and removed by the next run.

A run removes its pods, volumes and network when its test ends, but not when it is killed
(SIGKILL, a CI time limit, the machine's session ending): podman keeps the pods, their
anonymous volumes and the ConfigMap volumes named after the experiment, and the next run's
``kube play`` of a pod with the same name fails ("pod already exists"), or, worse, mounts the
old run's ConfigMap volume. Every pod and network a run creates is labelled with its owner,
the pytest process as PID and start time (a PID alone may be reused); the next run removes
whatever belongs to an owner no longer alive, and refuses to touch a live one's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from podman_api import podman

OWNER_LABEL = "undertow.dev/e2e-owner"


def process_token(pid: int) -> str | None:
    """``PID-STARTTIME`` of a live process (start time in clock ticks since boot, field 22
    of /proc/PID/stat), None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    return f"{pid}-{stat.rsplit(')', 1)[1].split()[19]}"


def this_owner() -> str:
    token = process_token(os.getpid())
    assert token is not None
    return token


def owner_alive(owner: str) -> bool:
    pid, _, _ = owner.partition("-")
    return pid.isdigit() and process_token(int(pid)) == owner


def reap_interrupted_runs(names: Iterable[str] = ()) -> list[str]:
    """Remove the pods and networks of every e2e run whose owner is gone, with the volumes
    their containers mounted, and any pod called one of ``names`` that no run owns (left by
    a run from before owners were labelled). A pod of ``names`` that a live run owns is an
    error naming that run. What was removed, for the log."""
    wanted = set(names)
    removed: list[str] = []
    stale: list[str] = []
    containers: list[str] = []
    for pod in json.loads(podman("pod", "ps", "--format", "json", check=False).stdout or "[]"):
        owner = (pod.get("Labels") or {}).get(OWNER_LABEL)
        if owner is None and pod["Name"] not in wanted:
            continue  # not an e2e pod
        if owner is not None and owner_alive(owner):
            if pod["Name"] in wanted:
                raise AssertionError(
                    f"pod {pod['Name']} belongs to an e2e run still going (pytest process "
                    f"{owner.split('-')[0]}): wait for it or stop it")
            continue
        stale.append(pod["Name"])
        containers += [c["Id"] for c in pod.get("Containers") or []]
    if stale:
        mounted = podman("container", "inspect", *containers, check=False).stdout
        volumes = {mount["Name"] for container in json.loads(mounted or "[]")
                   for mount in container.get("Mounts") or [] if mount.get("Name")}
        for name in stale:
            podman("pod", "rm", "-f", "-t", "0", name, check=False)
            removed.append(f"pod {name}")
        if volumes:
            podman("volume", "rm", "-f", *sorted(volumes), check=False)
            removed += [f"volume {v}" for v in sorted(volumes)]
    listing = podman("network", "ls", "--filter", f"label={OWNER_LABEL}", "--format", "json",
                     check=False).stdout
    for network in json.loads(listing or "[]"):
        if not owner_alive((network.get("labels") or {}).get(OWNER_LABEL, "")):
            podman("network", "rm", "-f", network["name"], check=False)
            removed.append(f"network {network['name']}")
    return removed
