"""``minibroker``: run a controller, a broker or a local cluster, and inspect topics.

    minibroker controller --listen HOST:PORT --data-dir DIR
    minibroker broker --id N --listen HOST:PORT --controller HOST:PORT --data-dir DIR
    minibroker cluster --brokers 3 --base-port PORT --data-dir DIR [--restart-after SECONDS]
    minibroker cluster status --data-dir DIR
    minibroker cluster restart {N|controller} --data-dir DIR
    minibroker topics create --bootstrap HOST:PORT --topic T --partitions P --replication-factor R
    minibroker describe --bootstrap HOST:PORT [--topic T]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from minibroker.cluster.types import DEFAULT_LISTENER
from minibroker.config import ConfigError, parse_overrides

LOG_FORMAT = "[%(asctime)s] %(levelname)s %(message)s (%(name)s)"


def host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host, int(port)


def broker_address(value: str) -> tuple[int, tuple[str, int]]:
    broker_id, sep, address = value.partition("=")
    if not sep or not broker_id.isdigit():
        raise argparse.ArgumentTypeError(f"expected ID=HOST:PORT, got {value!r}")
    return int(broker_id), host_port(address)


def named_host_port(value: str) -> tuple[str, tuple[str, int]]:
    """``NAME=HOST:PORT`` (a listener name as Kafka's: letters, digits, ``_``, ``-``), or
    ``HOST:PORT`` for the default listener."""
    name, sep, address = value.rpartition("=")
    if not sep:
        return DEFAULT_LISTENER, host_port(value)
    if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
        raise argparse.ArgumentTypeError(f"expected NAME=HOST:PORT, got {value!r}")
    return name.upper(), host_port(address)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minibroker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log-level", default=os.environ.get("MINIBROKER_LOG_LEVEL", "INFO"))
    sub = parser.add_subparsers(dest="command", required=True)

    def add_config(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                       help="a broker/topic config override (repeatable)")

    def add_secret(p: argparse.ArgumentParser) -> None:
        p.add_argument("--controller-secret-file", type=Path, metavar="PATH",
                       help="the file holding the cluster's controller secret (default: "
                            "$MINIBROKER_CONTROLLER_SECRET_FILE, else the secret itself in "
                            "$MINIBROKER_CONTROLLER_SECRET); required: the controller "
                            "serves only peers that hold it")

    c = sub.add_parser("controller", help="run the controller (KRaft's role)")
    c.add_argument("--listen", type=host_port, required=True)
    c.add_argument("--data-dir", type=Path, required=True)
    c.add_argument("--metrics-port", type=int)
    add_secret(c)
    add_config(c)

    b = sub.add_parser("broker", help="run one broker")
    b.add_argument("--id", type=int, required=True)
    b.add_argument("--listen", type=host_port, required=True)
    b.add_argument("--controller", type=host_port, required=True)
    b.add_argument("--data-dir", type=Path, required=True)
    b.add_argument("--metrics-port", type=int)
    b.add_argument("--listener", type=named_host_port, action="append", default=[],
                   metavar="NAME=HOST:PORT",
                   help="one more client listener, named as Kafka's listener names (KIP-103): "
                        "a client that connects to it gets its addresses in Metadata "
                        "(repeatable)")
    b.add_argument("--advertised-listener", type=named_host_port, action="append", default=[],
                   metavar="[NAME=]HOST:PORT",
                   help="the address clients of a listener get in Metadata (no NAME: the "
                        "--listen one; default: where the listener listens; repeatable)")
    b.add_argument("--broker-address", type=broker_address, action="append", default=[],
                   metavar="ID=HOST:PORT",
                   help="reach broker ID at this address for replication (repeatable)")
    b.add_argument("--failpoint-token", default=os.environ.get("MINIBROKER_FAILPOINT_TOKEN"),
                   help="bearer token of the failpoint endpoint (default: "
                        "$MINIBROKER_FAILPOINT_TOKEN; unset disables failpoints)")
    add_secret(b)
    add_config(b)

    cl = sub.add_parser("cluster", help="run a controller and N brokers as child processes; "
                                         "a node that exits leaves the others serving")
    cl.add_argument("--brokers", type=int, default=3)
    cl.add_argument("--base-port", type=int, default=9090)
    cl.add_argument("--host", default="127.0.0.1")
    cl.add_argument("--data-dir", type=Path, help="required to start a cluster")
    cl.add_argument("--restart-after", type=float, metavar="SECONDS",
                    help="start a node that exited (crash, kill -9) again after SECONDS "
                         "(default: it stays down until `minibroker cluster restart`)")
    add_config(cl)
    clsub = cl.add_subparsers(dest="cluster_command", metavar="{status,restart}")
    cs = clsub.add_parser("status", help="list the running cluster's nodes, pids and states")
    cs.add_argument("--data-dir", type=Path, required=True)
    cr = clsub.add_parser("restart", help="start a node of the running cluster that exited")
    cr.add_argument("node", help="a broker id, or controller")
    cr.add_argument("--data-dir", type=Path, required=True)

    t = sub.add_parser("topics", help="manage topics")
    tsub = t.add_subparsers(dest="topics_command", required=True)
    tc = tsub.add_parser("create", help="create a topic (Kafka's CreateTopics API)")
    tc.add_argument("--bootstrap", type=host_port, required=True)
    tc.add_argument("--topic", required=True)
    tc.add_argument("--partitions", type=int, default=1)
    tc.add_argument("--replication-factor", type=int, default=1)
    add_config(tc)

    d = sub.add_parser("describe", help="print leader, replicas, ISR, epoch and HW per partition")
    d.add_argument("--bootstrap", type=host_port, required=True)
    d.add_argument("--topic")
    return parser


def _run_until_signal(main_coro_factory) -> None:
    """Run a server until SIGINT or SIGTERM, then stop it cleanly."""

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await main_coro_factory(stop)

    asyncio.run(runner())


def cluster_command(args: argparse.Namespace) -> int:
    """``minibroker cluster``: start the launcher, or ask a running one (status, restart)."""
    from minibroker import cluster_control
    from minibroker.local_cluster import run_local_cluster

    if args.cluster_command is None:
        if args.data_dir is None:
            print("minibroker cluster: --data-dir is required", file=sys.stderr)
            return 2
        if args.restart_after is not None and args.restart_after < 0:
            print("minibroker cluster: --restart-after must be 0 or more seconds",
                  file=sys.stderr)
            return 2
        os.environ["MINIBROKER_LOG_LEVEL"] = args.log_level  # the children's, too
        return run_local_cluster(args.brokers, args.host, args.base_port, args.data_dir,
                                 args.config, args.restart_after)
    request = "status" if args.cluster_command == "status" else f"restart {args.node}"
    try:
        ok, text = cluster_control.ask(args.data_dir, request)
    except cluster_control.ControlError as exc:
        print(f"minibroker cluster {args.cluster_command}: {exc}", file=sys.stderr)
        return 1
    print(text, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format=LOG_FORMAT, stream=sys.stderr)
    try:
        config = parse_overrides(args.config) if hasattr(args, "config") else {}
    except ConfigError as exc:
        print(f"minibroker: {exc}", file=sys.stderr)
        return 2
    secret = b""
    if args.command in ("controller", "broker"):
        from minibroker.rpc_auth import AuthenticationError, load_secret

        try:
            secret = load_secret(args.controller_secret_file)
        except AuthenticationError as exc:
            print(f"minibroker {args.command}: {exc}", file=sys.stderr)
            return 2

    if args.command == "controller":
        from minibroker.controller.server import ControllerServer

        async def run_controller(stop: asyncio.Event) -> None:
            server = ControllerServer(args.data_dir, config, secret)
            await server.start(args.listen[0], args.listen[1], args.metrics_port)
            await stop.wait()
            await server.stop()

        _run_until_signal(run_controller)
        return 0

    if args.command == "broker":
        from minibroker.broker import BrokerOptions, run_broker

        advertised = dict(args.advertised_listener)
        listeners = dict(args.listener)
        unknown = set(advertised) - set(listeners) - {DEFAULT_LISTENER}
        if unknown or DEFAULT_LISTENER in listeners:
            print(f"minibroker: --advertised-listener names no --listener: {sorted(unknown)}"
                  if unknown else f"minibroker: --listener {DEFAULT_LISTENER} is --listen's",
                  file=sys.stderr)
            return 2
        options = BrokerOptions(
            broker_id=args.id, listen=args.listen, controller=args.controller,
            data_dir=args.data_dir, config=config,
            advertised=advertised.pop(DEFAULT_LISTENER, None),
            listeners=listeners, advertised_listeners=advertised,
            broker_addresses=dict(args.broker_address), metrics_port=args.metrics_port,
            failpoint_token=args.failpoint_token, controller_secret=secret)
        _run_until_signal(lambda stop: run_broker(options, stop))
        return 0

    if args.command == "cluster":
        return cluster_command(args)

    from minibroker import tools

    if args.command == "topics":
        return asyncio.run(tools.create_topic(args.bootstrap, args.topic, args.partitions,
                                              args.replication_factor, config))
    if args.command == "describe":
        return asyncio.run(tools.describe(args.bootstrap, args.topic))
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
