"""The Kafka-protocol source of a `ClusterView`, and topic creation: what any Kafka answers.

A stock admin client (confluent-kafka) asks DescribeCluster (brokers, racks, the
controller), DescribeTopics (leader, ISR, replicas) and ListOffsets ``latest`` (the high
watermark, and the leader epoch it was read in). Kafka's metadata lists live brokers only
(KRaft leaves fenced ones out), so every broker listed is unfenced; broker epochs and
per-replica log end offsets are not in the protocol's answers and stay unknown. KIP-966's
eligible leader replicas and last known ELR are in Kafka's DescribeTopicPartitions answer
(and the Java admin client's ``TopicPartitionInfo``), but confluent-kafka's
``TopicPartitionInfo`` (2.16) has only id, leader, replicas and ISR: they stay empty.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from undertow.cluster_view.model import NO_LEADER, BrokerRegistration, ClusterView, PartitionView


class KafkaAdminError(RuntimeError):
    """The cluster refused or did not answer an admin request."""


DESCRIBE_TIMEOUT_S = 5.0
"""How long ``undertow describe`` waits for an answer: a live cluster answers in well under
a second, and a person at a terminal should hear of a wrong address in seconds, not after
librdkafka's default request.timeout.ms (30 s)."""

_SILENT = logging.getLogger("undertow.cluster_view.librdkafka")
"""The ``logger`` handed to librdkafka: given one, it queues its log lines for ``poll()``
instead of writing them to stderr (a refused connection is one line every
reconnect.backoff.ms); what ``poll()`` serves is dropped here, and the error callback says
what went wrong in one sentence."""
_SILENT.addHandler(logging.NullHandler())
_SILENT.propagate = False


def admin_client(bootstrap: str) -> AdminClient:
    """A client for a cluster whose brokers die: metadata refreshed every second, so that a
    request bound for "the controller" (a KRaft broker names any live broker) finds a
    live one soon after a kill; librdkafka's own logs kept to errors, callers report."""
    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 3,
                        "topic.metadata.refresh.interval.ms": 1000})


def describe(bootstrap: str, topics: Iterable[str] | None = None,
             timeout_s: float = DESCRIBE_TIMEOUT_S) -> ClusterView:
    """`view_from_admin` for a person at a terminal: librdkafka silent, and an address
    where no broker answers a `KafkaAdminError` as soon as librdkafka gives up on every
    broker (``_ALL_BROKERS_DOWN``, one connection attempt), else after ``timeout_s``. The
    caller names ``bootstrap`` in front of the error's one line."""
    errors: list[KafkaError] = []
    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": _SILENT,
                         "error_cb": errors.append})
    _wait_for_a_broker(admin, errors, timeout_s)
    return view_from_admin(admin, topics, timeout_s)


