"""The commit a benchmark figure was measured at, for the JSON Lines ledgers in results/."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def commit() -> str:
    """HEAD's short hash, or "unknown" outside a git checkout."""
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                         capture_output=True, text=True)
    return out.stdout.strip() or "unknown"
