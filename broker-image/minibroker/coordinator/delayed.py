"""The classic group protocol's delayed operations: Kafka's ``DelayedJoin``,
``InitialDelayedJoin``, ``DelayedSync`` and ``DelayedHeartbeat``.

They wait in the broker's purgatory (``cluster.delayed.Purgatory``), keyed by group or by
member as Kafka's ``GroupJoinKey``, ``GroupSyncKey`` and ``MemberKey``, on the broker's
``Scheduler``: asyncio's in a broker, a manual clock in tests
(``tests/minibroker/stepper.py``).
Each only decides *when*; what happens is the ``Rebalancer``'s, as in
Kafka, where these classes call back into ``GroupCoordinator``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minibroker.cluster.delayed import DelayedOperation, Purgatory

if TYPE_CHECKING:
    from minibroker.coordinator.group_metadata import GroupMetadata
    from minibroker.coordinator.rebalance import Rebalancer

__all__ = ["DelayedHeartbeat", "DelayedJoin", "DelayedSync", "InitialDelayedJoin",
           "join_key", "member_key", "sync_key"]


def join_key(group_id: str) -> tuple[str, str]:
    return ("join", group_id)


def sync_key(group_id: str) -> tuple[str, str]:
    return ("sync", group_id)


def member_key(group_id: str, member_id: str) -> tuple[str, str, str]:
    return ("member", group_id, member_id)


class DelayedJoin(DelayedOperation):
    """Completes once every known member has rejoined, at the latest after the rebalance
    timeout; then the next generation starts (``on_complete_join``)."""

    def __init__(self, handler: Rebalancer, group: GroupMetadata) -> None:
        super().__init__({join_key(group.group_id)})
        self._handler = handler
        self.group = group

    def try_complete(self) -> bool:
        if self.group.has_all_members_joined:
            self.force_complete()
        return self.completed

    def on_expiration(self) -> None:
        pass

    def on_complete(self) -> None:
        self._handler.on_complete_join(self.group)


class InitialDelayedJoin(DelayedJoin):
    """The first rebalance of an empty group (``group.initial.rebalance.delay.ms``): it
    never completes early, and each member that joined meanwhile buys another delay, until
    the rebalance timeout is spent."""

    def __init__(self, handler: Rebalancer, purgatory: Purgatory,
                 group: GroupMetadata, configured_delay_ms: int, delay_ms: int,
                 remaining_ms: int) -> None:
        super().__init__(handler, group)
        self._purgatory = purgatory
        self._configured_delay_ms = configured_delay_ms
        self.delay_ms = delay_ms
        self._remaining_ms = remaining_ms

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        if self.group.new_member_added and self._remaining_ms != 0:
            self.group.new_member_added = False
            delay = min(self._configured_delay_ms, self._remaining_ms)
            remaining = max(self._remaining_ms - self.delay_ms, 0)
            op = InitialDelayedJoin(self._handler, self._purgatory, self.group,
                                    self._configured_delay_ms, delay, remaining)
            self._purgatory.try_complete_else_watch(op, delay)
        else:
            super().on_complete()


class DelayedSync(DelayedOperation):
    """After a generation starts, every member must send its SyncGroup within the rebalance
    timeout; those that did not are removed and the group rebalances (KIP-814's pending
    sync, Kafka 3.2+)."""

    def __init__(self, handler: Rebalancer, group: GroupMetadata) -> None:
        super().__init__({sync_key(group.group_id)})
        self._handler = handler
        self.group = group
        self.generation_id = group.generation_id

    def try_complete(self) -> bool:
        if self._handler.should_complete_pending_sync(self.group, self.generation_id):
            self.force_complete()
        return self.completed

    def on_expiration(self) -> None:
        self._handler.on_expire_pending_sync(self.group, self.generation_id)

    def on_complete(self) -> None:
        pass


class DelayedHeartbeat(DelayedOperation):
    """A member's session: completed by a heartbeat (or a join, sync or commit), it
    expires after the session timeout and the member is removed. ``is_pending``: a KIP-394
    member id handed out but not yet joined with."""

    def __init__(self, handler: Rebalancer, group: GroupMetadata, member_id: str,
                 is_pending: bool) -> None:
        super().__init__({member_key(group.group_id, member_id)})
        self._handler = handler
        self.group = group
        self.member_id = member_id
        self.is_pending = is_pending

    def try_complete(self) -> bool:
        if self._handler.should_complete_heartbeat(self.group, self.member_id,
                                                   self.is_pending):
            self.force_complete()
        return self.completed

    def on_expiration(self) -> None:
        self._handler.on_expire_heartbeat(self.group, self.member_id, self.is_pending)

    def on_complete(self) -> None:
        pass
