"""Whether a send the broker refused was really not written.

With ``retries: 0`` a definite error (NOT_ENOUGH_REPLICAS, ...) should prove that the record
is not in the log. Two facts break that proof when leadership moves while a send is out:
Kafka answers NOT_LEADER_OR_FOLLOWER to an acks=all produce whose leader stepped down after
appending it (the DelayedProduce completes with that error), and librdkafka re-sends after
NOT_LEADER_OR_FOLLOWER without counting it against ``retries``. The error the client reports
is then the answer to the second attempt, while the first one may be in the log.

So a send that failed definitively is held in a ``LeaderEpochGate`` until a cluster sample
taken after its completion shows its partition's leader epoch. It stays ``fail`` when that
epoch was already the controller's before the send was invoked (leader epochs only grow, so
leadership did not move in between), and becomes ``info`` otherwise, or when the run ends
before that is known.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError

# Errors that mean "this attempt was not written". NOT_LEADER_OR_FOLLOWER is not one of them:
# a leader that steps down answers it for records it had already appended.
DEFINITE_ERRORS = {
    KafkaError.NOT_ENOUGH_REPLICAS,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.INVALID_REQUIRED_ACKS,
    KafkaError.INVALID_MSG,
    KafkaError._UNKNOWN_PARTITION,
    KafkaError._UNKNOWN_TOPIC,
}


def error_name(error: KafkaError) -> str:
    """The name librdkafka gives an error, without a local error's leading underscore."""
    return error.name().lstrip("_") if error.name() else str(error.code())


def classify(error: KafkaError, retries: int) -> str:
    """``fail`` for a definite error on a single attempt (subject to the gate), else ``info``."""
    if error.code() in DEFINITE_ERRORS and retries == 0:
        return "fail"
    return "info"


@dataclass
class _Epoch:
    epoch: int
    since: float  # completion time of the first sample that showed this epoch


Settle = Callable[[dict[str, Any]], None]


class LeaderEpochGate:
    """Holds definitely failed sends until the cluster's leader epochs confirm them.

    `hold` takes a send record (topic, partition, t_invoke, t_complete, status "fail");
    `observe` takes each sampler round; `settle` receives every record once, with its final
    status. Thread-safe: producers hold from their delivery callbacks, the sampler observes.
    """

    def __init__(self, settle: Settle) -> None:
        self._settle = settle
        self._lock = threading.Lock()
        self._held: list[dict[str, Any]] = []
        self._epochs: dict[tuple[str, int], _Epoch] = {}
        self._asked = float("-inf")  # when the latest observed sample began
        self._closed = False

    def hold(self, record: dict[str, Any]) -> None:
        with self._lock:
            if self._closed:
                ready = [self._decide(record, known=False)]
            elif record["t_complete"] <= self._asked:
                ready = [self._decide(record, known=True)]
            else:
                self._held.append(record)
                ready = []
        self._emit(ready)

    def observe(self, asked: float, samples: list[dict[str, Any]]) -> None:
        """A sampler round that began at `asked`; each sample carries its completion `t`."""
        if not samples:
            return
        with self._lock:
            for s in samples:
                key = (s["topic"], s["partition"])
                known = self._epochs.get(key)
                if known is None or known.epoch != s["leader_epoch"]:
                    self._epochs[key] = _Epoch(s["leader_epoch"], s["t"])
            self._asked = max(self._asked, asked)
            ready = [r for r in self._held if r["t_complete"] <= asked]
            self._held = [r for r in self._held if r["t_complete"] > asked]
            ready = [self._decide(r, known=True) for r in ready]
        self._emit(ready)

    def close(self) -> None:
        """The run is over: what is still held cannot be confirmed and becomes ``info``."""
        with self._lock:
            self._closed = True
            ready = [self._decide(r, known=False) for r in self._held]
            self._held = []
        self._emit(ready)

    def _decide(self, record: dict[str, Any], known: bool) -> dict[str, Any]:
        epoch = self._epochs.get((record["topic"], record["partition"]))
        stable = known and epoch is not None and epoch.since <= record["t_invoke"]
        return record if stable else {**record, "status": "info"}

    def _emit(self, records: list[dict[str, Any]]) -> None:
        for record in records:
            self._settle(record)
