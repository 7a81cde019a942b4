"""A local Spark session's start with and without Spark's class-data-sharing archive
(`undertow_analysis.class_archive`, made by `make install`), side by side.

Each round starts two processes, one after the other: a session with the tests' settings
(`local[2]`, a small run's JVM) followed by one analysis of the warm-up's tiny history, one
process with the archive and one without (`UNDERTOW_CLASS_ARCHIVE_DIR` pointed at an empty
directory). Each prints when its session was ready and when its analysis was done, in wall
seconds from the start and in its JVM's CPU seconds (from /proc: the JVM is not a child the
process waits for).

    .venv/bin/python benchmarks/class_archive.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from reference import Reference

from undertow_analysis import class_archive


def _jvm_cpu_s(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure() -> None:
    """In the child: the session, then one analysis; one JSON line on stdout."""
    from pyspark.sql import SparkSession

    from undertow_analysis import job, session, warmup

    started = time.monotonic()
    builder = SparkSession.builder.master("local[2]").appName("class-archive-bench")
    conf = session.session_conf("local[2]", {"spark.ui.enabled": "false"},
                                planned_sends=session.SMALL_RUN_SENDS)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    ready = {"ready_s": time.monotonic() - started, "ready_cpu_s": _jvm_cpu_s(pid)}
    warmup.warm_up(spark, None, job.analyze)
    print(json.dumps({**ready, "done_s": time.monotonic() - started,
                      "done_cpu_s": _jvm_cpu_s(pid)}))
    spark.stop()


def run(with_archive: bool, empty: str) -> dict[str, float]:
    env = dict(os.environ)
    if not with_archive:
        env[class_archive.ENV_DIRECTORY] = empty
    out = subprocess.run([sys.executable, __file__, "--child"], env=env, check=True,
                         capture_output=True, text=True, timeout=600).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        measure()
        return 0
    if not class_archive.archive_path().is_file():
        print(f"no archive at {class_archive.archive_path()}: "
              f"python -m undertow_analysis.class_archive makes it", file=sys.stderr)
        return 2
    reference = Reference.measure()
    print(reference.start_line(), flush=True)
    print("| archive | session ready (wall s) | JVM CPU s then | first analysis done "
          "(wall s from the start) | JVM CPU s then |\n|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as empty:
        for _ in range(args.rounds):
            for with_archive in (True, False):
                r = run(with_archive, empty)
                print(f"| {'yes' if with_archive else 'no'} | {r['ready_s']:.2f} | "
                      f"{r['ready_cpu_s']:.2f} | {r['done_s']:.2f} | {r['done_cpu_s']:.2f} |",
                      flush=True)
    print(reference.finish().end_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
