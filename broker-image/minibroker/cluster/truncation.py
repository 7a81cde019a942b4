"""How a follower decides where to truncate before it fetches from a new leader.

``leader-epoch`` mode is KIP-101 with KIP-279's refinement, as Kafka's fetcher does it: ask
the leader for the end offset of our latest epoch, then cut to the smaller of its answer and
our own end offset for that epoch; if we never had the epoch the leader answered with, cut
to the end of our largest smaller epoch and ask again. ``high-watermark`` mode is the
pre-KIP-101 rule (cut to the local HW checkpoint), kept so that its data loss can be shown.
"""

from __future__ import annotations

from dataclasses import dataclass

from minibroker.cluster.types import UNDEFINED_EPOCH, UNDEFINED_OFFSET
from minibroker.storage.leader_epoch_cache import LeaderEpochCache


@dataclass(frozen=True)
class TruncationState:
    offset: int
    completed: bool


def truncation_for_epoch_answer(
    cache: LeaderEpochCache,
    log_end_offset: int,
    high_watermark: int,
    leader_epoch: int,
    leader_end_offset: int,
) -> TruncationState:
    """The follower's side of OffsetForLeaderEpoch (Kafka's getOffsetTruncationState)."""
    if leader_end_offset == UNDEFINED_OFFSET:
        # The leader knows nothing of our epoch: all we can trust is our high watermark.
        return TruncationState(min(high_watermark, log_end_offset), True)
    if leader_epoch == UNDEFINED_EPOCH:
        return TruncationState(min(leader_end_offset, log_end_offset), True)
    follower_epoch, follower_end = cache.end_offset_for(leader_epoch, log_end_offset)
    if follower_end == UNDEFINED_OFFSET:
        return TruncationState(min(leader_end_offset, log_end_offset), True)
    if follower_epoch != leader_epoch:
        # KIP-279: we never saw the leader's epoch; cut to the end of our largest smaller
        # epoch and ask again with what is then our latest epoch.
        return TruncationState(min(follower_end, log_end_offset), False)
    return TruncationState(min(follower_end, leader_end_offset, log_end_offset), True)
