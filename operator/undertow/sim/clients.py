"""Virtual Kafka clients: the workload's producers and consumers, as librdkafka behaves.

The model follows the settings ``undertow.runner.workload`` gives confluent-kafka
(docs/simulation.md, "The client model"):

- **Metadata.** Each client asks a broker (the bootstrap list in turn) for its metadata
  every ``topic.metadata.refresh.interval.ms`` (1 s) and at once after an error that says the
  leader moved; it sends to the leader that metadata names.
- **Connections.** A request only goes out on an open connection. A refused connection
  fails no request: the client tries again after ``reconnect.backoff.ms`` (100 ms), doubling
  up to ``reconnect.backoff.max.ms`` (10 s), while what waits for that broker stays queued.
  A reset connection fails the requests in flight on it (``_TRANSPORT``).
- **Producer.** ``linger.ms`` 2: a send waits up to 2 ms to join a batch for its partition.
  At most ``max.in.flight.requests.per.connection`` (5) Produce requests per broker. A
  request unanswered after ``request.timeout.ms`` fails with ``_TIMED_OUT``; a connection
  reset or refused fails with ``_TRANSPORT``. A failed batch is retried after
  ``retry.backoff.ms`` (100 ms) while attempts remain (``retries``), except that
  NOT_LEADER_OR_FOLLOWER is retried without counting (librdkafka refreshes the leader and
  re-sends). A failed batch is retried whole, as librdkafka retries its message sets. A record
  not acknowledged within ``message.timeout.ms`` fails with ``_MSG_TIMED_OUT``. acks=0
  reports success once the request is sent, with no offset. The outcome of each send is
  classified as the real workload does (``runner.outcomes``).
- **Idempotence** (``enable.idempotence``, KIP-98). The producer first gets a producer id
  (InitProducerId, retried while refused); every batch carries it, with the partition's next
  sequence number, fixed at its first send. Retried batches go out before new ones, in
  sequence order; OUT_OF_ORDER_SEQUENCE_NUMBER (a batch behind a failed one) is retried
  without counting, as librdkafka does while the failed one is retried.
- **Consumer.** ``assign`` of every partition from the beginning, fetching from each
  partition's leader (``fetch.wait.max.ms`` 500, ``fetch.min.bytes`` 1) with no leader
  epoch; OFFSET_OUT_OF_RANGE resets to the log start (``auto.offset.reset=earliest``).
  It reads committed (``isolation.level``, librdkafka's default, which the workload sets):
  the broker answers up to the last stable offset with the aborted transactions in range,
  and the consumer drops their batches and every control batch as Kafka's consumer does
  (``CompletedFetch.nextFetchedRecord``), its position moving past them; the end it asks for
  (ListOffsets latest) is the last stable offset.

Every client runs on the ``client`` host of the virtual network, which no fault kills (a
consumer that a partition may isolate has a host of its own), with connections of its own
(``KafkaEndpoint``), as each stock client is a librdkafka instance.

Long (about 530 lines): the librdkafka behaviours above, each a few methods of the producer's
or the consumer's model, which share the metadata and connection handling.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError

from minibroker.cluster.types import (
    ErrorCode,
    FetchPartition,
    FetchRequestData,
    FetchResult,
    MetadataImage,
    ProduceResult,
    TopicPartition,
)
from minibroker.storage.control_records import end_txn_marker_of
from minibroker.storage.records import build_batch, decode_records, iter_batches
from minibroker.storage.transaction_index import AbortedTxn
from undertow.runner.outcomes import classify
from undertow.runner.values import decode_value, padding
from undertow.runner.workload import WorkloadConfig, message_timeout_ms

LINGER_MS = 2.0
MAX_IN_FLIGHT = 5
RETRY_BACKOFF_MS = 100.0
METADATA_REFRESH_MS = 1000.0
METADATA_MAX_AGE_MS = 3 * METADATA_REFRESH_MS
"""librdkafka's ``metadata.max.age.ms`` when it is not set: three refresh intervals
(``rd_kafka_conf_finalize``). A topic's cache entry expires that long after the last answer
that named it."""
METADATA_FAST_REFRESH_MS = 100.0
"""Again this soon while a wanted partition has no leader (``retry.backoff.ms``)."""
RECONNECT_BACKOFF_MS = 100.0
RECONNECT_BACKOFF_MAX_MS = 10_000.0
FETCH_WAIT_MAX_MS = 500
FETCH_MAX_BYTES = 1 << 20
MAX_BATCH_RECORDS = 1000
SOCKET_TIMEOUT_MS = 60_000.0
"""librdkafka's ``socket.timeout.ms``: the bound of a request that is not a Produce."""

