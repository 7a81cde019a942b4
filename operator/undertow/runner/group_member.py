"""A member of the workload's consumer group (`workload.consumer.mode: subscribe`).

A stock confluent-kafka consumer that subscribes to the topic, as Kafka applications consume:
the group coordinator assigns its partitions (Kafka's classic protocol), it resumes each one
from the group's committed offset and commits its progress, automatically (librdkafka's
timer, enable.auto.commit) or by itself. Everything the consumer group checks need goes to
the history: each record returned, with the generation the member was in (reads.jsonl), and
each partition assigned or revoked, each committed offset the coordinator returned when the
member was assigned a partition, and each commit with its outcome (groups.jsonl).

Every call on the consumer is made from the member's own thread (librdkafka's consumer is
not thread-safe); the rebalance and commit callbacks run inside its `consume()`.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from undertow.runner.history import HistoryWriter
from undertow.runner.values import decode_value

log = logging.getLogger("undertow.group")

LIBRDKAFKA_LOG_LEVEL = 2
"""As the workload's other clients: librdkafka's critical messages only."""
POLL_S = 0.2
"""Each poll's wait (``consume(500, POLL_S)``): the rebalancer's rejoin and the run's stop
are seen between polls."""
COMMITTED_TIMEOUT_S = 5.0
"""How long a member waits for the committed offsets of the partitions it was assigned."""
REFUSED = frozenset({"ILLEGAL_GENERATION", "UNKNOWN_MEMBER_ID", "REBALANCE_IN_PROGRESS",
                     "FENCED_INSTANCE_ID", "STALE_MEMBER_EPOCH", "FENCED_MEMBER_EPOCH"})
"""Commit errors the coordinator answers before it appends anything (Kafka's
OffsetMetadataManager.commitOffset validates the member first, by generation in a classic
group, by member epoch in a consumer group): definitely not written."""
NOTHING_TO_COMMIT = "_NO_OFFSET"
_METADATA_MAGIC = b"CGMDv2:"


@dataclass(frozen=True)
class GroupSettings:
    """`workload.consumer` of a subscribe-mode experiment, in the client's units."""

    group_id: str
    commit: str
    """`auto` or `manual`."""
    commit_interval_ms: int
    isolation_level: str
    static_membership: bool
    session_timeout_ms: int
    """classic: the member's session.timeout.ms; consumer: the coordinator's, which the
    member does not set (librdkafka refuses session.timeout.ms there)."""
    group_protocol: str = "classic"

    def client_config(self, name: str, bootstrap: str) -> dict[str, Any]:
        config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "group.id": self.group_id,
            "client.id": f"undertow-{name}",
            "enable.auto.commit": self.commit == "auto",
            "auto.commit.interval.ms": self.commit_interval_ms,
            "auto.offset.reset": "earliest",
            "isolation.level": self.isolation_level,
            # The rebalance timeout librdkafka sends: how long a rebalance waits for a
            # member that does not rejoin (Kafka's default, 5 min, outlasts a run).
            "max.poll.interval.ms": max(2 * self.session_timeout_ms, 10_000),
            "topic.metadata.refresh.interval.ms": 1000,
            "log_level": LIBRDKAFKA_LOG_LEVEL,
        }
        if self.group_protocol == "consumer":  # KIP-848: the coordinator keeps time
            config["group.protocol"] = "consumer"
        else:
            config["session.timeout.ms"] = self.session_timeout_ms
            config["heartbeat.interval.ms"] = max(100, min(1000, self.session_timeout_ms // 3))
        if self.static_membership:
            config["group.instance.id"] = f"{self.group_id}-{name}"
        return config


def generation_of(metadata: object) -> int | None:
    """The generation in librdkafka's consumer group metadata (``CGMDv2:`` then the
    generation id as an int32 in the host's byte order, as librdkafka copies it); None when
    the format is not that one, or before the first join (-1)."""
    if isinstance(metadata, bytes) and metadata.startswith(_METADATA_MAGIC):
        generation = int.from_bytes(metadata[7:11], sys.byteorder, signed=True)
        return generation if generation >= 0 else None
    return None


def known_generation(consumer: Consumer, last: int | None) -> int | None:
    """The generation in ``consumer``'s group metadata now; ``last`` while it has none (it
    is between generations, or its coordinator is away)."""
    with contextlib.suppress(KafkaException):
        return generation_of(consumer.consumer_group_metadata())
    return last


def committed_offsets(consumer: Consumer, partitions: list[KafkaTopicPartition], name: str
                      ) -> dict[int, int | None]:
    """The group's committed offset of each of ``partitions`` that the coordinator answered
    for (None: nothing committed), asked once the member holds them; none when it does not
    answer within ``COMMITTED_TIMEOUT_S``."""
    try:
        answered = consumer.committed(partitions, timeout=COMMITTED_TIMEOUT_S)
    except KafkaException as exc:
        log.info("%s: no committed offsets for %s: %s", name,
                 [tp.partition for tp in partitions], exc)
        return {}
    return {tp.partition: tp.offset if tp.offset >= 0 else None
            for tp in answered if tp.error is None}


def commit_outcome(error: KafkaError | None) -> tuple[str, str | None]:
    """groups.jsonl's status and error of one partition's commit."""
    if error is None:
        return "ok", None
    name = error.name() or str(error.code())
    return ("fail" if name in REFUSED else "info"), name


class GroupMember:
    """One member: its consumer, its thread, and what it records."""

    def __init__(self, name: str, bootstrap: str, topic: str, settings: GroupSettings,
                 history: HistoryWriter) -> None:
        self.name = name
        self._bootstrap = bootstrap
        self._topic = topic
        self._settings = settings
        self._history = history
        self._stop = threading.Event()
        self._rejoin = threading.Event()
        self._positions: dict[int, int] = {}
        """Next offset to read, per partition it holds now."""
        self._committed: dict[int, int] = {}
        """The last offset it committed, per partition it holds now (manual commits)."""
        self._to_fetch: list[KafkaTopicPartition] = []
        self._generation: int | None = None
        self._member_id: str | None = None
        self._closing = False
        """Inside librdkafka's close: its callbacks (revoke, the last auto commit) record
        the member id known before it rather than ask the closing consumer (confluent-kafka
        holds the GIL through `memberid()`; a run froze, its proxies too, as a member
        closed under load)."""
        self._consumer = self._subscribe()
        self._thread = threading.Thread(target=self._run, name=f"member-{name}", daemon=True)

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float) -> bool:
        """Stop reading, commit (manual) and leave the group, waiting at most `timeout_s`
        for it; whether the member has left. A later call waits no more.

        The wait is bounded because librdkafka's close is not: it commits and sends
        LeaveGroup through the group's coordinator, and retries FindCoordinator for as long
        as none answers (librdkafka#3740), as when the group's `__consumer_offsets`
        partition is offline after the faults. The member's thread is then left closing."""
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def rejoin(self) -> None:
        """Leave the group and join it again as a new consumer (the group rebalances)."""
        self._rejoin.set()

    def _subscribe(self) -> Consumer:
        config = self._settings.client_config(self.name, self._bootstrap)
        if self._settings.commit == "auto":
            config["on_commit"] = self._on_auto_commit
        consumer = Consumer(config)
        consumer.subscribe([self._topic], on_assign=self._on_assign,
                           on_revoke=self._on_revoke, on_lost=self._on_lost)
        return consumer

    def _leave(self) -> None:
        if self._settings.commit == "manual":
            self._commit(self._consumer)
        self._closing = True
        try:
            self._consumer.close()  # auto commit: librdkafka commits the positions as it closes
        finally:
            self._closing = False

    def _run(self) -> None:
        next_commit = time.monotonic() + self._settings.commit_interval_ms / 1000
        try:
            while not self._stop.is_set():
                if self._rejoin.is_set():
                    self._rejoin.clear()
                    self._leave()
                    self._consumer = self._subscribe()
                self._poll()
                if self._settings.commit == "manual" and time.monotonic() >= next_commit:
                    self._commit(self._consumer)
                    next_commit = time.monotonic() + self._settings.commit_interval_ms / 1000
        finally:
            self._leave()

    def _poll(self) -> None:
        messages = self._consumer.consume(500, POLL_S)
        if self._to_fetch:
            self._record_committed()
        generation = self._current_generation()
        for message in messages:
            if message.error():
                continue
            self._history.read(consumer=self.name, phase="run", topic=self._topic,
                               partition=message.partition(), offset=message.offset(),
                               value=decode_value(message.value()), t=time.time(),
                               generation=generation, isolation=self._settings.isolation_level)
            self._positions[message.partition()] = message.offset() + 1

    def _current_generation(self) -> int | None:
        self._generation = known_generation(self._consumer, self._generation)
        return self._generation

    # ---- rebalance callbacks ----------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
        generation = self._current_generation()
        for tp in partitions:
            self._group("assign", tp.partition, generation=generation, consumer=consumer)
        # The coordinator's committed offsets, asked once the assignment is in place (from
        # the poll loop: a blocking call does not belong in librdkafka's rebalance callback).
        self._to_fetch = list(partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
        if self._settings.commit == "manual":
            self._commit(consumer)
        self._give_up(consumer, partitions)

    def _on_lost(self, consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
        self._give_up(consumer, partitions)  # its session expired: nothing may be committed

    def _give_up(self, consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
        for tp in partitions:
            self._group("revoke", tp.partition, consumer=consumer)
            self._positions.pop(tp.partition, None)
            self._committed.pop(tp.partition, None)

    def _record_committed(self) -> None:
        partitions, self._to_fetch = self._to_fetch, []
        for partition, offset in committed_offsets(self._consumer, partitions,
                                                   self.name).items():
            self._group("committed", partition, offset=offset)

    # ---- commits ----------------------------------------------------------------------------

    def _commit(self, consumer: Consumer) -> None:
        """Commit the positions that moved since the last commit, synchronously."""
        offsets = [KafkaTopicPartition(self._topic, p, position)
                   for p, position in sorted(self._positions.items())
                   if self._committed.get(p) != position]
        if not offsets:
            return
        t_invoke = time.time()
        try:
            results = consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if error is not None and error.name() == NOTHING_TO_COMMIT:
                return
            for tp in offsets:
                self._record_commit(tp, error or KafkaError(KafkaError._FAIL), t_invoke,
                                    consumer)
            return
        for tp in results or offsets:
            self._record_commit(tp, tp.error, t_invoke, consumer)

    def _on_auto_commit(self, error: KafkaError | None,
                        partitions: list[KafkaTopicPartition]) -> None:
        if error is not None and error.name() == NOTHING_TO_COMMIT:
            return
        for tp in partitions:
            if tp.topic == self._topic and tp.offset >= 0:
                self._record_commit(tp, error or tp.error, None, self._consumer)

    def _record_commit(self, tp: KafkaTopicPartition, error: KafkaError | None,
                       t_invoke: float | None, consumer: Consumer) -> None:
        status, name = commit_outcome(error)
        if status == "ok":
            self._committed[tp.partition] = tp.offset
        self._group("commit", tp.partition, offset=tp.offset, status=status, error=name,
                    t_invoke=t_invoke, consumer=consumer)

    def _group(self, type_: str, partition: int, *, consumer: Consumer | None = None,
               generation: int | None = None, **fields: Any) -> None:
        if not self._closing:
            self._member_id = (consumer or self._consumer).memberid() or None
        self._history.group(member=self.name, member_id=self._member_id,
                            generation=self._generation if generation is None else generation,
                            type=type_, topic=self._topic, partition=partition,
                            t=time.time(), **fields)
