"""One member of the workload's consume-transform-produce pipeline (`workload.pipeline`), a
process of its own so that the workload can SIGKILL it mid-transaction.

It does what a Kafka Streams task does with exactly-once: a stock confluent-kafka consumer in
the group reads the input topic `read_committed`; for each record a stock transactional
producer writes one output record, `{input value}/{transaction}`, to the same partition of
the output topic; every commit interval the transaction commits with the consumed offsets in
it (`send_offsets_to_transaction`: AddOffsetsToTxn, then TxnOffsetCommit to the group
coordinator, which holds them pending until the commit marker). A replacement reuses the
`transactional.id`; its InitProducerId fences the dead member's epoch and aborts what it left
open (Kafka's `TransactionCoordinator.handleInitProducerId`).

It writes no history itself. Each thing it does goes to stdout as one JSON line (`k` says
which: `ready`, `read`, `group`, `begin`, `send`, `acked`, `ending`, `end`), written before the
call it announces returns control to anything else, and the workload (`runner.pipeline`)
turns them into history lines: that way a member killed at any point leaves a history that
says exactly what it had done, and its open transaction is recorded by the one who saw it die.
It stops, ending its open transaction, when its stdin closes: the workload asked, or died.

Run as ``python -m undertow.runner.pipeline_member CONFIG`` (CONFIG: `MemberConfig` as JSON).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition

from undertow.runner.group_member import (
    COMMITTED_TIMEOUT_S,
    GroupSettings,
    committed_offsets,
    known_generation,
)
from undertow.runner.outcomes import error_name
from undertow.runner.transactional_producer import INIT_ATTEMPT_S
from undertow.runner.values import decode_value

log = logging.getLogger("undertow.pipeline")

OUTPUT_SEPARATOR = "/"
"""An output value is `{input value}{OUTPUT_SEPARATOR}{transaction}`."""
EXIT_FATAL = 3
"""The member's exit status after a fatal client error: the workload replaces it."""
POLL_S = 0.1


def output_value(input_value: str, txn: str) -> str:
    """The output record of `input_value` written in transaction `txn`: unique per attempt,
    so that the history keeps one send per value, and traceable to its input."""
    return f"{input_value}{OUTPUT_SEPARATOR}{txn}"


@dataclass(frozen=True)
class MemberConfig:
    """What a member process is started with (its command line's JSON)."""

    name: str
    """This process's name in the history (`c0.1`: member slot c0, its second process)."""
    transactional_id: str
    """The slot's `transactional.id`, the same for each of its processes."""
    bootstrap: str
    input_topic: str
    output_topic: str
    group: GroupSettings
    producer: dict[str, Any]
    """The workload's plain producer configuration, made transactional here."""
    transaction_timeout_ms: int
    end_timeout_s: float
    """How long a commit (with its offsets) or an abort is retried."""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> MemberConfig:
        fields = json.loads(text)
        return cls(**{**fields, "group": GroupSettings(**fields["group"])})


