"""Incremental fetch sessions, the leader's side (KIP-227; Kafka's ``FetchSession.scala``:
``FetchSessionCache``, ``FetchManager.newContext`` and its ``FetchContext`` kinds).

Without sessions a follower names every partition it follows from a leader in every Fetch,
and the leader answers every one, data or not: with a thousand partitions per leader that
is a thousand partitions encoded and decoded both ways twice a second while nothing
happens. A session keeps the partitions and what was last sent on the leader; an
incremental Fetch names only the partitions whose fetch position changed, and its answer
only the partitions with records, a new high watermark or log start offset, or an error.
The leader still reads every partition of the session at each fetch (so that the ISR sees
each follower keep up, as in Kafka); only the wire shrinks.

Sessions are what a client can make the broker hold: at most
``max.incremental.fetch.session.cache.slots`` of them, evicted as Kafka does (a stale one
first, then the least valuable, followers' sessions worth more than consumers').
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from minibroker import environment
from minibroker.cluster.types import ErrorCode, FetchResult

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
"""A full fetch that asks for a new session."""
FINAL_EPOCH = -1
"""A full fetch that asks for none (a sessionless fetch; every pre-v7 fetch)."""

_MAX_EPOCH = 2**31 - 1

PartitionKey = tuple[Hashable, int]
"""A partition as the Fetch names it: (topic id from v13, else topic name; index)."""


def next_epoch(epoch: int) -> int:
    """Kafka's ``FetchMetadata.nextEpoch``: 1 after the largest int32, never 0 again."""
    return epoch + 1 if epoch < _MAX_EPOCH else 1


@dataclass
class FetchPosition:
    """What a Fetch asks of one partition (Kafka's ``FetchRequest.PartitionData``)."""

    fetch_offset: int
    current_leader_epoch: int
    log_start_offset: int
    max_bytes: int


@dataclass
class CachedPartition:
    """A session's partition: the last position asked for, and the high watermark and log
    start offset last sent, to tell whether the next answer must name it."""

    position: FetchPosition
    high_watermark: int = -1
    log_start_offset: int = -1

    def must_respond(self, result: FetchResult) -> bool:
        """Kafka's ``CachedPartition.maybeUpdateResponseData``: records, a new high
        watermark or log start offset, or an error go in the answer, and what is sent is
        remembered. An error also forgets the high watermark, so that the partition is
        answered again once the error is gone."""
        respond = bool(result.records)
        if result.high_watermark != self.high_watermark:
            respond = True
            self.high_watermark = result.high_watermark
        if result.log_start_offset != self.log_start_offset:
            respond = True
            self.log_start_offset = result.log_start_offset
        if result.error != ErrorCode.none:
            self.high_watermark = -1
            respond = True
        return respond


@dataclass
class FetchSession:
    id: int
    privileged: bool
    """A follower's: worth more than a consumer's when the cache is full."""
    partitions: dict[PartitionKey, CachedPartition]
    creation_ms: float
    last_used_ms: float
    epoch: int = 1
    """The epoch the next incremental Fetch must carry."""

    def evictable_key(self) -> tuple[bool, int, int]:
        """Kafka's ``EvictableKey``: the lowest is evicted first."""
        return (self.privileged, len(self.partitions), self.id)

    def update(self, requested: Mapping[PartitionKey, FetchPosition],
               forgotten: list[PartitionKey]) -> None:
        for key, position in requested.items():
            cached = self.partitions.get(key)
            if cached is None:
                self.partitions[key] = CachedPartition(position)
            else:
                cached.position = position
        for key in forgotten:
            self.partitions.pop(key, None)


