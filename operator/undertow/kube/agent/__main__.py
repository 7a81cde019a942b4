"""``python -m undertow.kube.agent --listen HOST:PORT --pid-file FILE [--target MARKER]``:
the sidecar's command."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from undertow.kube.agent.errors import AgentError
from undertow.kube.agent.fault_agent import FaultAgent
from undertow.kube.agent.hold import Hold
from undertow.kube.agent.iptables_backend import iptables_command
from undertow.kube.agent.netfilter import Netfilter
from undertow.kube.agent.processes import Processes
from undertow.kube.agent.server import make_server

log = logging.getLogger("undertow.agent")


TOKEN_ENV = "UNDERTOW_AGENT_TOKEN"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m undertow.kube.agent",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", default="0.0.0.0:9200", help="HOST:PORT")
    parser.add_argument("--pid-file", type=Path, required=True,
                        help="where the broker's launcher records its pid (PID START)")
    parser.add_argument("--target", default="minibroker",
                        help="what the recorded process's command line must contain")
    parser.add_argument("--hold-file", type=Path, default=None,
                        help="where a kill holds the target down (its launcher waits on it)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="[%(asctime)s] %(levelname)s %(message)s (%(name)s)")
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        print(f"fault agent: ${TOKEN_ENV} is not set", file=sys.stderr)
        return 2
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        print(f"fault agent: --listen expects HOST:PORT, got {args.listen!r}", file=sys.stderr)
        return 2
    try:
        command = iptables_command()
    except AgentError as exc:
        print(f"fault agent: {exc}", file=sys.stderr)
        return 2
    log.info("iptables back end: %s", command[0])
    agent = FaultAgent(Netfilter(command), Processes(args.target, args.pid_file),
                       Hold(args.hold_file))
    agent.start()
    server = make_server(agent, host, int(port), token)

    def stop(signum: int, _frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    log.info("fault agent on %s, target %r (pid in %s)", args.listen, args.target,
             args.pid_file)
    try:
        server.serve_forever()
    finally:
        agent.heal()  # a terminating pod keeps nothing of ours
        agent.close()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
