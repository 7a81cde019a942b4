"""Where a new partition's replicas go: placed by the controller, or given by the client.

The controller places a topic's partitions round-robin over the live brokers (partition
``i`` starts at the ``i``-th live broker), a simplification of Kafka's
``StripedReplicaPlacer`` without racks; a CreatePartitions that names its replicas is
checked as Kafka 4.2's ``ReplicationControlManager.validateManualPartitionAssignment``
checks it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["InvalidAssignment", "place", "validate_manual_assignment"]


class InvalidAssignment(ValueError):
    """A manual assignment Kafka refuses with INVALID_REPLICA_ASSIGNMENT."""


def place(live: Sequence[int], first_index: int, count: int, replication_factor: int
          ) -> list[tuple[int, ...]]:
    """The replicas of partitions ``first_index .. first_index + count - 1``, the first of
    each its preferred leader. ``live`` is sorted and at least ``replication_factor`` long."""
    return [tuple(live[(index + i) % len(live)] for i in range(replication_factor))
            for index in range(first_index, first_index + count)]


def validate_manual_assignment(replicas: Sequence[int], replication_factor: int,
                               is_registered: Callable[[int], bool]) -> None:
    """Kafka's ``validateManualPartitionAssignment``: a non-empty list of distinct,
    registered brokers (checked in broker id order, as Kafka does), as many as the topic's
    replication factor."""
    if not replicas:
        raise InvalidAssignment("The manual partition assignment includes an empty "
                                "replica list.")
    previous = None
    for broker in sorted(replicas):
        if not is_registered(broker):
            raise InvalidAssignment(f"The manual partition assignment includes broker "
                                    f"{broker}, but no such broker is registered.")
        if broker == previous:
            raise InvalidAssignment(f"The manual partition assignment includes the broker "
                                    f"{broker} more than once.")
        previous = broker
    if len(replicas) != replication_factor:
        raise InvalidAssignment(f"The manual partition assignment includes a partition with "
                                f"{len(replicas)} replica(s), but this is not consistent "
                                f"with previous partitions, which have {replication_factor} "
                                f"replica(s).")