@dataclass
class FetchContext:
    """What one Fetch reads and how its answer is cut (Kafka's Full-, Incremental-,
    Sessionless- and SessionErrorContext in one)."""

    error: ErrorCode = ErrorCode.none
    partitions: dict[PartitionKey, FetchPosition] = field(default_factory=dict)
    """Every partition to read: the request's, or the whole session's."""
    session: FetchSession | None = None
    """An incremental fetch's session."""
    create_session: bool = False
    privileged: bool = False

    def respond(self, cache: FetchSessionCache, results: Mapping[PartitionKey, FetchResult],
                now_ms: float) -> tuple[int, dict[PartitionKey, FetchResult]]:
        """(the session id to answer, the partitions the answer names, in the order they
        were asked for); ``results`` holds one for each of ``partitions``."""
        if self.session is not None:
            cached = self.session.partitions
            return self.session.id, {key: results[key] for key in self.partitions
                                     if key not in cached or cached[key].must_respond(results[key])}
        session_id = INVALID_SESSION_ID
        if self.create_session:
            session_id = cache.maybe_create(now_ms, self.privileged, {
                key: CachedPartition(position, results[key].high_watermark,
                                     results[key].log_start_offset)
                for key, position in self.partitions.items()})
        return session_id, {key: results[key] for key in self.partitions}


class FetchSessionCache:
    def __init__(self, max_entries: int, eviction_ms: int, rng: random.Random | None = None
                 ) -> None:
        self.max_entries = max_entries
        self.eviction_ms = eviction_ms
        self.sessions: dict[int, FetchSession] = {}
        self._rng = rng or environment.random_source()

    def new_context(self, session_id: int, epoch: int,
                    requested: dict[PartitionKey, FetchPosition],
                    forgotten: list[PartitionKey], *, privileged: bool,
                    now_ms: float) -> FetchContext:
        """Kafka's ``FetchManager.newContext``."""
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            # A full fetch closes the session it names, and opens one unless FINAL.
            self.sessions.pop(session_id, None)
            return FetchContext(partitions=requested, create_session=epoch == INITIAL_EPOCH,
                                privileged=privileged)
        session = self.sessions.get(session_id)
        if session is None:
            return FetchContext(error=ErrorCode.fetch_session_id_not_found)
        if session.epoch != epoch:
            return FetchContext(error=ErrorCode.invalid_fetch_session_epoch)
        session.update(requested, forgotten)
        if not session.partitions:
            del self.sessions[session.id]
            return FetchContext(partitions=requested)
        session.last_used_ms = now_ms
        session.epoch = next_epoch(session.epoch)
        return FetchContext(
            partitions={key: cached.position for key, cached in session.partitions.items()},
            session=session)

    def maybe_create(self, now_ms: float, privileged: bool,
                     partitions: dict[PartitionKey, CachedPartition]) -> int:
        """A new session's id, or INVALID_SESSION_ID when the cache is full of sessions
        worth more (Kafka's ``FetchSessionCache.maybeCreateSession``)."""
        if not partitions or self.max_entries == 0:
            return INVALID_SESSION_ID
        session_id = self._new_id()
        candidate = FetchSession(session_id, privileged, partitions, now_ms, now_ms)
        if len(self.sessions) >= self.max_entries and not self._try_evict(candidate, now_ms):
            return INVALID_SESSION_ID
        self.sessions[session_id] = candidate
        return session_id

    def _try_evict(self, candidate: FetchSession, now_ms: float) -> bool:
        """Kafka's ``tryEvict``: the least recently used session if unused for
        ``min.incremental.fetch.session.eviction.ms``; else the lowest-valued session the
        candidate may evict, when it is worth less. A follower may evict any consumer's
        session, and a follower's older than the eviction time; a consumer, only sessions
        older than that."""
        oldest = min(self.sessions.values(), key=lambda s: s.last_used_ms)
        if now_ms - oldest.last_used_ms > self.eviction_ms:
            del self.sessions[oldest.id]
            return True
        evictable = [s for s in self.sessions.values()
                     if now_ms - s.creation_ms > self.eviction_ms
                     or (candidate.privileged and not s.privileged)]
        if not evictable:
            return False
        lowest = min(evictable, key=FetchSession.evictable_key)
        if candidate.evictable_key() < lowest.evictable_key():
            return False
        del self.sessions[lowest.id]
        return True

    def _new_id(self) -> int:
        while True:
            session_id = self._rng.randint(1, 2**31 - 1)
            if session_id not in self.sessions:
                return session_id
