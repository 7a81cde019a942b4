"""The client models' requests as Kafka requests to the real brokers (``sim/cluster.py``).

``clients.py``'s producer and consumer speak in small messages (``("produce", ...)``,
``("fetch", FetchRequestData)``); here each becomes the Kafka request a librdkafka client
sends, through the broker's own listener and API handlers, and the response becomes the
answer the model reads. Requests and responses travel the virtual network of the node's
environment (``minibroker.environment``) as objects, the request as the broker's codec
decodes it (``virtual_streams.ParcelChannel``: the codec's encoding and decoding cost a
third of a run, and the codec has tests of its own), so partitions, pauses and kills reach
the clients as they reach a stock client: a refused connect, a connection reset, a request
that times out.

**Connections.** One per broker, as librdkafka keeps one: requests are written as they are
made (up to the model's ``max.in.flight``) and answered in order, since the broker mutes a
connection while it serves a request (Kafka's ``SocketServer``). The consumer model fetches
each partition on its own (``clients.SimConsumer``), where librdkafka puts every partition a
broker leads in one Fetch; so that one partition's long poll never waits behind another's,
each partition's fetches take a connection of their own.

A transactional producer's coordinator requests take a connection of their own
(``COORDINATOR_LANE``), as librdkafka's logical coordinator broker does.

**Metadata.** Kafka's Metadata response carries no metadata offset: every answer is taken
as the newest (the model keeps the answer with the larger offset; here all are 0).
"""

from __future__ import annotations

import asyncio
import datetime
import math
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

from kio.schema.add_offsets_to_txn.v3 import request as add_offsets_req
from kio.schema.add_partitions_to_txn.v3 import request as add_req
from kio.schema.consumer_group_heartbeat.v1 import request as cgh_req
from kio.schema.end_txn.v1 import request as end_req
from kio.schema.end_txn.v5 import request as end_v5_req
from kio.schema.fetch.v12 import request as fetch_req
from kio.schema.find_coordinator.v4 import request as find_req
from kio.schema.heartbeat.v4 import request as heartbeat_req
from kio.schema.init_producer_id.v4 import request as init_req
from kio.schema.join_group.v9 import request as join_req
from kio.schema.leave_group.v5 import request as leave_req
from kio.schema.list_offsets.v7 import request as list_req
from kio.schema.metadata.v12 import request as metadata_req
from kio.schema.offset_commit.v8 import request as commit_req
from kio.schema.offset_commit.v9 import request as commit_v9_req
from kio.schema.offset_fetch.v7 import request as offset_fetch_req
from kio.schema.produce.v9 import request as produce_req
from kio.schema.produce.v12 import request as produce_v12_req
from kio.schema.sync_group.v5 import request as sync_req
from kio.schema.txn_offset_commit.v3 import request as txn_commit_req
from kio.static.primitive import i8, i16, i32, i64
from kio.static.protocol import RequestPayload

from minibroker import environment
from minibroker.cluster.types import (
    BrokerEndpoint,
    ErrorCode,
    FetchRequestData,
    FetchResult,
    MetadataImage,
    PartitionRegistration,
    ProduceResult,
    TopicImage,
    TopicPartition,
)
from minibroker.network.channel import REQUEST_CHANNEL
from minibroker.network.codec import KafkaProtocolError, Request
from minibroker.network.fetch_session import FINAL_EPOCH, INVALID_SESSION_ID
from minibroker.storage.transaction_index import AbortedTxn
from undertow.sim.clients import Endpoint, NetworkError
from undertow.sim.virtual_streams import ParcelChannel

CLIENT_ID = "undertow-sim"
# KIP-227's sessionless fetch, in the broker's own constants (made once: kio's typed ints
# check their range on every call).
SESSIONLESS_ID = i32(INVALID_SESSION_ID)
SESSIONLESS_EPOCH = i32(FINAL_EPOCH)
NO_EPOCH = i32(-1)
NO_LOG_START = i64(-1)
TRANSACTION_TIMEOUT_MS = 60_000  # librdkafka's transaction.timeout.ms
TIMEOUT_SCAN_S = 1.0
"""How often librdkafka looks for requests past their timeout: a broker thread scans its
queues once a second (``rd_kafka_broker_serve``: ``rd_interval(&rkb->rkb_timeout_scan_intvl,
1000000, now)``, then ``rd_kafka_broker_timeout_scan``), so a request fails at the first scan
after its timeout, up to a second late; the scans tick from the client's start."""

