"""Runs every experiment of the library N times with ``undertow run`` (analysis included) and
prints, per experiment, how often the verdict matched ``expect`` and how long a run took.

    .venv/bin/python benchmarks/experiment_reliability.py [--runs 20] [--only NAME ...] [--jobs 2]
    .venv/bin/python benchmarks/experiment_reliability.py --summary [--commits 7c69964,4f12915]

The target: each experiment reaches its expected verdict in at least 19 of 20 runs, each run
under 2 minutes.

Runs go round-robin over the experiments, so a measurement cut short still covers each one
evenly. Every run is appended to a ledger (``--ledger``, one JSON object a line: experiment,
expect, verdict, seconds, the load average, the commit, and from the report's loss
attribution the unexplained anomalous records and the mechanisms named), and the summary is
computed from the ledger, so measurements taken in several sittings add up. Runs whose
verdict was not the expected one, or with records no event explains, are kept (without
broker data) under ``--keep`` for inspection. ``--jobs 2`` runs
two experiments at a time: twice the runs per hour on two cores, each run slower (the ledger
records the load average each run started under). Each run's row also carries the reference
loop's time just before and just after the run (reference.py), and the summary its mean: the
seconds a run are read against it (they are not scaled to it, as most of a run is its
workload's fixed wall time).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ledger import commit, machine
from reference import Reference, brief

REPO = Path(__file__).resolve().parents[1]
LEDGER = REPO / "benchmarks" / "results" / "reliability.jsonl"


def expectation(path: Path) -> str:
    for verdict in ("loss", "anomalies"):
        if f"expect: {verdict}" in path.read_text():
            return verdict
    return "clean"


def run_once(path: Path, keep: Path, index: int, platform: str = "local") -> dict:
    """One run of `path` (analysis included); in simulation (`platform` sim) with seed
    `index`, so that each run of an experiment is another interleaving."""
    reference = Reference.measure()
    simulated = ["--platform", "sim", "--seed", str(index)] if platform == "sim" else []
    with tempfile.TemporaryDirectory(prefix="undertow-reliability-") as out:
        load = os.getloadavg()[0]
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "undertow", "run", str(path), "--out", out, "--no-progress",
             *simulated], cwd=REPO, capture_output=True, text=True)
        seconds = time.monotonic() - started
        written = Path(out) / "report.json"
        report = json.loads(written.read_text()) if written.exists() else None
        verdict = report["verdict"] if report else f"error({proc.returncode})"
        explained = (report or {}).get("explained") or {}
        unexplained = explained.get("unexplained")
        mechanisms = sorted({i["mechanism"] for i in explained.get("incidents", [])})
        # The truncation table adds up when its lost column is the lost count: every lost
        # record was cut by a truncation (a loss outside the table is unexplained), but for
        # records behind a hanging transaction, which no truncation took.
        lost = (report or {}).get("counts", {}).get("lost")
        cut_lost = explained.get("truncations_lost")
        behind = sum(i["lost"] for i in explained.get("incidents", [])
                     if i["mechanism"] == "hanging_transaction")
        if proc.returncode != 0 or unexplained or (lost and cut_lost + behind != lost):
            kept = keep / f"{path.stem}-{index}"
            shutil.rmtree(kept, ignore_errors=True)
            shutil.copytree(out, kept, ignore=shutil.ignore_patterns("cluster"))
            (kept / "output.txt").write_text(proc.stdout + proc.stderr)
    reference.finish()
    return {"experiment": path.stem, "platform": platform,
            "expect": expectation(path), "verdict": verdict,
            "seconds": round(seconds, 1), "load_before": round(load, 2), "commit": commit(),
            "t": round(time.time(), 1), "unexplained": unexplained, "mechanisms": mechanisms,
            "lost": lost, "truncations_lost": cut_lost,
            "seed": index if platform == "sim" else None,
            "consumption": consumed((report or {}).get("consumption")),
            "machine": {k: v for k, v in machine().items() if k != "load"},
            "reference": reference.record()}


def consumed(consumption: dict | None) -> dict | None:
    """A run's totals of its report's `consumption` (a consumer group's runs only): the
    seconds partitions went unconsumed and the longest stretch, the records returned again,
    the handovers and the longest pause of one (group_protocols.py compares them)."""
    if not consumption:
        return None
    t = consumption["total"]
    return {"protocol": consumption["group_protocol"], "unconsumed_s": t["unconsumed_s"],
            "longest_s": t["longest_s"] or 0.0, "returned_again": t["returned_again"],
            "handovers": t["handovers"], "longest_pause_s": t["longest_pause_s"] or 0.0}


SIM_SUFFIX = " (sim)"


def _row(experiment: str, platform: str) -> str:
    """The summary's row of an experiment's runs on a platform (older rows: local)."""
    return experiment + (SIM_SUFFIX if platform == "sim" else "")


def summary(ledger: Path, names: list[str], commits: list[str] | None = None) -> str:
    """Per experiment: runs as expected, mean and max seconds, runs under 2 minutes, the
    mean load average they started under, the mean reference loop time around them (of the
    runs that recorded it: the machine's speed their seconds are read against), the
    unexplained anomalous records (summed over the runs that recorded them: runs of analyses
    with loss attribution), the runs with losses whose truncation table adds up to the lost
    count, and the loss mechanisms named; only runs at `commits` (prefixes) if given."""
    runs: dict[str, list[dict]] = defaultdict(list)
    if ledger.exists():
        for line in ledger.read_text().splitlines():
            if line.strip():
                entry = json.loads(line)
                if not commits or any(entry["commit"].startswith(c) for c in commits):
                    runs[_row(entry["experiment"], entry.get("platform", "local"))].append(
                        entry)
    lines = [f"{'experiment':32} {'expect':6} {'as expected':>12} {'mean s':>7} {'max s':>6} "
             f"{'<120 s':>7} {'load':>5} {'ref s':>5} {'unexpl.':>7} {'cuts=lost':>9}  "
             f"other verdicts; "
             f"mechanisms"]
    for name in [_row(n, p) for n in names for p in ("local", "sim")]:
        done = runs.get(name, [])
        if not done and name.endswith(SIM_SUFFIX):
            continue
        if not done:
            lines.append(f"{name:32} (no runs)")
            continue
        matched = sum(r["verdict"] == r["expect"] for r in done)
        seconds = [r["seconds"] for r in done]
        other = sorted({r["verdict"] for r in done if r["verdict"] != r["expect"]})
        quick = sum(s < 120 for s in seconds)
        load = sum(r["load_before"] for r in done) / len(done)
        loops = [reading["loop_s"] for r in done if r.get("reference")
                 for reading in (r["reference"]["start"], r["reference"]["end"]) if reading]
        loop = f"{sum(loops) / len(loops):5.2f}" if loops else f"{'-':>5}"
        explained = [r for r in done if r.get("unexplained") is not None]
        unexplained = (f"{sum(r['unexplained'] for r in explained)}/{len(explained)}"
                       if explained else "-")
        mechanisms = sorted({m for r in explained for m in r.get("mechanisms", [])})
        tallied = [r for r in done if r.get("truncations_lost") is not None and r.get("lost")]
        adds_up = (f"{sum(r['truncations_lost'] == r['lost'] for r in tallied)}/{len(tallied)}"
                   if tallied else "-")
        lines.append(f"{name:32} {done[0]['expect']:6} {matched:>5}/{len(done):<6} "
                     f"{sum(seconds) / len(seconds):7.1f} {max(seconds):6.1f} "
                     f"{quick:>3}/{len(done):<3} {load:5.1f} {loop} {unexplained:>7} {adds_up:>9}  "
                     f"{','.join(other)}; {','.join(mechanisms)}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20, help="runs per experiment")
    parser.add_argument("--only", nargs="*", default=None, help="experiment names (file stems)")
    parser.add_argument("--ledger", type=Path, default=LEDGER)
    parser.add_argument("--summary", action="store_true", help="print the ledger's summary only")
    parser.add_argument("--commits", default=None,
                        help="summary of the runs at these commits only (comma-separated prefixes)")
    parser.add_argument("--jobs", type=int, default=1, help="experiments run at the same time")
    parser.add_argument("--platform", choices=("local", "sim"), default="local",
                        help="local processes, or the simulator (seed = the run's index)")
    parser.add_argument("--keep", type=Path, default=Path("runs/reliability-unexpected"),
                        help="where runs whose verdict was not the expected one are kept")
    args = parser.parse_args()
    files = sorted((REPO / "experiments").glob("*.yaml"))
    if args.only:
        unknown = set(args.only) - {f.stem for f in files}
        if unknown:
            parser.error(f"--only: no experiment named {', '.join(sorted(unknown))}")
        files = [f for f in files if f.stem in args.only]
    names = [f.stem for f in files]
    if not args.summary:
        args.ledger.parent.mkdir(parents=True, exist_ok=True)
        lock = threading.Lock()

        def record(index: int, path: Path) -> None:
            entry = run_once(path, args.keep, index, args.platform)
            with lock, args.ledger.open("a") as ledger:
                ledger.write(json.dumps(entry) + "\n")
                print(f"[{index}/{args.runs}] {entry['experiment']}: {entry['verdict']} "
                      f"(expected {entry['expect']}) in {entry['seconds']} s; "
                      f"{brief(entry['reference'])}", flush=True)

        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            runs = [pool.submit(record, index, path)
                    for index in range(1, args.runs + 1) for path in files]
            for run in runs:
                run.result()
    commits = args.commits.split(",") if args.commits else None
    print(summary(args.ledger, names, commits), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
