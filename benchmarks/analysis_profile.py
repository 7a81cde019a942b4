"""Where the analysis spends its CPU: one run of the job on a history, in a fresh driver JVM.

Prints the wall time, the JVM's CPU by thread kind (Spark task threads, JIT compiler, GC,
other; read from /proc, so it includes what Spark's own metrics leave out) and the executor CPU
of every stage that took any (Spark's REST API). Extra Spark settings compare configurations:

    .venv/bin/python benchmarks/analysis_profile.py HISTORY [--conf KEY=VALUE ...]

Timings on a shared machine drift by 10-15 % within an hour: compare configurations in runs
taken side by side. The wall time is also given scaled to the reference machine, with the
reference loop's time before the job and after it (reference.py). Generate a history with
`benchmarks/analysis_scale.py --keep` (or `write_scaled_history` of
`benchmarks/scaled_history.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
import urllib.request
from collections import Counter

from reference import AT, Reference

from undertow_analysis.job import analyze
from undertow_analysis.session import spark_session

UI_PORT = "4097"


def _thread_kind(name: str) -> str:
    if name.startswith("Executor task"):
        return "task"
    if "Compiler" in name:
        return "jit"
    if "GC" in name or re.match(r"G1 ", name) or name == "VM Thread":
        return "gc"
    return "other"


def jvm_cpu_by_thread_kind(pid: int) -> Counter[str]:
    """CPU seconds of the live threads of a JVM, summed by kind."""
    tick, cpu = os.sysconf("SC_CLK_TCK"), Counter[str]()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        cpu[_thread_kind(name)] += (int(fields[11]) + int(fields[12])) / tick
    return cpu


def stage_cpu() -> list[tuple[int, int, float, str]]:
    """(stage id, tasks, executor CPU seconds, name) of every completed stage."""
    base = f"http://127.0.0.1:{UI_PORT}/api/v1/applications"
    with urllib.request.urlopen(base) as r:
        app = json.load(r)[0]["id"]
    with urllib.request.urlopen(f"{base}/{app}/stages?status=complete") as r:
        stages = json.load(r)
    return sorted((s["stageId"], s["numTasks"], s["executorCpuTime"] / 1e9, s["name"])
                  for s in stages)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("history")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--driver-memory", default="4g")
    args = p.parse_args(argv)
    conf = {"spark.driver.memory": args.driver_memory, "spark.ui.enabled": "true",
            "spark.ui.port": UI_PORT, **dict(c.split("=", 1) for c in args.conf)}
    reference = Reference.measure()
    print(reference.start_line(), flush=True)
    spark, _ = spark_session("local[*]", conf)
    spark.sparkContext.setLogLevel("ERROR")
    pid = spark.sparkContext._gateway.proc.pid
    out = tempfile.mkdtemp(prefix="undertow-profile-")
    try:
        start = time.monotonic()
        result = analyze(spark, args.history, out)
        wall = time.monotonic() - start
        cpu = jvm_cpu_by_thread_kind(pid)
        stages = stage_cpu()
    finally:
        spark.stop()
        shutil.rmtree(out, ignore_errors=True)
    print(f"verdict {result['verdict']}, {result['counts']['attempted']:,} sends attempted")
    split = ", ".join(f"{kind} {seconds:.1f}" for kind, seconds in sorted(cpu.items()))
    print(f"wall {wall:.1f} s ({reference.duration(wall):.1f} s {AT}); JVM CPU s: {split}")
    for stage, tasks, seconds, name in stages:
        if seconds >= 0.05:
            print(f"  stage {stage:3} {tasks:4} tasks {seconds:7.1f} CPU s  {name[:60]}")
    print(reference.finish().end_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
