"""The commit a benchmark figure was measured at, for the JSON Lines ledgers in results/."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def machine() -> dict[str, object]:
    """The machine a figure was measured on, recorded beside it: figures from different
    machines are never compared as if they were one. CPU model, cores, the load average
    when the measurement started, memory."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    return {"cpu": model, "cores": os.cpu_count(), "memory_gib": memory_gib,
            "load": round(os.getloadavg()[0], 2)}


def machine_line() -> str:
    m = machine()
    return (f"machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, "
            f"load {m['load']}")


def commit() -> str:
    """HEAD's short hash, or "unknown" outside a git checkout."""
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                         capture_output=True, text=True)
    return out.stdout.strip() or "unknown"
