"""Time to verdict (issue 21): how long after its experiment ends `undertow run` prints the
verdict, with the analysis started with the run (the default) and without (the analysis in
the runner's process once the run is over: UNDERTOW_ANALYSIS_PRESTART=0).

    .venv/bin/python benchmarks/time_to_verdict.py [FILE] [--rounds N] [--modes prestart,after]
                                                   [--against DIR]

Each round runs FILE (default experiments/acksall-leader-kill.yaml) once per mode, the modes
alternating, and prints per run the seconds from the workload's end (meta.json's
`workload_start` plus the spec's duration) and from the history's close (meta.json's `end`,
written last) to the moment the runner printed the verdict (the history checker's, the first
VERDICT line; `undertow.runner.verdict`), read from its output as it comes, and (*report*)
from the workload's end to the Spark report's summary (the last VERDICT line).
For the pre-started analysis, it also prints what the analysis log says: when its session was
ready, how long the warm-up took, and how long it then waited for the history. Target: the
verdict within 8 s of the workload's end for runs under 100k sends. It also prints the time
from the last send's completion (the last acknowledgement or failure, or the workload's end
if later): sends in flight when the workload ends can take seconds more under faults, and no
verdict can come before their outcome is known, and the whole run's wall time (the price of
the workload's wait for the warm-up). Under each run, where the time after the workload went
(the run's own phase record, timings.json: healing, last sends, recovery, drain, history,
verdict, report; `undertow.runner.phases`), the analysis job's own time from its log, and the load
average when the verdict came; at the end, each phase's median.

`--against DIR` runs each mode a second time in each round from another checkout (a `git
worktree` of the commit before a change), interleaved with this one's runs: a side-by-side
comparison on one machine. The machine (CPU model, cores, memory, load) is printed first, with
the reference loop's time (reference.py), and that time again at the end; the seconds are not
scaled to it, as they mix the machine's work with fixed waits (in-flight sends' timeouts).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ledger import commit, machine_line
from reference import Reference

from undertow.runner.phases import PHASES
from undertow.runner.phases import read as read_phases
from undertow.spec import parse_duration

REPO = Path(__file__).resolve().parents[1]
MODES = {"prestart": "1", "after": "0"}
PRESTART_LOG = re.compile(r"warmed up in ([\d.]+) s|history closed after ([\d.]+) s"
                          r"|analysed in ([\d.]+) s")


def run_once(experiment: Path, mode: str, checkout: Path = REPO) -> dict:
    """One `undertow run` of `checkout`'s code, its verdict line timestamped as the runner
    prints it."""
    with tempfile.TemporaryDirectory(prefix="undertow-ttv-") as tmp:
        out = Path(tmp) / "out"
        load = os.getloadavg()[0]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "UNDERTOW_ANALYSIS_PRESTART": MODES[mode]}
        if checkout != REPO:  # its packages ahead of the installed ones, in every process
            env["PYTHONPATH"] = os.pathsep.join(
                str(checkout / d) for d in ("operator", "analysis", "broker-image"))
        started = time.time()
        proc = subprocess.Popen(
            [sys.executable, "-m", "undertow", "run", str(experiment), "--out", str(out),
             "--no-progress"],
            cwd=checkout, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        verdict_at, report_at, output, load_at_verdict = None, None, [], None
        for line in proc.stdout:
            output.append(line)
            if line.startswith("VERDICT:"):  # the history checker's, then the report's
                if verdict_at is None:
                    verdict_at, load_at_verdict = time.time(), os.getloadavg()[0]
                report_at = time.time()
        if proc.wait() not in (0, 1) or verdict_at is None:
            raise RuntimeError(f"undertow run failed ({proc.returncode}):\n{''.join(output)}")
        meta = json.loads((out / "history" / "meta.json").read_text())
        report = json.loads((out / "report.json").read_text())
        log = out / "analysis.log"
        warm_up = waited = job = None
        for match in PRESTART_LOG.finditer(log.read_text() if log.exists() else ""):
            warm_up = float(match[1]) if match[1] else warm_up
            waited = float(match[2]) if match[2] else waited
            job = float(match[3]) if match[3] else job
        phases = read_phases(out)  # None from a checkout that does not time its phases
        last_send = max(json.loads(line)["t_complete"]
                        for line in (out / "history" / "sends.jsonl").open())
    workload_end = meta["workload_start"] + parse_duration(meta["spec"]["workload"]["duration"])
    return {"mode": mode if checkout == REPO else f"{mode}@{checkout.name}",
            "verdict": report["verdict"], "sends": report["counts"]["attempted"],
            "run_s": round(verdict_at - started, 1),
            "after_workload_s": round(verdict_at - workload_end, 1),
            "report_s": round(report_at - workload_end, 1),
            "after_last_send_s": round(verdict_at - max(last_send, workload_end), 1),
            "after_close_s": round(verdict_at - meta["end"], 1),
            "warm_up_s": warm_up, "waited_s": waited, "job_s": job,
            "phases": phases["phases"] if phases else None,
            "load": round(load, 2), "load_at_verdict": round(load_at_verdict or load, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiment", nargs="?", type=Path,
                        default=REPO / "experiments" / "acksall-leader-kill.yaml")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--modes", default="prestart,after",
                        help="comma-separated, in the order each round runs them")
    parser.add_argument("--against", type=Path, metavar="DIR",
                        help="another checkout whose runs alternate with this one's")
    args = parser.parse_args()
    modes = args.modes.split(",")
    unknown = set(modes) - MODES.keys()
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}; modes are {sorted(MODES)}")
    print(f"commit {commit()}, {time.strftime('%Y-%m-%d %H:%M:%S')}; seconds to the verdict")
    print(machine_line())
    reference = Reference.measure()
    print(reference.start_line())
    print(f"{'mode':<20} {'verdict':<7} {'sends':>7} {'from workload end':>18} "
          f"{'from last send':>15} {'from history close':>19} {'warm-up':>8} {'waited':>7} "
          f"{'run':>6} {'load':>5} {'report':>7}")
    checkouts = [REPO] + ([args.against.resolve()] if args.against else [])
    rows = []
    for _ in range(args.rounds):
        for mode in modes:
            for checkout in checkouts:
                row = run_once(args.experiment, mode, checkout)
                rows.append(row)
                print(f"{row['mode']:<20} {row['verdict']:<7} {row['sends']:>7} "
                      f"{row['after_workload_s']:>18} {row['after_last_send_s']:>15} "
                      f"{row['after_close_s']:>19} "
                      f"{_blank(row['warm_up_s']):>8} {_blank(row['waited_s']):>7} "
                      f"{row['run_s']:>6} {row['load']:>5} {row['report_s']:>7}", flush=True)
                print(f"{'':<20} {_phases_line(row)}", flush=True)
    for mode in dict.fromkeys(r["mode"] for r in rows):
        times = [r["after_workload_s"] for r in rows if r["mode"] == mode]
        sends = [r["after_last_send_s"] for r in rows if r["mode"] == mode]
        runs = [r["run_s"] for r in rows if r["mode"] == mode]
        reports = [r["report_s"] for r in rows if r["mode"] == mode]
        print(f"{mode}: from the workload's end, median {statistics.median(times):.1f} s "
              f"(range {min(times)}-{max(times)}, {len(times)} runs); from the last send "
              f"{statistics.median(sends):.1f} s ({min(sends)}-{max(sends)}); the Spark "
              f"report {statistics.median(reports):.1f} s ({min(reports)}-{max(reports)}); "
              f"whole run {statistics.median(runs):.1f} s")
        timed = [r["phases"] for r in rows if r["mode"] == mode and r["phases"]]
        if timed:
            medians = {p: statistics.median(t.get(p, 0.0) for t in timed) for p in PHASES
                       if any(p in t for t in timed)}
            print(f"{mode}: median per phase after the workload: "
                  + ", ".join(f"{p} {s:.1f} s" for p, s in medians.items()))
    print(reference.finish().end_line())


def _phases_line(row: dict) -> str:
    """Where the run's time after the workload went (its timings.json), with the analysis's
    own job time (analysis.log) and the load average when the verdict came."""
    phases = row["phases"]
    if not phases:
        return f"(no phase record) load at the verdict {row['load_at_verdict']}"
    job = "" if row["job_s"] is None else f" (its job {row['job_s']} s)"
    return ("phases: " + ", ".join(f"{p} {s:.1f} s" for p, s in phases.items()) + job
            + f"; load at the verdict {row['load_at_verdict']}")


def _blank(value: float | None) -> str:
    return "-" if value is None else f"{value}"


if __name__ == "__main__":
    main()