LEADER_MOVED = {ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch,
                ErrorCode.unknown_leader_epoch, ErrorCode.leader_not_available,
                ErrorCode.unknown_topic_or_partition, ErrorCode.kafka_storage_error}


def error_name(code: int) -> str:
    """The name librdkafka gives an error, as ``runner.workload.error_name``."""
    return KafkaError(code).name().lstrip("_")


class NetworkError(Exception):
    """An exchange failed without an answer; ``reason``: refused, reset or timeout."""

    def __init__(self, reason: str, address: tuple[str, int]) -> None:
        super().__init__(f"{reason}: {address[0]}:{address[1]}")
        self.reason = reason


class Wakeup:
    """At most one pending call of ``callback``, at the earliest time asked for. A client
    waiting for several partitions' unreachable leaders wakes once when the first may be
    tried again: a timer per partition at each wake multiplied the timers at every reconnect
    backoff, without bound while a leader stayed down (librdkafka's broker thread wakes its
    queued partitions once per connection attempt)."""

    def __init__(self, client: Endpoint, callback: Callable[[], None]) -> None:
        self._client = client
        self._callback = callback
        self._due: float | None = None

    def at(self, when_ms: float) -> None:
        if self._due is not None and self._due <= when_ms:
            return
        self._due = when_ms
        self._client.later(when_ms - self._client.now_ms(), lambda: self._fire(when_ms))

    def _fire(self, when_ms: float) -> None:
        if self._due != when_ms:
            return  # an earlier wake superseded this one, and it has run
        self._due = None
        self._callback()


class Endpoint:
    """What the client models send through: requests to brokers by address, each answered
    or failed (``NetworkError``), with librdkafka's reconnect backoff per address. The
    transport is ``undertow.sim.kafka_endpoint.KafkaEndpoint``: the Kafka protocol, over the
    virtual network, to the brokers' own listeners."""

    def __init__(self, bootstrap: list[tuple[str, int]]) -> None:
        self.bootstrap = bootstrap
        self._down: dict[tuple[str, int], tuple[float, float]] = {}

    def connectable(self, address: tuple[str, int]) -> float:
        """0 when a request to ``address`` may go out now, else when it may (a failed
        connection's reconnect backoff)."""
        down = self._down.get(address)
        return 0.0 if down is None or down[0] <= self.now_ms() else down[0]

    def connection_failed(self, address: tuple[str, int]) -> None:
        backoff = self._down.get(address, (0.0, RECONNECT_BACKOFF_MS / 2))[1] * 2
        backoff = min(backoff, RECONNECT_BACKOFF_MAX_MS)
        self._down[address] = (self.now_ms() + backoff, backoff)

    def call(self, address: tuple[str, int], message: Any, timeout_ms: float,
             on_answer: Callable[[Any, NetworkError | None], None]) -> None:
        def answered(answer: Any, error: NetworkError | None) -> None:
            if error is None:
                self._down.pop(address, None)
            elif error.reason in ("refused", "reset"):
                self.connection_failed(address)
            on_answer(answer, error)

        self.exchange(address, message, timeout_ms, answered)

    def exchange(self, address: tuple[str, int], message: Any, timeout_ms: float,
                 on_answer: Callable[[Any, NetworkError | None], None]) -> None:
        """Send ``message`` and call ``on_answer`` once, with its answer or its failure."""
        raise NotImplementedError

    def now_ms(self) -> float:
        raise NotImplementedError

    def later(self, delay_ms: float, callback: Callable[[], None]) -> None:
        raise NotImplementedError


