"""Delayed links in the pod's network namespace: one NFQUEUE delayer process per link
(``undertow.platform.nfqueue_delay``, as on the netns platform), whose queue the
``netfilter`` rule feeds.

The rule carries ``--queue-bypass``: a delayer that dies, or an agent that dies with its
delayers, leaves the link's packets passing at once, so a delay outlives nothing. The
delayers are the agent's children; ``stop_all`` ends them when the agent heals or starts.
"""

from __future__ import annotations

import itertools
import select
import subprocess
import sys
from collections.abc import Sequence

from undertow.kube.agent.errors import AgentError
from undertow.platform.link_delay import LinkDelay

BIND_TIMEOUT_S = 10.0
"""How long a delayer may take to bind its queue."""


class Delays:
    """The delayer of each delayed (direction, peer), by the queue number it binds.

    ``prefix`` runs the delayer elsewhere (a test: ``ip netns exec NS``)."""

    def __init__(self, prefix: Sequence[str] = ()) -> None:
        self.prefix = tuple(prefix)
        self._queues = itertools.count(1)
        self._delayers: dict[tuple[str, str], tuple[int, subprocess.Popen]] = {}

    def start(self, direction: str, peer: str, delay: LinkDelay) -> int:
        """Start the link's delayer, bound and ready, and return its queue number."""
        self.stop(direction, peer)
        queue = next(self._queues)
        delayer = subprocess.Popen(
            [*self.prefix, sys.executable, "-m", "undertow.platform.nfqueue_delay", str(queue),
             str(delay.latency_s), str(delay.jitter_s), str(delay.correlation)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert delayer.stdout is not None and delayer.stderr is not None
        ready, _, _ = select.select([delayer.stdout], [], [], BIND_TIMEOUT_S)
        if not ready or delayer.stdout.readline().strip() != b"bound":
            _end(delayer)
            raise AgentError(f"the delayer of {direction} {peer} did not bind queue {queue} "
                             f"within {BIND_TIMEOUT_S:g}s: "
                             f"{delayer.stderr.read().decode(errors='replace')[-300:]}", 503)
        self._delayers[(direction, peer)] = (queue, delayer)
        return queue

    def links(self) -> list[tuple[str, str]]:
        """Each delayed (direction, peer)."""
        return sorted(self._delayers)

    def queue(self, direction: str, peer: str) -> int | None:
        found = self._delayers.get((direction, peer))
        return None if found is None else found[0]

    def stop(self, direction: str, peer: str) -> None:
        found = self._delayers.pop((direction, peer), None)
        if found is not None:
            _end(found[1])

    def stop_all(self) -> None:
        for direction, peer in list(self._delayers):
            self.stop(direction, peer)


def _end(delayer: subprocess.Popen) -> None:
    delayer.kill()
    delayer.wait(10)
    for pipe in (delayer.stdout, delayer.stderr):
        if pipe is not None:
            pipe.close()
