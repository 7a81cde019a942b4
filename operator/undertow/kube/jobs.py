"""What the operator's Jobs run in the operator image.

    python -m undertow.kube.jobs run --file F --out /data --namespace NS --seed S
    python -m undertow.kube.jobs publish --report /data/report --configmap NAME --namespace NS

``run`` is ``undertow run``'s runner (``run_experiment``) on the Kubernetes platform,
without the analysis: it writes the history to ``OUT/history`` on the experiment's volume
and exits 0 when the run went through, 2 on a bad experiment file, 1 otherwise (the
operator then heals and marks the experiment Failed). ``publish`` is the analysis Job's
second step: once the analysis image's ``python -m undertow_analysis`` has written the
report, it patches ``report.json`` (and ``report.html`` when it fits) into the
experiment's report ConfigMap, which the operator reads the verdict from.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from undertow.kube.api import KubeApi
from undertow.kube.experiment_objects import REPORT_KEY

log = logging.getLogger("undertow.kube.jobs")

CONFIG_MAP_LIMIT = 1_000_000
"""Bytes of data a ConfigMap may hold (the API server's limit is 1 MiB with metadata)."""


def run(file: Path, out: Path, namespace: str, seed: int) -> int:
    from undertow.kube.platform import KubernetesPlatform
    from undertow.runner.abort import RunAborted
    from undertow.runner.run import run_experiment
    from undertow.spec import SpecError, load_experiment

    try:
        loaded = load_experiment(file)
    except SpecError as exc:
        print(f"undertow: {exc}", file=sys.stderr)
        return 2
    platform = KubernetesPlatform.for_experiment(loaded, namespace)
    try:
        run_experiment(loaded, platform, out, seed=seed)
    except KeyboardInterrupt:
        log.warning("interrupted; every fault was healed on the way out")
        return 1
    except RunAborted as exc:  # the history could not be written: one line, as locally
        print(f"undertow: {exc}", file=sys.stderr)
        return 1
    except Exception:
        log.exception("the run failed")
        return 1
    log.info("history written to %s", out / "history")
    return 0


def publish_report(api: KubeApi, namespace: str, config_map: str, out: Path) -> list[str]:
    """Patch the report files into the ConfigMap; returns the keys written.

    ``report.html`` (with its embedded timeline) is left out when it would not fit; the
    full report stays on the history volume.
    """
    data = {REPORT_KEY: (out / REPORT_KEY).read_text(encoding="utf-8")}
    html = out / "report.html"
    if html.exists():
        text = html.read_text(encoding="utf-8")
        if len(text.encode()) + len(data[REPORT_KEY].encode()) <= CONFIG_MAP_LIMIT:
            data["report.html"] = text
        else:
            log.warning("report.html (%d bytes) does not fit in ConfigMap %s; it stays in %s",
                        len(text.encode()), config_map, html)
    api.patch("ConfigMap", namespace, config_map, {"data": data})
    return sorted(data)


def publish(report: Path, namespace: str, config_map: str) -> int:
    if not (report / REPORT_KEY).is_file():
        print(f"undertow publish: no {REPORT_KEY} in {report}", file=sys.stderr)
        return 2
    keys = publish_report(KubeApi.from_environment(), namespace, config_map, report)
    log.info("published %s to ConfigMap %s", ", ".join(keys), config_map)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m undertow.kube.jobs",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the workload and the nemesis; write the history")
    r.add_argument("--file", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--namespace", required=True)
    r.add_argument("--seed", type=int, required=True)
    p = sub.add_parser("publish", help="patch the analysis' report into its ConfigMap")
    p.add_argument("--report", type=Path, required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--configmap", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="[%(asctime)s] %(levelname)s %(message)s (%(name)s)")
    if args.command == "run":
        return run(args.file, args.out, args.namespace, args.seed)
    return publish(args.report, args.namespace, args.configmap)


if __name__ == "__main__":
    sys.exit(main())
