"""A virtual transactional producer, as librdkafka's transaction manager drives one
(``rdkafka_txnmgr.c``), with the workload's transactions: ``runner.transactional_producer``'s
loop over the model (docs/simulation.md, "The client model").

- **Coordinator.** FindCoordinator (key type 1) at a bootstrap broker; NOT_COORDINATOR or
  COORDINATOR_NOT_AVAILABLE sends the producer to look it up again after
  ``retry.backoff.ms``. Its requests go on a connection of their own (librdkafka's logical
  ``TxnCoordinator`` broker), apart from the Produce requests to the same broker. One that
  times out or whose connection drops is sent again after ``retry.backoff.ms`` to the same
  coordinator on a new connection, while a FindCoordinator runs beside it and moves the
  producer if the coordinator moved (``rd_kafka_buf_retry``, ``rd_kafka_txn_coord_query``):
  the request that timed out may still be on the wire, and reach the coordinator later.
- **Timeouts.** A transactional producer that does not set ``socket.timeout.ms`` (the
  workload does not) gets the transaction timeout less 100 ms (``socket_timeout_ms``); it
  bounds every request to the coordinator, and every Produce with the time its first record
  has left of ``message.timeout.ms``. A record not acknowledged within
  ``message.timeout.ms`` fails with MSG_TIMED_OUT, which makes the transaction abortable.
- **Producer id.** InitProducerId with the transactional id, retried while the coordinator
  answers COORDINATOR_LOAD_IN_PROGRESS, CONCURRENT_TRANSACTIONS or moved; it gives the
  epoch every batch carries. A new instance (after a fatal error or a commit whose outcome
  is unknown) calls it again, which bumps the epoch and fences the old one.
- **Partitions.** A record's partition is registered (AddPartitionsToTxn, one request at a
  time with every partition waiting) before any batch of it is sent; CONCURRENT_TRANSACTIONS
  (the previous transaction's markers still being written) is retried after 20 ms, as
  librdkafka does.
- **Batches** as the idempotent producer's (``clients.SimProducer``): per partition, one
  batch in flight, sequence numbers from 0 per epoch, the transactional attribute, acks=all;
  NOT_LEADER_OR_FOLLOWER and a failed exchange are retried, anything else makes the
  transaction abortable, and PRODUCER_FENCED or INVALID_PRODUCER_EPOCH fatal.
- **Epoch bump** (KIP-360). A transaction aborted with a batch whose answer was lost (it
  may be in the log, at its sequence numbers) ends with a new InitProducerId, which bumps
  the epoch and starts the sequences again: without it the next transaction's first batch
  would reuse those numbers and be taken for the lost one's duplicate.
- **End.** Commit waits for every batch, then EndTxn(commit), retried on a retriable error
  until the workload's end timeout (then unknown: ``info``); an abortable error turns it
  into an abort. Abort drops what was not sent, waits for what was, and sends
  EndTxn(abort) once any AddPartitionsToTxn went out, even one that was refused (librdkafka
  counts requests sent: in CompleteCommit the coordinator refuses it with
  INVALID_TXN_STATE, which is fatal to librdkafka, issue 4849).

**Transaction version 2** (``workload.transactions.transactionVersion: 2``): the same
producer speaking KIP-890 part 2 as the Java 4.x client's ``TransactionManager`` does when
the cluster has ``transaction.version`` 2, with librdkafka's timers kept, so that a
comparison of the two versions is one of the protocol alone. A partition joins the
transaction with its first record (``maybeAddPartition``: no AddPartitionsToTxn; the
leader adds it on Produce v12); EndTxn is v5 and sent once a record was (``transactionStarted``),
and its answer gives the producer id and epoch of the next transaction, whose sequences
start again at 0 (``EndTxnHandler``); an abortable error needs no epoch bump of the client's
own (``needToTriggerEpochBumpFromClient``), since every EndTxn bumps it; INVALID_PRODUCER_EPOCH
on a Produce makes the transaction abortable (``InvalidProducerEpochException``, KIP-588),
and CONCURRENT_TRANSACTIONS (the last transaction's markers still going out) is retried.

Each transaction and its sends are recorded as the real producer records them.

It is long because it is one client's state machine (librdkafka's idempotent and transactional
producer: InitProducerId, AddPartitionsToTxn, EndTxn, their retries and epoch bumps); splitting it
would split one state machine across files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError

from minibroker.cluster.types import ErrorCode, ProduceResult, TopicPartition
from minibroker.coordinator.transaction_metadata import TV_2
from minibroker.storage.records import TRANSACTIONAL_FLAG, build_batch
from undertow.runner.history import HistoryWriter
from undertow.runner.transactional_producer import (
    Ended,
    TxnSettings,
    aborts,
    record_transaction,
)
from undertow.runner.values import padding
from undertow.sim.clients import (
    LEADER_MOVED,
    RETRY_BACKOFF_MS,
    Endpoint,
    Metadata,
    NetworkError,
    Wakeup,
    error_name,
)

CONCURRENT_RETRY_MS = 20.0
"""librdkafka's quick retry of a request the coordinator answered CONCURRENT_TRANSACTIONS."""
RETRIABLE = {ErrorCode.coordinator_load_in_progress, ErrorCode.concurrent_transactions,
             ErrorCode.not_coordinator, ErrorCode.coordinator_not_available,
             ErrorCode.request_timed_out}
