"""Schema-aware protocol fuzzing of a live 3-broker minibroker cluster: can a hostile or
careless client crash, hang, fence or exhaust it through the Kafka protocol?

    nice -n 19 .venv/bin/python benchmarks/protocol_fuzz.py [--frames N] [--seed S]
        [--brokers 3] [--connections 16] [--minutes M] [--keep DIR]

Sends N frames (default 1,000,000) over every API and version the brokers advertise, built
from kio's request schemas: half valid requests with values drawn per field type (and the
cluster's own topic names and ids), half those requests corrupted where their layout puts a
length, a count, a tag or a varint (``tests/minibroker/schema_fuzz.py``). Several
connections per broker, each one request in flight, reopened whenever the broker closes
one. A watcher samples every second the processes' RSS (/proc), a Metadata request on a
fresh connection to each broker (its latency: the broker's event loop also sends its
heartbeats), and whether each process is alive; the controller's replication events give
the fences. At the end a stock client (confluent-kafka) produces 100 records with acks=all
to a new topic and consumes them back (``tests/minibroker/fuzz_campaign.py``).

Prints the frames sent and their rate, the count per API, what became of the valid and the
corrupted frames, the requests held past 2 s by API, crashes (any process that exited),
fences, peak RSS per process, the probe's worst latency per broker, the round trip, and
every frame the broker did not treat as it owed (a valid request closed without an answer:
a handler bug; its frame index and the seed rebuild it). ``--minutes`` stops sending when
that much time is up, whatever N. Exits 1 if anything crashed, was fenced or failed. The
reference loop's time (reference.py) is printed at the start and the end, and the frame rate
scaled to the reference machine.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from ledger import commit, machine_line
from reference import AT, Reference

for folder in ("tests", "tests/minibroker"):  # the test helpers the benchmark shares
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / folder))

from fuzz_campaign import Report, per_api_versions, run_campaign  # noqa: E402


def _failed(report: Report) -> bool:
    return bool(report.crashed or report.fences or report.tally.violations
                or report.log.handler_failures or report.round_trip is not None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--connections", type=int, default=16, help="per broker")
    parser.add_argument("--minutes", type=float, default=None,
                        help="stop sending after this long, however many frames are left")
    parser.add_argument("--keep", type=Path, default=None,
                        help="run the cluster in this directory and keep its logs and data")
    args = parser.parse_args()
    print(f"commit {commit()}; {machine_line()}; seed {args.seed}, {args.brokers} brokers, "
          f"{args.connections} connections each", flush=True)
    reference = Reference.measure()
    print(reference.start_line(), flush=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="protocol-fuzz-") as scratch:
        workdir = args.keep or Path(scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        report = run_campaign(
            workdir, frames=args.frames, seed=args.seed, brokers=args.brokers,
            connections_per_broker=args.connections,
            time_limit_s=None if args.minutes is None else args.minutes * 60,
            progress=lambda line: print(f"  {line}", flush=True))
    print("\n".join(report.lines()))
    versions = per_api_versions(report.tally)
    print("versions covered: " + ", ".join(f"{api} v{min(v)}-{max(v)}"
                                            for api, v in sorted(versions.items())))
    rate = report.frames / report.seconds if report.seconds else 0.0
    print(f"wall time {time.monotonic() - started:.0f} s; {reference.rate(rate):,.0f} frames/s "
          f"{AT}")
    print(reference.finish().end_line())
    return 1 if _failed(report) else 0


if __name__ == "__main__":
    sys.exit(main())
