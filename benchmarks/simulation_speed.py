"""How fast the simulation runs an experiment: wall time of `run_simulated` (the cluster, the
workload, the faults, the drain and the history; not the analysis), against the experiment's
workload duration in virtual time.

    .venv/bin/python benchmarks/simulation_speed.py [EXPERIMENT ...] [--rounds N]

Target (issue: deterministic simulation): acks1-leader-kill in 3 s of wall time or less. Each
round runs in this process, one after another, on /dev/shm when the machine has it. The
median is also given scaled to the reference machine (column @1.47s, reference.py), with the
reference loop's time at the start and the end.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from ledger import REPO, commit, machine_line
from reference import AT, Reference

from undertow.sim.files import scratch_root
from undertow.sim.world import run_simulated
from undertow.spec import load_experiment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiments", nargs="*", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    paths = args.experiments or sorted((REPO / "experiments").glob("*.yaml"))
    print(f"commit {commit()}; {machine_line()}; {args.rounds} rounds each")
    reference = Reference.measure()
    print(reference.start_line())
    print(f"{'experiment':34s} {'virtual s':>9s} {'wall min':>8s} {'median':>7s} {AT:>7s} "
          f"{'x':>5s}")
    for path in paths:
        loaded = load_experiment(path)
        walls = []
        for round_ in range(args.rounds):
            work = Path(tempfile.mkdtemp(prefix="undertow-bench-", dir=scratch_root()))
            try:
                started = time.perf_counter()
                run_simulated(loaded, work, seed=round_ + 1)
                walls.append(time.perf_counter() - started)
            finally:
                shutil.rmtree(work, ignore_errors=True)
        virtual, median = loaded.experiment.spec.workload.duration, statistics.median(walls)
        print(f"{path.stem:34s} {virtual:9.0f} {min(walls):8.2f} {median:7.2f} "
              f"{reference.duration(median):7.2f} {virtual / median:5.0f}", flush=True)
    print(reference.finish().end_line())


if __name__ == "__main__":
    main()
