"""Eligible leader replicas (KIP-966, Kafka 4.1+'s default) step by step: every transition of
the ELR and the last known leader, clean-shutdown detection (KAFKA-15582/15586/18106), the
election order (ISR, ELR, last known leader, then unclean) and the loss Kafka's own rules
still allow (the last known leader after a power loss)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rule_sets import KAFKA_3_7, KAFKA_4_2
from stepper import SimCluster

from minibroker.cluster.types import NO_LEADER, ErrorCode, PartitionRegistration, TopicPartition
from minibroker.controller.partition_change import build_change
from minibroker.events import ElectionKind
from minibroker.storage.clean_shutdown import CLEAN_SHUTDOWN_FILE

TP = TopicPartition("orders", 0)
SESSION_MS = 3000


def cluster(root: Path, rules: dict[str, str] = KAFKA_4_2, **config: str) -> SimCluster:
    sim = SimCluster(root, brokers=3, config={
        "min.insync.replicas": "2", "replica.lag.time.max.ms": "3000", **rules, **config})
    sim.create_topic("orders", replication_factor=3)
    assert sim.registration(TP).replicas == (1, 2, 3)
    return sim


def acked(sim: SimCluster, count: int, prefix: str = "m") -> list[bytes]:
    """``count`` records acknowledged with acks=all by the whole ISR."""
    values = []
    for i in range(count):
        send = sim.produce(TP, [f"{prefix}{i}"], acks=-1)
        sim.replicate(rounds=2)
        assert send.acknowledged
        values.append(send.values[0])
    return values


def fence_dead(sim: SimCluster) -> None:
    """Let the sessions of the brokers that are down expire."""
    sim.advance(SESSION_MS + 500)


def down(sim: SimCluster, *steps: tuple[str, int]) -> None:
    """Each (how, broker) in turn: ``stop`` (clean), ``crash`` or ``power_loss``, then the
    controller fences it."""
    for how, broker_id in steps:
        if how == "stop":
            sim.stop(broker_id)
        else:
            sim.crash(broker_id, power_loss=how == "power_loss")
        fence_dead(sim)


def events_of(sim: SimCluster, kind: str, since: int = 0) -> list[dict]:
    return [e for e in sim.events()[since:] if e["type"] == kind]


def values_on(sim: SimCluster, broker_id: int) -> list[bytes]:
    return [v for _, v in sim.log_values(broker_id, TP)]


def test_replicas_leaving_an_isr_below_min_isr_join_the_elr_until_the_isr_is_back(
        tmp_path: Path) -> None:
    sim = cluster(tmp_path)
    acked(sim, 2)
    down(sim, ("stop", 3))
    reg = sim.registration(TP)
    assert (reg.isr, reg.elr) == ((1, 2), ()), "an ISR at min ISR needs no ELR"
    mark = len(sim.events())
    down(sim, ("stop", 2))
    reg = sim.registration(TP)
    assert (reg.leader, reg.isr, reg.elr, reg.last_known_elr) == (1, (1,), (2,), ())
    [change] = events_of(sim, "elr_change", mark)
    assert (change["old_elr"], change["elr"], change["reason"], change["broker"]) == (
        [], [2], "isr_below_min", 2)

    sim.start(2)  # a clean restart keeps it in the ELR
    assert sim.registration(TP).elr == (2,)
    mark = len(sim.events())
    sim.replicate(rounds=3)  # it catches up: the ISR is back at min ISR
    reg = sim.registration(TP)
    assert (reg.isr, reg.elr) == ((1, 2), ())
    [change] = events_of(sim, "elr_change", mark)
    assert (change["elr"], change["reason"]) == ([], "isr_at_min")


def test_a_lagging_replica_never_joins_the_elr(tmp_path: Path) -> None:
    """Only members of the ISR can become eligible: one that left for lag lacks records."""
    sim = cluster(tmp_path)
    acked(sim, 1)
    sim.crash(3)
    sim.start(3)  # back, unfenced, but it never fetches
    for _ in range(40):
        sim.fetch_round(2)
        sim.advance(100)
    assert sim.registration(TP).isr == (1, 2)
    acked_later = sim.produce(TP, ["only-on-1-and-2"], acks=-1)
    sim.fetch_round(2)
    sim.fetch_round(2)
    assert acked_later.acknowledged
    sim.crash(2)
    fence_dead(sim)  # broker 3 keeps heartbeating: only 2 is fenced
    reg = sim.registration(TP)
    assert (reg.isr, reg.elr) == ((1,), (2,))
    assert 3 not in reg.elr


def test_an_elr_member_is_elected_when_the_isr_is_empty_and_loses_nothing(
        tmp_path: Path) -> None:
    """KIP-966's last replica standing: 2 stops cleanly (ELR), leader 1 crashes with the ISR
    {1}; 2 comes back, still eligible, and leads with every acknowledged record."""
    sim = cluster(tmp_path)
    values = acked(sim, 3)
    down(sim, ("stop", 3), ("stop", 2))
    sim.crash(1)
    mark = len(sim.events())
    fence_dead(sim)
    reg = sim.registration(TP)
    assert (reg.leader, reg.isr, reg.elr, reg.last_known_elr) == (NO_LEADER, (), (1, 2), (1,))
    [offline] = events_of(sim, "leader_election", mark)
    assert offline["kind"] == "offline"
    assert "nor ELR member in [1, 2]" in offline["detail"]

    mark = len(sim.events())
    sim.start(2)
    reg = sim.registration(TP)
    assert (reg.leader, reg.isr, reg.elr, reg.last_known_elr) == (2, (2,), (1,), ())
    [election] = events_of(sim, "leader_election", mark)
    assert (election["kind"], election["leader"], election["reason"]) == (
        "elr", 2, "broker_unfenced")
    assert "elected from the eligible leader replicas [1, 2]" in election["detail"]
    assert [e["reason"] for e in events_of(sim, "elr_change", mark)] == ["elected"]
    assert values_on(sim, 2) == values
    assert sim.controller.unclean_elections == 0

    mark = len(sim.events())
    sim.start(1)  # it was killed: an unclean shutdown takes it out of the ELR
    assert sim.registration(TP).elr == ()
    [change] = events_of(sim, "elr_change", mark)
    assert (change["old_elr"], change["elr"], change["reason"], change["broker"]) == (
        [1], [], "unclean_shutdown", 1)


def test_the_same_faults_under_kafka_3_7_elect_the_last_isr_member_only(tmp_path: Path) -> None:
    """Without ELR the ISR keeps its last member: 2 may not lead, the partition stays
    offline until 1 is back."""
    sim = cluster(tmp_path, KAFKA_3_7)
    acked(sim, 3)
    down(sim, ("stop", 3), ("stop", 2), ("crash", 1))
    reg = sim.registration(TP)
    assert (reg.leader, reg.isr, reg.elr) == (NO_LEADER, (1,), ())
    sim.start(2)
    assert sim.leader_of(TP) == NO_LEADER
    sim.start(1)
    assert (sim.leader_of(TP), sim.registration(TP).isr) == (1, (1,))
    assert not events_of(sim, "elr_change")


def test_a_crash_is_an_unclean_shutdown_that_removes_the_replica_from_isr_and_elr(
        tmp_path: Path) -> None:
    sim = cluster(tmp_path)
    acked(sim, 1)
    down(sim, ("stop", 3), ("crash", 2))
    assert sim.registration(TP).elr == (2,)
    epoch = sim.registration(TP).partition_epoch
    sim.start(2)
    reg = sim.registration(TP)
    assert reg.elr == ()
    assert reg.partition_epoch > epoch
    assert not (tmp_path / "broker-2" / CLEAN_SHUTDOWN_FILE).exists()


def test_clean_shutdown_is_recorded_and_proven_by_the_broker_epoch(tmp_path: Path) -> None:
    """KAFKA-15582: the epoch is written at a clean stop and taken at the next start;
    KAFKA-15586: the controller believes it only if it is the epoch it registered last."""
    sim = cluster(tmp_path)
    epoch = sim.broker_epoch(2)
    sim.stop(2)
    proof = tmp_path / "broker-2" / CLEAN_SHUTDOWN_FILE
    assert json.loads(proof.read_text()) == {"version": 0, "brokerEpoch": epoch}
    fence_dead(sim)
    sim.start(2)
    assert not proof.exists(), "the proof is spent at the start"
    sim.replicate(rounds=3)
    assert sim.registration(TP).isr == (1, 2, 3)

    # A stale proof (an earlier incarnation's epoch) proves nothing.
    down(sim, ("stop", 3), ("stop", 2))
    assert sim.registration(TP).elr == (2,)
    proof.write_text(json.dumps({"version": 0, "brokerEpoch": epoch}))
    sim.start(2)
    assert sim.registration(TP).elr == ()


def test_the_last_known_leader_is_elected_once_it_is_unfenced(tmp_path: Path) -> None:
    """Every replica crashes: all three restart uncleanly, so the ISR and the ELR end empty;
    the leader of the moment the ISR emptied leads again, and only once it is unfenced
    (KAFKA-19522: another broker's unfencing does not elect a fenced last known leader)."""
    sim = cluster(tmp_path)
    values = acked(sim, 3)
    down(sim, ("crash", 3), ("crash", 2), ("crash", 1))
    reg = sim.registration(TP)
    assert (reg.isr, reg.elr, reg.last_known_elr) == ((), (1, 2), (1,))
    sim.start(3)
    sim.start(2)
    reg = sim.registration(TP)
    assert (reg.leader, reg.elr, reg.last_known_elr) == (NO_LEADER, (1,), (1,))
    mark = len(sim.events())
    sim.start(1)
    reg = sim.registration(TP)
    assert (reg.leader, reg.isr, reg.elr, reg.last_known_elr) == (1, (1,), (), ())
    [election] = events_of(sim, "leader_election", mark)
    # Elected when unfenced, not while its unclean re-registration emptied the ELR.
    assert (election["kind"], election["reason"]) == ("last_known_leader", "broker_unfenced")
    assert "LAST KNOWN LEADER election: broker 1" in election["detail"]
    assert sim.controller.unclean_elections == 1
    sim.replicate(rounds=3)
    assert [v for _, v in sim.read_committed(TP)] == values


def test_the_last_known_leader_loses_what_a_power_loss_took(tmp_path: Path) -> None:
    """The loss Kafka 4.2's rules allow: the last known leader is elected after an unclean
    shutdown, and with no fsync a power loss took its acknowledged records. Brokers 2 and 3
    still had them in their page cache, but their own unclean restarts removed them from the
    ELR, and they truncate to the new leader's log. Kafka 3.7 loses the same records by
    electing its last ISR member (pod-delete-ephemeral.yaml's mechanism)."""
    sim = cluster(tmp_path)
    values = acked(sim, 3)
    down(sim, ("crash", 3), ("crash", 2), ("power_loss", 1))
    for broker_id in (3, 2, 1):
        sim.start(broker_id)
    assert sim.leader_of(TP) == 1
    assert [e["kind"] for e in events_of(sim, "leader_election")][-1] == "last_known_leader"
    sim.replicate(rounds=3)
    committed = [v for _, v in sim.read_committed(TP)]
    assert not set(values) & set(committed), "every acknowledged record is lost"
    assert values_on(sim, 2) == values_on(sim, 1) == committed


def test_unclean_election_only_after_the_isr_and_the_elr(tmp_path: Path) -> None:
    """With unclean.leader.election.enable, a live ELR member still comes first; the
    lagging replica is elected uncleanly only when no ELR member is live."""
    for elr_live, expected in ((True, ("elr", 2)), (False, ("unclean", 3))):
        sim = cluster(tmp_path / str(elr_live), **{"unclean.leader.election.enable": "true"})
        acked(sim, 1)
        down(sim, ("crash", 3))
        sim.start(3)  # live, out of the ISR, never fetching
        down(sim, ("stop", 2))
        if elr_live:
            sim.start(2)  # clean: still eligible, not yet back in the ISR
        assert sim.registration(TP).elr == (2,)
        mark = len(sim.events())
        down(sim, ("crash", 1))
        [election] = events_of(sim, "leader_election", mark)
        assert (election["kind"], election["leader"]) == expected
        if not elr_live:
            assert sim.registration(TP).elr == (), "an unclean election clears the ELR"


def test_a_min_isr_change_clears_the_elr_and_reaches_the_leader(tmp_path: Path) -> None:
    """Eligibility was earned against the old min.insync.replicas: changing the topic's value
    clears its ELR and last known leader (Kafka 4.2's ``createClearElrRecordsAsNeeded``);
    the leader applies the new minimum at once. A request that changes nothing of the
    topic's own config writes no ConfigRecord (``incrementalAlterConfigResource`` compares
    the topic's value before and after), so it clears nothing: a DELETE of an override the
    topic does not have, and a SET to the override it has. A SET of the cluster's default
    on a topic without an override is a change (null to "2")."""
    sim = cluster(tmp_path)
    acked(sim, 1)
    down(sim, ("stop", 3), ("stop", 2))
    assert sim.registration(TP).elr == (2,)
    epoch = sim.registration(TP).partition_epoch
    mark = len(sim.events())
    assert sim.controller.alter_topic_config("orders", {"min.insync.replicas": None}) == (
        ErrorCode.none, None)
    assert (sim.registration(TP).elr, sim.registration(TP).partition_epoch) == ((2,), epoch)
    assert sim.controller.alter_topic_config("orders", {"min.insync.replicas": "2"}) == (
        ErrorCode.none, None)
    assert sim.registration(TP).elr == (), "null to 2 is a change, though 2 is the default"
    assert sim.registration(TP).partition_epoch == epoch + 1
    [change] = events_of(sim, "elr_change", mark)
    assert change["reason"] == "min_isr_changed"
    sim.start(2)  # back in the ISR, then out again: in the ELR once more
    for _ in range(20):
        if 2 in sim.registration(TP).isr:
            break
        sim.replicate()
        sim.advance(100)
    else:
        pytest.fail(f"broker 2 never rejoined the ISR: {sim.registration(TP)}")
    down(sim, ("stop", 2))
    assert sim.registration(TP).elr == (2,)
    epoch = sim.registration(TP).partition_epoch
    assert sim.controller.alter_topic_config("orders", {"min.insync.replicas": "2"}) == (
        ErrorCode.none, None)
    assert (sim.registration(TP).elr, sim.registration(TP).partition_epoch) == ((2,), epoch)
    mark = len(sim.events())
    assert sim.controller.alter_topic_config("orders", {"min.insync.replicas": "1"}) == (
        ErrorCode.none, None)
    assert sim.registration(TP).elr == ()
    [change] = events_of(sim, "elr_change", mark)
    assert (change["old_elr"], change["elr"], change["reason"]) == ([2], [], "min_isr_changed")
    assert sim.replica(1, TP).config.min_insync_replicas == 1
    assert sim.produce(TP, ["alone"], acks=-1).acknowledged, "one ISR member is enough now"
    error, message = sim.controller.alter_topic_config("orders", {"min.insync.replicas": "x"})
    assert error == ErrorCode.invalid_config and "min.insync.replicas" in message


def test_an_elr_member_is_never_elected_while_the_isr_has_a_live_member(tmp_path: Path) -> None:
    """min.insync.replicas equal to the replication factor: the first broker to leave the ISR
    joins the ELR. Back after a clean stop, it is live and still eligible but not yet in the
    ISR; when the leader goes, the ISR's remaining member is elected cleanly, not the ELR
    member ahead of it in the replicas (``PartitionChangeBuilder.isValidNewLeader``: an ELR
    member only when the target ISR is empty)."""
    sim = cluster(tmp_path, **{"min.insync.replicas": "3"})
    acked(sim, 1)
    down(sim, ("stop", 1))
    reg = sim.registration(TP)
    assert (reg.leader, reg.isr, reg.elr) == (2, (2, 3), (1,))
    sim.start(1)  # clean: still eligible, never fetching, so not back in the ISR
    assert sim.registration(TP).elr == (1,)
    mark = len(sim.events())
    down(sim, ("stop", 2))
    [election] = events_of(sim, "leader_election", mark)
    assert (election["kind"], election["leader"]) == ("clean", 3)
    reg = sim.registration(TP)
    assert (reg.leader, reg.isr, reg.elr) == (3, (3,), (1, 2))


def test_the_last_known_leader_comes_before_an_unclean_election() -> None:
    """With unclean.leader.election.enable and the ISR and the ELR both empty, a live last
    known leader is elected as such (``PartitionChangeBuilder.electAnyLeader``:
    ``canElectLastKnownLeader`` is tried before ``unclean.leader.election.enable``), even
    when another live replica comes first in the replicas."""
    reg = PartitionRegistration(replicas=(1, 2, 3), isr=(), leader=NO_LEADER, leader_epoch=4,
                                partition_epoch=9, elr=(), last_known_elr=(2,))
    change = build_change(reg, target_isr=(), min_isr=2, is_acceptable_leader=lambda _: True,
                          elr_enabled=True, unclean_enabled=True)
    after = change.registration
    assert (change.election, after.leader, after.isr, after.elr, after.last_known_elr) == (
        ElectionKind.LAST_KNOWN_LEADER, 2, (2,), (), ())
    assert (after.leader_epoch, after.partition_epoch) == (5, 10)
    # The last known leader not acceptable (fenced): only then an unclean election.
    change = build_change(reg, target_isr=(), min_isr=2,
                          is_acceptable_leader=lambda broker: broker != 2, elr_enabled=True,
                          unclean_enabled=True)
    assert (change.election, change.registration.leader) == (ElectionKind.UNCLEAN, 1)
