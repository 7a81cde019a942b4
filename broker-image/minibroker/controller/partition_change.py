"""Kafka's ``PartitionChangeBuilder``: one partition's next registration, from the change a
caller wants (a target ISR, a broker to remove or to admit) and the rules of the Kafka
version the cluster follows.

Every change of a partition's leader, ISR, ELR or last known leader goes through
``build_change``, so the election order lives in one place:

1. a live member of the (target) ISR, the current leader first;
2. with ``eligible.leader.replicas.version=1`` (Kafka 4.1+, KIP-966) and an empty ISR, a live
   member of the ELR: replicas that left an ISR smaller than ``min.insync.replicas`` and so
   hold every committed record;
3. with ELR, when the ISR and the ELR are both empty, the last known leader, once it is live
   again (KIP-966 part 1's "balanced" recovery: ``canElectLastKnownLeader``; Kafka 4.1's
   KAFKA-19522 requires it to be acceptable). Kafka counts this election as unclean: the ISR
   becomes the leader alone and the ELR is cleared;
4. only with ``unclean.leader.election.enable``, any live replica.

An unclean election (3 or 4) marks the partition RECOVERING (KIP-704, ``tryElection``); the
leader's next AlterPartition says RECOVERED (``targetLeaderRecoveryState``).

Without ELR (Kafka 3.7 and before, ``eligible.leader.replicas.version=0``) steps 2 and 3 do
not exist and an empty target ISR is never written: the ISR keeps its last member, which
is how KRaft brings a partition back with the replica that had everything.

Source: ``metadata/src/main/java/org/apache/kafka/controller/PartitionChangeBuilder.java``
(``build``, ``maybePopulateTargetElr``, ``electAnyLeader``, ``tryElection``,
``maybeUpdateRecordElr``, ``maybeUpdateLastKnownLeader``), Kafka 4.2.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, replace

from minibroker.cluster.types import NO_LEADER, LeaderRecoveryState, PartitionRegistration
from minibroker.events import ElectionKind as Election

__all__ = ["PartitionChange", "build_change"]


@dataclass(frozen=True)
class PartitionChange:
    """The registration after a change, and what happened on the way."""

    registration: PartitionRegistration
    election: Election | None
    """None when the leader did not change."""

    def elr_changed(self, before: PartitionRegistration) -> bool:
        after = self.registration
        return (after.elr, after.last_known_elr) != (before.elr, before.last_known_elr)


def _ordered(replicas: tuple[int, ...], members: Collection[int]) -> tuple[int, ...]:
    """``members`` in the replicas' order (Kafka's sets are unordered; this keeps the
    registrations, the events and the tests deterministic)."""
    return tuple(r for r in replicas if r in members)


def build_change(reg: PartitionRegistration, *, target_isr: Collection[int], min_isr: int,
                 is_acceptable_leader: Callable[[int], bool], elr_enabled: bool,
                 unclean_enabled: bool, unclean_shutdown: Collection[int] = (),
                 target_recovery_state: LeaderRecoveryState | None = None
                 ) -> PartitionChange:
    """The registration that follows ``reg`` when its ISR becomes ``target_isr``.

    ``is_acceptable_leader`` is Kafka's predicate of the same name: live (unfenced, or being
    unfenced by this change) and neither being removed nor back from an unclean shutdown.
    ``unclean_shutdown``: brokers that re-registered without a clean shutdown; they leave
    the ELR (KAFKA-15586, KAFKA-18106). ``target_recovery_state``: the leader recovery
    state an AlterPartition carries (None: the registration's own).
    """
    isr = _ordered(reg.replicas, target_isr)
    elr, last_known = reg.elr, reg.last_known_elr

    # maybePopulateTargetElr: an ISR below min ISR hands its leavers to the ELR; an ISR at
    # min ISR or above needs none.
    if elr_enabled:
        if len(isr) >= min_isr:
            elr = ()
        else:
            elr = _ordered(reg.replicas, (set(reg.elr) | set(reg.isr)) - set(isr)
                           - set(unclean_shutdown))

    def is_valid(replica: int) -> bool:
        return (replica in isr or (not isr and replica in elr)) and is_acceptable_leader(replica)

    # electAnyLeader.
    election: Election | None = None
    leader = reg.leader
    if not is_valid(reg.leader):
        leader = next((r for r in reg.replicas if is_valid(r)), NO_LEADER)
        if leader != NO_LEADER:
            election = Election.ELR if leader in elr else Election.CLEAN
        elif (elr_enabled and not isr and not elr and len(reg.last_known_elr) == 1
              and is_acceptable_leader(reg.last_known_elr[0])):
            leader, election = reg.last_known_elr[0], Election.LAST_KNOWN_LEADER
        elif unclean_enabled:
            leader = next((r for r in reg.replicas if is_acceptable_leader(r)), NO_LEADER)
            election = Election.UNCLEAN if leader != NO_LEADER else None
        if leader == NO_LEADER:
            election = Election.OFFLINE if reg.leader != NO_LEADER else None

    # tryElection: an ELR member becomes the ISR; after an unclean election (the last known
    # leader's included) the ISR is the leader alone.
    if election == Election.ELR:
        isr = (leader,)
        elr = tuple(r for r in elr if r != leader)
    elif election in (Election.UNCLEAN, Election.LAST_KNOWN_LEADER):
        isr = (leader,)

    # KIP-704: an unclean election marks the partition RECOVERING; the target an
    # AlterPartition carries is applied after the election, as ``build`` does.
    recovery = reg.leader_recovery_state
    if election in (Election.UNCLEAN, Election.LAST_KNOWN_LEADER):
        recovery = LeaderRecoveryState.RECOVERING
    if target_recovery_state is not None and target_recovery_state != reg.leader_recovery_state:
        recovery = target_recovery_state

    # maybeUpdateRecordElr: an unclean election, or ELR off, leaves no ELR.
    if not elr_enabled or election in (Election.UNCLEAN, Election.LAST_KNOWN_LEADER):
        elr = ()
    # Without ELR an empty ISR is never written: the last member stays (Kafka 3.7).
    if not isr and not elr_enabled:
        isr = reg.isr

    # maybeUpdateLastKnownLeader: the leader of the moment the ISR first emptied is kept
    # (LastKnownElr); a partition with a leader again forgets it.
    if elr_enabled:
        if not isr and reg.leader != NO_LEADER and reg.last_known_elr != (reg.leader,):
            last_known = (reg.leader,)
        elif (election is not None and leader != NO_LEADER) or (
                election is None and reg.leader != NO_LEADER):
            last_known = ()
    else:
        last_known = ()

    changed_leader = election is not None
    after = replace(
        reg, leader=leader, isr=isr, elr=elr, last_known_elr=last_known,
        leader_recovery_state=recovery,
        leader_epoch=reg.leader_epoch + (1 if changed_leader else 0),
        partition_epoch=reg.partition_epoch)
    if after != reg:
        after = replace(after, partition_epoch=reg.partition_epoch + 1)
    return PartitionChange(after, election)
