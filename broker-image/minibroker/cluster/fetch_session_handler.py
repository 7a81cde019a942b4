"""Incremental fetch sessions, the follower's side (KIP-227; Kafka's
``FetchSessionHandler``): which partitions the next Fetch names, and with which session id
and epoch.

The first Fetch to a leader is full (every followed partition, epoch 0), and the leader's
answer gives a session id. Later Fetches are incremental: they name only partitions that
are new or whose position (fetch offset, leader epoch, log start offset, max bytes)
changed since the leader last saw it, and drop those no longer followed; the leader reads
the rest as it holds them. Any session error, a lost answer or a leader without room
starts over with a full Fetch, which also closes the old session on the leader.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass

from minibroker.cluster.types import ErrorCode, FetchPartition
from minibroker.network.fetch_session import INITIAL_EPOCH, INVALID_SESSION_ID, next_epoch


@dataclass(frozen=True)
class FetchPlan:
    """What the next Fetch carries."""

    session_id: int
    epoch: int
    partitions: dict[Hashable, FetchPartition]
    """The partitions it names: all of them when full, else the new and the changed."""
    forgotten: list[Hashable]

    @property
    def full(self) -> bool:
        return self.epoch == INITIAL_EPOCH


class FetchSessionHandler:
    def __init__(self) -> None:
        self.session_id = INVALID_SESSION_ID
        self.epoch = INITIAL_EPOCH
        self._session: dict[Hashable, FetchPartition] = {}
        """What the leader's session holds, as far as this side knows."""
        self._next: dict[Hashable, FetchPartition] = {}

    def build(self, partitions: Mapping[Hashable, FetchPartition]) -> FetchPlan:
        self._next = dict(partitions)
        if self.epoch == INITIAL_EPOCH:
            return FetchPlan(self.session_id, INITIAL_EPOCH, dict(partitions), [])
        changed = {key: fp for key, fp in partitions.items() if self._session.get(key) != fp}
        forgotten = [key for key in self._session if key not in partitions]
        return FetchPlan(self.session_id, self.epoch, changed, forgotten)

    def handle_response(self, plan: FetchPlan, error: ErrorCode, session_id: int) -> bool:
        """Take the leader's answer to ``plan``; False when the answer is a session error
        (it names no partition, and the next Fetch is full)."""
        if error != ErrorCode.none:
            # FETCH_SESSION_ID_NOT_FOUND: the leader lost it (a restart, an eviction);
            # INVALID_FETCH_SESSION_EPOCH: an answer went missing. Either way, start over.
            self.session_id = (INVALID_SESSION_ID if error == ErrorCode.fetch_session_id_not_found
                               else plan.session_id)
            self.reset()
            return False
        if plan.full:
            # INVALID_SESSION_ID: the leader had no room; the next full Fetch asks again.
            self.session_id = session_id
            self.epoch = INITIAL_EPOCH if session_id == INVALID_SESSION_ID else 1
        elif session_id == INVALID_SESSION_ID:
            # The leader closed the session (it became empty): the next fetch is full.
            self.session_id = INVALID_SESSION_ID
            self.reset()
            return True
        else:
            self.epoch = next_epoch(self.epoch)
        self._session = self._next
        return True

    def reset(self) -> None:
        """The next Fetch is full, and closes the session this side had (Kafka's
        ``nextCloseExisting``): after a session error, or a Fetch whose answer was lost."""
        self.epoch = INITIAL_EPOCH
        self._session = {}
