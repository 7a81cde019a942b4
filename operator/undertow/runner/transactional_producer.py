"""A transactional producer of the workload (`workload.transactions`): stock confluent-kafka
driven through librdkafka's transaction API (init, begin, produce, commit or abort), each
transaction and each of its sends recorded with the transaction's outcome.

A transactional record is acknowledged by its commit, not by its produce response, so a send's
line waits for its transaction to end: `ok` with its offset when the commit was acknowledged,
`fail` when the transaction was aborted (`read_committed` must never return it), `info` when
the commit's outcome is unknown (it timed out, or the producer failed fatally while it was
out). After an `info` the producer is replaced by a new one with the same `transactional.id`,
whose InitProducerId bumps the epoch: the coordinator completes or aborts what the old one
left (Kafka's `TransactionCoordinator.handleInitProducerId`), and fences the old one.

The error handling follows librdkafka's transactional API contract: a retriable error
(`KafkaError.retriable()`) is retried by calling the same method again, an abortable one
(`txn_requires_abort()`) is answered with `abort_transaction`, anything else is fatal.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Producer

from undertow.runner.abort import Abort
from undertow.runner.outcomes import error_name
from undertow.runner.pacing import Pacer
from undertow.runner.values import padding

log = logging.getLogger("undertow.workload")

INIT_ATTEMPT_S = 10.0
"""How long one `init_transactions` call may take before it is tried again."""


@dataclass(frozen=True)
class TxnSettings:
    """`workload.transactions` in the client's units."""

    records_per_transaction: int
    abort_ratio: float
    timeout_ms: int
    transaction_version: int = 1
    """The protocol the producers speak (2: simulation only, `check_stock_clients`)."""


def aborts(n: int, ratio: float) -> bool:
    """Whether transaction n (from 0) is one the workload aborts: `ratio` of them, spread
    evenly and deterministically (0.1: transactions 9, 19, 29, ...)."""
    return int((n + 1) * ratio) > int(n * ratio)


class TransactionLog(Protocol):
    """Where a transaction's line goes: the history (`HistoryWriter.transaction`), or the
    stdout of a producer process, whose runner writes it there (`producer_process`)."""

    def transaction(self, **fields: Any) -> None: ...


class SentRecord(Protocol):
    """A send of a transaction, as a producer (real or simulated) keeps it."""

    value: str
    partition: int
    t_invoke: float
    offset: int | None
    error: str | None


@dataclass(frozen=True)
class Ended:
    """A transaction that ended: whose, and how."""

    producer: str
    topic: str
    transactional_id: str
    txn: str
    intent: str
    status: str
    error: str | None
    t_begin: float
    t_end_invoke: float | None
    t_complete: float
    offsets: dict[int, int] | None = None
    """A pipeline member's: the input offsets committed with it, per partition."""


def record_transaction(history: TransactionLog, record_send: Callable[[dict[str, Any]], None],
                       ended: Ended, sends: Sequence[SentRecord]) -> None:
    """Each send's line with its transaction's outcome (a send of a committed transaction
    without an acknowledged offset is `info`), then the transaction's line."""
    for send in sends:
        committed = ended.status == "ok" and send.offset is not None and send.offset >= 0
        record_send({
            "producer": ended.producer, "value": send.value, "topic": ended.topic,
            "partition": send.partition,
            "status": ended.status if ended.status != "ok" or committed else "info",
            "offset": send.offset if committed else None,
            "error": None if committed else (send.error or ended.error or "ABORTED"),
            "t_invoke": send.t_invoke, "t_complete": ended.t_complete, "txn": ended.txn})
    history.transaction(
        producer=ended.producer, txn=ended.txn, transactional_id=ended.transactional_id,
        intent=ended.intent, status=ended.status, error=ended.error,
        values=[s.value for s in sends], t_begin=ended.t_begin,
        t_end_invoke=ended.t_end_invoke, t_complete=ended.t_complete,
        offsets=None if ended.offsets is None else {
            str(p): o for p, o in sorted(ended.offsets.items())})


@dataclass
class Send:
    """A send of a transaction (`SentRecord`), its offset or error filled in by its delivery
    report."""

    value: str
    partition: int
    t_invoke: float
    offset: int | None = None
    error: str | None = None


def _poll(producer: Producer, timeout: float) -> None:
    """Serve delivery reports; confluent-kafka raises a fatal error from poll() too, which
    the next transactional call reports where it is handled."""
    try:
        producer.poll(timeout)
    except KafkaException as exc:
        log.debug("poll: %s", exc.args[0])


