"""Kafka's ``AlterPartitionManager``: a leader's ISR changes go to the controller in
batches, one request in flight at a time; whatever was queued while it was out goes in the
next. Thousands of partitions changing at once (a broker's return after a fence) cost the
controller a few commits, not thousands.

The transport is the caller's: the broker's controller RPC, or the simulator's virtual
network. It is handed a batch and a callback, which it calls once with the answers, item
by item, or with None when the request was lost (every item then gets REQUEST_TIMED_OUT).
"""

from __future__ import annotations

from collections.abc import Callable

from minibroker.cluster.partition import AlterPartitionRequest
from minibroker.cluster.types import ErrorCode, PartitionRegistration

MAX_ALTER_PARTITION_ITEMS = 1000
"""Partitions in one AlterPartition request: a batch answered well within the broker's
RPC timeout, and within ``listener.name.controller.socket.request.max.bytes``."""

Answer = tuple[ErrorCode, PartitionRegistration | None]
OnResponse = Callable[[ErrorCode, PartitionRegistration | None], None]
Transmit = Callable[[list[AlterPartitionRequest], Callable[[list[Answer] | None], None]], None]


class AlterPartitionManager:
    """The ``AlterPartitionSender`` a ``ReplicaManager`` is given."""

    def __init__(self, transmit: Transmit) -> None:
        self._transmit = transmit
        self._queue: list[tuple[AlterPartitionRequest, OnResponse]] = []
        self._in_flight = False

    def send(self, request: AlterPartitionRequest, on_response: OnResponse) -> None:
        self._queue.append((request, on_response))
        if not self._in_flight:
            self._send_queued()

    def _send_queued(self) -> None:
        batch = self._queue[:MAX_ALTER_PARTITION_ITEMS]
        del self._queue[:MAX_ALTER_PARTITION_ITEMS]
        self._in_flight = True

        def answered(answers: list[Answer] | None) -> None:
            # Changes the answers cause are queued behind them, and go in the next request.
            for index, (_, on_response) in enumerate(batch):
                on_response(*(answers[index] if answers is not None
                              else (ErrorCode.request_timed_out, None)))
            self._in_flight = False
            if self._queue:
                self._send_queued()

        self._transmit([request for request, _ in batch], answered)
