"""Runs every experiment of the library N times with ``undertow run`` (analysis included) and
prints, per experiment, how often the verdict matched ``expect`` and how long a run took.

    .venv/bin/python benchmarks/experiment_reliability.py [--runs 20] [--only NAME ...]

The target: each experiment reaches its expected verdict in at least 19 of 20 runs, each run
under 2 minutes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--keep", type=Path, default=Path("runs/reliability-unexpected"),
                        help="where runs whose verdict was not the expected one are kept")
    args = parser.parse_args()
    files = sorted((REPO / "experiments").glob("*.yaml"))
    if args.only:
        files = [f for f in files if f.stem in args.only]
    print(f"{'experiment':36} {'expect':6} {'as expected':>12} {'mean s':>7} {'max s':>6}  "
          "verdicts", flush=True)
    for path in files:
        verdicts, durations = [], []
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="undertow-reliability-") as out:
                started = time.monotonic()
                proc = subprocess.run(
                    [sys.executable, "-m", "undertow", "run", str(path), "--out", out,
                     "--no-progress"], cwd=REPO, capture_output=True, text=True)
                durations.append(time.monotonic() - started)
                report = Path(out) / "report.json"
                verdicts.append(json.loads(report.read_text())["verdict"] if report.exists()
                                else f"error({proc.returncode})")
                if proc.returncode != 0:
                    kept = args.keep / f"{path.stem}-{len(verdicts)}"
                    shutil.rmtree(kept, ignore_errors=True)
                    shutil.copytree(out, kept, ignore=shutil.ignore_patterns("cluster"))
                    (kept / "output.txt").write_text(proc.stdout + proc.stderr)
        expect = "loss" if "expect: loss" in path.read_text() else "clean"
        matched = sum(v == expect for v in verdicts)
        print(f"{path.stem:36} {expect:6} {matched:>5}/{args.runs:<6} "
              f"{sum(durations) / len(durations):7.1f} {max(durations):6.1f}  "
              f"{','.join(verdicts)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