class Metadata:
    """A client's metadata cache: each partition's leader and each broker's address."""

    def __init__(self, client: Endpoint, topic: str, first: int = 0) -> None:
        self._client = client
        self._topic = topic
        self._next = first
        self.image = MetadataImage()
        self._asking = False
        self._stopped = False
        self._started = False
        self._answered_ms: float | None = None
        """When the last answer came (each names the topic, as the client asks for it)."""
        self.listeners: list[Callable[[], None]] = []

    def when_cached(self, then: Callable[[], None]) -> None:
        """``then()`` once the topic is in the cache unexpired (``METADATA_MAX_AGE_MS``): at
        once, or after a refresh brings it back (librdkafka's consumer join waits so,
        ``rd_kafka_cgrp_metadata_refresh``: join-state wait-metadata)."""
        if (self._answered_ms is not None and self._topic in self.image.topics
                and self._client.now_ms() - self._answered_ms <= METADATA_MAX_AGE_MS):
            then()
            return

        def answered() -> None:
            self.listeners.remove(answered)
            then()

        self.listeners.append(answered)
        self.refresh()

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        self.refresh()

        def periodic() -> None:
            if self._stopped:
                return
            self.refresh()
            self._client.later(METADATA_REFRESH_MS, periodic)

        self._client.later(METADATA_REFRESH_MS, periodic)

    def stop(self) -> None:
        self._stopped = True

    def refresh(self) -> None:
        """Ask the next bootstrap broker (one request at a time)."""
        if self._asking or self._stopped:
            return
        self._asking = True
        address = self._client.bootstrap[self._next % len(self._client.bootstrap)]
        self._next += 1

        def answered(image: Any, error: NetworkError | None) -> None:
            self._asking = False
            if error is None and image.metadata_offset >= self.image.metadata_offset:
                self.image = image
                self._answered_ms = self._client.now_ms()
                for listener in list(self.listeners):
                    listener()
            if error is not None or not self._all_led():
                self._client.later(METADATA_FAST_REFRESH_MS, self.refresh)

        self._client.call(address, ("metadata", None), SOCKET_TIMEOUT_MS, answered)

    def _all_led(self) -> bool:
        topic = self.image.topics.get(self._topic)
        return topic is not None and all(self.leader(p) is not None for p in topic.partitions)

    def leader(self, partition: int) -> tuple[int, tuple[str, int]] | None:
        """The partition's leader and its address, when the metadata names a live one."""
        topic = self.image.topics.get(self._topic)
        if topic is None or partition not in topic.partitions:
            return None
        leader = topic.partitions[partition].leader
        endpoint = self.image.brokers.get(leader)
        if leader < 0 or endpoint is None:
            return None
        return leader, (endpoint.host, endpoint.port)


class LeaderWait:
    """Partitions whose fetches wait for a leader they cannot connect to. librdkafka moves a
    partition to its new leader's broker thread as soon as a metadata answer names that
    leader (``rd_kafka_toppar_broker_update``), and a broker going down makes it ask for the
    metadata of the topics it knows at once (``rd_kafka_broker_fail``: "broker down"). So a
    parked partition goes on at its leader's reconnect time (``reconnect.backoff.ms``) or at
    the first metadata answer that names another leader, whichever comes first."""

    def __init__(self, client: Endpoint, metadata: Metadata) -> None:
        self._client = client
        self._metadata = metadata
        self._parked: dict[int, tuple[int, int, Callable[[], None]]] = {}
        """Per partition: its parking's number, the leader it waits for, what goes on."""
        self._parkings = 0
        metadata.listeners.append(self._metadata_answered)

    def park(self, p: int, leader: int, retry_at: float, go_on: Callable[[], None]) -> None:
        self._parkings += 1
        parking = self._parkings
        self._parked[p] = (parking, leader, go_on)
        self._metadata.refresh()

        def reconnectable() -> None:
            if self._parked.get(p, (None,))[0] == parking:
                del self._parked[p]
                go_on()

        self._client.later(retry_at - self._client.now_ms(), reconnectable)

    def _metadata_answered(self) -> None:
        for p, (_, leader, go_on) in sorted(self._parked.items()):
            now = self._metadata.leader(p)
            if now is not None and now[0] != leader:
                del self._parked[p]
                go_on()


@dataclass
class _Message:
    seq: int
    value: str
    partition: int
    payload: bytes
    t_invoke: float
    deadline_ms: float
    retries: int = 0


@dataclass
class _Batch:
    messages: list[_Message]
    base_sequence: int = -1


@dataclass
class _PartitionQueue:
    queue: deque[_Message] = field(default_factory=deque)
    retries: list[_Batch] = field(default_factory=list)
    """Failed batches to send again, whole, before anything new (by base sequence)."""
    backoff_until_ms: float = 0.0
    next_sequence: int = 0


Submit = Callable[[dict[str, Any]], None]


