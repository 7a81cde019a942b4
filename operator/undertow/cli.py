"""``undertow``: run chaos experiments and analyse their histories.

    undertow run FILE [--out DIR] [--seed N] [--platform local|sim|kube] [--network proxy|netns]
    undertow analyze HISTORY_DIR --out DIR [--master URL] [--allow-incomplete]
    undertow explore FILE [--runs N] [--master URL] [--confirm K] [--out DIR]
    undertow explore FILE --matrix [--per-cell N] [--master URL] [--out DIR]
    undertow validate FILE [FILE ...]
    undertow plan FILE [--seed N]
    undertow describe --bootstrap HOST:PORT [--topic T ...]

``run`` starts its analysis with the run, so that Spark is up when the history is closed
(`undertow.runner.analysis_process`; UNDERTOW_ANALYSIS_PRESTART=0 analyses in the runner's
own process afterwards instead); the verdict comes first from the history checker, the
moment the history closes, and the Spark report must agree with it
(`undertow.runner.verdict`). It exits 0 when the verdict matches the experiment's
``expect``, 1 when it does not, and 2 on bad input or an error (the report and the checker
disagreeing among them). An error is one line on
stderr, whichever thread of the run it happened in (a history file that could not be
written, above all); tracebacks are logged at ``--log-level DEBUG`` only. ``explore``
stopped by Ctrl-C (SIGINT) writes the best schedule each shrink had found so far and exits
130, as a shell reports a command that SIGINT ended (128 + 2).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from undertow.runner.abort import RunAborted
from undertow.spec import LoadedExperiment, SpecError, choose_seed, load_experiment, plan
from undertow.spec.errors import format_loc
from undertow.spec.experiment import check_simulated_clients, check_stock_clients
from undertow.spec.meta import FieldError

EXIT_AS_EXPECTED, EXIT_UNEXPECTED, EXIT_ERROR = 0, 1, 2
EXIT_INTERRUPTED = 130
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class OneLineLogs(logging.Formatter):
    """A logged exception as its type and message at the end of the record's line; its
    traceback only when `tracebacks` (--log-level DEBUG). A run that fails says why in one
    line, not in tracebacks from its threads (issue 22)."""

    def __init__(self, fmt: str, *, tracebacks: bool) -> None:
        super().__init__(fmt)
        self._tracebacks = tracebacks

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info is None or self._tracebacks:
            return super().format(record)
        error = record.exc_info[1]
        plain = logging.makeLogRecord({**record.__dict__, "exc_info": None, "exc_text": None})
        return f"{super().format(plain)}: {type(error).__name__}: {error}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="undertow", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log-level", default="WARNING")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run an experiment locally and report its verdict")
    run.add_argument("file", type=Path)
    run.add_argument("--cluster-file", type=Path, action="append", default=[],
                     help="more files holding the BrokerCluster the experiment refers to")
    run.add_argument("--out", type=Path, help="output directory (default: runs/NAME-TIME)")
    run.add_argument("--seed", type=int, help="seed of the random fault schedule")
    run.add_argument("--platform", choices=("local", "sim", "kube"), default="local",
                     help="local processes (default), deterministic simulation in virtual "
                          "time (the same seed gives the same history), or the experiment's "
                          "BrokerCluster deployed by the operator (from where its pods' "
                          "service names resolve: a pod of the cluster, as the runner Job)")
    run.add_argument("--namespace", default="undertow",
                     help="--platform kube: the BrokerCluster's namespace (default: undertow, "
                          "the one the operator's installs watch)")
    run.add_argument("--network", choices=("proxy", "netns"), default="proxy",
                     help="partitions through per-link TCP proxies (default) or netns+iptables "
                          "(root)")
    run.add_argument("--no-analysis", action="store_true",
                     help="stop after writing the history")
    run.add_argument("--no-progress", action="store_true", help="no live progress display")

    analyze = sub.add_parser("analyze", help="check a history with the Spark job")
    analyze.add_argument("history")
    analyze.add_argument("--out", required=True)
    analyze.add_argument("--master", default=None)
    analyze.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    analyze.add_argument("--allow-incomplete", action="store_true",
                         help="analyse a history that meta.json marks incomplete (a run stopped "
                              "by a failure); the report says so")

    explore = sub.add_parser(
        "explore", help="run many fault schedules in simulation on Spark, shrink each loss to "
                        "a minimal experiment")
    explore.add_argument("file", type=Path)
    explore.add_argument("--runs", type=int, default=200, help="schedules to draw (default 200)")
    explore.add_argument("--master", default=None,
                         help="Spark master (default local[*]: every core of this machine)")
    explore.add_argument("--seed", type=int, default=1, help="the first schedule's seed")
    explore.add_argument("--confirm", type=int, default=0, metavar="K",
                         help="run each minimal experiment K times on local processes")
    explore.add_argument("--out", type=Path,
                         help="output directory (default: runs/explore-NAME-TIME)")
    explore.add_argument("--matrix", action="store_true",
                         help="sweep acks x min.insync.replicas x unclean election x fsync x "
                              "rule set against each fault class, --per-cell schedules each")
    explore.add_argument("--per-cell", type=int, default=20, metavar="N",
                         help="--matrix: schedules per cell (default 20)")

    validate = sub.add_parser("validate", help="validate experiment files")
    validate.add_argument("files", type=Path, nargs="+")

    show = sub.add_parser("plan", help="print the fault schedule an experiment and seed give")
    show.add_argument("file", type=Path)
    show.add_argument("--seed", type=int)

    describe = sub.add_parser(
        "describe", help="leader, leader epoch, ISR and high watermark of any Kafka's partitions, "
                         "as its protocol reports them")
    describe.add_argument("--bootstrap", required=True, metavar="HOST:PORT")
    describe.add_argument("--topic", action="append", metavar="T",
                          help="only these topics (default: all but internal ones)")
    return parser


def _analysis(history: Path, out: Path) -> dict:
    from undertow_analysis.job import run_analysis
    from undertow_analysis.session import SPARK_LOG

    return run_analysis(str(history.resolve()), str(out.resolve()), jvm_log=out / SPARK_LOG)


@contextmanager
def _analyzer(args: argparse.Namespace, loaded: LoadedExperiment, out: Path
              ) -> Iterator[tuple[Callable[[Path, Path], dict] | None, Callable[[], None]]]:
    """How the run is analysed, and what its workload waits for: not at all
    (--no-analysis); by a process started now, which starts Spark and warms it up while the
    cluster starts, the workload waiting for it (`analysis_process`); or, with
    UNDERTOW_ANALYSIS_PRESTART=0, in this process once the run is over."""
    from undertow.runner.analysis_process import AnalysisProcess, prestart_enabled

    if args.no_analysis:
        yield None, lambda: None
    elif not prestart_enabled():
        yield _analysis, lambda: None
    else:
        with AnalysisProcess.start(out / "history", out, loaded) as process:
            def warm() -> None:
                waited = process.wait_until_warm()
                if waited is None:
                    logging.getLogger("undertow").warning(
                        "the analysis did not warm up in time; starting the workload anyway "
                        "(the verdict will take longer)")
                else:
                    logging.getLogger("undertow").info(
                        "analysis warmed up; the workload starts (waited %.1f s)", waited)

            yield process.result, warm


def cmd_run(args: argparse.Namespace) -> int:
    from undertow.platform.base import Platform, PlatformError
    from undertow.platform.local import LocalPlatform, LocalPlatformConfig
    from undertow.runner.phases import summary_line
    from undertow.runner.preflight import InsufficientSpace, check_free_space, estimate
    from undertow.runner.progress import Progress
    from undertow.runner.run import run_experiment
    from undertow.sim.world import simulated_platform

    loaded = load_experiment(args.file, args.cluster_file)
    try:
        (check_simulated_clients if args.platform == "sim" else check_stock_clients)(
            loaded.experiment.spec)
    except FieldError as exc:
        raise SpecError(exc.message, source=str(args.file),
                        path=format_loc(("spec", *exc.loc))) from None
    name = loaded.experiment.metadata.name
    out = args.out or Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if (out / "history").exists() and any((out / "history").iterdir()):
        print(f"undertow: {out} already holds a history; choose another --out",
              file=sys.stderr)
        return EXIT_ERROR
    try:  # the local cluster's logs and the history share --out's file system
        check_free_space(out, estimate(loaded.experiment.spec))
    except InsufficientSpace as exc:
        print(f"undertow: {exc}", file=sys.stderr)
        return EXIT_ERROR
    out.mkdir(parents=True, exist_ok=True)
    seed = choose_seed(loaded.experiment.spec) if args.seed is None else args.seed
    if args.platform == "sim":
        platform: Platform = simulated_platform(loaded, out / "cluster", seed)
    elif args.platform == "kube":
        from undertow.kube.platform import KubernetesPlatform

        try:
            platform = KubernetesPlatform.for_experiment(loaded, args.namespace)
        except PlatformError as exc:
            print(f"undertow: {exc}", file=sys.stderr)
            return EXIT_ERROR
    else:
        cluster = loaded.cluster.spec
        config = cluster.config.as_overrides()
        platform = LocalPlatform(LocalPlatformConfig(
            workdir=out / "cluster", brokers=cluster.brokers, network=args.network,
            broker_config=config, controller_config=config,
            ephemeral_storage=cluster.storage.type == "ephemeral",
            clients=loaded.experiment.spec.own_link_clients()))
    # The verdict is printed inside: leaving waits for the analysis's JVM to exit.
    with _analyzer(args, loaded, out) as (analyze, warmed_up):
        # In simulation the workload takes seconds of CPU, not its duration of wall time:
        # it does not wait for the warm-up, which has nothing to compete with for long.
        before_workload = warmed_up if args.platform == "local" else (lambda: None)
        with Progress(enabled=not args.no_progress, live=sys.stdout.isatty()) as progress:
            result = run_experiment(loaded, platform, out, seed=seed, analyze=analyze,
                                    on_progress=progress, before_workload=before_workload)
        if result.timings is not None:
            print(summary_line(result.timings), flush=True)
        if result.verdict is None:
            print(f"History written to {result.history_dir} (analysis skipped).")
            return EXIT_AS_EXPECTED
        code = _verdict(result.report or {}, loaded, out)
        return EXIT_ERROR if result.disagreement else code


def _verdict(report: dict, loaded: LoadedExperiment, out: Path) -> int:
    """The last line; exit 1 also when the verdict is the expected one but a planned fault
    was not injected: the run did not test the experiment, and CI must not pass it."""
    from undertow_history.checker import as_expected

    expect = loaded.experiment.spec.expect
    skipped = report.get("faults_skipped") or []
    passed = as_expected(report["verdict"], expect, skipped)
    outcome = "as expected" if passed else (
        f"NOT as expected: {len(skipped)} planned fault(s) not injected" if skipped
        else "NOT as expected")
    print(f"\nVerdict: {report['verdict']} (expected {expect}: {outcome}). "
          f"Report: {out / 'report.html'}", flush=True)
    return EXIT_AS_EXPECTED if passed else EXIT_UNEXPECTED


def cmd_explore(args: argparse.Namespace) -> int:
    from undertow.explore.command import Interrupted, explore

    if args.runs < 1 or args.confirm < 0:
        print("undertow: --runs must be at least 1 and --confirm at least 0", file=sys.stderr)
        return EXIT_ERROR
    loaded = load_experiment(args.file)
    try:
        check_simulated_clients(loaded.experiment.spec)
    except FieldError as exc:
        raise SpecError(exc.message, source=str(args.file),
                        path=format_loc(("spec", *exc.loc))) from None
    name = loaded.experiment.metadata.name
    out = args.out or Path("runs") / f"explore-{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if args.matrix:
        return _explore_matrix(args, loaded, out)
    try:
        exploration = explore(loaded, out, runs=args.runs, master=args.master,
                              first_seed=args.seed, confirm=args.confirm,
                              on_progress=lambda line: print(line, flush=True))
    except Interrupted as stop:
        print(f"\nundertow: explore stopped (Ctrl-C) while {stop.stage}", flush=True)
        if stop.exploration is not None:
            _explore_summary(stop.exploration.to_json(), out)
        else:
            print("  nothing written yet: Spark returns the schedules' outcomes all "
                  "together, at the end")
        return EXIT_INTERRUPTED
    summary = exploration.to_json()
    _explore_summary(summary, out)
    expected = loaded.experiment.spec.expect
    verdicts = summary["verdicts"]
    found = "loss" if verdicts.get("loss") else \
        "anomalies" if verdicts.get("anomalies") else "clean"
    return EXIT_AS_EXPECTED if found == expected else EXIT_UNEXPECTED


def _explore_summary(summary: dict, out: Path) -> None:
    """Write the report, print what it found and where."""
    from undertow.explore.report import skipped_line, write_report

    _json, html = write_report(summary, out)
    lossy = summary["verdicts"].get("loss", 0)
    anomalous = summary["verdicts"].get("anomalies", 0)
    anomalies = f", {anomalous} gave anomalies without a loss" if anomalous else ""
    print(f"\n{lossy} of {summary['runs']} schedules lost acknowledged records{anomalies} "
          f"({summary['schedules_per_second']:.2f} schedules/s). Report: {html}")
    if summary.get("faults_skipped"):
        print(f"  {skipped_line(summary['faults_skipped'])}")
    for m in summary["minimal"]:
        confirmed = (f", reproduced {m['confirmed']} of {m['confirm_runs']} times on local "
                     f"processes" if m["confirm_runs"] else "")
        shrunk = "" if m["shrunk"] else f" (from {m['found_faults']}, NOT fully shrunk)"
        print(f"  {m['mechanism']}: {m['faults']} fault(s){shrunk} in {m['file']}{confirmed}")


def _explore_matrix(args: argparse.Namespace, loaded: LoadedExperiment, out: Path) -> int:
    from undertow.explore.matrix import markdown_table, render_matrix, run_matrix
    from undertow.explore.spark import explore_session
    from undertow_analysis.session import SPARK_LOG

    if args.per_cell < 1:
        print("undertow: --per-cell must be at least 1", file=sys.stderr)
        return EXIT_ERROR
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    cells = run_matrix(explore_session(args.master, out / SPARK_LOG), loaded, args.per_cell,
                       first_seed=args.seed)
    seconds = time.monotonic() - started
    title = f"undertow explore --matrix: {loaded.experiment.metadata.name}"
    (out / "matrix.json").write_text(json.dumps(
        {"experiment": loaded.experiment.metadata.name, "per_cell": args.per_cell,
         "seconds": seconds, "cells": [c.to_json() for c in cells]}, indent=2) + "\n")
    (out / "matrix.html").write_text(render_matrix(cells, title))
    table = markdown_table(cells)
    (out / "matrix.md").write_text(table)
    runs = sum(c.runs for c in cells)
    print(table)
    print(f"{len(cells)} cells, {runs} schedules in {seconds:.0f} s "
          f"({runs / seconds:.2f}/s). Heat map: {out / 'matrix.html'}")
    return EXIT_AS_EXPECTED


def cmd_validate(args: argparse.Namespace) -> int:
    for path in args.files:
        loaded = load_experiment(path)
        print(f"{path}: {loaded.experiment.metadata.name} OK "
              f"(cluster {loaded.cluster.metadata.name}, expect {loaded.experiment.spec.expect})")
    return EXIT_AS_EXPECTED


def cmd_plan(args: argparse.Namespace) -> int:
    loaded = load_experiment(args.file)
    seed = choose_seed(loaded.experiment.spec) if args.seed is None else args.seed
    shown: dict[str, object] = {
        "seed": seed, "plan": [p.to_json() for p in plan(loaded.experiment, seed)]}
    pipeline = loaded.experiment.spec.workload.pipeline
    if pipeline is not None and pipeline.kill_every is not None:
        # Not the nemesis's: the workload kills its own pipeline members (runner.pipeline).
        shown["pipeline_kills"] = (f"every {pipeline.kill_every:g}s from the workload's start, "
                                   f"a pipeline member in turn, SIGKILLed mid-transaction")
    print(json.dumps(shown, indent=2))
    return EXIT_AS_EXPECTED


def cmd_describe(args: argparse.Namespace) -> int:
    from undertow.cluster_view.kafka import KafkaAdminError, describe
    from undertow.cluster_view.table import render

    try:
        view = describe(args.bootstrap, args.topic)
    except KafkaAdminError as exc:
        print(f"undertow: describe {args.bootstrap}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print(render(view))
    return EXIT_AS_EXPECTED


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Ctrl-C (and kill -INT) stops every command whatever the parent left: a shell starts a
    # script's background jobs with SIGINT ignored, Python then raises no KeyboardInterrupt,
    # and a run would go on with its faults injected instead of healing them and stopping.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
    handler = logging.StreamHandler()
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    handler.setFormatter(OneLineLogs(
        LOG_FORMAT, tracebacks=logging.getLogger().isEnabledFor(logging.DEBUG)))
    try:
        if args.command == "run":
            return cmd_run(args)
        if args.command == "validate":
            return cmd_validate(args)
        if args.command == "explore":
            return cmd_explore(args)
        if args.command == "plan":
            return cmd_plan(args)
        if args.command == "describe":
            return cmd_describe(args)
        if args.command == "analyze":
            from undertow_analysis.__main__ import main as analyze_main

            argv_ = [args.history, "--out", args.out]
            if args.master:
                argv_ += ["--master", args.master]
            for conf in args.conf:
                argv_ += ["--conf", conf]
            if args.allow_incomplete:
                argv_.append("--allow-incomplete")
            return analyze_main(argv_)
    except SpecError as exc:
        print(f"undertow: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except RunAborted as exc:  # the platform's exit healed and stopped everything on the way
        print(f"undertow: {exc}; the run was stopped, every fault healed", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("undertow: interrupted; every fault was recovered", file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:  # an error, not a verdict: exit 2 with the reason
        logging.getLogger("undertow").debug("failed", exc_info=True)
        print(f"undertow: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