Address = tuple[str, int]
OnAnswer = Callable[[Any, NetworkError | None], None]
Decode = Callable[[Any], Any]


@dataclass(frozen=True)
class _Exchange:
    """A model message as a Kafka request, and how its response reads as the answer;
    ``decode`` None: no response comes (a Produce with acks=0)."""

    request: RequestPayload
    decode: Decode | None
    lane: str = "main"
    """The connection it goes on, of those to its broker."""


def _metadata(topic: str | None) -> _Exchange:
    topics = None if topic is None else (
        metadata_req.MetadataRequestTopic(topic_id=None, name=topic),)
    return _Exchange(metadata_req.MetadataRequest(
        topics=topics, allow_auto_topic_creation=False,
        include_topic_authorized_operations=False), _image)


def _image(response: Any) -> MetadataImage:
    brokers = {b.node_id: BrokerEndpoint(b.node_id, b.host, b.port) for b in response.brokers}
    topics = {}
    for t in response.topics:
        if t.error_code != ErrorCode.none or t.name is None:
            continue
        partitions = {p.partition_index: PartitionRegistration(
            replicas=tuple(p.replica_nodes), isr=tuple(p.isr_nodes), leader=p.leader_id,
            leader_epoch=p.leader_epoch, partition_epoch=-1) for p in t.partitions}
        topics[t.name] = TopicImage(t.name, str(t.topic_id), {}, partitions)
    return MetadataImage(metadata_offset=0, brokers=brokers, topics=topics,
                         cluster_id=response.cluster_id or "")


def _init_producer_id() -> _Exchange:
    return _Exchange(init_req.InitProducerIdRequest(
        transactional_id=None,
        transaction_timeout=datetime.timedelta(milliseconds=TRANSACTION_TIMEOUT_MS),
        producer_id=i64(-1), producer_epoch=i16(-1)),
        lambda r: (ErrorCode(r.error_code), r.producer_id))


def _produce(acks: int, timeout_ms: int, tp: TopicPartition, records: bytes,
             transactional_id: str | None = None, version: int = 9) -> _Exchange:
    """Produce v9, or v12 (a client on transaction version 2: the leader adds the
    partition to the transaction, KIP-890)."""
    m = produce_v12_req if version == 12 else produce_req
    # The model's own numbers, in range: typed without kio's range check (as the fetcher's).
    request = m.ProduceRequest(
        transactional_id=transactional_id, acks=cast(i16, acks),
        timeout=datetime.timedelta(milliseconds=timeout_ms),
        topic_data=(m.TopicProduceData(name=tp.topic, partition_data=(
            m.PartitionProduceData(index=cast(i32, tp.partition), records=records),)),))

    def decode(response: Any) -> ProduceResult:
        answer = response.responses[0].partition_responses[0]
        return ProduceResult(ErrorCode(answer.error_code), answer.base_offset,
                             answer.log_start_offset, answer.error_message)

    return _Exchange(request, decode if acks != 0 else None)


def _list_offset(tp: TopicPartition, timestamp: int, _epoch: int = -1,
                 isolation_level: int = 0, *_: int) -> _Exchange:
    """ListOffsets; read committed, latest is the last stable offset."""
    request = list_req.ListOffsetsRequest(
        replica_id=i32(-1), isolation_level=cast(i8, isolation_level),
        topics=(list_req.ListOffsetsTopic(name=tp.topic, partitions=(
            list_req.ListOffsetsPartition(partition_index=i32(tp.partition),
                                          current_leader_epoch=i32(-1),
                                          timestamp=i64(timestamp)),)),))

    def decode(response: Any) -> tuple[ErrorCode, int]:
        answer = response.topics[0].partitions[0]
        return ErrorCode(answer.error_code), answer.offset

    return _Exchange(request, decode)


