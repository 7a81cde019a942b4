"""A group coordinator on a manual clock, for the state-machine tests: its writes to
``__consumer_offsets`` are answered by the test (at once, or held to show what waits for
the acks), and its replication events are collected."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from manual_scheduler import ManualScheduler

from minibroker.cluster.types import (
    ErrorCode,
    MetadataImage,
    PartitionRegistration,
    ProduceResult,
    TopicImage,
    TopicPartition,
)
from minibroker.coordinator.group_coordinator import GroupCoordinator
from minibroker.coordinator.group_metadata import JoinGroupResult, SyncGroupResult
from minibroker.coordinator.group_metadata_manager import OFFSETS_TOPIC, partition_for
from minibroker.coordinator.records import OffsetAndMetadata
from minibroker.events import ReplicationEventLog
from minibroker.storage.producer_state import AppendOrigin

GROUP = "g"
PROTOCOLS = [("range", b"subscription")]
SESSION_MS = 6000
REBALANCE_MS = 20000


def group_on(partition: int, partitions: int) -> str:
    """A group id that lands on ``partition``."""
    return next(f"group-{i}" for i in range(10_000)
                if partition_for(f"group-{i}", partitions) == partition)


class Harness:
    def __init__(self, tmp_path: Path, partitions: int = 1, *, replica: Any = None,
                 **config: str) -> None:
        """``replica``: what the coordinator replays when it leads (None: an empty log)."""
        self.scheduler = ManualScheduler(start_ms=1_000_000)
        self.events: list[dict[str, Any]] = []
        log = ReplicationEventLog(tmp_path, clock=lambda: self.scheduler.now_ms() / 1000,
                                  on_event=self.events.append)
        self.hold = False
        self.held: list[Callable[[], None]] = []
        self.next_offset = 0
        self.written: list[tuple[TopicPartition, bytes]] = []
        self.origins: list[AppendOrigin] = []
        reg = PartitionRegistration((1,), (1,), 1, 0, 0)
        self.image = MetadataImage(1, topics={OFFSETS_TOPIC: TopicImage(
            OFFSETS_TOPIC, "00" * 16, {}, dict.fromkeys(range(partitions), reg))})
        self.coordinator = GroupCoordinator(
            1, self.scheduler, config={"offsets.topic.num.partitions": str(partitions),
                                       "group.initial.rebalance.delay.ms": "0", **config},
            events=log, append=self._append, local_partition=lambda _tp: replica,
            metadata_image=lambda: self.image, wall_clock_ms=self.scheduler.now_ms)

    def lead(self, partition: int = 0, epoch: int = 0, *, load: bool = True) -> None:
        self.coordinator.on_leadership_change(TopicPartition(OFFSETS_TOPIC, partition), True,
                                              epoch)
        if load:
            self.advance(0)

    def advance(self, ms: float) -> None:
        self.scheduler.advance(ms)

    def _append(self, *, acks: int, timeout_ms: int, entries: dict[TopicPartition, bytes],
                on_complete: Callable[[dict[TopicPartition, ProduceResult]], None],
                origin: AppendOrigin = AppendOrigin.CLIENT,
                verification_guards: object = None) -> None:
        results = {}
        for tp, batch in entries.items():
            self.written.append((tp, batch))
            self.origins.append(origin)
            results[tp] = ProduceResult(ErrorCode.none, base_offset=self.next_offset)
            self.next_offset += 1
        if self.hold:
            self.held.append(lambda: on_complete(results))
        else:
            on_complete(results)

    def release(self) -> None:
        held, self.held = self.held, []
        for complete in held:
            complete()

    # ---- requests ------------------------------------------------------------------------

    def join(self, member_id: str = "", *, instance: str | None = None, version: int = 5,
             protocols: list[tuple[str, bytes]] = PROTOCOLS, group: str = GROUP,
             session_ms: int = SESSION_MS, rebalance_ms: int = REBALANCE_MS
             ) -> list[JoinGroupResult]:
        """The JoinGroup's answer lands in the returned list (empty while parked)."""
        answer: list[JoinGroupResult] = []
        self.coordinator.handle_join_group(
            group, member_id, instance, require_known_member_id=version >= 4,
            support_skipping_assignment=version >= 9, client_id="client",
            client_host="/127.0.0.1", rebalance_timeout_ms=rebalance_ms,
            session_timeout_ms=session_ms, protocol_type="consumer", protocols=protocols,
            callback=answer.append)
        return answer

    def join_new(self, **kwargs: Any) -> list[JoinGroupResult]:
        """KIP-394's two steps: MEMBER_ID_REQUIRED, then the join with that id."""
        (first,) = self.join(**kwargs)
        assert first.error == ErrorCode.member_id_required
        return self.join(first.member_id, **kwargs)

    def sync(self, member_id: str, generation: int, assignment: dict[str, bytes] | None = None,
             *, instance: str | None = None, group: str = GROUP) -> list[SyncGroupResult]:
        answer: list[SyncGroupResult] = []
        self.coordinator.handle_sync_group(group, generation, member_id, "consumer", "range",
                                           instance, assignment or {}, answer.append)
        return answer

    def heartbeat(self, member_id: str, generation: int, *, instance: str | None = None,
                  group: str = GROUP) -> ErrorCode:
        return self.coordinator.handle_heartbeat(group, member_id, instance, generation)

    def commit(self, member_id: str, generation: int, offsets: dict[TopicPartition, int],
               *, group: str = GROUP) -> list[dict[TopicPartition, ErrorCode]]:
        answer: list[dict[TopicPartition, ErrorCode]] = []
        self.coordinator.handle_commit_offsets(
            group, member_id, None, generation,
            {tp: OffsetAndMetadata(o, commit_timestamp=0) for tp, o in offsets.items()},
            answer.append)
        return answer

    def stable_group(self, *members: str) -> tuple[int, list[str]]:
        """Join ``len(members)`` new members and complete the generation (the first to
        join leads and assigns each its name as bytes): (generation, member ids)."""
        answers = [self.join_new() for _ in members]
        self.advance(0)
        ids = [a[0].member_id for a in answers]
        generation = answers[0][0].generation_id
        leader = answers[0][0].leader_id
        for member_id in ids:
            if member_id != leader:
                self.sync(member_id, generation)
        self.sync(leader, generation, dict(zip(ids, (m.encode() for m in members),
                                               strict=True)))
        return generation, ids

    def types(self, start: int = 0) -> list[tuple[str, str | None]]:
        """(type, reason) of the events since ``start``."""
        return [(e["type"], e.get("reason")) for e in self.events[start:]]