class SimProducer:
    def __init__(self, index: int, client: Endpoint, cfg: WorkloadConfig, submit: Submit,
                 clock_s: Callable[[], float]) -> None:
        self.name = f"p{index}"
        self._client = client
        self._cfg = cfg
        self._submit = submit
        self._clock_s = clock_s
        self._metadata = Metadata(client, cfg.topic, first=index)
        self._metadata.listeners.append(self._pump)
        self._acks = {"all": -1, "-1": -1, "1": 1, "0": 0}[cfg.acks]
        self._message_timeout_ms = message_timeout_ms(cfg)
        self._queues = [_PartitionQueue() for _ in range(cfg.partitions)]
        self._in_flight: dict[int, int] = {}
        self._pump_scheduled = False
        self._stopped = False
        self._seq = 0
        self._pad = padding(self.name, cfg.record_size)
        self._reconnected = Wakeup(client, self._pump)
        self.outstanding = 0
        self._producer_id: int | None = None if cfg.idempotent else -1
        self._init_attempts = 0
        self._uncounted = {ErrorCode.not_leader_or_follower}
        if cfg.idempotent:
            self._uncounted.add(ErrorCode.out_of_order_sequence_number)

    def start(self) -> None:
        self._metadata.start()
        if self._producer_id is None:
            self._init_producer_id()
        self._send_next()

    def _init_producer_id(self) -> None:
        """InitProducerId at a bootstrap broker, again after a backoff until one answers."""
        self._init_attempts += 1
        address = self._client.bootstrap[self._init_attempts % len(self._client.bootstrap)]

        def answered(answer: Any, error: NetworkError | None) -> None:
            if error is None and answer[0] == ErrorCode.none:
                self._producer_id = answer[1]
                self._pump()
                return
            self._client.later(RETRY_BACKOFF_MS, self._init_producer_id)

        self._client.call(address, ("init_producer_id", None), SOCKET_TIMEOUT_MS, answered)

    def stop(self) -> None:
        """No new sends; outstanding ones still end (``outstanding`` counts them)."""
        self._stopped = True

    def close(self) -> None:
        self._metadata.stop()

    def _send_next(self) -> None:
        if self._stopped:
            return
        cfg = self._cfg
        seq = self._seq
        self._seq += 1
        value = f"{self.name}-{seq}"
        partition = seq % cfg.partitions
        now = self._client.now_ms()
        self._queues[partition].queue.append(_Message(
            seq, value, partition, (value + self._pad).encode(), self._clock_s(),
            now + self._message_timeout_ms))
        self.outstanding += 1
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self._client.later(LINGER_MS, self._scheduled_pump)
        if cfg.rate > 0:
            self._client.later(1000.0 / cfg.rate, self._send_next)

    def _scheduled_pump(self) -> None:
        self._pump_scheduled = False
        self._pump()

    def _pump(self) -> None:
        """Send what is queued where a leader is known and a request slot is free."""
        if self._producer_id is None:
            return  # no producer id yet
        now = self._client.now_ms()
        for partition, pq in enumerate(self._queues):
            self._expire(pq, now)
            if not (pq.queue or pq.retries) or pq.backoff_until_ms > now:
                continue
            leader = self._metadata.leader(partition)
            if leader is None:
                continue
            broker_id, address = leader
            if self._in_flight.get(broker_id, 0) >= MAX_IN_FLIGHT:
                continue
            retry_at = self._client.connectable(address)
            if retry_at:
                self._reconnected.at(retry_at)
                continue
            if pq.retries:
                batch = pq.retries.pop(0)
            else:
                batch = _Batch([pq.queue.popleft()
                                for _ in range(min(len(pq.queue), MAX_BATCH_RECORDS))])
                if self._cfg.idempotent:
                    batch.base_sequence = pq.next_sequence
                    pq.next_sequence += len(batch.messages)
            self._send(broker_id, address, partition, batch)

    def _expire(self, pq: _PartitionQueue, now: float) -> None:
        while pq.queue and pq.queue[0].deadline_ms <= now:
            self._finish(pq.queue.popleft(), KafkaError._MSG_TIMED_OUT)
        for batch in [b for b in pq.retries if b.messages[0].deadline_ms <= now]:
            pq.retries.remove(batch)
            for m in batch.messages:
                self._finish(m, KafkaError._MSG_TIMED_OUT)

    def _send(self, broker_id: int, address: tuple[str, int], partition: int,
              sent: _Batch) -> None:
        cfg = self._cfg
        tp = TopicPartition(cfg.topic, partition)
        batch = sent.messages
        assert self._producer_id is not None
        records = build_batch([m.payload for m in batch],
                              timestamp_ms=int(self._client.now_ms()),
                              producer_id=self._producer_id,
                              producer_epoch=0 if self._producer_id >= 0 else -1,
                              base_sequence=sent.base_sequence)
        self._in_flight[broker_id] = self._in_flight.get(broker_id, 0) + 1
        message = ("produce", (self._acks, cfg.request_timeout_ms, tp, records))
        if self._acks == 0:  # fire and forget: success once sent, no offset
            self._client.call(address, message, cfg.request_timeout_ms, lambda _a, _e: None)
            self._in_flight[broker_id] -= 1
            for m in batch:
                self._finish(m, None, None)
            return

        def answered(result: ProduceResult | None, error: NetworkError | None) -> None:
            self._in_flight[broker_id] -= 1
            if error is not None:
                self._metadata.refresh()
                if error.reason == "refused":  # never sent: it waits for a connection
                    self._failed(sent, KafkaError._TRANSPORT, counts=False)
                else:
                    self._failed(sent, KafkaError._TIMED_OUT if error.reason == "timeout"
                                 else KafkaError._TRANSPORT, counts=True)
            elif result is None or result.error == ErrorCode.none:
                assert result is not None
                for i, m in enumerate(batch):
                    self._finish(m, None, result.base_offset + i)
            else:
                if result.error in LEADER_MOVED:
                    self._metadata.refresh()
                self._failed(sent, int(result.error),
                             counts=result.error not in self._uncounted)
            self._pump()

        self._client.call(address, message, cfg.request_timeout_ms, answered)

    def _failed(self, batch: _Batch, code: int, *, counts: bool) -> None:
        """Retry the batch whole while attempts remain (all its records were sent together,
        so they share their count), else each record fails with ``code``."""
        first = batch.messages[0]
        if counts and first.retries >= self._cfg.retries:
            for m in batch.messages:
                self._finish(m, code)
            return
        if counts:
            for m in batch.messages:
                m.retries += 1
        pq = self._queues[first.partition]
        pq.retries.append(batch)
        pq.retries.sort(key=lambda b: (b.base_sequence, b.messages[0].seq))
        pq.backoff_until_ms = self._client.now_ms() + RETRY_BACKOFF_MS
        self._client.later(RETRY_BACKOFF_MS, self._pump)

    def _finish(self, m: _Message, error: int | None, offset: int | None = None) -> None:
        self.outstanding -= 1
        if error is None:
            status, error_text = "ok", None
        else:
            status, error_text = classify(KafkaError(error), self._cfg.retries), error_name(error)
        self._submit({"producer": self.name, "value": m.value, "topic": self._cfg.topic,
                      "partition": m.partition, "status": status, "offset": offset,
                      "error": error_text, "t_invoke": m.t_invoke,
                      "t_complete": self._clock_s()})


