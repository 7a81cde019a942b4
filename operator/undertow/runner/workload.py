"""The workload: stock Kafka clients (confluent-kafka / librdkafka) writing unique values and
reading every partition, every outcome recorded in the history.

A send is ``ok`` (acknowledged, with its offset), ``fail`` (the broker said no, and no earlier
attempt could have been written: see ``outcomes``) or ``info`` (timed out, disconnected, or an
error after retries or a leader change: the record may or may not be in the log). Values are
``p{producer}-{seq}``, padded to the record size (``values``).

When the run is aborted (`undertow.runner.abort`) the workers stop waiting: producers give up
their outstanding sends' outcomes and the drain stops, so neither holds up a run that stops.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition

from undertow.runner.abort import Abort
from undertow.runner.group_member import GroupMember, GroupSettings
from undertow.runner.history import HistoryWriter
from undertow.runner.outcomes import LeaderEpochGate, classify, error_name
from undertow.runner.pacing import Pacer
from undertow.runner.pipeline import Pipeline, PipelineSettings, member_config
from undertow.runner.producer_process import ProducerProcess, ProducerProcessConfig, StartClient
from undertow.runner.transactional_producer import (
    TransactionalProducer,
    TransactionLog,
    TxnSettings,
)
from undertow.runner.values import decode_value, padding

log = logging.getLogger("undertow.workload")

# librdkafka logs every disconnect and refused connection a fault causes (levels 3-6): keep
# only its critical messages; the outcome of every send is in the history anyway.
LIBRDKAFKA_LOG_LEVEL = 2
ABORT_POLL_S = 0.2
"""How often a producer waiting for its last outcomes, and the drain, look at the abort."""
WATERMARK_TIMEOUT_S = 5.0
"""How long the drain waits for one answer to its end-offset request."""
WATERMARK_RETRY_S = 0.5
"""Between the drain's end-offset requests for a partition without a reachable leader."""
END_OFFSETS_SHARE = 0.25
"""The part of the drain's time it may spend asking for end offsets; the rest is reading."""
MEMBERS_CLOSE_TIMEOUT_S = 60.0
"""How long the run's consumers may take, in all, to commit and leave once stopped (the
same in simulation); those still closing then are named in meta.json's
`consumers_not_closed`."""
ISOLATION_LEVEL = "read_committed"
"""The `assign` consumers' and the drain's isolation.level (librdkafka's default, said
explicitly): the transactional workload's checks read what committed readers see."""


@dataclass(frozen=True)
class WorkloadConfig:
    topic: str
    partitions: int
    producers: int = 1
    consumers: int = 1
    acks: str = "all"
    retries: int = 0
    request_timeout_ms: int = 5000
    rate: float = 200.0
    record_size: int = 100
    idempotent: bool = False
    group: GroupSettings | None = None
    """subscribe mode: the consumers are the members of this consumer group."""
    rebalance_every_s: float | None = None
    """subscribe mode: every this often one member (in turn) leaves and joins again."""
    transactions: TxnSettings | None = None
    """The producers are transactional (KIP-98)."""
    pipeline: PipelineSettings | None = None
    """The group's members are a consume-transform-produce pipeline (`runner.pipeline`)."""
    process_producers: tuple[str, ...] = ()
    """The producers (`p0`) the schedule pauses: each runs as a process of its own
    (`runner.producer_process`), the others as threads."""


def outcomes_wait_s(cfg: WorkloadConfig) -> float:
    """The longest a producer waits, once stopped, for its outstanding sends' outcomes: every
    attempt's request timeout, and 5 s more."""
    return cfg.request_timeout_ms * (cfg.retries + 1) / 1000 + 5


def message_timeout_ms(cfg: WorkloadConfig) -> int:
    """The producers' message.timeout.ms: every attempt's request timeout, and 1 s more (a
    transactional producer's is capped at its transaction timeout)."""
    return cfg.request_timeout_ms * (cfg.retries + 1) + 1000


