"""What the loss analysis cannot go below: the cost of reading the history with Spark.

Runs, each in its own process (a fresh driver JVM, as `undertow analyze` runs), four levels of
the job on one history and prints their wall times:

- session: start and stop the Spark session the job uses;
- parse:   + parse sends.jsonl and reads.jsonl with their schemas and line checks (Spark's
           JSON source), to a no-op sink;
- shuffle: + the narrow event rows and the one shuffle by value the checks read (`checks.events`,
           `checks.by_value`), to a no-op sink;
- job:     the whole job, `python -m undertow_analysis HISTORY --out DIR`.

The differences say what each part costs: parse - session is Spark's JSON reader, job - shuffle
is every check and the report. Levels alternate round by round, because this machine's speed
drifts by 10-25 % within minutes. The medians are also given scaled to the reference machine
(reference.py), and the reference loop's time at the start and the end goes with them (and
into the ledger's row with --record).

    .venv/bin/python benchmarks/analysis_floor.py HISTORY [--rounds 2] [--record]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from ledger import commit, machine
from reference import AT, Reference

LEVELS = ("session", "parse", "shuffle", "job")
RESULTS = Path(__file__).parent / "results" / "analysis_floor.jsonl"
DRIVER_MEMORY = "4g"


def run_level(history: str, level: str) -> None:
    """The body of one level, in this process."""
    from pyspark.sql import functions as F

    from undertow_analysis import checks
    from undertow_analysis.io import read_history
    from undertow_analysis.session import spark_session

    spark, _ = spark_session("local[*]", {"spark.driver.memory": DRIVER_MEMORY})
    try:
        if level == "session":
            return
        h = read_history(spark, history)
        sends, reads = h.lines("sends"), h.lines("reads")
        if level == "parse":
            # A hash of every column, so none is pruned from the parse.
            df = sends.select(F.hash(*sends.columns).alias("h")).unionByName(
                reads.select(F.hash(*reads.columns).alias("h")))
        else:
            df = checks.by_value(checks.events(sends, reads))
        df.write.format("noop").mode("overwrite").save()
    finally:
        spark.stop()


def timed(history: str, level: str) -> float:
    """Wall seconds of one level in a fresh process."""
    with tempfile.TemporaryDirectory(prefix="undertow-floor-") as out:
        cmd = ([sys.executable, "-m", "undertow_analysis", history, "--out", out,
                "--conf", f"spark.driver.memory={DRIVER_MEMORY}"] if level == "job"
               else [sys.executable, __file__, history, "--level", level])
        start = time.monotonic()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("history")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--level", choices=LEVELS, help=argparse.SUPPRESS)  # a child process
    p.add_argument("--record", action="store_true", help=f"append the medians to {RESULTS}")
    args = p.parse_args(argv)
    if args.level:
        run_level(args.history, args.level)
        return 0
    reference = Reference.measure()
    print(reference.start_line(), flush=True)
    times: dict[str, list[float]] = {level: [] for level in LEVELS}
    for round_ in range(args.rounds):
        for level in LEVELS:
            times[level].append(timed(args.history, level))
            print(f"round {round_ + 1}: {level:8} {times[level][-1]:7.1f} s", flush=True)
    median = {level: round(statistics.median(ts), 1) for level, ts in times.items()}
    print(f"\n{'level':8} {'median s':>9} {AT:>9}  {'of the job':>10}")
    for level in LEVELS:
        print(f"{level:8} {median[level]:9.1f} {reference.duration(median[level]):9.1f}  "
              f"{median[level] / median['job']:10.0%}")
    print(f"\nJSON reader (parse - session): {median['parse'] - median['session']:.1f} s; "
          f"checks and report (job - shuffle): {median['job'] - median['shuffle']:.1f} s")
    print(reference.finish().end_line())
    if args.record:
        sizes = {name: (Path(args.history) / f"{name}.jsonl").stat().st_size
                 for name in ("sends", "reads")}
        row = {"history_bytes": sizes, "rounds": args.rounds,
               **{f"{k}_s": v for k, v in median.items()},
               "commit": commit(), "date": date.today().isoformat(), "machine": machine(),
               "reference": reference.record()}
        with RESULTS.open("a") as f:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