def _fetch(data: FetchRequestData) -> _Exchange:
    """A consumer's Fetch by topic name (v12), outside any fetch session (KIP-227's
    sessionless fetch: session id 0, epoch -1), as the model asks one partition at a time."""
    by_topic: dict[str, list[fetch_req.FetchPartition]] = {}
    for fp in data.partitions:
        by_topic.setdefault(fp.tp.topic, []).append(fetch_req.FetchPartition(
            partition=cast(i32, fp.tp.partition),
            current_leader_epoch=cast(i32, fp.current_leader_epoch),
            fetch_offset=cast(i64, fp.fetch_offset), last_fetched_epoch=NO_EPOCH,
            log_start_offset=NO_LOG_START, partition_max_bytes=cast(i32, fp.max_bytes)))
    request = fetch_req.FetchRequest(
        cluster_id=None, replica_id=cast(i32, data.replica_id),
        max_wait=datetime.timedelta(milliseconds=data.max_wait_ms),
        min_bytes=cast(i32, data.min_bytes), max_bytes=cast(i32, data.max_bytes),
        isolation_level=cast(i8, data.isolation_level), session_id=SESSIONLESS_ID,
        session_epoch=SESSIONLESS_EPOCH,
        topics=tuple(fetch_req.FetchTopic(topic=t, partitions=tuple(ps))
                     for t, ps in by_topic.items()),
        forgotten_topics_data=(), rack_id="")

    def decode(response: Any) -> dict[TopicPartition, FetchResult]:
        if response.error_code != ErrorCode.none:
            return {fp.tp: FetchResult(ErrorCode(response.error_code))
                    for fp in data.partitions}
        return {TopicPartition(t.topic, p.partition_index): FetchResult(
            ErrorCode(p.error_code), p.high_watermark, p.last_stable_offset,
            p.log_start_offset, p.records or b"",
            None if p.aborted_transactions is None else [
                AbortedTxn(a.producer_id, a.first_offset, -1, -1)
                for a in p.aborted_transactions])
            for t in response.responses for p in t.partitions}

    return _Exchange(request, decode,
                     lane="fetch-" + ",".join(str(fp.tp) for fp in data.partitions))


# ---- the classic group protocol (``group_member.SimGroupMember``), at librdkafka's versions --


@dataclass(frozen=True)
class JoinAnswer:
    error: ErrorCode
    member_id: str
    generation_id: int
    leader_id: str
    skip_assignment: bool
    members: list[tuple[str, str | None, bytes]]


@dataclass(frozen=True)
class SyncAnswer:
    error: ErrorCode
    assignment: bytes


@dataclass(frozen=True)
class CommittedOffset:
    error: ErrorCode
    offset: int


def _find_coordinator(group_id: str) -> _Exchange:
    def decode(response: Any) -> tuple[ErrorCode, int, Address | None]:
        (c,) = response.coordinators
        if c.error_code != ErrorCode.none:
            return ErrorCode(c.error_code), -1, None
        return ErrorCode.none, c.node_id, (c.host, c.port)

    return _Exchange(find_req.FindCoordinatorRequest(key_type=i8(0), coordinator_keys=(group_id,)),
                     decode)


def _join_group(body: dict[str, Any]) -> _Exchange:
    request = join_req.JoinGroupRequest(
        group_id=body["group_id"],
        session_timeout=datetime.timedelta(milliseconds=body["session_timeout_ms"]),
        rebalance_timeout=datetime.timedelta(milliseconds=body["rebalance_timeout_ms"]),
        member_id=body["member_id"], group_instance_id=body["instance_id"],
        protocol_type="consumer", protocols=tuple(
            join_req.JoinGroupRequestProtocol(name=name, metadata=metadata)
            for name, metadata in body["protocols"]), reason=None)

    def decode(r: Any) -> JoinAnswer:
        return JoinAnswer(ErrorCode(r.error_code), r.member_id, r.generation_id, r.leader,
                          r.skip_assignment, [(m.member_id, m.group_instance_id, m.metadata)
                                              for m in r.members])

    return _Exchange(request, decode)


