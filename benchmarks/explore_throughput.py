"""Schedules per second of `undertow explore`, at several Spark masters side by side.

    .venv/bin/python benchmarks/explore_throughput.py [FILE] [--masters local[2]:1000,local[1]:300]

Each master explores its number of schedules (the same first seeds) of FILE (default:
benchmarks/experiments/explore-safe.yaml, a 30 s experiment under Kafka's safe configuration)
in a process of its own, one after the other; the figure is the schedules' wall time from
the first task to the last result (not the session's start), from explore.json. Target
(issue: deterministic simulation): 1,000 schedules of a 30 s experiment in 10 minutes or less
on a 2-core machine. Each rate is also printed scaled to the reference machine
(reference.py), and the reference loop's time at the start and the end of the run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ledger import REPO, commit, machine_line
from reference import AT, Reference

DEFAULT = REPO / "benchmarks" / "experiments" / "explore-safe.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--masters", default="local[2]:1000,local[1]:300",
                        help="MASTER:SCHEDULES, comma-separated")
    args = parser.parse_args()
    print(f"commit {commit()}; {machine_line()}; {args.file.name}")
    reference = Reference.measure()
    print(reference.start_line(), flush=True)
    for item in args.masters.split(","):
        master, _, runs = item.rpartition(":")
        with tempfile.TemporaryDirectory(prefix="undertow-explore-bench-") as out:
            started = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-m", "undertow", "explore", str(args.file), "--runs",
                 runs, "--master", master, "--out", out],
                capture_output=True, text=True)
            whole = time.monotonic() - started
            if not (Path(out) / "explore.json").exists():
                print(f"{master}: failed (exit {done.returncode}): {done.stderr[-800:]}")
                continue
            summary = json.loads((Path(out) / "explore.json").read_text())
        rate = summary["schedules_per_second"]
        print(f"{master:10s} {summary['runs']} schedules in {summary['seconds']:.0f} s "
              f"({rate:.2f}/s, {reference.rate(rate):.2f}/s {AT}; whole command {whole:.0f} s); "
              f"verdicts {summary['verdicts']}; losses {summary['losses_by_mechanism']}",
              flush=True)
    print(reference.finish().end_line())


if __name__ == "__main__":
    main()
