"""A broker held down after a kill: a file with a deadline that the broker's launcher waits on.

A ``kill`` is SIGKILL of the broker process in place, as the local platform does it (Kafka's
hard bounce): its container restarts under the pod's restart policy, with the same IP and
the same volumes. So that the broker stays down for the fault's duration, as it does
locally, the agent first writes this file into a volume both containers mount; the
container's launcher (``cluster_objects._LAUNCHER``) waits, before it starts the broker, until
the file is gone or its deadline has passed. The deadline is in the file, so the broker
comes back even when the agent and the runner are gone.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

from undertow.kube.agent.errors import AgentError


class Hold:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        """None: no launcher waits on a file; killed brokers restart at once."""

    def set(self, duration_s: float) -> None:
        """Hold the broker down for at most ``duration_s`` (whole seconds since the epoch,
        rounded up, which is what ``date +%s`` in the launcher compares against)."""
        if self.path is None:
            return
        deadline = math.ceil(time.time() + duration_s)
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_text(f"{deadline}\n")
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.path)
        except OSError as exc:
            raise AgentError(f"cannot write the hold file {self.path}: {exc}") from exc

    def clear(self) -> None:
        if self.path is None:
            return
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise AgentError(f"cannot remove the hold file {self.path}: {exc}") from exc

    def active(self) -> bool:
        if self.path is None:
            return False
        try:
            return int(self.path.read_text().strip() or 0) > time.time()
        except (OSError, ValueError):
            return False
