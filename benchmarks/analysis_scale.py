"""How the loss analysis scales: synthetic histories of 1M, 5M and 20M sends.

Each history has a run read and a drain read per healthy record (about 3 lines per send) and
anomalies of every kind planted every 10,007 sends. For each size: write it (numpy, fixed-width
lines), run `python -m undertow_analysis` in its own process (a fresh driver JVM), check its
counts against the planted ones, and print history lines per second and the driver's peak
memory (RSS of the Python driver plus its JVM, sampled every 100 ms). The data is deleted
afterwards unless --keep.

With --compare-events each history is analysed again without its events.jsonl, then once
more with it (with, without, with: a drift of the machine's speed does not favour either):
the loss attribution (the events joined with the anomalies, and each truncation with the
acknowledged sends in the one pass over the history) must cost at most 10 % more time than
the analysis without it, the mean of the two runs with events against the one without.

With --group the run's consumers are a consumer group (`subscribe` mode): the run reads carry
a generation and groups.jsonl holds the members' assignments and commits, so the job runs the
consumer group's checks too (one more scan of reads.jsonl and a shuffle of the run reads).

    .venv/bin/python benchmarks/analysis_scale.py [--sizes 1000000,5000000] [--dir /tmp/x]
                                                  [--compare-events] [--group]

Lines per second are also given scaled to the reference machine (column @1.47s), and the
reference loop's time at the start and the end of the run is printed and goes into every row
of the JSON list (reference.py).
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
from pathlib import Path

from reference import AT, Reference
from scaled_history import write_scaled_history

PAGE = os.sysconf("SC_PAGE_SIZE")


def _tree_rss(root: int) -> int:
    """Resident bytes of a process and all its descendants."""
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * PAGE
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    stack += [int(c) for c in f.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def _run_job(history: Path, out: Path, conf: list[str]) -> tuple[float, int, str]:
    """Wall seconds, peak RSS of the driver tree, stdout."""
    cmd = [sys.executable, "-m", "undertow_analysis", str(history), "--out", str(out)]
    for c in conf:
        cmd += ["--conf", c]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    peak, done = 0, threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.1):
            peak = max(peak, _tree_rss(proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, _ = proc.communicate()
    elapsed = time.monotonic() - start
    done.set()
    sampler.join()
    if proc.returncode:
        raise SystemExit(f"analysis of {history} failed with exit {proc.returncode}:\n{stdout}")
    return elapsed, peak, stdout


def _lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 24), b""))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1000000,5000000,20000000",
                   help="comma-separated numbers of sends")
    p.add_argument("--dir", default=None, help="scratch directory (default: a new temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the generated histories")
    p.add_argument("--driver-memory", default="4g")
    p.add_argument("--compare-events", action="store_true",
                   help="also analyse each history without events.jsonl and print the cost")
    p.add_argument("--group", action="store_true",
                   help="histories of a consumer group's run (groups.jsonl, generations)")
    args = p.parse_args(argv)
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="undertow-scale-"))
    conf = [f"spark.driver.memory={args.driver_memory}"]
    rows = []
    reference = Reference.measure()
    print(reference.start_line())
    print(f"{'sends':>11} {'lines':>12} {'generate s':>10} {'analyse s':>9} "
          f"{'lines/s':>10} {AT:>10} {'sends/s':>9} {'peak RSS':>9}  counts")
    for n in (int(s) for s in args.sizes.split(",")):
        history, out = scratch / f"history-{n}", scratch / f"out-{n}"
        start = time.monotonic()
        expected = write_scaled_history(history, n, group=args.group)
        generated = time.monotonic() - start
        os.sync()  # the first analysis must not read while the history's pages are written back
        lines = _lines(history / "sends.jsonl") + _lines(history / "reads.jsonl")
        elapsed, peak, _ = _run_job(history, out, conf)
        counts = json.loads((out / "report.json").read_text())["counts"]
        ok = "as planted" if counts == expected else f"MISMATCH {counts} != {expected}"
        rows.append({"sends": n, "lines": lines, "generate_s": round(generated, 1),
                     "analyse_s": round(elapsed, 1), "lines_per_s": round(lines / elapsed),
                     "peak_rss_mib": round(peak / 2**20)})
        print(f"{n:>11,} {lines:>12,} {generated:>10.1f} {elapsed:>9.1f} "
              f"{lines / elapsed:>10,.0f} {reference.rate(lines / elapsed):>10,.0f} "
              f"{n / elapsed:>9,.0f} {peak / 2**20:>6,.0f} MiB  {ok}",
              flush=True)
        if args.compare_events:
            (history / "events.jsonl").rename(scratch / "events.jsonl")
            without, _, _ = _run_job(history, scratch / f"out-{n}-no-events", conf)
            (scratch / "events.jsonl").rename(history / "events.jsonl")
            shutil.rmtree(scratch / f"out-{n}-no-events")
            again, _, _ = _run_job(history, scratch / f"out-{n}-again", conf)
            shutil.rmtree(scratch / f"out-{n}-again")
            rows[-1].update(without_events_s=round(without, 1), again_s=round(again, 1))
            with_events = (elapsed + again) / 2
            print(f"{'':>11} without events.jsonl {without:.1f} s, with it again {again:.1f} s:"
                  f" the attribution costs {(with_events / without - 1):+.1%}", flush=True)
        if not args.keep:
            shutil.rmtree(history)
            shutil.rmtree(out)
    if not args.keep and args.dir is None:
        shutil.rmtree(scratch)
    print(reference.finish().end_line())
    print(json.dumps([{**row, "reference": reference.record()} for row in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
