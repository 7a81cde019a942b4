"""How often the minimal experiments `undertow explore` found reproduce on real processes.

    .venv/bin/python benchmarks/confirm_minimal.py EXPLORE_DIR [EXPLORE_DIR ...] [--runs 5]

For each minimal experiment in each exploration's explore.json, --runs runs with `undertow
run` on local processes, one at a time, each history checked with the Spark-free checker: a
run reproduces when the mechanism behind most of its loss is the one the file was shrunk
for. (`undertow explore --confirm K` does the same as part of an exploration.) The reference
loop's time (reference.py) is printed at the start and the end; the seconds a run are not
scaled to it, as most of a run is its workload's fixed wall time.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from ledger import commit, machine_line
from reference import Reference

from undertow.explore.command import confirm_once


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("explorations", nargs="+", type=Path)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="undertow-confirm-"))
    print(f"commit {commit()}; {machine_line()}; runs in {out}")
    reference = Reference.measure()
    print(reference.start_line(), flush=True)
    for exploration in args.explorations:
        for minimal in json.loads((exploration / "explore.json").read_text())["minimal"]:
            path, mechanism = Path(minimal["file"]), minimal["mechanism"]
            started = time.monotonic()
            outcomes = [confirm_once(path, out / f"{path.stem}-{i}") for i in range(args.runs)]
            reproduced = sum(o == mechanism for o in outcomes)
            print(f"{path.stem} ({minimal['faults']} faults): {reproduced} of {args.runs} "
                  f"reproduced {mechanism} ({', '.join(outcomes)}); "
                  f"{(time.monotonic() - started) / args.runs:.0f} s a run", flush=True)
    print(reference.finish().end_line())


if __name__ == "__main__":
    main()