class TransactionalProducer:
    """One transactional producer thread: transactions back to back, at the workload's rate
    of records, until stopped (the transaction under way is still ended)."""

    def __init__(self, index: int, config: dict[str, Any], topic: str, partitions: int,
                 rate: float, record_size: int, settings: TxnSettings, end_timeout_s: float,
                 history: TransactionLog, record_send: Callable[[dict[str, Any]], None],
                 abort: Abort) -> None:
        """`config`: the plain producer's librdkafka configuration, made transactional here;
        `record_send`: where each send's line goes (the history and the progress counts);
        `end_timeout_s`: how long a commit or abort is retried before it counts as unknown."""
        self.name = f"p{index}"
        self.transactional_id = f"undertow-{self.name}"
        self._config = {**config, "transactional.id": self.transactional_id,
                        "enable.idempotence": True, "acks": "all",
                        "transaction.timeout.ms": settings.timeout_ms,
                        # librdkafka refuses a delivery timeout past the transaction's.
                        "message.timeout.ms": min(config["message.timeout.ms"],
                                                  settings.timeout_ms),
                        "error_cb": self._on_error}
        self._topic, self._partitions = topic, partitions
        self._rate = rate
        self._pad = padding(self.name, record_size)
        self._settings = settings
        self._end_timeout_s = end_timeout_s
        self._history = history
        self._record_send = record_send
        self._abort = abort
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self) -> None:
        self._thread.join()

    def _stopping(self) -> bool:
        return self._stop.is_set() or self._abort.is_set()

    def _new_producer(self) -> Producer | None:
        """A producer with its transactions initialised (the epoch bumped, anything the
        previous one left open completed or aborted by the coordinator), retried while the
        error is retriable; None when stopped first or the error is fatal."""
        producer = Producer(self._config)
        while not self._stopping():
            try:
                producer.init_transactions(INIT_ATTEMPT_S)
                return producer
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if not error.retriable():
                    log.error("%s: init_transactions failed: %s", self.name, error)
                    return None
        return None

    def _run(self) -> None:
        producer = self._new_producer()
        n = seq = 0
        pacer = Pacer(self._rate)
        while producer is not None and not self._stopping():
            txn = f"{self.name}-t{n}"
            intent = "abort" if aborts(n, self._settings.abort_ratio) else "commit"
            t_begin = time.time()
            try:
                producer.begin_transaction()
            except KafkaException as exc:  # a fatal error of the last transaction's end
                log.warning("%s: begin_transaction failed (%s): a new producer takes over",
                            self.name, exc.args[0])
                producer = self._new_producer()
                continue
            sends: list[Send] = []
            for _ in range(self._settings.records_per_transaction):
                if self._stopping():
                    break
                send = Send(f"{self.name}-{seq}", seq % self._partitions, time.time())
                try:
                    producer.produce(self._topic, (send.value + self._pad).encode(),
                                     partition=send.partition,
                                     on_delivery=self._on_delivery(send))
                except BufferError:
                    _poll(producer, 0.05)
                    continue
                except KafkaException as exc:  # the transaction is in an error state
                    send.error = error_name(exc.args[0])
                    sends.append(send)
                    seq += 1
                    break
                sends.append(send)
                seq += 1
                pacer.wait(partial(_poll, producer), self._stopping)
            t_end_invoke = time.time()
            status, error, fatal = self._end(producer, intent)
            pacer.resume()  # the end's time is not made up by a burst of the next one's
            _poll(producer, 0)  # the delivery reports of the last sends
            self._write(txn, intent, status, error, sends, t_begin, t_end_invoke, time.time())
            n += 1
            if status == "info" or fatal:
                # A new producer's InitProducerId bumps the epoch: the coordinator completes
                # or aborts what this one left, and fences it.
                log.warning("%s: %s ended with %s (%s): a new producer takes over", self.name,
                            txn, error, "fatal" if fatal else "outcome unknown")
                producer = self._new_producer()

    def _end(self, producer: Producer, intent: str) -> tuple[str, str | None, bool]:
        """Commit or abort the open transaction: `ok` (committed), `fail` (aborted: as
        intended, or after an abortable error) or `info` (a commit whose outcome is unknown),
        with the error that decided it, and whether the producer is left in a fatal state.

        An abort that fails never committed. librdkafka can fail one fatally with
        INVALID_TXN_STATE when none of the transaction's partitions was registered (its
        AddPartitionsToTxn met CONCURRENT_TRANSACTIONS while the previous commit's markers
        were being written) yet it sends EndTxn(abort), which the coordinator, in
        CompleteCommit, refuses as Kafka's TransactionCoordinator does (librdkafka issue
        4849): the transaction is still aborted, and a new producer takes over."""
        deadline = time.monotonic() + self._end_timeout_s
        call = producer.commit_transaction if intent == "commit" else producer.abort_transaction
        while True:
            try:
                call(max(0.1, deadline - time.monotonic()))
                return ("ok" if intent == "commit" else "fail"), None, False
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
            if error.retriable() and time.monotonic() < deadline and not self._abort.is_set():
                continue
            if intent == "commit" and error.txn_requires_abort():
                # librdkafka refuses the commit before sending EndTxn (a send failed): it is
                # not committed, and the abort makes that final.
                return "fail", error_name(error), not self._abort_after(producer)
            # An abort that failed still never committed; a commit that failed may have.
            return ("info" if intent == "commit" else "fail"), error_name(error), error.fatal()

    def _abort_after(self, producer: Producer) -> bool:
        """Abort after an abortable error; False when the producer is left unusable."""
        deadline = time.monotonic() + self._end_timeout_s
        while time.monotonic() < deadline and not self._abort.is_set():
            try:
                producer.abort_transaction(max(0.1, deadline - time.monotonic()))
                return True
            except KafkaException as exc:
                if not exc.args[0].retriable():
                    return False  # the coordinator aborts it when it times out
        return False

    def _on_error(self, error: KafkaError) -> None:
        """librdkafka's errors, which the transactional API calls report where they are
        handled (`_end`)."""
        log.debug("%s: %s", self.name, error)

    def _on_delivery(self, send: Send) -> Callable[[KafkaError | None, Any], None]:
        def callback(err: KafkaError | None, msg: Any) -> None:
            if err is None:
                send.offset = msg.offset()
            else:
                send.error = error_name(err)

        return callback

    def _write(self, txn: str, intent: str, status: str, error: str | None,
               sends: list[Send], t_begin: float, t_end_invoke: float,
               t_complete: float) -> None:
        record_transaction(
            self._history, self._record_send, Ended(
                self.name, self._topic, self.transactional_id, txn, intent, status, error,
                t_begin, t_end_invoke, t_complete), sends)