def _sync_group(body: dict[str, Any]) -> _Exchange:
    request = sync_req.SyncGroupRequest(
        group_id=body["group_id"], generation_id=i32(body["generation_id"]),
        member_id=body["member_id"], group_instance_id=body["instance_id"],
        protocol_type="consumer", protocol_name=body["protocol_name"],
        assignments=tuple(sync_req.SyncGroupRequestAssignment(member_id=m, assignment=a)
                          for m, a in body["assignments"].items()))
    return _Exchange(request, lambda r: SyncAnswer(ErrorCode(r.error_code), r.assignment))


def _heartbeat(body: dict[str, Any]) -> _Exchange:
    return _Exchange(heartbeat_req.HeartbeatRequest(
        group_id=body["group_id"], generation_id=i32(body["generation_id"]),
        member_id=body["member_id"], group_instance_id=body["instance_id"]),
        lambda r: ErrorCode(r.error_code))


def _leave_group(body: dict[str, Any]) -> _Exchange:
    return _Exchange(leave_req.LeaveGroupRequest(group_id=body["group_id"], members=tuple(
        leave_req.MemberIdentity(member_id=member_id, group_instance_id=instance_id,
                                 reason=None)
        for member_id, instance_id in body["members"])), lambda r: ErrorCode(r.error_code))


def _offset_commit(body: dict[str, Any]) -> _Exchange:
    """OffsetCommit v8, or v9 (``api_version`` 9: a consumer protocol member's, whose
    generation is its member epoch; Kafka refuses such a member an earlier version)."""
    schema: Any = commit_v9_req if body.get("api_version") == 9 else commit_req
    by_topic: dict[str, list[Any]] = {}
    for tp, offset in body["offsets"].items():
        by_topic.setdefault(tp.topic, []).append(schema.OffsetCommitRequestPartition(
            partition_index=i32(tp.partition), committed_offset=i64(offset),
            committed_leader_epoch=i32(-1), committed_metadata=""))
    request = schema.OffsetCommitRequest(
        group_id=body["group_id"], generation_id_or_member_epoch=i32(body["generation_id"]),
        member_id=body["member_id"], group_instance_id=body["instance_id"],
        topics=tuple(schema.OffsetCommitRequestTopic(name=t, partitions=tuple(ps))
                     for t, ps in by_topic.items()))
    return _Exchange(request, lambda r: {
        TopicPartition(t.name, p.partition_index): ErrorCode(p.error_code)
        for t in r.topics for p in t.partitions})


def _offset_fetch(body: dict[str, Any]) -> _Exchange:
    by_topic: dict[str, list[i32]] = {}
    for tp in body["partitions"]:
        by_topic.setdefault(tp.topic, []).append(i32(tp.partition))
    request = offset_fetch_req.OffsetFetchRequest(
        group_id=body["group_id"], require_stable=body["require_stable"],
        topics=tuple(offset_fetch_req.OffsetFetchRequestTopic(name=t, partition_indexes=tuple(ps))
                     for t, ps in by_topic.items()))
    return _Exchange(request, lambda r: (ErrorCode(r.error_code), {
        TopicPartition(t.name, p.partition_index): CommittedOffset(
            ErrorCode(p.error_code), p.committed_offset)
        for t in r.topics for p in t.partitions}))


# ---- the consumer protocol (KIP-848, ``consumer_member.SimConsumerMember``), v1 as -------
# ---- librdkafka 2.16 sends it ------------------------------------------------------------


@dataclass(frozen=True)
class ConsumerHeartbeatAnswer:
    error: ErrorCode
    member_id: str | None
    member_epoch: int
    heartbeat_interval_ms: int
    assignment: dict[str, list[int]] | None
    """Partitions by topic id (``uuid.hex``, minibroker's form), when the answer has one."""


