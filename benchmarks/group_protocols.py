"""Kafka's two consumer group protocols side by side: the classic one (JoinGroup, SyncGroup,
an eager rebalance of every member) and the consumer protocol (KIP-848: the coordinator
assigns, each member reconciles on its own), on the experiments that have a twin of each
(`NAME` and `NAME-kip848`), from the same simulated seeds.

    .venv/bin/python benchmarks/experiment_reliability.py --platform sim --runs 10 \\
        --only group-coordinator-kill group-coordinator-kill-kip848 \\
               consumer-isolated consumer-isolated-kip848
    .venv/bin/python benchmarks/group_protocols.py [--commits b380cca]

The measures are each run's report's `consumption` (`analysis/undertow_analysis/
consumption.py`), as the reliability ledger keeps them: the seconds partitions went
unconsumed while a record waited (summed over the partitions) and the longest such stretch,
the records returned again, the handovers of a partition between members and the longest
pause of one (no member holding the partition). A seed counts when both twins ran it.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

LEDGER = Path(__file__).resolve().parent / "results" / "reliability.jsonl"
PAIRS = ("group-coordinator-kill", "consumer-isolated")
TWIN = "-kip848"


def latest_runs(ledger: Path, commits: list[str] | None) -> dict[tuple[str, int], dict]:
    """The last simulated run with consumption of each (experiment, seed)."""
    runs: dict[tuple[str, int], dict] = {}
    for line in ledger.read_text().splitlines():
        if not line.strip():
            continue
        entry = json.loads(line)
        if (entry.get("platform") != "sim" or entry.get("seed") is None
                or not entry.get("consumption")
                or (commits and not any(entry["commit"].startswith(c) for c in commits))):
            continue
        runs[(entry["experiment"], entry["seed"])] = entry
    return runs


def _mean(values: list[float]) -> str:
    return f"{statistics.mean(values):8.2f}" if values else f"{'-':>8}"


def table(runs: dict[tuple[str, int], dict]) -> str:
    lines = [f"{'experiment':34} {'protocol':8} {'runs':>4} {'as exp.':>7} "
             f"{'unconsumed s':>12} {'max':>6} {'longest s':>9} {'again':>8} "
             f"{'handovers':>9} {'pause s':>8} {'max':>6}",
             f"{'':34} {'':8} {'':>4} {'':>7} {'mean':>12} {'':>6} {'mean':>9} {'mean':>8} "
             f"{'mean':>9} {'mean':>8} {'':>6}"]
    for name in PAIRS:
        seeds = sorted({s for (e, s) in runs if e == name}
                       & {s for (e, s) in runs if e == name + TWIN})
        for experiment in (name, name + TWIN):
            rows = [runs[(experiment, s)] for s in seeds]
            if not rows:
                lines.append(f"{experiment:34} (no seed run by both twins)")
                continue
            c = [r["consumption"] for r in rows]
            unconsumed = [x["unconsumed_s"] for x in c]
            pauses = [x["longest_pause_s"] for x in c]
            lines.append(
                f"{experiment:34} {c[0]['protocol']:8} {len(rows):>4} "
                f"{sum(r['verdict'] == r['expect'] for r in rows):>7} "
                f"{_mean(unconsumed):>12} {max(unconsumed):6.2f} "
                f"{_mean([x['longest_s'] for x in c]):>9} "
                f"{_mean([x['returned_again'] for x in c]):>8} "
                f"{_mean([x['handovers'] for x in c]):>9} {_mean(pauses):>8} "
                f"{max(pauses):6.2f}")
        lines.append(f"{'':34} seeds {', '.join(map(str, seeds)) or '-'}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ledger", type=Path, default=LEDGER)
    parser.add_argument("--commits", help="only the runs at these commits (comma-separated "
                                          "prefixes)")
    args = parser.parse_args()
    print(table(latest_runs(args.ledger, args.commits.split(",") if args.commits else None)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