def producer_config(name: str, bootstrap: str, cfg: WorkloadConfig) -> dict[str, Any]:
    """librdkafka's configuration of producer `name`."""
    return {
        "bootstrap.servers": bootstrap,
        "client.id": f"undertow-{name}",
        "acks": cfg.acks,
        "retries": cfg.retries,
        "enable.idempotence": cfg.idempotent,
        "request.timeout.ms": cfg.request_timeout_ms,
        "message.timeout.ms": message_timeout_ms(cfg),
        "linger.ms": 2,
        "max.in.flight.requests.per.connection": 5,
        "topic.metadata.refresh.interval.ms": 1000,
        "log_level": LIBRDKAFKA_LOG_LEVEL,
    }


class ProducerWorker:
    def __init__(self, index: int, bootstrap: str, cfg: WorkloadConfig,
                 submit: Callable[[dict[str, Any]], None], abort: Abort) -> None:
        self.name = f"p{index}"
        self._cfg = cfg
        self._submit = submit
        self._abort = abort
        self._stop = threading.Event()
        self._producer = Producer(producer_config(self.name, bootstrap, cfg))
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self) -> None:
        self._thread.join()

    def _run(self) -> None:
        cfg = self._cfg
        pad = padding(self.name, cfg.record_size)
        pacer = Pacer(cfg.rate)
        seq = 0
        while not self._stop.is_set():
            value = f"{self.name}-{seq}"
            partition = seq % cfg.partitions
            t_invoke = time.time()
            try:
                self._producer.produce(cfg.topic, (value + pad).encode(), partition=partition,
                                       on_delivery=self._on_delivery(value, partition, t_invoke))
            except BufferError:
                self._producer.poll(0.05)
                continue
            seq += 1
            self._producer.poll(0)
            pacer.wait(self._producer.poll, self._stop.is_set)
        # Wait for every outstanding send's outcome: each ends ok, fail or (timed out) info;
        # unless the run was aborted, when the outcomes could not be recorded anyway.
        deadline = time.monotonic() + outcomes_wait_s(cfg)
        while (self._producer.flush(ABORT_POLL_S) and time.monotonic() < deadline
               and not self._abort.is_set()):
            pass

    def _on_delivery(self, value: str, partition: int, t_invoke: float):
        def callback(err: KafkaError | None, msg) -> None:
            t_complete = time.time()
            if err is None:
                # acks=0: the broker never answers, so the client has no offset (-1001).
                offset = msg.offset()
                status, offset, error = "ok", offset if offset >= 0 else None, None
            else:
                status, offset, error = classify(err, self._cfg.retries), None, error_name(err)
            self._submit({"producer": self.name, "value": value, "topic": self._cfg.topic,
                          "partition": partition, "status": status, "offset": offset,
                          "error": error, "t_invoke": t_invoke, "t_complete": t_complete})

        return callback


def producer_worker(index: int, bootstrap: str, cfg: WorkloadConfig, *,
                    submit: Callable[[dict[str, Any]], None],
                    settled: Callable[[dict[str, Any]], None], transactions: TransactionLog,
                    abort: Abort) -> ProducerWorker | TransactionalProducer:
    """Producer `index`, plain or transactional, on a thread of the calling process (the
    runner's, or a producer process's of its own): `submit` takes a plain send's outcome,
    `settled` a transactional send's with its transaction's, `transactions` each
    transaction's line."""
    if cfg.transactions is None:
        return ProducerWorker(index, bootstrap, cfg, submit, abort)
    return TransactionalProducer(
        index, producer_config(f"p{index}", bootstrap, cfg), cfg.topic, cfg.partitions,
        cfg.rate, cfg.record_size, cfg.transactions, outcomes_wait_s(cfg), transactions,
        settled, abort)