MOVED = {ErrorCode.not_coordinator, ErrorCode.coordinator_not_available}
FATAL = {ErrorCode.producer_fenced, ErrorCode.invalid_producer_epoch,
         ErrorCode.invalid_producer_id_mapping, ErrorCode.invalid_txn_state,
         ErrorCode.transactional_id_authorization_failed}


def socket_timeout_ms(transaction_timeout_ms: int) -> float:
    """librdkafka's ``socket.timeout.ms`` for a transactional producer that leaves it unset:
    the transaction timeout less 100 ms, at least 900 ms (``rd_kafka_conf_finalize``: "make
    sure at least one request can be sent before the transaction times out"). It is the
    timeout of every request to the coordinator (``rd_kafka_buf_new_request0`` gives each
    request ``socket.timeout.ms``; EndTxn and AddPartitionsToTxn keep it) and the cap of a
    Produce's (``rd_kafka_buf_calc_timeout``); ``request.timeout.ms`` is only the broker's
    acks wait, written in the Produce request."""
    return float(max(transaction_timeout_ms - 100, 900))


@dataclass
class _Send:
    value: str
    partition: int
    payload: bytes
    t_invoke: float
    deadline_ms: float = float("inf")  # message.timeout.ms after the produce call
    offset: int | None = None
    error: str | None = None
    sent: bool = False
    uncertain: bool = False  # sent, its answer lost: it may be in the log


@dataclass
class _Txn:
    name: str
    intent: str
    t_begin: float
    sends: list[_Send] = field(default_factory=list)
    registered: set[int] = field(default_factory=set)
    requested: bool = False  # an AddPartitionsToTxn went out
    end_sent: bool = False  # its EndTxn went out (retried from there on, not sent again)
    abortable: str | None = None  # the error that made it abortable
    t_end_invoke: float | None = None
    offsets: dict[int, int] = field(default_factory=dict)  # a pipeline member's input offsets