def _consumer_group_heartbeat(body: dict[str, Any]) -> _Exchange:
    """ConsumerGroupHeartbeat v1: ``None`` fields are left out (they did not change since
    the last heartbeat), ``owned`` is the partitions by topic id."""
    owned = body.get("owned")
    rebalance_timeout_ms = body.get("rebalance_timeout_ms", -1)
    request = cgh_req.ConsumerGroupHeartbeatRequest(
        group_id=body["group_id"], member_id=body["member_id"],
        member_epoch=i32(body["member_epoch"]), instance_id=None, rack_id=None,
        rebalance_timeout=datetime.timedelta(milliseconds=rebalance_timeout_ms),
        subscribed_topic_names=body.get("topics"),
        subscribed_topic_regex="" if body.get("topics") is not None else None,
        server_assignor=None,
        topic_partitions=None if owned is None else tuple(
            cgh_req.TopicPartitions(topic_id=uuid.UUID(topic_id),
                                    partitions=tuple(i32(p) for p in sorted(ps)))
            for topic_id, ps in sorted(owned.items())))

    def decode(r: Any) -> ConsumerHeartbeatAnswer:
        assignment = None if r.assignment is None else {
            t.topic_id.hex: sorted(t.partitions) for t in r.assignment.topic_partitions}
        return ConsumerHeartbeatAnswer(
            ErrorCode(r.error_code), r.member_id, r.member_epoch,
            int(r.heartbeat_interval.total_seconds() * 1000), assignment)

    return _Exchange(request, decode)


# ---- transactions (``clients.SimTransactionalProducer``), at librdkafka 2.16's versions ---

COORDINATOR_LANE = "txn-coordinator"
"""The transaction coordinator's requests (InitProducerId, AddPartitionsToTxn,
AddOffsetsToTxn, EndTxn) go on a connection of their own: librdkafka sends them to its
logical broker ``TxnCoordinator`` (``rd_kafka_txns_init``: ``rd_kafka_broker_add_logical``),
which connects to the coordinator apart from the broker handle whose connection carries the
Produce requests, so a Produce that times out (and drops its connection) leaves an EndTxn in
flight alone, and the reverse."""


def _find_txn_coordinator(transactional_id: str) -> _Exchange:
    """FindCoordinator for a transactional id (key type 1)."""
    exchange = _find_coordinator(transactional_id)
    return _Exchange(find_req.FindCoordinatorRequest(
        key_type=i8(1), coordinator_keys=(transactional_id,)), exchange.decode)


def _init_txn_producer_id(args: tuple[str, int, int, int]) -> _Exchange:
    """InitProducerId with a transactional id: (error, producer id, epoch)."""
    transactional_id, timeout_ms, producer_id, epoch = args
    return _Exchange(init_req.InitProducerIdRequest(
        transactional_id=transactional_id,
        transaction_timeout=datetime.timedelta(milliseconds=timeout_ms),
        producer_id=cast(i64, producer_id), producer_epoch=cast(i16, epoch)),
        lambda r: (ErrorCode(r.error_code), r.producer_id, r.producer_epoch),
        lane=COORDINATOR_LANE)


def _add_partitions_to_txn(args: tuple[str, int, int, list[TopicPartition]]) -> _Exchange:
    """AddPartitionsToTxn v3 (a client's: one transaction): the first partition error, or
    none."""
    transactional_id, producer_id, epoch, tps = args
    by_topic: dict[str, list[i32]] = {}
    for tp in tps:
        by_topic.setdefault(tp.topic, []).append(cast(i32, tp.partition))
    request = add_req.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=transactional_id,
        v3_and_below_producer_id=cast(i64, producer_id),
        v3_and_below_producer_epoch=cast(i16, epoch),
        v3_and_below_topics=tuple(add_req.AddPartitionsToTxnTopic(name=t, partitions=tuple(ps))
                                  for t, ps in by_topic.items()))

    return _Exchange(request, lambda r: _first_error(
        p.partition_error_code for t in r.results_by_topic_v3_and_below
        for p in t.results_by_partition), lane=COORDINATOR_LANE)


def _first_error(codes: Iterable[int]) -> ErrorCode:
    """A per-partition response's first partition error, or none (a client's requests of
    one transaction stand or fall together)."""
    return next((ErrorCode(c) for c in codes if c != ErrorCode.none), ErrorCode.none)


def _end_txn(args: tuple[str, int, int, bool]) -> _Exchange:
    """EndTxn v1 (librdkafka's): commit or abort."""
    transactional_id, producer_id, epoch, commit = args
    return _Exchange(end_req.EndTxnRequest(
        transactional_id=transactional_id, producer_id=cast(i64, producer_id),
        producer_epoch=cast(i16, epoch), committed=commit),
        lambda r: ErrorCode(r.error_code), lane=COORDINATOR_LANE)


