"""Kafka's replication rules on the step-by-step cluster: unclean election, min.insync.replicas,
ISR shrink and expand, divergent logs after a double power loss."""

from __future__ import annotations

from pathlib import Path

import pytest
from rule_sets import KAFKA_3_7
from stepper import SimCluster

from minibroker.cluster.errors import KafkaApiError
from minibroker.cluster.types import (
    NO_LEADER,
    ErrorCode,
    FetchRequestData,
    FetchResult,
    TopicPartition,
)

TP = TopicPartition("orders", 0)
LAG_MS = 3000
SESSION_MS = 3000


def fill(sim: SimCluster, count: int) -> None:
    for i in range(count):
        assert sim.produce(TP, [f"m{i}"], acks=1).acknowledged
    sim.replicate(rounds=3)


def advance_with_fetches(sim: SimCluster, ms: int, fetchers: list[int], step: int = 100) -> None:
    """Time passes while only ``fetchers`` keep fetching."""
    for _ in range(ms // step):
        for broker_id in fetchers:
            if sim.is_running(broker_id):
                sim.fetch_round(broker_id)
        sim.advance(step)


@pytest.mark.parametrize("unclean", [True, False])
def test_unclean_election_walkthrough(tmp_path: Path, unclean: bool) -> None:
    """Seed 000's offset-101 walkthrough: brokers 1 and 2 hold offset 101, broker 3 fell
    behind at 101; 1 and 2 crash. Unclean election makes 3 leader and loses 101; without
    it the partition stays offline until an ISR member returns, and nothing is lost.
    Kafka 3.7's rules, as the seed (test_elr.py has 4.1+'s)."""
    sim = SimCluster(tmp_path, brokers=3, config={**KAFKA_3_7,
                                                  "replica.lag.time.max.ms": str(LAG_MS),
        "min.insync.replicas": "2", "unclean.leader.election.enable": str(unclean).lower()})
    sim.create_topic("orders", replication_factor=3)
    assert sim.registration(TP).replicas == (1, 2, 3)
    fill(sim, 101)
    assert sim.replica(3, TP).log_end_offset == 101
    # Broker 3 stops fetching; offset 101 is acknowledged once 3 has left the ISR.
    send = sim.produce(TP, ["m101"], acks=-1)
    advance_with_fetches(sim, LAG_MS + 2000, fetchers=[2])
    assert sim.registration(TP).isr == (1, 2)
    assert send.acknowledged and send.result.base_offset == 101
    sim.fetch_round(2)
    assert sim.replica(1, TP).high_watermark == 102
    assert sim.replica(3, TP).log_end_offset == 101
    assert sim.read_committed(TP)[-1] == (101, b"m101")  # a consumer read offset 101

    sim.crash(1)
    sim.crash(2)
    sim.advance(SESSION_MS + 500)
    if unclean:
        assert sim.leader_of(TP) == 3
        assert sim.registration(TP).isr == (3,)
        assert sim.controller.unclean_elections == 1
        assert (101, b"m101") not in sim.read_committed(TP)
        assert sim.replica(3, TP).log_end_offset == 101
    else:
        assert sim.leader_of(TP) == NO_LEADER
        assert sim.controller.offline_partitions_count() == 1
        assert sim.produce(TP, ["x"], acks=-1).result.error == ErrorCode.not_leader_or_follower
        sim.start(2)
        assert sim.leader_of(TP) == 2
        sim.replicate()
        assert sim.read_committed(TP)[101] == (101, b"m101")
        assert sim.replica(3, TP).log_end_offset == 102


def test_min_insync_replicas_rejects_writes_while_the_isr_is_short(tmp_path: Path) -> None:
    sim = SimCluster(tmp_path, brokers=3, config={"min.insync.replicas": "2"})
    sim.create_topic("orders", replication_factor=3)
    fill(sim, 3)
    leader = sim.leader_of(TP)
    followers = [b for b in sim.registration(TP).replicas if b != leader]
    for follower in followers:
        sim.crash(follower)
    sim.advance(SESSION_MS + 500)
    assert sim.registration(TP).isr == (leader,)

    rejected = sim.produce(TP, ["rejected"], acks=-1)
    assert rejected.result.error == ErrorCode.not_enough_replicas
    assert [v for _, v in sim.read_committed(TP)] == [b"m0", b"m1", b"m2"]  # reads still work
    assert sim.produce(TP, ["acks1"], acks=1).acknowledged  # acks=1 is not guarded

    sim.start(followers[0])
    sim.replicate()
    assert len(sim.registration(TP).isr) == 2
    accepted = sim.produce(TP, ["accepted"], acks=-1)
    sim.replicate()
    assert accepted.acknowledged


@pytest.mark.parametrize("rule", ["strict", "legacy"])
def test_not_enough_replicas_after_append_and_request_timeout(tmp_path: Path, rule: str) -> None:
    """An acks=all batch appended while the ISR was large enough, whose followers then drop
    out. Kafka up to 3.6 (`legacy`) moves the HW past it with the leader alone in the ISR and
    answers NOT_ENOUGH_REPLICAS_AFTER_APPEND; since 3.7 (`strict`, KAFKA-15583) the HW
    stands still under min ISR, so the request times out instead."""
    sim = SimCluster(tmp_path, brokers=3, config={"replica.lag.time.max.ms": str(LAG_MS),
        "min.insync.replicas": "2", "high.watermark.min.isr.rule": rule})
    sim.create_topic("orders", replication_factor=3)
    fill(sim, 1)
    timed_out = sim.produce(TP, ["slow"], acks=-1, timeout_ms=1000)
    sim.advance(1000)
    assert timed_out.result.error == ErrorCode.request_timed_out

    pending = sim.produce(TP, ["after-append"], acks=-1, timeout_ms=LAG_MS + 4000)
    advance_with_fetches(sim, LAG_MS + 2000, fetchers=[])
    leader = sim.leader_of(TP)
    assert sim.registration(TP).isr == (leader,)
    if rule == "legacy":
        # The followers left the ISR: the HW passed the batch with only the leader in the ISR.
        assert pending.result.error == ErrorCode.not_enough_replicas_after_append
    else:
        assert pending.result is None
        assert sim.replica(leader, TP).high_watermark == 1
        sim.advance(2000)
        assert pending.result.error == ErrorCode.request_timed_out


def test_isr_shrinks_after_lag_time_and_expands_when_caught_up(tmp_path: Path) -> None:
    sim = SimCluster(tmp_path, brokers=3, config={"replica.lag.time.max.ms": str(LAG_MS)})
    sim.create_topic("orders", replication_factor=3)
    leader, f1, f2 = sim.registration(TP).replicas
    fill(sim, 1)
    # f2 stops fetching while writes go on: still in the ISR just under the lag time...
    for i in range(int(LAG_MS / 100) - 2):
        sim.produce(TP, [f"w{i}"], acks=1)
        advance_with_fetches(sim, 100, fetchers=[f1])
    assert f2 in sim.registration(TP).isr
    # ... and out once it is past it (the check runs every lag/2).
    for i in range(int(LAG_MS / 100)):
        sim.produce(TP, [f"x{i}"], acks=1)
        advance_with_fetches(sim, 100, fetchers=[f1])
    assert sim.registration(TP).isr == (leader, f1)
    assert sim.replica(leader, TP).isr_shrinks == 1
    # It fetches again: it rejoins once its LEO reaches the HW.
    sim.fetch_round(f2)
    sim.fetch_round(f2)
    assert sim.registration(TP).isr == (leader, f1, f2)
    assert sim.replica(leader, TP).isr_expands == 1


@pytest.mark.parametrize("mode", ["leader-epoch", "high-watermark"])
def test_divergent_logs_after_double_power_loss(tmp_path: Path, mode: str) -> None:
    """KIP-101 scenario 2: both replicas lose power; the old follower comes back first and
    writes a different record at the old leader's last offset. With leader epochs the old
    leader truncates to the new epoch's start and the logs agree; with the HW rule its HW
    covered that offset, so it keeps its record and the logs diverge."""
    sim = SimCluster(tmp_path, brokers=2, config={"replica.lag.time.max.ms": str(LAG_MS),
        "replication.truncation.mode": mode, "log.flush.interval.messages": "1"})
    sim.create_topic("orders", replication_factor=2)
    a, b = sim.registration(TP).replicas
    fill(sim, 2)
    # b stops fetching and falls out of the ISR; a alone commits offset 2
    # (min.insync.replicas=1).
    old = sim.produce(TP, ["old"], acks=-1)
    advance_with_fetches(sim, LAG_MS + 2000, fetchers=[])
    assert sim.registration(TP).isr == (a,)
    assert old.acknowledged and old.result.base_offset == 2
    for rm in sim.brokers.values():
        rm.checkpoint_high_watermarks()
    assert sim.replica(a, TP).high_watermark == 3

    sim.crash(a, power_loss=True)
    sim.crash(b, power_loss=True)
    sim.advance(SESSION_MS + 500)
    # b comes back first; with a still fenced, only an unclean election could pick b...
    sim.controller.config["unclean.leader.election.enable"] = "true"
    sim.start(b)
    assert sim.leader_of(TP) == b
    assert sim.produce(TP, ["new"], acks=1).acknowledged
    sim.start(a)
    sim.replicate()
    at_2 = {broker: dict(sim.log_values(broker, TP)).get(2) for broker in (a, b)}
    assert at_2[b] == b"new"
    if mode == "leader-epoch":
        assert at_2[a] == b"new"
        assert sim.log_values(a, TP) == sim.log_values(b, TP)
    else:
        assert at_2[a] == b"old"


def test_kip279_a_noop_truncation_still_truncates_the_epoch_cache(tmp_path: Path) -> None:
    """Kafka's UnifiedLog.truncateTo: a truncation at or past the log end offset still drops
    epoch entries starting there. Broker 3 becomes leader of epoch 2, appends nothing, and
    is fenced while it runs (its heartbeats are lost); broker 2, which holds epoch-1 records
    3 never saw, is elected (unclean) and writes epoch 3. As a follower, 3 asks for epoch 2,
    is told epoch 1 ends at 12, truncates to its own end of epoch 0 (10, its log end
    offset: nothing to cut) and must then ask for epoch 0 instead of epoch 2 again, or it
    never fetches nor rejoins the ISR."""
    sim = SimCluster(tmp_path, brokers=3, config={
        "min.insync.replicas": "1", "unclean.leader.election.enable": "true"})
    sim.create_topic("orders", replication_factor=3)
    fill(sim, 10)
    sim.crash(1)
    sim.advance(SESSION_MS + 500)
    assert (sim.leader_of(TP), sim.registration(TP).leader_epoch) == (2, 1)
    for value in ("e1-a", "e1-b"):  # acks=1, never fetched by broker 3
        assert sim.produce(TP, [value], acks=1).acknowledged
    sim.crash(2)
    sim.advance(SESSION_MS + 500)
    assert (sim.leader_of(TP), sim.registration(TP).leader_epoch) == (3, 2)
    follower = sim.replica(3, TP)
    assert [(e.epoch, e.start_offset) for e in follower.leader_epoch_cache.entries] == [
        (0, 0), (2, 10)]
    sim.start(2)  # back, but not fetching yet: its log still holds epoch 1
    sim.advance(SESSION_MS + 500, silent=[3])
    assert sim.leader_of(TP) == 2 and sim.controller.unclean_elections == 1
    assert sim.produce(TP, ["e3"], acks=1).acknowledged
    assert [(e.epoch, e.start_offset) for e in sim.replica(2, TP).leader_epoch_cache.entries
            ] == [(0, 0), (1, 10), (3, 12)]

    sim.advance(500)  # 3 heartbeats again, still running, now a follower of 2
    sim.fetch_round(3)  # before the fix: RuntimeError, the truncation did not converge
    assert [(e.epoch, e.start_offset) for e in follower.leader_epoch_cache.entries] == [
        (0, 0), (1, 10), (3, 12)]
    assert follower.log_end_offset == 13
    sim.replicate()
    assert 3 in sim.registration(TP).isr


@pytest.mark.parametrize("clean", [True, False])
def test_only_a_flush_makes_records_survive_a_power_loss_after_a_restart(tmp_path: Path,
                                                                       clean: bool) -> None:
    """Kafka's flush triggers: a clean shutdown flushes every log and checkpoints its
    recovery point, so a power loss after the restart drops nothing; a kill does not flush,
    the restart does not either (LogLoader), and the same power loss drops what was never
    fsynced. acks=1 with no replicas and the default (no) flush policy."""
    sim = SimCluster(tmp_path, brokers=1, config={"min.insync.replicas": "1"})
    sim.create_topic("orders", replication_factor=1)
    for i in range(10):
        assert sim.produce(TP, [f"m{i}"], acks=1).acknowledged
    if clean:
        sim.stop(1)
    else:
        sim.crash(1)
    sim.start(1)
    sim.advance(3500)  # registered once the previous incarnation's session expired
    assert sim.replica(1, TP).log_end_offset == 10  # the page cache survived either way
    sim.crash(1, power_loss=True)
    sim.start(1)
    sim.advance(3500)
    assert sim.replica(1, TP).log_end_offset == (10 if clean else 0)


@pytest.mark.parametrize("rule", ["strict", "legacy"])
def test_kafka_15583_the_high_watermark_stands_still_below_min_isr(tmp_path: Path,
                                                                  rule: str) -> None:
    """Kafka 3.7's maybeIncrementLeaderHW (KAFKA-15583): with the ISR below
    min.insync.replicas the leader does not advance the high watermark, so what a lone
    leader acknowledges with acks=1 stays invisible until a follower has it again. Kafka up
    to 3.6 (`legacy`) advanced it to the lone leader's log end offset at once."""
    sim = SimCluster(tmp_path, brokers=3, config={
        "min.insync.replicas": "2", "high.watermark.min.isr.rule": rule})
    sim.create_topic("orders", replication_factor=3)
    fill(sim, 4)
    leader = sim.leader_of(TP)
    followers = [b for b in (1, 2, 3) if b != leader]
    for broker_id in followers:
        sim.crash(broker_id)
    advance_with_fetches(sim, LAG_MS + 500, fetchers=[])
    assert sim.registration(TP).isr == (leader,)
    for value in ("alone-1", "alone-2"):
        assert sim.produce(TP, [value], acks=1).acknowledged
    assert sim.replica(leader, TP).log_end_offset == 6
    seen = [v.decode() for _, v in sim.read_committed(TP)]
    if rule == "strict":
        assert sim.replica(leader, TP).high_watermark == 4
        assert seen == [f"m{i}" for i in range(4)]
        assert sim.produce(TP, ["all"], acks=-1).result.error == ErrorCode.not_enough_replicas
    else:
        assert sim.replica(leader, TP).high_watermark == 6
        assert seen[-2:] == ["alone-1", "alone-2"]

    sim.start(followers[0])  # catches up, rejoins: ISR of 2 again, the HW moves on
    advance_with_fetches(sim, 1000, fetchers=[followers[0]])
    assert sorted(sim.registration(TP).isr) == sorted([leader, followers[0]])
    assert sim.replica(leader, TP).high_watermark == 6


def test_kafka_15583_min_isr_is_capped_at_the_replica_count(tmp_path: Path) -> None:
    """Kafka 3.7's effectiveMinIsr = min(min.insync.replicas, replicas): a topic with fewer
    replicas than min.insync.replicas takes acks=all writes and commits them (Kafka up to
    3.6 refused them with NOT_ENOUGH_REPLICAS)."""
    outcomes = {}
    for rule in ("strict", "legacy"):
        sim = SimCluster(tmp_path / rule, brokers=1, config={
            "min.insync.replicas": "2", "high.watermark.min.isr.rule": rule})
        sim.create_topic("orders", replication_factor=1)
        sent = sim.produce(TP, ["only"], acks=-1)
        outcomes[rule] = (sent.result.error, sim.replica(1, TP).high_watermark)
    assert outcomes == {"strict": (ErrorCode.none, 1),
                        "legacy": (ErrorCode.not_enough_replicas, 0)}


def test_kip_207_a_new_leader_answers_offset_not_available_until_its_hw_reaches_its_epoch(
        tmp_path: Path) -> None:
    """KIP-207 (Kafka 2.2): followers learn the HW one fetch after the leader, so a newly
    elected leader's HW can be below the start of its epoch, and below what consumers of the
    old leader already saw. ListOffsets(latest) from a consumer then gets the retriable
    OFFSET_NOT_AVAILABLE rather than that stale HW; followers still get the LEO."""
    sim = SimCluster(tmp_path, brokers=3)
    sim.create_topic("orders", replication_factor=3)
    a, b, c = sim.registration(TP).replicas
    for i in range(3):
        assert sim.produce(TP, [f"m{i}"], acks=1).acknowledged
    sim.fetch_round(b)
    sim.fetch_round(c)  # both have the records; they have not learnt the new HW yet
    sim.crash(a)
    sim.controller.fence_broker(a, "killed")
    leader = sim.leader_of(TP)
    partition = sim.replica(leader, TP)
    assert partition.leader_epoch_start_offset == 3 and partition.high_watermark < 3

    def latest(replica_id: int) -> tuple[ErrorCode, int]:
        try:
            offset, _ = partition.fetch_offset_for_timestamp(-1, partition.leader_epoch, 0,
                                                             replica_id)
        except KafkaApiError as exc:
            return exc.code, -1
        return ErrorCode.none, offset

    assert latest(-1) == (ErrorCode.offset_not_available, -1)
    assert latest(c if leader == b else b) == (ErrorCode.none, 3)
    sim.replicate()  # the other follower fetches from the new leader: the HW moves to 3
    assert latest(-1) == (ErrorCode.none, 3)


def test_kip_903_a_fetch_from_a_previous_incarnation_changes_nothing(tmp_path: Path) -> None:
    """KIP-903 (Kafka 3.5+): a follower restarted after a power loss with a shorter log; a
    fetch its previous incarnation sent before dying (held by a network fault) reaches the
    leader afterwards. Its fetch offset is the end of a log that no longer exists: accepted,
    it would put the follower back in the ISR, where a clean election could make it leader
    and lose committed records. The leader refuses it by broker epoch (NOT_LEADER_OR_FOLLOWER)
    and had already reset its view of the follower when the new incarnation registered."""
    sim = SimCluster(tmp_path, brokers=3)
    sim.create_topic("orders", replication_factor=3)
    leader, b, c = sim.registration(TP).replicas
    fill(sim, 5)
    stale = FetchRequestData(
        replica_id=b, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
        partitions=sim.brokers[b].build_follower_fetch([TP], 1 << 20),
        replica_epoch=sim.broker_epoch(b))
    assert stale.partitions[0].fetch_offset == 5
    old_epoch = sim.broker_epoch(b)

    sim.crash(b, power_loss=True)  # nothing was fsynced: it comes back empty
    advance_with_fetches(sim, SESSION_MS + 500, fetchers=[c])
    assert sim.registration(TP).isr == (leader, c)
    sim.start(b)
    assert sim.broker_epoch(b) > old_epoch
    assert sim.replica(b, TP).log_end_offset == 0
    view = sim.replica(leader, TP).remote_replicas[b]
    assert view.log_end_offset == -1  # reset: the old incarnation's LEO is forgotten

    answers: dict[TopicPartition, FetchResult] = {}
    sim.brokers[leader].fetch_messages(stale, answers.update)
    sim.deliver_alter_partitions()
    assert answers[TP].error == ErrorCode.not_leader_or_follower
    assert view.log_end_offset == -1
    assert sim.registration(TP).isr == (leader, c)
    assert sim.replica(leader, TP).high_watermark == 5

    # The new incarnation catches up by fetching and rejoins with its own epoch.
    sim.replicate()
    assert sim.registration(TP).isr == (leader, b, c)
    assert view.broker_epoch == sim.broker_epoch(b)


def test_kip_841_a_leader_does_not_take_a_broker_in_controlled_shutdown_back_into_the_isr(
        tmp_path: Path) -> None:
    """Kafka's Partition.isReplicaIsrEligible (KIP-841): a follower whose broker is in
    controlled shutdown is not added back to the ISR however caught up it is: the controller
    took it out (handleBrokerInControlledShutdown), and would refuse it (INELIGIBLE_REPLICA)."""
    sim = SimCluster(tmp_path, config={"min.insync.replicas": "1"}, auto_alter_partition=False)
    sim.create_topic("orders", partitions=3)
    leader = sim.leader_of(TP)
    follower = next(r for r in sim.registration(TP).replicas if r != leader and any(
        reg.leader == r for reg in sim.controller.topics["orders"].partitions.values()))
    c = sim.controller
    assert c.heartbeat(follower, sim.broker_epoch(follower), c.metadata_offset,
                       want_shut_down=True) == (ErrorCode.none, False)
    assert follower not in sim.registration(TP).isr
    assert sim.brokers[leader].image.brokers[follower].in_controlled_shutdown
    assert sim.produce(TP, ["after"], acks=1).acknowledged
    for _ in range(3):
        sim.fetch_round(follower)
        sim.fetch_round(leader)
    assert sim.replica(follower, TP).log_end_offset == sim.replica(leader, TP).log_end_offset
    assert [request.new_isr for broker, request, _ in sim.pending_alter_partitions
            if broker == leader and request.tp == TP and follower in request.new_isr] == []


def test_a_broker_in_controlled_shutdown_stops_fetching_what_it_is_out_of_the_isr_of(
        tmp_path: Path) -> None:
    """Kafka's ReplicaManager.beginControlledShutdown and applyLocalFollowersDelta: once its
    controlled shutdown has begun, a follower replica whose ISR the controller took the
    broker out of stops fetching; one still in the ISR goes on."""
    sim = SimCluster(tmp_path, config={"min.insync.replicas": "1"})
    sim.create_topic("orders", partitions=3)
    leader = sim.leader_of(TP)
    follower = next(r for r in sim.registration(TP).replicas if r != leader and any(
        reg.leader == r for reg in sim.controller.topics["orders"].partitions.values()))
    sim.brokers[follower].begin_controlled_shutdown()
    assert sim.produce(TP, ["before"], acks=1).acknowledged
    sim.fetch_round(follower)  # in the ISR yet: it fetches
    assert sim.replica(follower, TP).log_end_offset == 1
    c = sim.controller
    c.heartbeat(follower, sim.broker_epoch(follower), c.metadata_offset, want_shut_down=True)
    assert follower not in sim.registration(TP).isr
    assert sim.produce(TP, ["after"], acks=1).acknowledged
    sim.fetch_round(follower)
    assert sim.replica(follower, TP).log_end_offset == 1
    assert TP not in sim.brokers[follower].follower_states
