"""The simulated transactional producer times out, retries and connects as librdkafka 2.16
does, the steps by which a delayed EndTxn lands in the next transaction (Jepsen 2024,
experiments/txn-delayed-endtxn-tv1.yaml):

- a transactional producer that leaves ``socket.timeout.ms`` unset gets the transaction timeout
  less 100 ms (``rd_kafka_conf_finalize``), the timeout of every coordinator request and the
  cap of every Produce, whose own is what its first record has left of ``message.timeout.ms``
  (``rd_kafka_ProduceRequest``, ``rd_kafka_buf_calc_timeout``); a record past that fails with
  MSG_TIMED_OUT and the transaction is aborted (the epoch bumped: it may be in the log);
- an EndTxn that timed out goes again to the same coordinator after ``retry.backoff.ms``,
  without waiting for the FindCoordinator that runs beside it (``rd_kafka_buf_retry`` on the
  logical ``TxnCoordinator`` broker);
- a Produce refused with INVALID_TXN_STATE (the leader's KIP-890 verification) makes the
  transaction abortable, not the producer fatal (``rd_kafka_handle_Produce_error``);
- the coordinator's requests go on a connection of their own, so a Produce that times out
  (and closes its connection) leaves an EndTxn to the same broker alone
  (``rd_kafka_broker_add_logical``);
- a request fails at librdkafka's once-a-second timeout scan, not at its timeout's instant
  (``rd_kafka_broker_serve``).

The producer runs against a scripted endpoint (each request kind answered, failed or left
unanswered as a test says) on a clock of its own; the transport against a scripted broker on
the virtual network."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from test_virtual_loop import LATENCY, run

from minibroker import environment
from minibroker.cluster.types import (
    BrokerEndpoint,
    ErrorCode,
    MetadataImage,
    PartitionRegistration,
    ProduceResult,
    TopicImage,
    TopicPartition,
)
from minibroker.network.channel import REQUEST_CHANNEL
from undertow.runner.transactional_producer import TxnSettings
from undertow.sim.clients import RETRY_BACKOFF_MS, Endpoint, NetworkError
from undertow.sim.kafka_endpoint import TIMEOUT_SCAN_S, KafkaEndpoint
from undertow.sim.transactional_producer import SimTransactionalProducer
from undertow.sim.virtual_streams import VirtualNetwork

BROKER = ("broker-0", 9092)
TOPIC = "t"
Answer = Callable[[Any, NetworkError | None], None]


class Scripted(Endpoint):
    """A producer's transport on a clock of its own: each request kind is answered by
    ``script[kind](args)`` 1 ms later, which returns the answer, a ``NetworkError`` (after
    the request's timeout), or None (no answer: it times out)."""

    def __init__(self, script: dict[str, Callable[[Any], Any]]) -> None:
        super().__init__([BROKER])
        self.script = script
        self.now = 0.0
        self.calls: list[tuple[float, str, float, Any]] = []
        """(when, kind, timeout, args) of every request."""
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()

    def exchange(self, address: tuple[str, int], message: Any, timeout_ms: float,
                 on_answer: Answer) -> None:
        kind, args = message
        self.calls.append((self.now, kind, timeout_ms, args))
        answer = self.script[kind](args)
        if answer is None or isinstance(answer, NetworkError):
            self.later(timeout_ms, lambda: on_answer(
                None, answer or NetworkError("timeout", address)))
        else:
            self.later(1.0, lambda: on_answer(answer, None))

    def now_ms(self) -> float:
        return self.now

    def later(self, delay_ms: float, callback: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (self.now + delay_ms, next(self._order), callback))

    def run_until(self, until_ms: float) -> None:
        while self._timers and self._timers[0][0] <= until_ms:
            self.now, _, callback = heapq.heappop(self._timers)
            callback()
        self.now = until_ms

    def of(self, kind: str) -> list[tuple[float, str, float, Any]]:
        return [c for c in self.calls if c[1] == kind]


def _image() -> MetadataImage:
    return MetadataImage(
        metadata_offset=0, brokers={0: BrokerEndpoint(0, *BROKER)}, cluster_id="c",
        topics={TOPIC: TopicImage(TOPIC, "id", {}, {0: PartitionRegistration(
            replicas=(0,), isr=(0,), leader=0, leader_epoch=0, partition_epoch=0)})})


def _offsets() -> Callable[[Any], ProduceResult]:
    offsets = itertools.count(step=10)
    return lambda _args: ProduceResult(ErrorCode.none, next(offsets), 0, None)


def script(**overrides: Callable[[Any], Any]) -> dict[str, Callable[[Any], Any]]:
    """A broker that answers every request well, but for ``overrides``."""
    return {"metadata": lambda _: _image(),
            "find_txn_coordinator": lambda _: (ErrorCode.none, 0, BROKER),
            "init_txn_producer_id": lambda _: (ErrorCode.none, 7, 0),
            "add_partitions_to_txn": lambda _: ErrorCode.none,
            "produce": _offsets(),
            "end_txn": lambda _: ErrorCode.none,
            **overrides}


class Recorded:
    """The history lines the producer writes."""

    def __init__(self) -> None:
        self.txns: list[dict[str, Any]] = []
        self.sends: list[dict[str, Any]] = []

    def transaction(self, **line: Any) -> None:
        self.txns.append(line)


def producer(endpoint: Scripted, recorded: Recorded, timeout_ms: int = 2000,
             records: int = 2) -> SimTransactionalProducer:
    """A started producer of ``records``-record transactions at 100 records/s, with
    librdkafka's default message timeout as the workload gives it (request.timeout.ms 5 s,
    5 retries: 31 s, capped at the transaction timeout)."""
    made = SimTransactionalProducer(
        0, endpoint, TOPIC, 1, 100.0, 16, TxnSettings(records, 0.0, timeout_ms), 5000, 60_000,
        recorded, recorded.sends.append, lambda: endpoint.now / 1000,  # type: ignore[arg-type]
        message_timeout_ms=31_000)
    made.start()
    return made


def test_coordinator_requests_time_out_at_the_transaction_timeout_less_100_ms() -> None:
    endpoint, recorded = Scripted(script(end_txn=lambda _: None)), Recorded()
    producer(endpoint, recorded, timeout_ms=2000)
    endpoint.run_until(5000)
    kinds = ("init_txn_producer_id", "add_partitions_to_txn", "end_txn")
    assert {c[2] for k in kinds for c in endpoint.of(k)} == {1900.0}
    # librdkafka's floor: socket.timeout.ms is at least 900 ms however short the transaction.
    short = Scripted(script())
    producer(short, Recorded(), timeout_ms=1000)
    short.run_until(1000)
    assert {c[2] for c in short.of("end_txn")} == {900.0}


def test_an_endtxn_that_timed_out_goes_again_to_the_coordinator_after_the_backoff() -> None:
    """The first EndTxn is never answered; once it times out, a FindCoordinator goes out
    beside the retry and is never answered either: the retry does not wait for it."""
    answered = {"end_txn": 0}

    def end_txn(_args: Any) -> ErrorCode | None:
        answered["end_txn"] += 1
        return None if answered["end_txn"] == 1 else ErrorCode.none

    found = {"n": 0}

    def find(_args: Any) -> tuple[ErrorCode, int, tuple[str, int]] | None:
        found["n"] += 1
        return (ErrorCode.none, 0, BROKER) if found["n"] == 1 else None

    endpoint, recorded = Scripted(script(end_txn=end_txn, find_txn_coordinator=find)), Recorded()
    producer(endpoint, recorded)
    endpoint.run_until(3000)
    first, retry = endpoint.of("end_txn")[:2]
    assert retry[0] == first[0] + 1900 + RETRY_BACKOFF_MS
    assert [c[0] for c in endpoint.of("find_txn_coordinator")][1:] == [first[0] + 1900]
    assert recorded.txns[0]["status"] == "ok"


def test_a_produce_times_out_with_its_records_message_timeout_and_aborts() -> None:
    """Produce requests that are never answered: each times out at socket.timeout.ms or at
    what its first record has left of message.timeout.ms (the transaction timeout, 2 s),
    whichever comes first; the records fail with MSG_TIMED_OUT 2 s after they were produced,
    the transaction is aborted (EndTxn), and the epoch bumped (InitProducerId) since the
    records may be in the log."""
    endpoint, recorded = Scripted(script(produce=lambda _: None)), Recorded()
    producer(endpoint, recorded)
    endpoint.run_until(2500)
    (end,) = endpoint.of("end_txn")
    began = endpoint.of("add_partitions_to_txn")[0][0]  # as its first record was produced
    produces = [c for c in endpoint.of("produce") if c[0] < end[0]]
    assert produces[0][2] == 1900.0
    # The second record, 10 ms after the first, is the last to fail.
    assert max(when + timeout for when, _, timeout, _ in produces) <= began + 2010
    assert [s["error"] for s in recorded.sends] == ["MSG_TIMED_OUT"] * 2
    assert recorded.txns[0]["status"] == "fail"
    assert end[3][3] is False  # an abort
    assert len(endpoint.of("init_txn_producer_id")) == 2


def test_records_failing_while_the_abort_is_out_do_not_send_it_again() -> None:
    """The first record fails at 2 s and the abort's EndTxn goes out, unanswered; the second
    record fails 10 ms later: the EndTxn is only retried, after its own timeout."""
    ended = {"n": 0}

    def end_txn(_args: Any) -> ErrorCode | None:
        ended["n"] += 1
        return None if ended["n"] == 1 else ErrorCode.none

    endpoint, recorded = Scripted(script(produce=lambda _: None, end_txn=end_txn)), Recorded()
    producer(endpoint, recorded)
    endpoint.run_until(5000)
    first, retry = [c[0] for c in endpoint.of("end_txn")][:2]
    assert retry == first + 1900 + RETRY_BACKOFF_MS
    assert recorded.txns[0]["status"] == "fail"


def test_a_produce_the_leader_refuses_as_outside_the_transaction_makes_it_abortable() -> None:
    """INVALID_TXN_STATE on a Produce (KIP-890 verification: the partition is in no ongoing
    transaction) is abortable: the producer sends EndTxn(abort), as librdkafka's
    abort_transaction does, instead of giving up fatally without one."""
    endpoint, recorded = Scripted(script(
        produce=lambda _: ProduceResult(ErrorCode.invalid_txn_state, -1, 0, None))), Recorded()
    producer(endpoint, recorded)
    endpoint.run_until(500)
    assert recorded.txns[0]["status"] == "fail"
    assert recorded.txns[0]["error"] == "INVALID_TXN_STATE"
    assert [c[3][3] for c in endpoint.of("end_txn")][:1] == [False]


# ---- the transport: KafkaEndpoint over the virtual network ----------------------------------


def _broker(answer_after_s: dict[str, float | None]) -> Callable[..., Any]:
    """A broker that answers a request of API ``name`` after ``answer_after_s[name]``
    seconds (None: never), each request on its own, with a response the model can read."""
    async def serve(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        channel = writer.get_extra_info(REQUEST_CHANNEL)
        while (request := await channel.receive()) is not None:
            after = answer_after_s[request.api_key.name]
            if after is not None:
                asyncio.get_running_loop().call_later(
                    after, channel.send, request, SimpleNamespace(error_code=0))

    return serve


def _exchanges(answer_after_s: dict[str, float | None],
               requests: list[tuple[float, Any, float]]) -> list[tuple[float, str]]:
    """``requests`` ((when, message, timeout ms)) from one client to one broker; when each
    was answered or failed, and how."""
    async def main(loop: asyncio.AbstractEventLoop) -> list[tuple[float, str]]:
        net = VirtualNetwork(loop, LATENCY)
        await net.start_server(_broker(answer_after_s), *BROKER)
        done: list[tuple[float, str]] = []
        with environment.entered(net.environment("client", loop.time)):
            endpoint = KafkaEndpoint([BROKER], TOPIC)
            for when, message, timeout_ms in requests:
                loop.call_later(when, endpoint.exchange, BROKER, message, timeout_ms,
                                lambda answer, error: done.append(
                                    (loop.time(), "answered" if error is None
                                     else error.reason)))
        while len(done) < len(requests):
            await asyncio.sleep(0.1)
        return done

    return run(main)


PRODUCE = ("produce", (-1, 5000, TopicPartition(TOPIC, 0), b"", "tx"))
END_TXN = ("end_txn", ("tx", 7, 0, True))


def test_an_endtxn_is_not_failed_by_a_produce_timing_out_on_the_same_broker() -> None:
    """A Produce the broker never answers times out at 1 s and closes its connection; an
    EndTxn to the same broker, answered after 1.5 s, is answered all the same."""
    done = _exchanges({"PRODUCE": None, "END_TXN": 1.5},
                      [(0.0, PRODUCE, 1000.0), (0.0, END_TXN, 1900.0)])
    assert [how for _, how in done] == ["timeout", "answered"]


def test_a_request_fails_at_the_first_timeout_scan_after_its_timeout() -> None:
    """librdkafka scans for timed-out requests once a second from the client's start: an
    EndTxn sent 0.3 s in with a 1.9 s timeout fails at the scan of 3 s, not at 2.2 s."""
    ((when, how),) = _exchanges({"END_TXN": None}, [(0.3, END_TXN, 1900.0)])
    assert how == "timeout"
    assert when == 3 * TIMEOUT_SCAN_S
