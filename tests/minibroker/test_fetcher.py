"""The follower fetcher's truncation loop never spins: a follower whose OffsetForLeaderEpoch
rounds do not end (as the no-op truncation livelock did) backs off, bounded and logged."""

from __future__ import annotations

import asyncio
import logging
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from minibroker.cluster.fetcher import MAX_TRUNCATION_ROUNDS, ReplicaFetcher
from minibroker.cluster.types import ErrorCode, TopicPartition

TP = TopicPartition("orders", 0)


class StuckReplicaManager:
    """A follower that asks the same question after every answer."""

    broker_id = 3

    def __init__(self) -> None:
        self.follower_states = {TP: SimpleNamespace(leader_id=2, needs_truncation=True)}
        self.answers: list[tuple[int, int]] = []

    def truncation_request(self, tp: TopicPartition) -> tuple[int, int]:
        return (3, 2)  # current leader epoch 3, our latest epoch 2: never changes

    def on_epoch_answer(self, tp: TopicPartition, epoch: int, end_offset: int) -> None:
        self.answers.append((epoch, end_offset))


class Leader:
    def __init__(self) -> None:
        self.requests = 0

    async def request(self, request: Any, timeout: float | None = None) -> Any:
        self.requests += 1
        await asyncio.sleep(0)  # a real round trip suspends: wait_for can cut a spin
        answer = SimpleNamespace(error_code=ErrorCode.none, leader_epoch=1, end_offset=12)
        return SimpleNamespace(topics=[SimpleNamespace(partitions=[answer])])


@pytest.mark.asyncio
async def test_a_truncation_that_never_ends_backs_off_after_bounded_rounds(
        caplog: pytest.LogCaptureFixture) -> None:
    rm = StuckReplicaManager()

    async def nothing() -> None:
        return None

    fetcher = ReplicaFetcher(2, rm, lambda _id: None, nothing, max_wait_ms=100,
                             max_bytes=1 << 20)  # type: ignore[arg-type]
    fetcher.partitions.add(TP)  # no wake-up: its own loop stays idle
    leader = Leader()
    try:
        with caplog.at_level(logging.WARNING, logger="minibroker.fetcher"):
            await asyncio.wait_for(fetcher._truncate(leader), 5)  # type: ignore[arg-type]
    finally:
        await fetcher.stop()
    assert leader.requests == MAX_TRUNCATION_ROUNDS
    assert rm.answers == [(1, 12)] * MAX_TRUNCATION_ROUNDS
    assert f"truncation unfinished after {MAX_TRUNCATION_ROUNDS} OffsetForLeaderEpoch " \
           "rounds (still asking for epoch 2); backing off" in caplog.text


class CapturingLeader:
    """Answers one fetch with nothing and keeps the request it was sent."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def request(self, request: Any, timeout: float | None = None) -> Any:
        self.sent.append(request)
        return SimpleNamespace(error_code=ErrorCode.none, session_id=0, responses=[])


ORDERS_ID = uuid.UUID(int=42)


class CaughtUpReplicaManager:
    broker_id = 3

    def __init__(self) -> None:
        self.follower_states = {TP: SimpleNamespace(leader_id=2, needs_truncation=False)}
        self.image = SimpleNamespace(topics={
            "orders": SimpleNamespace(name="orders", topic_id=ORDERS_ID.hex)})

    def build_follower_fetch(self, tps: list[TopicPartition], max_bytes: int) -> list[Any]:
        return [SimpleNamespace(tp=tp, current_leader_epoch=4, fetch_offset=10,
                                log_start_offset=0, max_bytes=max_bytes) for tp in tps]


@pytest.mark.asyncio
async def test_the_follower_fetch_asks_the_leader_to_wait_for_replica_fetch_min_bytes() -> None:
    """replica.fetch.min.bytes and replica.fetch.wait.max.ms reach the leader's DelayedFetch,
    as in Kafka's ReplicaFetcherThread: that is what batches replication. The fetch is v15:
    topics by id, and the broker epoch in ReplicaState (KIP-903)."""
    async def nothing() -> None:
        return None

    fetcher = ReplicaFetcher(2, CaughtUpReplicaManager(), lambda _id: None,  # type: ignore[arg-type]
                             nothing, max_wait_ms=800, max_bytes=1 << 20, min_bytes=65536,
                             broker_epoch=lambda: 17)
    fetcher.partitions.add(TP)
    leader = CapturingLeader()
    try:
        await asyncio.wait_for(fetcher._fetch(leader), 5)  # type: ignore[arg-type]
    finally:
        await fetcher.stop()
    (request,) = leader.sent
    assert request.min_bytes == 65536
    assert request.max_wait.total_seconds() == 0.8
    assert (request.replica_state.replica_id, request.replica_state.replica_epoch) == (3, 17)
    assert [(t.topic_id, [p.fetch_offset for p in t.partitions]) for t in request.topics] == \
        [(ORDERS_ID, [10])]
    # The first fetch to a leader is full and asks for a session (KIP-227).
    assert (request.session_id, request.session_epoch) == (0, 0)
