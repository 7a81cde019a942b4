"""Incremental fetch sessions (KIP-227): the leader's cache and its eviction rules
(``network/fetch_session.py``), the follower's handler (``cluster/fetch_session_handler.py``),
and the two together over any sequence of fetches, lost answers and leader restarts."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.cluster.fetch_session_handler import FetchSessionHandler
from minibroker.cluster.types import ErrorCode, FetchPartition, FetchResult, TopicPartition
from minibroker.network.fetch_session import (
    INVALID_SESSION_ID,
    CachedPartition,
    FetchPosition,
    FetchSessionCache,
)

EVICTION_MS = 120_000


def position(offset: int = 0) -> FetchPosition:
    return FetchPosition(fetch_offset=offset, current_leader_epoch=1, log_start_offset=0,
                         max_bytes=1 << 20)


def cached(n: int) -> dict:
    return {("t", i): CachedPartition(position()) for i in range(n)}


def full_cache(privileged: bool, size: int, now_ms: float) -> tuple[FetchSessionCache, int]:
    cache = FetchSessionCache(1, EVICTION_MS, random.Random(1))
    session_id = cache.maybe_create(now_ms, privileged, cached(size))
    assert session_id != INVALID_SESSION_ID
    return cache, session_id


def test_a_consumer_cannot_evict_a_young_session_and_a_follower_evicts_a_consumers() -> None:
    cache, consumer = full_cache(privileged=False, size=5, now_ms=0)
    assert cache.maybe_create(1000, False, cached(50)) == INVALID_SESSION_ID
    assert set(cache.sessions) == {consumer}
    follower = cache.maybe_create(1000, True, cached(1))
    assert follower != INVALID_SESSION_ID and set(cache.sessions) == {follower}
    # A young follower's session is safe from everyone, even a bigger follower's.
    assert cache.maybe_create(2000, True, cached(50)) == INVALID_SESSION_ID
    assert cache.maybe_create(2000, False, cached(50)) == INVALID_SESSION_ID


def test_a_session_unused_past_the_eviction_time_goes_first() -> None:
    cache, follower = full_cache(privileged=True, size=50, now_ms=0)
    assert cache.maybe_create(EVICTION_MS, False, cached(1)) == INVALID_SESSION_ID
    assert set(cache.sessions) == {follower}
    consumer = cache.maybe_create(EVICTION_MS + 1, False, cached(1))
    assert set(cache.sessions) == {consumer}


def test_an_old_but_used_session_is_evicted_only_by_a_more_valuable_one() -> None:
    cache, old = full_cache(privileged=False, size=5, now_ms=0)
    # Used lately (not stale), but created past the eviction time: evictable by value.
    cache.new_context(old, 1, {}, [], privileged=False, now_ms=EVICTION_MS + 10)
    assert cache.maybe_create(EVICTION_MS + 20, False, cached(4)) == INVALID_SESSION_ID
    bigger = cache.maybe_create(EVICTION_MS + 20, False, cached(6))
    assert set(cache.sessions) == {bigger}


def test_no_slots_no_sessions() -> None:
    cache = FetchSessionCache(0, EVICTION_MS)
    assert cache.maybe_create(0, True, cached(3)) == INVALID_SESSION_ID


def test_a_full_fetch_closes_the_session_it_names() -> None:
    cache, session_id = full_cache(privileged=True, size=2, now_ms=0)
    context = cache.new_context(session_id, 0, {("t", 0): position()}, [], privileged=True,
                                now_ms=1)
    assert session_id not in cache.sessions and context.create_session


def fp(partition: int, offset: int) -> FetchPartition:
    return FetchPartition(TopicPartition("t", partition), offset, 1, 0, 1 << 20)


def test_the_handler_names_new_and_changed_partitions_and_forgets_the_dropped() -> None:
    handler = FetchSessionHandler()
    first = handler.build({0: fp(0, 5), 1: fp(1, 7)})
    assert (first.session_id, first.epoch, sorted(first.partitions)) == (0, 0, [0, 1])
    assert handler.handle_response(first, ErrorCode.none, 99)
    second = handler.build({0: fp(0, 6), 2: fp(2, 0)})
    assert (second.session_id, second.epoch) == (99, 1)
    assert (sorted(second.partitions), second.forgotten) == ([0, 2], [1])
    assert handler.handle_response(second, ErrorCode.none, 99)
    assert handler.build({0: fp(0, 6), 2: fp(2, 0)}).partitions == {}
    # A lost answer: the next fetch is full and closes session 99 on the leader.
    handler.reset()
    third = handler.build({0: fp(0, 6)})
    assert (third.session_id, third.epoch, list(third.partitions)) == (99, 0, [0])
    # The leader lost the session: full again, naming no session.
    assert handler.handle_response(third, ErrorCode.none, 100)
    fourth = handler.build({0: fp(0, 6)})
    assert not handler.handle_response(fourth, ErrorCode.fetch_session_id_not_found, 0)
    assert (handler.build({0: fp(0, 6)}).session_id, handler.epoch) == (0, 0)


def test_an_incremental_answer_names_each_partition_with_records_a_new_hw_or_an_error() -> None:
    """Kafka's ``CachedPartition.maybeUpdateResponseData``: an incremental answer leaves out
    only the partitions with nothing new. Records with an unchanged high watermark (a
    follower's fetch past the HW, or a consumer's below it) must still be answered."""
    cache = FetchSessionCache(10, EVICTION_MS, random.Random(3))
    keys = [("t", 0), ("t", 1), ("t", 2)]
    full = cache.new_context(0, 0, {key: position() for key in keys}, [], privileged=True,
                             now_ms=0)
    session_id, answered = full.respond(
        cache, {key: FetchResult(ErrorCode.none, high_watermark=3, log_start_offset=0)
                for key in keys}, 0)
    assert session_id != INVALID_SESSION_ID and list(answered) == keys

    def incremental(epoch: int, results: dict[tuple[str, int], FetchResult]) -> list:
        context = cache.new_context(session_id, epoch, {}, [], privileged=True, now_ms=epoch)
        assert context.error == ErrorCode.none and list(context.partitions) == keys
        return list(context.respond(cache, results, epoch)[1])

    now = dict.fromkeys(keys, FetchResult(ErrorCode.none, high_watermark=3, log_start_offset=0))
    assert incremental(1, now) == []
    batch = FetchResult(ErrorCode.none, high_watermark=3, log_start_offset=0, records=b"batch")
    assert incremental(2, {**now, keys[1]: batch}) == [keys[1]]
    now[keys[0]] = FetchResult(ErrorCode.none, high_watermark=4, log_start_offset=0)
    now[keys[2]] = FetchResult(ErrorCode.none, high_watermark=3, log_start_offset=2)
    assert incremental(3, now) == [keys[0], keys[2]]
    assert incremental(4, now) == []
    error = FetchResult(ErrorCode.not_leader_or_follower)
    assert incremental(5, {**now, keys[1]: error}) == [keys[1]]
    # The error forgot the high watermark: the partition is answered again once it is gone.
    assert incremental(6, now) == [keys[1]]


def test_an_incremental_fetch_with_another_epoch_is_refused_and_changes_nothing() -> None:
    """Kafka's ``FetchManager.newContext``: an incremental fetch must carry the session's
    next epoch; a replayed or skipped one is INVALID_FETCH_SESSION_EPOCH, and the session
    still expects the epoch it did."""
    cache = FetchSessionCache(10, EVICTION_MS, random.Random(5))
    full = cache.new_context(0, 0, {("t", 0): position()}, [], privileged=True, now_ms=0)
    session_id, _ = full.respond(cache, {("t", 0): FetchResult(ErrorCode.none, 3)}, 0)
    assert cache.new_context(session_id, 1, {}, [], privileged=True,
                             now_ms=1).error == ErrorCode.none
    for epoch in (1, 3):  # the one just used, replayed; one ahead
        refused = cache.new_context(session_id, epoch, {("t", 1): position()}, [],
                                    privileged=True, now_ms=2)
        assert (refused.error, refused.partitions) == (ErrorCode.invalid_fetch_session_epoch,
                                                       {})
    served = cache.new_context(session_id, 2, {}, [], privileged=True, now_ms=3)
    assert (served.error, list(served.partitions)) == (ErrorCode.none, [("t", 0)])


# One fetch round: the follower's new positions (partition -> offset, None to stop
# following), then whether the answer is lost, and whether the leader restarted before it.
rounds = st.lists(st.tuples(
    st.dictionaries(st.integers(0, 5), st.one_of(st.none(), st.integers(0, 3)), max_size=4),
    st.booleans(), st.integers(0, 9)), max_size=30)


@settings(max_examples=300, deadline=None)
@given(rounds)
def test_the_leader_reads_what_the_follower_asks_after_any_fetches_losses_and_restarts(
        plan: list[tuple[dict[int, int | None], bool, int]]) -> None:
    """Whatever happens, each fetch the leader serves reads exactly the follower's current
    partitions at the follower's current positions; and the follower never mistakes a
    session error for an answer."""
    cache = FetchSessionCache(10, EVICTION_MS, random.Random(7))
    handler = FetchSessionHandler()
    wanted: dict[int, FetchPartition] = {}
    for now, (changes, lost, restart) in enumerate(plan):
        for partition, offset in changes.items():
            if offset is None:
                wanted.pop(partition, None)
            else:
                wanted[partition] = fp(partition, offset)
        if restart == 0:
            cache = FetchSessionCache(10, EVICTION_MS, random.Random(now))
        request = handler.build(wanted)
        context = cache.new_context(
            request.session_id, request.epoch,
            {("t", key): FetchPosition(p.fetch_offset, p.current_leader_epoch,
                                       p.log_start_offset, p.max_bytes)
             for key, p in request.partitions.items()},
            [("t", key) for key in request.forgotten], privileged=True, now_ms=now)
        if context.error != ErrorCode.none:
            assert not handler.handle_response(request, context.error, INVALID_SESSION_ID)
            continue
        assert {key: p.fetch_offset for (_, key), p in context.partitions.items()} == {
            key: p.fetch_offset for key, p in wanted.items()}
        results = {key: FetchResult(ErrorCode.none, high_watermark=3)
                   for key in context.partitions}
        session_id, _ = context.respond(cache, results, now)
        if lost:
            handler.reset()
        else:
            assert handler.handle_response(request, ErrorCode.none, session_id)
