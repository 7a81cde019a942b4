"""The command line of the analysis job (`undertow analyze` passes its arguments on):

    python -m undertow_analysis HISTORY --out DIR [--master URL] [--conf KEY=VALUE ...]
                                [--allow-incomplete]
    spark-submit analysis/undertow_analysis/__main__.py HISTORY --out DIR
    python -m undertow_analysis HISTORY --out DIR --wait SECONDS [--planned-sends N]
                                [--warm-file PATH] [--lifeline]
                                                  (started before the run ends: prestart.py)
"""

import os
import sys

if not __package__:
    # Run as a file (spark-submit): Python put this directory first on sys.path, where io.py
    # and html.py would shadow the standard library. Import the package from its parent.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [os.path.dirname(here)] + [p for p in sys.path if os.path.abspath(p) != here]

import argparse
from collections.abc import Sequence
from pathlib import Path

from undertow_analysis.precheck import check_history


def _conf(pairs: Sequence[str]) -> dict[str, str]:
    conf = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--conf expects KEY=VALUE, got {pair!r}")
        conf[key] = value
    return conf


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="undertow-analysis",
        description="Check a history for lost acknowledged records and write the loss report.")
    p.add_argument("history", help="history directory (any URI Spark reads: file://, s3a://, "
                                   "hdfs://, or a local path)")
    p.add_argument("--out", required=True, help="output directory for report.json, "
                                                "report.html and anomalies/ (any URI)")
    p.add_argument("--master", default=None,
                   help="Spark master (default local[*]; under spark-submit, its --master)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Spark configuration, repeatable")
    p.add_argument("--allow-incomplete", action="store_true",
                   help="analyse a history that meta.json marks incomplete (a failure stopped "
                        "the run); the report says so")
    p.add_argument("--wait", type=float, metavar="SECONDS",
                   help="start Spark at once and analyse the history when the run writing it "
                        "closes it (meta.json's end set), waiting at most SECONDS")
    p.add_argument("--planned-sends", type=int, metavar="N",
                   help="how many sends the run planned (with --wait): the JVM of a small "
                        "run is set up for a small job")
    p.add_argument("--warm-file", metavar="PATH",
                   help="(with --wait) create PATH once the session is ready and warmed up, "
                        "for the run to start its workload then")
    p.add_argument("--lifeline", action="store_true",
                   help="stdin is a pipe from the process that started this one: exit as soon "
                        "as it closes (that process is gone or gave up the run)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: exit 0 whatever the verdict (the verdict is in the report), 2 on bad
    input, an incomplete history among them unless --allow-incomplete."""
    args = parser().parse_args(argv)
    if args.wait is None:  # else the run is still writing it (prestart)
        try:
            check_history(args.history)
        except (FileNotFoundError, ValueError) as e:
            print(f"undertow analyze: {e}", file=sys.stderr)
            return 2
    # PySpark only now: a history refused above is refused in well under a second.
    from undertow_analysis import prestart
    from undertow_analysis.job import run_analysis
    from undertow_analysis.session import SPARK_LOG, SparkDidNotStart

    if args.lifeline:
        prestart.watch_lifeline()
    under_spark_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    master = args.master or (None if under_spark_submit else "local[*]")
    # The JVM's console goes to OUT/spark.log, not between the lines of this command's own
    # output; a run's analysis (--wait) writes everything to the run's analysis.log already.
    jvm_log = None if args.wait is not None or "://" in args.out \
        else Path(args.out) / SPARK_LOG
    try:
        run_analysis(args.history, args.out, master, _conf(args.conf),
                     allow_incomplete=args.allow_incomplete, wait=args.wait,
                     planned_sends=args.planned_sends, warm_file=args.warm_file,
                     jvm_log=jvm_log)
    except (FileNotFoundError, ValueError, prestart.HistoryNotClosed,
            SparkDidNotStart) as e:
        print(f"undertow analyze: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
