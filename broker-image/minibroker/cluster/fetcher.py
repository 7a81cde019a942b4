"""Follower replication: one ``ReplicaFetcher`` per leader broker, pulling with Kafka's Fetch.

Each fetcher first truncates newly followed partitions (OffsetForLeaderEpoch, or the
pre-KIP-101 high-watermark rule), then long-polls the leader with ``replica_id`` set and
``fetch_offset`` = our LEO, appends what comes back and takes the HW from the response.
Fetches go in an incremental fetch session (KIP-227, ``fetch_session_handler``): after the
first, they name only what changed. The decisions themselves live in
``ReplicaManager``/``Partition``; this module only moves bytes, so the same rules also
run in the tests' step-by-step cluster (``tests/minibroker/stepper.py``).
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import cast

from kio.schema.fetch.v15 import request as fetch_req
from kio.schema.list_offsets.v7 import request as list_req
from kio.schema.offset_for_leader_epoch.v4 import request as epoch_req
from kio.schema.types import BrokerId
from kio.static.primitive import i8, i32, i64

from minibroker.cluster.fetch_session_handler import FetchSessionHandler
from minibroker.cluster.replica_manager import ReplicaManager
from minibroker.cluster.types import ErrorCode, FetchResult, TopicPartition
from minibroker.network.client import KafkaConnection
from minibroker.shutdown import end_tasks

log = logging.getLogger("minibroker.fetcher")

RETRY_BACKOFF_S = 0.1
READ_UNCOMMITTED = i8(0)
MAX_TRUNCATION_ROUNDS = 16
"""OffsetForLeaderEpoch rounds for one partition before the fetcher backs off and says so.
KIP-279 needs one round per epoch the follower has and the leader lacks; a follower that
asks the same question again and again (as the no-op truncation bug did) must not spin."""


_topic_uuid = functools.lru_cache(maxsize=1024)(uuid.UUID)
"""A topic id as the image holds it (a string), parsed once: every fetch names its topics."""


class ReplicaFetcher:
    def __init__(
        self,
        leader_id: int,
        replica_manager: ReplicaManager,
        address_of: Callable[[int], tuple[str, int] | None],
        before_append: Callable[[], Awaitable[None]],
        *,
        max_wait_ms: int,
        max_bytes: int,
        min_bytes: int = 1,
        broker_epoch: Callable[[], int] = lambda: -1,
    ) -> None:
        self.leader_id = leader_id
        self._rm = replica_manager
        self._address_of = address_of
        self._before_append = before_append
        self._max_wait_ms = max_wait_ms
        self._max_bytes = max_bytes
        # The fields every Fetch repeats, made once (kio's typed ints check their range).
        self._replica_id = BrokerId(replica_manager.broker_id)
        self._max_wait = datetime.timedelta(milliseconds=max_wait_ms)
        self._min_bytes = i32(min_bytes)
        self._broker_epoch = broker_epoch
        self.partitions: set[TopicPartition] = set()
        self._wakeup = asyncio.Event()
        self._conn: KafkaConnection | None = None
        self._session = FetchSessionHandler()
        self._topic_ids: dict[str, uuid.UUID] = {}
        """The id each topic had when this fetcher last named it (a forgotten partition
        is named by that id, even after its topic is gone from the image)."""
        self._task = asyncio.create_task(self._run(), name=f"fetcher-{leader_id}")

    def add(self, tp: TopicPartition) -> None:
        self.partitions.add(tp)
        self._wakeup.set()

    def remove(self, tp: TopicPartition) -> None:
        self.partitions.discard(tp)

    async def stop(self) -> None:
        """Kafka's ShutdownableThread.shutdown: the fetch loop has ended when this returns
        (within shutdown.STOP_TIMEOUT_S), so no answer is appended after the stop."""
        await end_tasks([self._task], f"fetcher for leader {self.leader_id}")
        if self._conn is not None:
            self._conn.close()

    async def _run(self) -> None:
        while True:
            if not self.partitions:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            try:
                conn = await self._connection()
                await self._truncate(conn)
                await self._fetch(conn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # connection loss, timeouts: reconnect after a pause
                log.debug("Fetcher for leader %d: %s", self.leader_id, exc)
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
                await asyncio.sleep(RETRY_BACKOFF_S)

    async def _connection(self) -> KafkaConnection:
        if self._conn is None:
            address = self._address_of(self.leader_id)
            if address is None:
                raise ConnectionError(f"no address for broker {self.leader_id}")
            self._conn = await KafkaConnection.connect(
                address[0], address[1], client_id=f"replica-{self._rm.broker_id}")
        return self._conn

    def _followed(self) -> list[TopicPartition]:
        return sorted(
            tp for tp in self.partitions
            if (s := self._rm.follower_states.get(tp)) is not None and s.leader_id == self.leader_id
        )

    async def _truncate(self, conn: KafkaConnection) -> None:
        for tp in self._followed():
            state = self._rm.follower_states[tp]
            rounds = 0
            while (self._rm.follower_states.get(tp) is state
                   and (request := self._rm.truncation_request(tp)) is not None):
                rounds += 1
                if rounds > MAX_TRUNCATION_ROUNDS:
                    # _fetch skips the partition while it needs truncation and sleeps.
                    log.warning("%s: truncation unfinished after %d OffsetForLeaderEpoch "
                                "rounds (still asking for epoch %d); backing off", tp,
                                MAX_TRUNCATION_ROUNDS, request[1])
                    break
                current, latest = request
                response = await conn.request(epoch_req.OffsetForLeaderEpochRequest(
                    replica_id=i32(self._rm.broker_id),
                    topics=(epoch_req.OffsetForLeaderTopic(topic=tp.topic, partitions=(
                        epoch_req.OffsetForLeaderPartition(
                            partition=i32(tp.partition), current_leader_epoch=i32(current),
                            leader_epoch=i32(latest)),)),)))
                answer = response.topics[0].partitions[0]
                if answer.error_code != ErrorCode.none:
                    log.debug("OffsetForLeaderEpoch for %s: %s", tp, answer.error_code.name)
                    break
                if self._rm.follower_states.get(tp) is state:
                    self._rm.on_epoch_answer(tp, answer.leader_epoch, answer.end_offset)

    async def _fetch(self, conn: KafkaConnection) -> None:
        ready = [tp for tp in self._followed()
                 if not self._rm.follower_states[tp].needs_truncation]
        if not ready:
            await asyncio.sleep(RETRY_BACKOFF_S)
            return
        states = {tp: self._rm.follower_states[tp] for tp in ready}
        # Fetch v15: topics by id, and the follower's broker epoch (KIP-903), so that the
        # leader can refuse a fetch this broker's previous incarnation left in flight.
        topic_ids = self._topic_ids
        for topic in {tp.topic for tp in ready}:
            topic_ids[topic] = _topic_uuid(self._rm.image.topics[topic].topic_id)
        plan = self._session.build({
            (topic_ids[fp.tp.topic], fp.tp.partition): fp
            for fp in self._rm.build_follower_fetch(ready, self._max_bytes)})
        # The partitions' numbers are the follower's own state, in range: ``cast`` types
        # them without kio's range check (the codec's struct packing is the bound).
        by_topic: dict[uuid.UUID, list[fetch_req.FetchPartition]] = {}
        for (topic_id, _), fp in plan.partitions.items():
            by_topic.setdefault(topic_id, []).append(fetch_req.FetchPartition(
                partition=cast(i32, fp.tp.partition),
                current_leader_epoch=cast(i32, fp.current_leader_epoch),
                fetch_offset=cast(i64, fp.fetch_offset),
                log_start_offset=cast(i64, fp.log_start_offset),
                partition_max_bytes=cast(i32, fp.max_bytes)))
        forgotten: dict[uuid.UUID, list[i32]] = {}
        for topic_id, index in plan.forgotten:
            forgotten.setdefault(topic_id, []).append(cast(i32, index))
        request = fetch_req.FetchRequest(
            replica_state=fetch_req.ReplicaState(
                replica_id=self._replica_id, replica_epoch=cast(i64, self._broker_epoch())),
            max_wait=self._max_wait,
            min_bytes=self._min_bytes,
            max_bytes=cast(i32, self._max_bytes * max(len(ready), 1)),
            isolation_level=READ_UNCOMMITTED,
            session_id=cast(i32, plan.session_id),
            session_epoch=cast(i32, plan.epoch),
            topics=tuple(fetch_req.FetchTopic(topic_id=t, partitions=tuple(ps))
                         for t, ps in by_topic.items()),
            forgotten_topics_data=tuple(
                fetch_req.ForgottenTopic(topic_id=t, partitions=tuple(ps))
                for t, ps in forgotten.items()))
        try:
            response = await conn.request(request, timeout=self._max_wait_ms / 1000 + 5)
        except BaseException:
            self._session.reset()  # the leader may or may not have taken this epoch
            raise
        if not self._session.handle_response(plan, response.error_code, response.session_id):
            log.debug("Fetch session with leader %d: %s; the next fetch is full",
                      self.leader_id, response.error_code.name)
            return
        names = {topic_id: topic for topic, topic_id in topic_ids.items()}
        await self._before_append()
        out_of_range: list[TopicPartition] = []
        backoff = False
        for answered in response.responses:
            for data in answered.partitions:
                tp = TopicPartition(names.get(answered.topic_id, ""), data.partition_index)
                if self._rm.follower_states.get(tp) is not states.get(tp):
                    continue  # leadership moved while the fetch was in flight
                if data.error_code == ErrorCode.none:
                    self._rm.on_follower_fetch(tp, FetchResult(
                        ErrorCode.none, data.high_watermark, data.last_stable_offset,
                        data.log_start_offset, data.records or b""))
                elif data.error_code == ErrorCode.offset_out_of_range:
                    out_of_range.append(tp)
                else:
                    backoff = True  # fenced, unknown epoch, not leader: wait for metadata
        for tp in out_of_range:
            await self._handle_out_of_range(conn, tp, states[tp])
        if backoff:
            await asyncio.sleep(RETRY_BACKOFF_S)

    async def _handle_out_of_range(self, conn: KafkaConnection, tp: TopicPartition,
                                   state: object) -> None:
        offsets = []
        for timestamp in (-2, -1):
            response = await conn.request(list_req.ListOffsetsRequest(
                replica_id=i32(self._rm.broker_id), isolation_level=READ_UNCOMMITTED,
                topics=(list_req.ListOffsetsTopic(name=tp.topic, partitions=(
                    list_req.ListOffsetsPartition(
                        partition_index=i32(tp.partition),
                        current_leader_epoch=i32(self._rm.partitions[tp].leader_epoch),
                        timestamp=i64(timestamp)),)),)))
            answer = response.topics[0].partitions[0]
            if answer.error_code != ErrorCode.none:
                return
            offsets.append(answer.offset)
        if self._rm.follower_states.get(tp) is state:
            self._rm.on_follower_out_of_range(tp, offsets[0], offsets[1])


class ReplicaFetcherManager:
    """Keeps one fetcher per leader broker (Kafka's ReplicaFetcherManager)."""

    def __init__(self, make_fetcher: Callable[[int], ReplicaFetcher]) -> None:
        self._make_fetcher = make_fetcher
        self.fetchers: dict[int, ReplicaFetcher] = {}
        self._leader_of: dict[TopicPartition, int] = {}

    def follow(self, tp: TopicPartition, leader_id: int) -> None:
        self.unfollow(tp)
        fetcher = self.fetchers.get(leader_id)
        if fetcher is None:
            fetcher = self.fetchers[leader_id] = self._make_fetcher(leader_id)
        fetcher.add(tp)
        self._leader_of[tp] = leader_id

    def unfollow(self, tp: TopicPartition) -> None:
        leader_id = self._leader_of.pop(tp, None)
        if leader_id is not None and leader_id in self.fetchers:
            self.fetchers[leader_id].remove(tp)

    async def stop(self) -> None:
        for fetcher in self.fetchers.values():
            await fetcher.stop()
