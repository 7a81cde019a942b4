"""Helpers of the container tests: the engine the build scripts pick, and ``run``
arguments for a container spec exactly as the operator renders it."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


E2E_GATE = "UNDERTOW_E2E_PODS"
"""Set to 1 by ``make e2e-pods``: the tests that build the images (minutes on a fresh
machine) or play pods run there, not in ``make test``."""


def e2e_marks(*marks: Any) -> list[Any]:
    """``marks`` and, unless ``make e2e-pods`` runs, a skip that says how to run them."""
    if os.environ.get(E2E_GATE) == "1":
        return list(marks)
    return [*marks, pytest.mark.skip(
        reason=f"builds or runs the images: run with make e2e-pods ({E2E_GATE}=1)")]


def mark_folder(items: list[Any], folder: Path, *marks: Any) -> None:
    """Add ``marks`` to every collected test under ``folder``."""
    for item in items:
        if folder in Path(item.fspath).parents:
            for mark in marks:
                item.add_marker(mark)


@dataclass(frozen=True)
class Engine:
    """The engine, its settings and the image tag, exactly as the build scripts see them."""

    name: str
    env: Mapping[str, str]
    tag: str

    def image(self, name: str) -> str:
        return f"undertow/{name}:{self.tag}"

    def run(self, *args: str, check: bool = True, timeout: float = 300,
            ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([self.name, *args], capture_output=True, text=True,
                                env=self.env, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"{self.name} {' '.join(args)} exited {result.returncode}:\n"
                                 f"{result.stdout}\n{result.stderr}")
        return result


def probe_engine() -> Engine | str:
    """The engine scripts/container-engine.sh picks, or why there is none."""
    script = (". scripts/container-engine.sh && "
              'printf "%s\\n%s\\n%s\\n" "$ENGINE" "${CONTAINERS_CONF:-}" "$IMAGE_TAG"')
    probe = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True,
                           check=False)
    if probe.returncode != 0:
        return probe.stderr.strip() or "no container engine"
    name, conf, tag = probe.stdout.splitlines()
    env = dict(os.environ)
    if conf:
        env["CONTAINERS_CONF"] = conf
    check = subprocess.run([name, "info"], capture_output=True, text=True, env=env,
                           check=False)
    if check.returncode != 0:
        return f"{name} info failed: {check.stderr.strip()[:200]}"
    return Engine(name, env, tag)


def run_args(container: Mapping[str, Any], *, pod_security: Mapping[str, Any],
             binds: Mapping[str, Path], env: Mapping[str, str] | None = None,
             network: str = "host", extra: Sequence[str] = ()) -> list[str]:
    """``ENGINE run`` arguments for one container spec the operator rendered: its image,
    command, plain environment, user, capabilities and read-only root, and its volume
    mounts (``binds`` maps a volume name to a host directory; any other volume, the
    emptyDirs, becomes a tmpfs). Values from fieldRefs or Secrets come in ``env``; what
    stands in for the API server (a kubeconfig mount, a published port) in ``extra``."""
    security = {**pod_security, **(container.get("securityContext") or {})}
    args = ["--network", network]
    if "runAsUser" in security:
        args += ["--user", f"{security['runAsUser']}:{security.get('runAsGroup', 0)}"]
    if security.get("readOnlyRootFilesystem"):
        args.append("--read-only")
    if security.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    capabilities = security.get("capabilities") or {}
    for cap in capabilities.get("drop", []):
        args += ["--cap-drop", cap]
    for cap in capabilities.get("add", []):
        args += ["--cap-add", cap]
    for item in container.get("env", []):
        if "value" in item:
            args += ["-e", f"{item['name']}={item['value']}"]
    for name, value in (env or {}).items():
        args += ["-e", f"{name}={value}"]
    for mount in container.get("volumeMounts", []):
        path = mount["mountPath"]
        if mount["name"] in binds:
            mode = "ro" if mount.get("readOnly") else "rw"
            args += ["-v", f"{binds[mount['name']]}:{path}:{mode}"]
        else:
            args += ["--tmpfs", f"{path}:rw,mode=1777"]
    return [*args, *extra, "--entrypoint", json.dumps(container["command"][:1]),
            container["image"], *container["command"][1:]]


def kubeconfig(directory: Path, server: str) -> Path:
    """A kubeconfig naming ``server`` (the emulator), readable by any container user."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o755)
    path = directory / "config"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": server}}],
        "users": [{"name": "nobody", "user": {}}],
        "contexts": [{"name": "emulator",
                      "context": {"cluster": "emulator", "user": "nobody"}}]}))
    path.chmod(0o644)
    return path


def wait_for_log(engine: Engine, name: str, needle: str, timeout: float = 60) -> str:
    """The container's log once it holds ``needle``; fails with the log otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        result = engine.run("logs", name, check=False)
        text = result.stdout + result.stderr
        if needle in text:
            return text
        state = engine.run("inspect", "--format", "{{.State.Status}}", name,
                           check=False).stdout.strip()
        if state in ("exited", "stopped") or time.monotonic() > deadline:
            raise AssertionError(f"{name} ({state}) never logged {needle!r}:\n{text}")
        time.sleep(0.5)