class WorkloadStats:
    """Counts for the live progress line; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts = {"ok": 0, "fail": 0, "info": 0}
        self.errors: dict[str, int] = {}
        self._recent_acks: deque[float] = deque()

    def record(self, status: str, error: str | None) -> None:
        with self._lock:
            self.counts[status] += 1
            if error:
                self.errors[error] = self.errors.get(error, 0) + 1
            if status == "ok":
                now = time.monotonic()
                self._recent_acks.append(now)

    def acks_per_second(self) -> float:
        with self._lock:
            cutoff = time.monotonic() - 1.0
            while self._recent_acks and self._recent_acks[0] < cutoff:
                self._recent_acks.popleft()
            return float(len(self._recent_acks))


class SendOutcomes:
    """Where every send's outcome goes, in both worlds (`Workload`, `sim.world.SimWorkload`):
    to the history and the progress counts, a definite failure held first by the leader-epoch
    gate (`outcomes.LeaderEpochGate`: the sampler feeds it, the run closes it)."""

    def __init__(self, history: HistoryWriter) -> None:
        self._history = history
        self.stats = WorkloadStats()
        self.epoch_gate = LeaderEpochGate(self._record)

    def submit(self, send: dict[str, Any]) -> None:
        if send["status"] == "fail":
            self.epoch_gate.hold(send)
        else:
            self._record(send)

    def settled(self, send: dict[str, Any]) -> None:
        """A send whose transaction decided its outcome, recorded at once: an abort is
        final whatever leadership did while it was out, so no gate holds it."""
        self._record(send)

    def progress(self, acks_per_second: float) -> dict[str, Any]:
        """The progress line's counts, errors and rate."""
        return {"counts": dict(self.stats.counts), "errors": dict(self.stats.errors),
                "acks_per_second": acks_per_second}

    def _record(self, send: dict[str, Any]) -> None:
        self._history.send(**send)
        self.stats.record(send["status"], send["error"])


class ConsumerWorker:
    """Reads every partition from the earliest offset with ``assign``, recording each record."""

    def __init__(self, name: str, bootstrap: str, topic: str, partitions: int,
                 history: HistoryWriter, phase: str) -> None:
        self.name = name
        self._topic = topic
        self._partitions = partitions
        self._history = history
        self._phase = phase
        self._stop = threading.Event()
        self.positions: dict[int, int] = {}
        self._consumer = Consumer({
            "bootstrap.servers": bootstrap,
            "group.id": f"undertow-{name}",
            "client.id": f"undertow-{name}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": ISOLATION_LEVEL,
            "topic.metadata.refresh.interval.ms": 1000,
            "log_level": LIBRDKAFKA_LOG_LEVEL,
        })
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def assign(self) -> None:
        self._consumer.assign([KafkaTopicPartition(self._topic, p, OFFSET_BEGINNING)
                               for p in range(self._partitions)])

    def start(self) -> None:
        self.assign()
        self._thread.start()

    def stop(self, timeout_s: float) -> bool:
        """Stop reading and close, as `GroupMember.stop` (without a group, its close has no
        coordinator to wait for); whether it has closed. A later call waits no more."""
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join(timeout_s)
            if not self._thread.is_alive():
                self.close()
        return not self._thread.is_alive()

    def close(self) -> None:
        self._consumer.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll_once()

    def poll_once(self, timeout: float = 0.2) -> None:
        for message in self._consumer.consume(500, timeout):
            if message.error():
                continue
            self._history.read(consumer=self.name, phase=self._phase, topic=self._topic,
                               partition=message.partition(), offset=message.offset(),
                               value=decode_value(message.value()), t=time.time(),
                               isolation=ISOLATION_LEVEL)
            self.positions[message.partition()] = message.offset() + 1

    def read_positions(self) -> None:
        """Take each partition's position from the client, which also moves past what it
        does not return: a transaction's control records (markers) and, read committed, its
        aborted records. Without it a drain would wait for the offsets of markers."""
        with contextlib.suppress(KafkaException):
            for tp in self._consumer.position([KafkaTopicPartition(self._topic, p)
                                               for p in range(self._partitions)]):
                if tp.offset >= 0:
                    self.positions[tp.partition] = max(self.positions.get(tp.partition, 0),
                                                       tp.offset)

    def end_offsets(self, deadline: float, abort: Abort) -> dict[int, int | None]:
        """Each partition's end offset (its HW, the last offset a consumer can read), asked
        again while its leader is unknown or unreachable, until `deadline` (time.monotonic())
        or an abort; None for a partition that never answered."""
        ends: dict[int, int | None] = dict.fromkeys(range(self._partitions))
        errors: dict[int, KafkaException] = {}
        while True:
            for p in [p for p, end in ends.items() if end is None]:
                try:
                    _low, ends[p] = self._consumer.get_watermark_offsets(
                        KafkaTopicPartition(self._topic, p),
                        timeout=max(0.1, min(WATERMARK_TIMEOUT_S, deadline - time.monotonic())))
                except KafkaException as exc:
                    errors[p] = exc
            if all(end is not None for end in ends.values()) or abort.is_set() or (
                    time.monotonic() >= deadline):
                for p in (p for p, end in ends.items() if end is None and p in errors):
                    log.warning("drain: no end offset for %s-%d, not read: %s", self._topic, p,
                                errors[p])
                return ends
            abort.wait(WATERMARK_RETRY_S)