def _end_txn_v5(args: tuple[str, int, int, bool]) -> _Exchange:
    """EndTxn v5 (the Java 4.x client's on transaction version 2): the answer carries the
    producer id and epoch of the next transaction."""
    transactional_id, producer_id, epoch, commit = args
    return _Exchange(end_v5_req.EndTxnRequest(
        transactional_id=transactional_id, producer_id=cast(i64, producer_id),
        producer_epoch=cast(i16, epoch), committed=commit),
        lambda r: (ErrorCode(r.error_code), r.producer_id, r.producer_epoch),
        lane=COORDINATOR_LANE)


def _add_offsets_to_txn(args: tuple[str, int, int, str]) -> _Exchange:
    """AddOffsetsToTxn v3: the group's offsets partition joins the transaction."""
    transactional_id, producer_id, epoch, group_id = args
    return _Exchange(add_offsets_req.AddOffsetsToTxnRequest(
        transactional_id=transactional_id, producer_id=cast(i64, producer_id),
        producer_epoch=cast(i16, epoch), group_id=group_id),
        lambda r: ErrorCode(r.error_code), lane=COORDINATOR_LANE)


def _txn_offset_commit(body: dict[str, Any]) -> _Exchange:
    """TxnOffsetCommit v3 (KIP-447: with the member id and generation): the first partition
    error, or none."""
    by_topic: dict[str, list[txn_commit_req.TxnOffsetCommitRequestPartition]] = {}
    for tp, offset in body["offsets"].items():
        by_topic.setdefault(tp.topic, []).append(txn_commit_req.TxnOffsetCommitRequestPartition(
            partition_index=cast(i32, tp.partition), committed_offset=cast(i64, offset),
            committed_leader_epoch=i32(-1), committed_metadata=""))
    request = txn_commit_req.TxnOffsetCommitRequest(
        transactional_id=body["transactional_id"], group_id=body["group_id"],
        producer_id=cast(i64, body["producer_id"]), producer_epoch=cast(i16, body["epoch"]),
        generation_id=cast(i32, body["generation_id"]), member_id=body["member_id"],
        group_instance_id=body["instance_id"],
        topics=tuple(txn_commit_req.TxnOffsetCommitRequestTopic(name=t, partitions=tuple(ps))
                     for t, ps in by_topic.items()))

    return _Exchange(request, lambda r: _first_error(
        p.error_code for t in r.topics for p in t.partitions))


MESSAGES: dict[str, Callable[..., _Exchange]] = {
    "metadata": lambda topic: _metadata(topic),
    "init_producer_id": lambda _: _init_producer_id(),
    "produce": lambda args: _produce(*args),
    "list_offset": lambda args: _list_offset(*args),
    "fetch": _fetch,
    "find_coordinator": _find_coordinator,
    "find_txn_coordinator": _find_txn_coordinator,
    "init_txn_producer_id": _init_txn_producer_id,
    "add_partitions_to_txn": _add_partitions_to_txn,
    "end_txn": _end_txn,
    "end_txn_v5": _end_txn_v5,
    "add_offsets_to_txn": _add_offsets_to_txn,
    "txn_offset_commit": _txn_offset_commit,
    "join_group": _join_group,
    "sync_group": _sync_group,
    "heartbeat": _heartbeat,
    "leave_group": _leave_group,
    "offset_commit": _offset_commit,
    "offset_fetch": _offset_fetch,
    "consumer_group_heartbeat": _consumer_group_heartbeat,
}
"""The model's messages, by kind, as Kafka requests."""


