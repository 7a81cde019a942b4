"""The follower fetcher's truncation loop never spins: a follower whose OffsetForLeaderEpoch
rounds do not end (as the no-op truncation livelock did) backs off, bounded and logged."""

from __future__ import annotations

import asyncio
import logging
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
