"""``Replica``: the leader's view of one follower (Kafka's remote replica state).

The leader learns a follower's log end offset only from the ``fetch_offset`` of its Fetch
requests (seed 000), and decides whether it is caught up from when it last reached the
leader's log end offset. It also keeps the broker epoch those fetches came with (KIP-903):
state learnt from an earlier incarnation of the follower must not admit it to the ISR.
"""

from __future__ import annotations

from dataclasses import dataclass

UNKNOWN_OFFSET = -1


@dataclass
class Replica:
    broker_id: int
    log_end_offset: int = UNKNOWN_OFFSET
    last_caught_up_time_ms: float = 0.0
    last_fetch_time_ms: float = 0.0
    last_fetch_leader_log_end_offset: int = 0
    # The broker epoch of the last fetch: None before any, -1 from a follower that does not
    # send one (Fetch before v15).
    broker_epoch: int | None = None

    def update_fetch_state(self, fetch_offset: int, leader_end_offset: int, now_ms: float,
                           broker_epoch: int = -1) -> None:
        """Kafka's ReplicaState update: caught up if it reached the leader's LEO at this fetch
        or the leader's LEO of the previous fetch."""
        if fetch_offset >= leader_end_offset:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, now_ms)
        elif fetch_offset >= self.last_fetch_leader_log_end_offset:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, self.last_fetch_time_ms)
        self.log_end_offset = fetch_offset
        self.last_fetch_leader_log_end_offset = leader_end_offset
        self.last_fetch_time_ms = now_ms
        self.broker_epoch = broker_epoch

    def is_caught_up(self, leader_end_offset: int, now_ms: float, lag_max_ms: int) -> bool:
        return (self.log_end_offset == leader_end_offset
                or now_ms - self.last_caught_up_time_ms <= lag_max_ms)

    def reset(self, now_ms: float, in_isr: bool, leader_end_offset: int) -> None:
        """A new leader knows nothing of its followers yet; ISR members get a full lag window.
        Also what the leader does when a follower comes back as a new incarnation."""
        self.log_end_offset = UNKNOWN_OFFSET
        self.last_caught_up_time_ms = now_ms if in_isr else 0.0
        self.last_fetch_time_ms = 0.0
        self.last_fetch_leader_log_end_offset = leader_end_offset
        self.broker_epoch = None
