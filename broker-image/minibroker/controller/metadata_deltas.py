"""Which registrations each committed metadata offset changed, so that a broker long-polling
from offset S gets only what changed after S (a ``MetadataDelta``), not the whole image.

Kafka's brokers replay the metadata log's records after their offset
(``BrokerMetadataListener``) and load a snapshot only when they are too far behind. Here the
controller keeps, for its last ``RETAINED_OFFSETS`` offsets, the partitions each one changed;
a broker further behind, or one that knew another controller state (after a restart that
lost the retained offsets, or another cluster id), gets the whole image, as a snapshot.

The changes are found by comparing each commit with the one before (registrations are
replaced, never changed, so identity tells), not by marking every place that changes a
partition: a change the controller forgets to mark cannot be left out of a delta.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from minibroker.cluster.types import PartitionRegistration

RETAINED_OFFSETS = 10_000


@dataclass(frozen=True)
class _Committed:
    topic_id: str
    config: dict[str, str]
    partitions: dict[int, PartitionRegistration]


@dataclass(frozen=True)
class TopicChange:
    """Of one topic at one offset: the partitions whose registration changed, or ``None``
    for a new or deleted topic (all of them)."""

    partitions: frozenset[int] | None


TopicState = tuple[str, str, dict[str, str], dict[int, PartitionRegistration]]
"""A topic's name, id, config and partitions, as committed."""


class MetadataDeltaLog:
    def __init__(self, offset: int, topics: Iterable[TopicState]) -> None:
        """The controller's state at ``offset`` (its start, or its restart): deltas start
        there."""
        self._first = offset + 1
        """The first offset whose changes are kept; deltas start from ``_first - 1``."""
        self._changes: deque[dict[str, TopicChange]] = deque(maxlen=RETAINED_OFFSETS)
        self._committed = {name: _Committed(topic_id, dict(config), dict(partitions))
                           for name, topic_id, config, partitions in topics}

    def record(self, topics: Iterable[TopicState]) -> None:
        """The next offset's state (name, id, config, partitions of every topic)."""
        changed: dict[str, TopicChange] = {}
        committed: dict[str, _Committed] = {}
        for name, topic_id, config, partitions in topics:
            before = self._committed.get(name)
            if before is None or before.topic_id != topic_id:
                changed[name] = TopicChange(None)
            else:
                touched = frozenset(i for i, reg in partitions.items()
                                    if before.partitions.get(i) is not reg)
                if touched or before.config != config:
                    changed[name] = TopicChange(touched)
            committed[name] = _Committed(topic_id, dict(config), dict(partitions))
        for name in self._committed.keys() - committed.keys():  # a RemoveTopicRecord
            changed[name] = TopicChange(None)
        self._committed = committed
        if len(self._changes) == self._changes.maxlen:
            self._first += 1
        self._changes.append(changed)

    def changes_since(self, since: int, offset: int) -> dict[str, frozenset[int] | None] | None:
        """Topic -> changed partitions (``None``: all) between ``since`` and ``offset`` (the
        current offset); ``None`` when ``since`` is outside what is kept. A topic named here
        that the controller no longer has was deleted."""
        if since < self._first - 1 or since > offset:
            return None
        union: dict[str, frozenset[int] | None] = {}
        kept = len(self._changes)
        for index in range(kept - (offset - since), kept):
            for name, change in self._changes[index].items():
                if change.partitions is None or union.get(name, frozenset()) is None:
                    union[name] = None
                else:
                    union[name] = union.get(name, frozenset()) | change.partitions
        return union