class _Connection:
    """One client connection to one broker: requests pipelined, answers read in order."""

    def __init__(self, address: Address, on_closed: Callable[[_Connection], None],
                 scans_from: float = 0.0) -> None:
        """``scans_from``: when its client started, from which the timeout scans tick."""
        self.address = address
        self._on_closed = on_closed
        self._scans_from = scans_from
        self._writer: asyncio.StreamWriter | None = None
        self._channel: ParcelChannel | None = None
        self._unsent: list[Request] = []
        self._pending: deque[tuple[int, _Exchange, OnAnswer, asyncio.TimerHandle]] = deque()
        self._next_id = 0
        self._closed = False
        self._task = asyncio.get_running_loop().create_task(self._run())

    def send(self, exchange: _Exchange, timeout_ms: float, on_answer: OnAnswer) -> None:
        correlation_id = self._next_id
        self._next_id += 1
        parcel = Request.of(exchange.request, correlation_id, CLIENT_ID)
        if self._channel is None:
            self._unsent.append(parcel)
        else:
            self._channel.post(parcel)
        if exchange.decode is None:  # acks=0: done once written, no response comes
            asyncio.get_running_loop().call_soon(on_answer, None, None)
            return
        loop = asyncio.get_running_loop()
        # Failed at the first timeout scan at or after its timeout (``TIMEOUT_SCAN_S``).
        scans = math.ceil((loop.time() + timeout_ms / 1000 - self._scans_from) / TIMEOUT_SCAN_S)
        timer = loop.call_at(self._scans_from + scans * TIMEOUT_SCAN_S, self._timed_out,
                             correlation_id)
        self._pending.append((correlation_id, exchange, on_answer, timer))

    async def _run(self) -> None:
        host, port = self.address
        try:
            open_connection = environment.current().open_object_connection
            assert open_connection is not None, "a simulated host's network carries objects"
            _, self._writer = await open_connection(host, port)
        except OSError:
            self.fail("refused")
            return
        self._channel = self._writer.get_extra_info(REQUEST_CHANNEL)
        for parcel in self._unsent:
            self._channel.post(parcel)
        self._unsent.clear()
        try:
            while self._pending or not self._closed:
                answer = await self._channel.next()
                if answer is None or not self._pending:
                    break
                correlation_id, exchange, on_answer, timer = self._pending.popleft()
                timer.cancel()
                received, response = answer
                if received != correlation_id:
                    raise KafkaProtocolError(f"response carries correlation id {received}")
                assert exchange.decode is not None
                on_answer(exchange.decode(response), None)
        except (OSError, KafkaProtocolError):
            pass
        self.fail("reset")

    def _timed_out(self, correlation_id: int) -> None:
        """librdkafka fails a request unanswered after its timeout and, since a late answer
        would read as the next one's, drops the connection with it."""
        for i, (pending_id, _, on_answer, _) in enumerate(self._pending):
            if pending_id == correlation_id:
                del self._pending[i]
                on_answer(None, NetworkError("timeout", self.address))
                break
        self.fail("reset")

    def fail(self, reason: str) -> None:
        """Close, failing what is still unanswered with ``reason``."""
        if not self._closed:
            self._closed = True
            self._on_closed(self)
            if self._writer is not None:
                self._writer.close()
            self._task.cancel()
        while self._pending:
            _, _, on_answer, timer = self._pending.popleft()
            timer.cancel()
            on_answer(None, NetworkError(reason, self.address))


class KafkaEndpoint(Endpoint):
    """The client models' transport in the simulated cluster of real brokers: every
    message a Kafka request on the network of the environment it is created in."""

    def __init__(self, bootstrap: list[Address], topic: str) -> None:
        super().__init__(bootstrap)
        self._topic = topic
        self._loop = asyncio.get_running_loop()
        self._started = self._loop.time()
        self._connections: dict[tuple[Address, str], _Connection] = {}

    def exchange(self, address: Address, message: Any, timeout_ms: float,
                 on_answer: OnAnswer) -> None:
        kind, args = message
        exchange = MESSAGES[kind](self._topic if kind == "metadata" else args)
        key = (address, exchange.lane)
        connection = self._connections.get(key)
        if connection is None:
            connection = self._connections[key] = _Connection(
                address, lambda closed: self._connections.pop(key, None)
                if self._connections.get(key) is closed else None, self._started)
        connection.send(exchange, timeout_ms, on_answer)

    def now_ms(self) -> float:
        return self._loop.time() * 1000

    def later(self, delay_ms: float, callback: Callable[[], None]) -> None:
        self._loop.call_later(delay_ms / 1000, callback)

    def close(self) -> None:
        for connection in list(self._connections.values()):
            connection.fail("reset")