READ_COMMITTED = 1  # Kafka's IsolationLevel.READ_COMMITTED


def committed_records(records: bytes, aborted: list[AbortedTxn] | None
                      ) -> tuple[list[tuple[int, bytes | None]], int | None]:
    """The (offset, value) a read_committed consumer returns from one fetched partition, and
    the offset past its last batch (None: no batch): Kafka's consumer
    (``CompletedFetch.nextFetchedRecord``) drops a transactional batch of a producer whose
    aborted transaction (``aborted``, from the Fetch response) began at or before the
    batch's end, until that producer's ABORT marker, and every control batch."""
    pending = sorted(aborted or [], key=lambda a: a.first_offset)
    open_aborts: set[int] = set()
    found: list[tuple[int, bytes | None]] = []
    end = None
    for header, batch in iter_batches(records, validate_crc=False):
        end = header.last_offset + 1
        if header.producer_id >= 0:
            while pending and pending[0].first_offset <= header.last_offset:
                open_aborts.add(pending.pop(0).producer_id)
        if header.is_control:
            if end_txn_marker_of(header, batch).is_abort:
                open_aborts.discard(header.producer_id)
            continue
        if header.is_transactional and header.producer_id in open_aborts:
            continue
        found.extend((r.offset, r.value) for r in decode_records(batch))
    return found, end