def drain(bootstrap: str, topic: str, partitions: int, history: HistoryWriter,
          abort: Abort, timeout_s: float = 60.0) -> dict[int, tuple[int | None, int]]:
    """A fresh consumer reads every partition from its log start to its end (the HW), for at
    most `timeout_s` in all, or until the run is aborted.

    Returns, per partition, (end offset, offset read up to) so the report can say whether the
    drain was complete. A partition still without a reachable leader (the cluster did not
    heal) after END_OFFSETS_SHARE of the time has the end None and is not read: what it holds
    is unknown, which the report says, rather than a failed run; the others are read.
    """
    consumer = ConsumerWorker("drain", bootstrap, topic, partitions, history, "drain")
    started = time.monotonic()
    deadline = started + timeout_s
    ends = consumer.end_offsets(started + timeout_s * END_OFFSETS_SHARE, abort)
    consumer.assign()
    while time.monotonic() < deadline and not abort.is_set() and any(
            end is not None and consumer.positions.get(p, 0) < end for p, end in ends.items()):
        consumer.poll_once(ABORT_POLL_S)
        consumer.read_positions()
    consumer.close()
    return {p: (end, consumer.positions.get(p, 0)) for p, end in ends.items()}


class Workload:
    """Producers and run-phase consumers. Definite failures pass through `epoch_gate`: feed
    it the cluster sampler's rounds and close it when the sampler stops."""

    def __init__(self, bootstrap: str, cfg: WorkloadConfig, history: HistoryWriter,
                 abort: Abort, client_bootstrap: Callable[[str], str] | None = None,
                 start_client: StartClient | None = None) -> None:
        """``client_bootstrap(name)``: where client ``name`` (``c1``, ``p0``) connects, when
        clients have links of their own (``Platform.bootstrap_for``); else ``bootstrap``.
        ``start_client``: how a producer of ``cfg.process_producers`` is started as a
        process of its own (``Platform.start_client``)."""
        own = client_bootstrap or (lambda _name: bootstrap)
        self.outcomes = SendOutcomes(history)
        self.epoch_gate = self.outcomes.epoch_gate
        calls: dict[str, Any] = {"submit": self.outcomes.submit,
                                 "settled": self.outcomes.settled, "transactions": history,
                                 "abort": abort}
        self.producers: list[ProducerWorker | TransactionalProducer | ProducerProcess] = []
        for i in range(cfg.producers):
            if f"p{i}" not in cfg.process_producers:
                self.producers.append(producer_worker(i, own(f"p{i}"), cfg, **calls))
                continue
            if start_client is None:
                raise ValueError(f"p{i} runs as a process of its own: start_client is needed")
            process = ProducerProcess(
                ProducerProcessConfig(i, own(f"p{i}"), cfg), start_client, **calls,
                logs=history.directory.parent / "clients", end_timeout_s=outcomes_wait_s(cfg))
            self.producers.append(process)
            # Its client built before the workload starts, as a thread's is.
            process.prepare()
        self.pipeline = None if cfg.pipeline is None else self._pipeline(cfg, own, history,
                                                                         abort)
        self.consumers: list[ConsumerWorker | GroupMember] = [] if self.pipeline else [
            GroupMember(f"c{i}", own(f"c{i}"), cfg.topic, cfg.group, history)
            if cfg.group is not None else
            ConsumerWorker(f"c{i}", own(f"c{i}"), cfg.topic, cfg.partitions, history, "run")
            for i in range(cfg.consumers)]
        self._rebalance_every_s = cfg.rebalance_every_s
        self._stopped = threading.Event()
        self._rebalancer = threading.Thread(target=self._rebalance, name="rebalancer",
                                            daemon=True)

    def _pipeline(self, cfg: WorkloadConfig, own: Callable[[str], str],
                  history: HistoryWriter, abort: Abort) -> Pipeline:
        assert cfg.pipeline is not None and cfg.group is not None \
            and cfg.transactions is not None, "a pipeline's spec has a group and transactions"
        settings, group, txns = cfg.pipeline, cfg.group, cfg.transactions
        return Pipeline.build(
            cfg.consumers, lambda slot, name: member_config(
                slot, name, bootstrap=own(slot), input_topic=cfg.topic, settings=settings,
                group=group, producer=producer_config(name, own(slot), cfg),
                transaction_timeout_ms=txns.timeout_ms, end_timeout_s=outcomes_wait_s(cfg)),
            settings, history, self.outcomes.settled, abort, outcomes_wait_s(cfg))

    def start(self) -> None:
        for worker in (*self.consumers, *self.producers):
            worker.start()
        if self.pipeline is not None:
            self.pipeline.start()
        if self._rebalance_every_s is not None:
            self._rebalancer.start()

    def _rebalance(self) -> None:
        """Every `rebalance_every_s`, the next member leaves the group and joins again."""
        assert self._rebalance_every_s is not None
        turn = 0
        while not self._stopped.wait(self._rebalance_every_s):
            member = self.consumers[turn % len(self.consumers)]
            if isinstance(member, GroupMember):
                log.info("%s leaves the group and joins again", member.name)
                member.rejoin()
            turn += 1

    def progress(self) -> dict[str, Any]:
        return self.outcomes.progress(self.outcomes.stats.acks_per_second())

    def stop_producers(self) -> None:
        for producer in self.producers:
            producer.stop()

    def await_outcomes(self) -> None:
        """Each producer flushes for at most `outcomes_wait_s` once stopped."""
        for producer in self.producers:
            producer.join()

    def stop_consumers(self) -> list[str]:
        """The group's members commit and leave, within `MEMBERS_CLOSE_TIMEOUT_S` in all;
        the names of those still closing then (the pipeline's members are SIGKILLed at
        its own bound instead)."""
        deadline = time.monotonic() + MEMBERS_CLOSE_TIMEOUT_S
        # A thread stuck in C with the GIL would freeze this whole process (the proxies
        # included), and no Python-level bound could say where: faulthandler's own thread
        # writes every thread's stack to stderr if the close outlasts its bound by far.
        faulthandler.dump_traceback_later(MEMBERS_CLOSE_TIMEOUT_S + 30)
        try:
            closing = [consumer.name for consumer in self.consumers
                       if not consumer.stop(max(0.0, deadline - time.monotonic()))]
        finally:
            faulthandler.cancel_dump_traceback_later()
        if self.pipeline is not None:
            self.pipeline.stop()
        return closing

    def stop(self) -> None:
        """On every way out of a run: no more sends, no more reads (idempotent). Producers
        are not waited for: they finish their outstanding sends on their own, quickly when
        the run was aborted."""
        self._stopped.set()
        for producer in self.producers:
            producer.stop()
        deadline = time.monotonic() + MEMBERS_CLOSE_TIMEOUT_S
        for consumer in self.consumers:
            consumer.stop(max(0.0, deadline - time.monotonic()))
        if self.pipeline is not None:
            self.pipeline.stop()