class Emitter:
    """One JSON line per call on a file descriptor, in one write each (the reader takes a
    line without its newline, the last one of a killed process, as not written)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()

    def __call__(self, kind: str, **fields: Any) -> None:
        data = (json.dumps({"k": kind, **fields}, separators=(",", ":")) + "\n").encode()
        with self._lock:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]


class _Transaction:
    def __init__(self, name: str) -> None:
        self.name = name
        self.positions: dict[int, int] = {}
        """The next input offset to read, per partition read in this transaction."""


class Member:
    """The member's loop: read, transform, and end a transaction every commit interval."""

    def __init__(self, config: MemberConfig, emit: Callable[..., None]) -> None:
        self._config = config
        self._emit = emit
        self.stopping = threading.Event()
        self._txn: _Transaction | None = None
        self._n = 0
        self._generation: int | None = None
        self._to_fetch: list[KafkaTopicPartition] = []
        self._producer = Producer({
            **config.producer, "transactional.id": config.transactional_id,
            "enable.idempotence": True, "acks": "all",
            "transaction.timeout.ms": config.transaction_timeout_ms,
            "message.timeout.ms": min(config.producer["message.timeout.ms"],
                                      config.transaction_timeout_ms),
            "error_cb": lambda error: log.debug("%s: %s", config.name, error)})
        self._consumer = Consumer(config.group.client_config(config.name, config.bootstrap))

    def run(self) -> int:
        """Until stopped; the exit status (EXIT_FATAL after a fatal client error)."""
        if not self._init():
            return EXIT_FATAL
        self._emit("ready", t=time.time())
        self._consumer.subscribe([self._config.input_topic], on_assign=self._on_assign,
                                 on_revoke=self._on_revoke, on_lost=self._on_lost)
        interval = self._config.group.commit_interval_ms / 1000
        next_commit = time.monotonic() + interval
        try:
            while not self.stopping.is_set():
                self._poll()
                if time.monotonic() >= next_commit:
                    if self._txn is not None and not self._end("commit"):
                        return EXIT_FATAL
                    next_commit = time.monotonic() + interval
            if self._txn is not None and not self._end("commit"):
                return EXIT_FATAL
        finally:
            self._consumer.close()
        return 0

    def _init(self) -> bool:
        """InitProducerId, retried while retriable: the epoch bump that fences the previous
        process of this transactional id."""
        while not self.stopping.is_set():
            try:
                self._producer.init_transactions(INIT_ATTEMPT_S)
                return True
            except KafkaException as exc:
                if not exc.args[0].retriable():
                    log.error("%s: init_transactions failed: %s", self._config.name, exc)
                    return False
        return False

    def _poll(self) -> None:
        messages = self._consumer.consume(500, POLL_S)
        if self._to_fetch:
            self._record_committed()
        generation = self._current_generation()
        for message in messages:
            if message.error():
                continue
            value, partition = decode_value(message.value()), message.partition()
            self._emit("read", partition=partition, offset=message.offset(), value=value,
                       t=time.time(), generation=generation)
            self._transform(value, partition, message.offset())

    def _transform(self, value: str, partition: int, offset: int) -> None:
        if self._txn is None:
            self._begin()
        txn = self._txn
        assert txn is not None
        out = output_value(value, txn.name)
        self._emit("send", txn=txn.name, value=out, partition=partition, t_invoke=time.time())
        while True:
            try:
                self._producer.produce(self._config.output_topic, out.encode(),
                                       partition=partition, on_delivery=self._on_delivery(out))
                break
            except BufferError:
                self._producer.poll(0.05)
            except KafkaException as exc:  # the transaction is in an error state: its end
                self._emit("acked", value=out, offset=None, error=error_name(exc.args[0]))
                break
        txn.positions[partition] = offset + 1
        self._producer.poll(0)

    def _begin(self) -> None:
        name = f"{self._config.name}-t{self._n}"
        self._n += 1
        t_begin = time.time()
        self._producer.begin_transaction()  # local to the client: nothing to record before
        self._emit("begin", txn=name, t_begin=t_begin)
        self._txn = _Transaction(name)

    def _on_delivery(self, value: str) -> Callable[[KafkaError | None, Any], None]:
        def callback(err: KafkaError | None, msg: Any) -> None:
            self._emit("acked", value=value, offset=msg.offset() if err is None else None,
                       error=None if err is None else error_name(err))

        return callback

    # ---- a transaction's end ----------------------------------------------------------------

    def _end(self, intent: str) -> bool:
        """Commit (with the consumed offsets) or abort the open transaction, announcing it
        first; False when the producer is left in a fatal state. After an abort the consumer
        goes back to the group's committed offsets, so that the aborted records are
        transformed again."""
        txn = self._txn
        assert txn is not None
        self._txn = None
        offsets = {str(p): o for p, o in sorted(txn.positions.items())} if intent == "commit" \
            else None
        self._emit("ending", txn=txn.name, intent=intent, t_end_invoke=time.time(),
                   offsets=offsets)
        deadline = time.monotonic() + self._config.end_timeout_s
        error: KafkaError | None = None
        if intent == "commit":
            error = self._retry(lambda timeout: self._producer.send_offsets_to_transaction(
                [KafkaTopicPartition(self._config.input_topic, p, o)
                 for p, o in sorted(txn.positions.items())],
                self._consumer.consumer_group_metadata(), timeout), deadline)
            if error is None:
                error = self._retry(self._producer.commit_transaction, deadline)
            if error is None:
                self._emit("end", txn=txn.name, status="ok", error=None, t_complete=time.time())
                return True
            if not error.txn_requires_abort():
                # Whether it committed is unknown; the workload replaces this process.
                self._emit("end", txn=txn.name, status="info", error=error_name(error),
                           t_complete=time.time())
                return False
        aborted = self._retry(self._producer.abort_transaction, deadline)
        # An abort that failed never committed either: the coordinator aborts it on the
        # replacement's InitProducerId or when it times out.
        self._emit("end", txn=txn.name, status="fail",
                   error=error_name(error) if error is not None else (
                       error_name(aborted) if aborted is not None else None),
                   t_complete=time.time())
        return aborted is None and self._rewind()

    def _retry(self, call: Callable[[float], object], deadline: float) -> KafkaError | None:
        """`call(timeout)` again while its error is retriable (librdkafka's transactional
        API contract) and time is left; the error that ended it, None on success."""
        while True:
            try:
                call(max(0.1, deadline - time.monotonic()))
                return None
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
            if not error.retriable() or time.monotonic() >= deadline:
                return error

    def _rewind(self) -> bool:
        """Seek every assigned partition back to the group's committed offset (the start
        when none); False when the consumer cannot say."""
        try:
            assigned = self._consumer.assignment()
            for tp in self._consumer.committed(assigned, timeout=COMMITTED_TIMEOUT_S):
                self._consumer.seek(KafkaTopicPartition(
                    tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING))
        except KafkaException as exc:
            log.error("%s: cannot go back to the committed offsets: %s", self._config.name, exc)
            return False
        return True

    # ---- the group ----------------------------------------------------------------------------

    def _current_generation(self) -> int | None:
        self._generation = known_generation(self._consumer, self._generation)
        return self._generation

    def _group(self, type_: str, partition: int, consumer: Consumer,
               offset: int | None = None) -> None:
        self._emit("group", type=type_, partition=partition, offset=offset,
                   member_id=consumer.memberid() or None, generation=self._generation,
                   t=time.time())

    def _on_assign(self, consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
        self._current_generation()
        for tp in partitions:
            self._group("assign", tp.partition, consumer)
        self._to_fetch = list(partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
        """Commit what was transformed before the partitions go, as Kafka Streams does: its
        offsets go with it, so the next owner starts after it."""
        if self._txn is not None and not self._end("commit"):
            self.stopping.set()  # fatal: the workload replaces this process
        for tp in partitions:
            self._group("revoke", tp.partition, consumer)

    def _on_lost(self, consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
        """The session expired: another member may own the partitions already, so what was
        transformed is aborted, not committed."""
        if self._txn is not None and not self._end("abort"):
            self.stopping.set()
        for tp in partitions:
            self._group("revoke", tp.partition, consumer)

    def _record_committed(self) -> None:
        partitions, self._to_fetch = self._to_fetch, []
        for partition, offset in committed_offsets(self._consumer, partitions,
                                                   self._config.name).items():
            self._group("committed", partition, self._consumer, offset=offset)


def _stop_when_stdin_closes(stopping: threading.Event) -> None:
    while sys.stdin.buffer.read(4096):
        pass
    stopping.set()


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    member = Member(MemberConfig.from_json(argv[1]), Emitter(sys.stdout.fileno()))
    threading.Thread(target=_stop_when_stdin_closes, args=(member.stopping,), daemon=True,
                     name="stdin").start()
    return member.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