def _wait_for_a_broker(admin: AdminClient, errors: list[KafkaError], timeout_s: float) -> None:
    """Return once a broker answers DescribeCluster; raise `KafkaAdminError` once
    librdkafka reports every broker down, or after ``timeout_s``. librdkafka retries a
    refused connection until the request times out, and the answer's future then says
    only "Failed while waiting for controller"; its error callback (served by ``poll``)
    says why at the first attempt."""
    answered = admin.describe_cluster(request_timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    while not answered.done() and time.monotonic() < deadline:
        admin.poll(0.05)
        if any(e.code() == KafkaError._ALL_BROKERS_DOWN for e in errors):
            raise KafkaAdminError(f"no Kafka broker answers{_why(errors)}")
    error = answered.exception() if answered.done() else None
    if not answered.done() or _code(error) == KafkaError._TIMED_OUT:
        raise KafkaAdminError(f"no Kafka broker answered within {timeout_s:g} s"
                              f"{_why(errors)}")
    if error is not None:
        raise KafkaAdminError(f"DescribeCluster failed: {_text(error)}")


def _why(errors: list[KafkaError]) -> str:
    """The first connection error as a parenthesis: ``(Connection refused)``, not
    librdkafka's ``HOST:PORT/bootstrap: Connect to ipv4#HOST:PORT failed: Connection
    refused (after 0ms in state CONNECT)``."""
    for error in errors:
        if error.code() in (KafkaError._TRANSPORT, KafkaError._RESOLVE):
            text = re.sub(r"\s*\(after \d+ms in state \w+\)\s*$", "", error.str())
            return f" ({text.rsplit(' failed: ', 1)[-1].split('/bootstrap: ', 1)[-1]})"
    return ""


def _code(error: BaseException | None) -> int | None:
    """The `KafkaError` code a `KafkaException` carries, if any."""
    inner = error.args[0] if isinstance(error, KafkaException) and error.args else None
    return inner.code() if isinstance(inner, KafkaError) else None


def _text(error: BaseException) -> str:
    """A `KafkaException` as its message and Kafka's name for it (``Broker: Not
    controller (NOT_CONTROLLER)``), not the ``KafkaError{code=...}`` repr."""
    inner = error.args[0] if isinstance(error, KafkaException) and error.args else None
    return f"{inner.str()} ({inner.name()})" if isinstance(inner, KafkaError) else str(error)


def view_from_admin(admin: AdminClient, topics: Iterable[str] | None = None,
                    timeout_s: float = 10.0) -> ClusterView:
    """The view of ``topics`` (None: every topic but Kafka's internal ones) as the
    cluster's Kafka protocol describes them. Topics the cluster does not have
    (``UNKNOWN_TOPIC_OR_PART``) are named together in one `KafkaAdminError`."""
    try:
        cluster = admin.describe_cluster(request_timeout=timeout_s).result()
        if topics is None:
            listed = admin.list_topics(timeout=timeout_s).topics
            topics = sorted(t for t in listed if not t.startswith("__"))
        described = (admin.describe_topics(TopicCollection(list(topics)),
                                           request_timeout=timeout_s) if topics else {})
        _raise_unknown(described)
        partitions: dict[tuple[str, int], PartitionView] = {}
        for future in described.values():
            description = future.result()
            for info in description.partitions:
                partitions[(description.name, info.id)] = PartitionView(
                    topic=description.name, partition=info.id,
                    leader=info.leader.id if info.leader is not None else NO_LEADER,
                    leader_epoch=-1, isr=tuple(n.id for n in info.isr),
                    replicas=tuple(n.id for n in info.replicas))
        latest = _latest_offsets(admin, [p for p in partitions.values() if p.has_leader],
                                 timeout_s)
    except KafkaException as exc:
        raise KafkaAdminError(_text(exc)) from exc
    for key, (high_watermark, leader_epoch) in latest.items():
        p = partitions[key]
        partitions[key] = PartitionView(
            topic=p.topic, partition=p.partition, leader=p.leader, leader_epoch=leader_epoch,
            isr=p.isr, replicas=p.replicas, high_watermark=high_watermark)
    brokers = {n.id: BrokerRegistration(broker_id=n.id, fenced=False, rack=n.rack)
               for n in cluster.nodes}
    return ClusterView(brokers=brokers,
                       controller=cluster.controller.id if cluster.controller else None,
                       partitions=partitions)


def _raise_unknown(described: Mapping[str, Future[Any]]) -> None:
    """A `KafkaAdminError` naming every topic whose DescribeTopics answer is
    ``UNKNOWN_TOPIC_OR_PART``: "no topic X" says more than the error's repr."""
    unknown = [topic for topic, future in described.items()
               if _code(future.exception()) == KafkaError.UNKNOWN_TOPIC_OR_PART]
    if unknown:
        raise KafkaAdminError(f"no topic{'s' if len(unknown) > 1 else ''} "
                              f"{', '.join(map(repr, unknown))} on this cluster "
                              f"(Kafka's UNKNOWN_TOPIC_OR_PART)")


def _latest_offsets(admin: AdminClient, partitions: list[PartitionView], timeout_s: float
                    ) -> dict[tuple[str, int], tuple[int, int]]:
    """(high watermark, leader epoch) per partition, from ListOffsets ``latest``."""
    if not partitions:
        return {}
    asked = {TopicPartition(p.topic, p.partition): OffsetSpec.latest() for p in partitions}
    answers = {}
    for tp, future in admin.list_offsets(asked, request_timeout=timeout_s).items():
        result = future.result()
        epoch = result.leader_epoch if result.leader_epoch is not None else -1
        answers[(tp.topic, tp.partition)] = (result.offset, epoch)
    return answers


def create_topic(admin: AdminClient, name: str, partitions: int, replication_factor: int,
                 config: Mapping[str, str], timeout_s: float = 15.0) -> None:
    """CreateTopics, as any Kafka serves it; an existing topic counts as created (a retry
    after a lost answer must not fail the run)."""
    new = NewTopic(name, partitions, replication_factor, config=dict(config))
    future = admin.create_topics([new], request_timeout=timeout_s)[name]
    try:
        future.result()
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return
        raise KafkaAdminError(f"CreateTopics {name}: {error or exc}") from exc

