"""Purgatory: requests that wait for replication (``DelayedProduce``) or data (``DelayedFetch``).

As in Kafka, a delayed operation is re-checked when something it waits on changes (the
HW moved, the ISR changed, leadership changed, new data arrived) and completes at the
latest when its timeout expires.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable

from minibroker.cluster.scheduler import Scheduler, Timer
from minibroker.cluster.types import ErrorCode, FetchResult, ProduceResult, TopicPartition


class DelayedOperation:
    """Watched under ``keys``: partitions here, groups and members in the group coordinator
    (``coordinator/delayed.py``)."""

    def __init__(self, keys: set[Hashable]) -> None:
        self.keys = keys
        self.completed = False
        self.timer: Timer | None = None

    def try_complete(self) -> bool:
        raise NotImplementedError

    def on_expiration(self) -> None:
        raise NotImplementedError

    def force_complete(self) -> None:
        if not self.completed:
            self.completed = True
            if self.timer is not None:
                self.timer.cancel()
            self.on_complete()

    def on_complete(self) -> None:
        raise NotImplementedError


class DelayedProduce(DelayedOperation):
    """acks=all: answer once the HW passed every partition's last appended offset."""

    def __init__(
        self,
        results: dict[TopicPartition, ProduceResult],
        required_offsets: dict[TopicPartition, int],
        check: Callable[[TopicPartition, int], tuple[bool, ErrorCode]],
        respond: Callable[[dict[TopicPartition, ProduceResult]], None],
    ) -> None:
        super().__init__(set(required_offsets))
        self.results = dict(results)
        self.pending = dict(required_offsets)
        self._check = check
        self._respond = respond

    def try_complete(self) -> bool:
        for tp, required in list(self.pending.items()):
            done, error = self._check(tp, required)
            if done:
                del self.pending[tp]
                if error != ErrorCode.none:
                    self.results[tp] = ProduceResult(error=error)
        if not self.pending:
            self.force_complete()
        return self.completed

    def on_expiration(self) -> None:
        for tp in self.pending:
            self.results[tp] = ProduceResult(
                error=ErrorCode.request_timed_out,
                error_message=f"{tp}: not replicated to the ISR within the request timeout",
            )
        self.pending.clear()

    def on_complete(self) -> None:
        self._respond(self.results)


class DelayedFetch(DelayedOperation):
    """A fetch with no data yet: answer when min_bytes are there or max_wait_ms passed.

    As Kafka's ``DelayedFetch.tryComplete`` compares offsets (the fetch offset against the
    HW or the LEO, and the leader epoch) before it reads anything, ``may_complete`` is a
    cheap test run first: most re-checks (a produce that moved the LEO but not yet the HW a
    consumer waits on) end there, without reading the log.
    """

    def __init__(
        self,
        keys: set[TopicPartition],
        read: Callable[[], tuple[dict[TopicPartition, FetchResult], int, bool]],
        min_bytes: int,
        respond: Callable[[dict[TopicPartition, FetchResult]], None],
        may_complete: Callable[[], bool],
    ) -> None:
        super().__init__(keys)
        self._read = read
        self._min_bytes = min_bytes
        self._respond = respond
        self._may_complete = may_complete
        self._results: dict[TopicPartition, FetchResult] = {}

    def try_complete(self) -> bool:
        if not self._may_complete():
            return False
        results, size, has_error = self._read()
        if size >= self._min_bytes or has_error:
            self._results = results
            self.force_complete()
        return self.completed

    def on_expiration(self) -> None:
        self._results, _, _ = self._read()

    def on_complete(self) -> None:
        self._respond(self._results)


class Purgatory:
    """Delayed operations watched by key (a partition, a group), each with its own
    expiration timer."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler
        self._watchers: dict[Hashable, list[DelayedOperation]] = defaultdict(list)

    def try_complete_else_watch(self, op: DelayedOperation, timeout_ms: float) -> None:
        if op.try_complete():
            return

        def expire() -> None:
            if not op.completed:
                op.on_expiration()
                op.force_complete()
                self._forget(op)

        op.timer = self._scheduler.call_later(timeout_ms, expire)
        for key in op.keys:
            self._watchers[key].append(op)

    def check_and_complete(self, key: Hashable) -> None:
        ops = self._watchers.get(key)
        if not ops:
            return
        for op in list(ops):
            if op.completed or op.try_complete():
                self._forget(op)

    def _forget(self, op: DelayedOperation) -> None:
        for key in op.keys:
            ops = self._watchers.get(key)
            if ops and op in ops:
                ops.remove(op)
                if not ops:
                    del self._watchers[key]

    def shutdown(self) -> None:
        """Kafka's ``DelayedOperationPurgatory.shutdown``: the waiting operations are dropped,
        their timers cancelled, none answered. The logs they would read are about to close,
        and the connections they would answer close with the broker."""
        for ops in self._watchers.values():
            for op in ops:
                if op.timer is not None:
                    op.timer.cancel()
                op.completed = True
        self._watchers.clear()

    def watched(self) -> int:
        return len({id(op) for ops in self._watchers.values() for op in ops})