Read = Callable[[str, int, int, str, float], None]
"""Records one read: consumer, partition, offset, value, time."""


class SimConsumer:
    """``assign`` of every partition from its beginning; one fetch loop per partition."""

    def __init__(self, name: str, client: Endpoint, topic: str, partitions: int,
                 on_read: Read, clock_s: Callable[[], float], first: int = 0) -> None:
        self.name = name
        self._client = client
        self._topic = topic
        self._on_read = on_read
        self._clock_s = clock_s
        self._metadata = Metadata(client, topic, first=first)
        self._leader_wait = LeaderWait(client, self._metadata)
        self.positions: dict[int, int] = {}
        self._partitions = partitions
        self._stopped = False

    def start(self, partitions: list[int] | None = None) -> None:
        """Read ``partitions`` (default: all) from their beginnings."""
        self._metadata.start()
        for p in range(self._partitions) if partitions is None else partitions:
            self._reset(p)

    def end_offsets(self, on_end: Callable[[int, int], None]) -> None:
        """Ask each partition's leader for its end (the HW), again while it has none."""
        self._metadata.start()

        def ask(p: int) -> None:
            if self._stopped:
                return

            def answered(offset: int | None) -> None:
                if offset is None:
                    self._retry(p, ask)
                else:
                    on_end(p, offset)

            self.list_offset(p, -1, answered)

        for p in range(self._partitions):
            ask(p)

    def stop(self) -> None:
        self._stopped = True
        self._metadata.stop()

    def _retry(self, p: int, then: Callable[[int], None]) -> None:
        self._metadata.refresh()
        self._client.later(RETRY_BACKOFF_MS, lambda: then(p))

    def list_offset(self, p: int, timestamp: int,
                    on_offset: Callable[[int | None], None]) -> None:
        """ListOffsets at the leader: -2 the log start, -1 the end (the HW); None when no
        leader answered."""
        leader = self._metadata.leader(p)
        if leader is None:
            on_offset(None)
            return

        def answered(answer: Any, error: NetworkError | None) -> None:
            if error is not None or answer[0] != ErrorCode.none:
                on_offset(None)
                return
            on_offset(answer[1])

        self._client.call(leader[1], ("list_offset", (TopicPartition(self._topic, p), timestamp,
                                                      -1, READ_COMMITTED, -1)),
                          SOCKET_TIMEOUT_MS, answered)

    def _reset(self, p: int) -> None:
        """auto.offset.reset=earliest: the log start, then fetch from there."""
        if self._stopped:
            return

        def reset(offset: int | None) -> None:
            if self._stopped:
                return
            if offset is None:
                self._retry(p, self._reset)
                return
            self.positions[p] = offset
            self._fetch(p)

        self.list_offset(p, -2, reset)

    def _fetch(self, p: int) -> None:
        if self._stopped:
            return
        leader = self._metadata.leader(p)
        if leader is None:
            self._retry(p, self._fetch)
            return
        retry_at = self._client.connectable(leader[1])
        if retry_at:
            self._leader_wait.park(p, leader[0], retry_at, lambda: self._fetch(p))
            return
        tp = TopicPartition(self._topic, p)
        position = self.positions[p]
        request = FetchRequestData(replica_id=-1, max_wait_ms=FETCH_WAIT_MAX_MS, min_bytes=1,
                                   max_bytes=FETCH_MAX_BYTES,
                                   partitions=[FetchPartition(tp, position,
                                                              max_bytes=FETCH_MAX_BYTES)],
                                   isolation_level=READ_COMMITTED)

        def answered(results: Any, error: NetworkError | None) -> None:
            if self._stopped:
                return
            if error is not None:
                self._retry(p, self._fetch)
                return
            result: FetchResult = results[tp]
            if result.error == ErrorCode.offset_out_of_range:
                self._reset(p)
                return
            if result.error != ErrorCode.none:
                self._retry(p, self._fetch)
                return
            now = self._clock_s()
            records, end = committed_records(result.records, result.aborted_transactions)
            for offset, value in records:
                if offset >= self.positions[p]:
                    self._on_read(self.name, p, offset, decode_value(value), now)
                    self.positions[p] = offset + 1
            if end is not None:
                self.positions[p] = max(self.positions[p], end)
            self._fetch(p)

        self._client.call(leader[1], ("fetch", request),
                          FETCH_WAIT_MAX_MS + SOCKET_TIMEOUT_MS, answered)
