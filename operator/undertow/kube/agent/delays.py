"""Delayed links in the pod's network namespace: one NFQUEUE delayer process per link
(``undertow.platform.nfqueue_delay``, as on the netns platform), whose queue the
``netfilter`` rule feeds.

The rule carries ``--queue-bypass``: a delayer that dies, or an agent that dies with its
delayers, leaves the link's packets passing at once, so a delay outlives nothing. The
delayers are the agent's children; ``stop_all`` ends them when the agent heals or starts.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from undertow.kube.agent.errors import AgentError
from undertow.platform.link_delay import LinkDelay
from undertow.platform.nfqueue_delay import Delayer, DelayerError


class Delays:
    """The delayer of each delayed (direction, peer), by the queue number it binds.

    ``prefix`` runs the delayer elsewhere (a test: ``ip netns exec NS``)."""

    def __init__(self, prefix: Sequence[str] = ()) -> None:
        self.prefix = tuple(prefix)
        self._queues = itertools.count(1)
        self._delayers: dict[tuple[str, str], tuple[int, Delayer]] = {}

    def start(self, direction: str, peer: str, delay: LinkDelay) -> int:
        """Start the link's delayer, bound and ready, and return its queue number."""
        self.stop(direction, peer)
        queue = next(self._queues)
        try:
            delayer = Delayer.start(queue, delay, self.prefix)
        except DelayerError as exc:
            raise AgentError(f"the delayer of {direction} {peer}: {exc}", 503) from None
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
            found[1].stop()

    def stop_all(self) -> None:
        for direction, peer in list(self._delayers):
            self.stop(direction, peer)