class SimTransactionalProducer:
    """One transactional producer (``transactional.id`` ``undertow-pN``): transactions back
    to back at the workload's rate of records until stopped."""

    def __init__(self, index: int, client: Endpoint, topic: str, partitions: int,
                 rate: float, record_size: int, settings: TxnSettings, request_timeout_ms: int,
                 end_timeout_ms: float, history: HistoryWriter,
                 record_send: Callable[[dict[str, Any]], None],
                 clock_s: Callable[[], float], message_timeout_ms: float | None = None) -> None:
        """``request_timeout_ms``: the Produce's ``request.timeout.ms``, the broker's wait
        for acks=all; ``message_timeout_ms``: the producer's ``message.timeout.ms`` (default
        the transaction timeout, which bounds it)."""
        self.name = f"p{index}"
        self.transactional_id = f"undertow-{self.name}"
        self._client = client
        self._topic, self._partitions = topic, partitions
        self._interval_ms = 1000.0 / rate if rate > 0 else 0.0
        self._pad = padding(self.name, record_size)
        self._reconnected = Wakeup(client, self._pump)
        self._settings = settings
        self._tv2 = settings.transaction_version >= TV_2
        self._request_timeout_ms = request_timeout_ms
        self._socket_timeout_ms = socket_timeout_ms(settings.timeout_ms)
        self._message_timeout_ms = float(min(message_timeout_ms or settings.timeout_ms,
                                             settings.timeout_ms))
        self._end_timeout_ms = end_timeout_ms
        self._history = history
        self._record_send = record_send
        self._clock_s = clock_s
        self._metadata = Metadata(client, topic, first=index)
        self._metadata.listeners.append(self._pump)
        self._coordinator: tuple[str, int] | None = None
        self._querying = False  # a FindCoordinator beside a retry is out
        self._pid, self._epoch = -1, -1
        self._sequences: dict[int, int] = {}
        self._in_flight: set[int] = set()
        self._adding = False
        self._txn: _Txn | None = None
        self._n = self._seq = 0
        self._stopped = False
        self._ending = False
        self._fatal = False  # the open transaction's error is fatal to this instance
        self._deadline_ms = 0.0  # when the transaction's end gives up
        self.outstanding = 1  # until the last transaction ends after `stop`

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._metadata.start()
        self._init()

    def stop(self) -> None:
        """No new transaction; the one open ends (``outstanding`` drops to 0 then)."""
        self._stopped = True
        if self._txn is None and not self._ending:
            self.outstanding = 0

    def close(self) -> None:
        self._metadata.stop()

    def _init(self) -> None:
        """A new instance: InitProducerId (bumping the epoch), then the next transaction."""
        self._sequences.clear()

        def answered(answer: Any) -> None:
            error, pid, epoch = answer
            if error == ErrorCode.none:
                self._pid, self._epoch = pid, epoch
                self._begin()
            elif error in RETRIABLE:
                self._client.later(RETRY_BACKOFF_MS, self._init)
            else:  # fatal: the producer stops, as init_transactions raising would stop it
                self.outstanding = 0

        self._coordinated(("init_txn_producer_id", (self.transactional_id,
                                                    self._settings.timeout_ms, -1, -1)),
                          answered)

    # ---- the coordinator ---------------------------------------------------------------------

    def _coordinated(self, message: tuple[str, Any], on_answer: Callable[[Any], None]) -> None:
        """Send ``message`` to the coordinator (found first); its answer, or a retry of it
        after a failed exchange or a coordinator that moved (the answer's first element is
        its error code, or the answer is one).

        A failed exchange (timed out, reset, refused) is sent again after
        ``retry.backoff.ms`` to the coordinator as it is then, on a new connection, with a
        FindCoordinator beside it: librdkafka retries the request on its logical
        ``TxnCoordinator`` broker (``rd_kafka_txn_handle_EndTxn``'s RETRY and REFRESH on
        _TIMED_OUT and _TRANSPORT: ``rd_kafka_buf_retry``, and
        ``rd_kafka_txn_coord_timer_start``), which keeps its address until a query names
        another broker (``rd_kafka_txn_coord_set``)."""
        coordinator = self._coordinator
        if coordinator is None:
            self._find_coordinator(lambda: self._coordinated(message, on_answer))
            return

        def answered(answer: Any, error: NetworkError | None) -> None:
            code = None if error is not None else (
                answer[0] if isinstance(answer, tuple) else answer)
            if error is not None:
                self._query_coordinator(coordinator)
                self._client.later(RETRY_BACKOFF_MS,
                                   lambda: self._coordinated(message, on_answer))
                return
            if code in MOVED:
                self._coordinator = None
                self._client.later(RETRY_BACKOFF_MS,
                                   lambda: self._coordinated(message, on_answer))
                return
            on_answer(answer)

        self._client.call(coordinator, message, self._socket_timeout_ms, answered)

    def _query_coordinator(self, failed: tuple[str, int]) -> None:
        """Look the coordinator up again beside the retry (one query at a time, as
        ``rd_kafka_txn_coord_query``'s ``txn_wait_coord``); its answer replaces the address
        the retries go to."""
        if self._querying or self._coordinator != failed:
            return
        self._querying = True

        def found() -> None:
            self._querying = False

        self._find_coordinator(found, keep=False)

    def _find_coordinator(self, then: Callable[[], None], keep: bool = True) -> None:
        """FindCoordinator at a bootstrap broker, again after a backoff until one names the
        coordinator; ``keep``: until then, as a query beside a retry does not."""
        address = self._client.bootstrap[(self._n + self._seq) % len(self._client.bootstrap)]

        def answered(answer: Any, error: NetworkError | None) -> None:
            if error is None and answer[0] == ErrorCode.none and answer[2] is not None:
                self._coordinator = answer[2]
                then()
            elif keep:
                self._client.later(RETRY_BACKOFF_MS, lambda: self._find_coordinator(then))
            else:
                then()

        self._client.call(address, ("find_txn_coordinator", self.transactional_id),
                          self._socket_timeout_ms, answered)

    # ---- a transaction ---------------------------------------------------------------------

    def _begin(self) -> None:
        if self._stopped:
            self.outstanding = 0
            return
        n = self._n
        self._txn = _Txn(f"{self.name}-t{n}", "abort" if aborts(n, self._settings.abort_ratio)
                         else "commit", self._clock_s())
        self._n += 1
        self._produce_next()

    def _produce_next(self) -> None:
        txn = self._txn
        if txn is None or self._ending:
            return
        if len(txn.sends) >= self._settings.records_per_transaction or self._stopped:
            self._end()
            return
        seq = self._seq
        self._seq += 1
        value = f"{self.name}-{seq}"
        txn.sends.append(self._new_send(txn, value, seq % self._partitions,
                                        (value + self._pad).encode()))
        self._register()
        self._pump()
        self._client.later(self._interval_ms, self._produce_next)

    def _new_send(self, txn: _Txn, value: str, partition: int, payload: bytes) -> _Send:
        """A record of ``txn``, failing at its ``message.timeout.ms`` unless acknowledged."""
        send = _Send(value, partition, payload, self._clock_s(),
                     self._client.now_ms() + self._message_timeout_ms)
        self._client.later(self._message_timeout_ms, lambda: self._expired(txn, send))
        return send

    def _expired(self, txn: _Txn, send: _Send) -> None:
        """``message.timeout.ms`` passed with the record unacknowledged: it fails with
        MSG_TIMED_OUT (``rd_kafka_broker_toppar_msgq_scan`` for one still queued; one in
        flight meets its Produce's timeout, which is capped at its first record's), and the
        transaction is abortable (``rd_kafka_txn_op_commit_transaction`` refuses a commit
        after failed deliveries). One that was sent may be in the log, so the abort bumps
        the epoch (``rd_kafka_idemp_drain_epoch_bump``; here the send's ``uncertain``)."""
        if self._txn is not txn or send.offset is not None:
            return
        send.error = error_name(KafkaError._MSG_TIMED_OUT)
        self._fail(txn, KafkaError._MSG_TIMED_OUT)
        self._maybe_finish()

    def _register(self) -> None:
        """AddPartitionsToTxn of the partitions not yet in the transaction, one request at a
        time."""
        txn = self._txn
        if txn is None or self._adding or txn.abortable is not None:
            return
        wanted = sorted({s.partition for s in txn.sends} - txn.registered)
        if not wanted or (self._ending and txn.intent == "abort"):
            return
        txn.requested = True
        if self._tv2:  # the leader adds it on the Produce (Java's maybeAddPartition)
            txn.registered.update(wanted)
            return
        self._adding = True

        def answered(code: ErrorCode) -> None:
            self._adding = False
            if self._txn is not txn:
                return
            if code == ErrorCode.none:
                txn.registered.update(wanted)
                self._pump()
            elif code == ErrorCode.concurrent_transactions:
                self._client.later(CONCURRENT_RETRY_MS, self._register)
                return
            elif code in RETRIABLE:
                self._client.later(RETRY_BACKOFF_MS, self._register)
                return
            else:
                self._fail(txn, code)
            self._register()
            self._maybe_finish()

        self._coordinated(("add_partitions_to_txn", (
            self.transactional_id, self._pid, self._epoch,
            [TopicPartition(self._topic, p) for p in wanted])), answered)

    def _pump(self) -> None:
        """A batch of each registered partition with unsent records and none in flight."""
        txn = self._txn
        if txn is None or txn.abortable is not None:
            return
        for p in sorted(txn.registered - self._in_flight):
            batch = [s for s in txn.sends if s.partition == p and not s.sent]
            if not batch or (self._ending and txn.intent == "abort"):
                continue
            leader = self._metadata.leader(p)
            if leader is None:
                continue
            if retry_at := self._client.connectable(leader[1]):
                self._reconnected.at(retry_at)
                continue
            self._send(txn, p, leader[1], batch)

    def _send(self, txn: _Txn, p: int, address: tuple[str, int], batch: list[_Send]) -> None:
        base = self._sequences.get(p, 0)
        records = build_batch([s.payload for s in batch],
                              timestamp_ms=int(self._client.now_ms()), producer_id=self._pid,
                              producer_epoch=self._epoch, base_sequence=base,
                              attributes=TRANSACTIONAL_FLAG)
        for s in batch:
            s.sent = True
        self._in_flight.add(p)
        message = ("produce", (-1, self._request_timeout_ms, TopicPartition(self._topic, p),
                               records, self.transactional_id, 12 if self._tv2 else 9))

        def answered(result: ProduceResult | None, error: NetworkError | None) -> None:
            self._in_flight.discard(p)
            if self._txn is not txn:
                return
            if error is not None or (result is not None and result.error in LEADER_MOVED):
                self._metadata.refresh()
                for s in batch:  # sent again whole, at the same sequence
                    s.sent = False
                    s.uncertain = s.uncertain or error is not None
            elif self._tv2 and result is not None \
                    and result.error == ErrorCode.concurrent_transactions:
                for s in batch:  # the last transaction still ending: again, as it was
                    s.sent = False
                self._client.later(CONCURRENT_RETRY_MS, self._pump)
                self._maybe_finish()
                return
            elif result is not None and result.error == ErrorCode.none:
                self._sequences[p] = base + len(batch)
                for i, s in enumerate(batch):
                    s.offset = result.base_offset + i
                    s.uncertain = False
            else:
                assert result is not None
                # rd_kafka_handle_Produce_error: INVALID_PRODUCER_EPOCH fences the producer
                # (fatal); any other permanent error makes the transaction abortable
                # (INVALID_TXN_STATE of a partition the coordinator says is not in it too).
                self._fail(txn, result.error, fatal=not self._tv2
                           and result.error == ErrorCode.invalid_producer_epoch)
            self._client.later(0 if error is None else RETRY_BACKOFF_MS, self._pump)
            self._maybe_finish()

        # rd_kafka_ProduceRequest: the first record's time left, capped at socket.timeout.ms
        # (rd_kafka_buf_calc_timeout); a record past its time has failed (``_expired``).
        timeout_ms = min(self._socket_timeout_ms, batch[0].deadline_ms - self._client.now_ms())
        self._client.call(address, message, max(timeout_ms, 1.0), answered)

    def _fail(self, txn: _Txn, code: int, fatal: bool | None = None) -> None:
        """An error that makes the transaction abortable, or the producer fatal (``fatal``;
        None: as the coordinator's answers are, by ``FATAL``)."""
        if txn.abortable is None:
            txn.abortable = error_name(code)
            self._fatal = code in FATAL if fatal is None else fatal

    # ---- the end ---------------------------------------------------------------------------

    def _end(self) -> None:
        txn = self._txn
        assert txn is not None
        self._ending = True
        txn.t_end_invoke = self._clock_s()
        self._deadline_ms = self._client.now_ms() + self._end_timeout_ms
        self._client.later(self._end_timeout_ms, lambda: self._gave_up(txn))
        self._maybe_finish()

    def _gave_up(self, txn: _Txn) -> None:
        """The workload's end timeout passed with the transaction still open: its outcome is
        unknown (as the real producer's commit that keeps timing out)."""
        if self._txn is txn:
            self._finish(txn, "info" if txn.intent == "commit" else "fail", "TIMED_OUT",
                         fatal=True)

    def _maybe_finish(self) -> None:
        """Once nothing is in flight (and, committing, every record acknowledged), EndTxn."""
        txn = self._txn
        if txn is None or not self._ending or self._in_flight or self._adding or txn.end_sent:
            return
        aborting = txn.intent == "abort" or txn.abortable is not None
        if not aborting and any(s.offset is None for s in txn.sends):
            return  # still registering or sending
        if self._fatal:
            self._finish(txn, "fail", txn.abortable, fatal=True)
            return
        if aborting and not txn.requested:
            self._finish(txn, "fail", txn.abortable)  # nothing reached the coordinator
            return
        txn.end_sent = True
        self._end_txn(txn, commit=not aborting)

    def _end_txn(self, txn: _Txn, commit: bool) -> None:
        def answered(answer: ErrorCode | tuple[ErrorCode, int, int]) -> None:
            code = answer[0] if isinstance(answer, tuple) else answer
            if code == ErrorCode.none:
                if isinstance(answer, tuple):  # EndTxn v5: the next transaction's epoch
                    self._pid, self._epoch = answer[1], answer[2]
                    self._sequences.clear()
                self._finish(txn, "ok" if commit else "fail", txn.abortable)
            elif code in RETRIABLE and self._client.now_ms() < self._deadline_ms:
                delay = CONCURRENT_RETRY_MS if code == ErrorCode.concurrent_transactions \
                    else RETRY_BACKOFF_MS
                self._client.later(delay, lambda: self._end_txn(txn, commit))
            else:  # a commit may have happened; an abort never committed
                self._finish(txn, "info" if commit else "fail", error_name(code), fatal=True)

        self._coordinated(("end_txn_v5" if self._tv2 else "end_txn",
                           (self.transactional_id, self._pid, self._epoch, commit)), answered)

    def _finish(self, txn: _Txn, status: str, error: str | None, fatal: bool = False) -> None:
        record_transaction(
            self._history, self._record_send, Ended(
                self.name, self._topic, self.transactional_id, txn.name, txn.intent, status,
                error, txn.t_begin, txn.t_end_invoke, self._clock_s()), txn.sends)
        self._txn, self._ending, self._fatal = None, False, False
        # KIP-360, as librdkafka: an aborted transaction with a batch whose answer was lost
        # may have written it, so its sequence numbers cannot go on: the epoch is bumped.
        # Under version 2 the EndTxn bumped it already.
        if status == "info" or fatal or (not self._tv2
                                         and any(s.uncertain for s in txn.sends)):
            self._init()  # a new instance: its InitProducerId fences this one
        else:
            self._begin()
