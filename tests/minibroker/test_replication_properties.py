"""Property test: random fault sequences on the step-by-step cluster keep Kafka's invariants
(the formal models' LeaderInIsr, StrongIsr, HW monotonicity, and no loss of acknowledged
records while elections are clean), under Kafka 3.7's rules and under 4.1+'s with eligible
leader replicas (KIP-966), where the ISR may empty and elections also take an ELR member or
the last known leader."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rule_sets import KAFKA_3_7, KAFKA_4_2
from stepper import SimCluster

from minibroker.cluster.types import NO_LEADER, TopicPartition

TP = TopicPartition("t", 0)
BROKERS = (1, 2, 3)

step = st.one_of(
    st.tuples(st.just("produce"), st.sampled_from([1, -1])),
    st.tuples(st.just("fetch"), st.sampled_from(BROKERS)),
    st.tuples(st.just("truncate"), st.sampled_from(BROKERS)),
    st.tuples(st.just("fence"), st.sampled_from(BROKERS)),
    st.tuples(st.just("advance"), st.sampled_from([100, 500, 1600, 3500])),
    st.tuples(st.just("crash"), st.sampled_from(BROKERS)),
    st.tuples(st.just("power_loss"), st.sampled_from(BROKERS)),
    st.tuples(st.just("restart"), st.sampled_from(BROKERS)),
    st.tuples(st.just("stop"), st.sampled_from(BROKERS)),  # a clean shutdown
)
ELECTIONS_WITHOUT_LOSS = {"clean", "elr", "last_known_leader", "preferred", "offline"}
"""With every write fsynced, the last known leader has every committed record too: it led
when the ISR emptied, and a crash takes nothing fsynced (``test_elr.py`` keeps the case where
it loses records: a power loss without fsync)."""


def check_invariants(sim: SimCluster, hw_seen: dict[tuple[int, int], int]) -> None:
    reg = sim.registration(TP)
    if reg.leader != NO_LEADER:
        assert reg.leader in reg.isr, f"leader {reg.leader} not in ISR {reg.isr}"
    # KIP-966: the ELR holds replicas out of the ISR, and only while the ISR is below min ISR.
    assert not set(reg.elr) & set(reg.isr), f"ELR {reg.elr} overlaps ISR {reg.isr}"
    if len(reg.isr) >= 2 or not sim.controller.elr_enabled:
        assert not reg.elr, f"ELR {reg.elr} with ISR {reg.isr}"
    for broker_id, rm in sim.brokers.items():
        partition = rm.partitions.get(TP)
        if partition is None or not partition.is_leader:
            continue
        key = (broker_id, partition.leader_epoch)
        assert partition.high_watermark >= hw_seen.get(key, 0), "leader HW decreased"
        hw_seen[key] = partition.high_watermark
        assert partition.high_watermark <= partition.log_end_offset
        committed = [r for r in sim.log_values(broker_id, TP) if r[0] < partition.high_watermark]
        for member in partition.isr:
            if member != broker_id and sim.has_replica(member, TP):
                prefix = [r for r in sim.log_values(member, TP) if r[0] < len(committed)]
                assert prefix == committed, f"ISR member {member} lacks committed records"
    running = [b for b in sim.brokers if TP in sim.brokers[b].partitions]
    for x in running:
        for y in running:
            bound = min(sim.replica(x, TP).high_watermark, sim.replica(y, TP).high_watermark)
            assert [r for r in sim.log_values(x, TP) if r[0] < bound] == \
                   [r for r in sim.log_values(y, TP) if r[0] < bound]


def run_steps(root: str, rules: dict[str, str], steps) -> SimCluster:
    """Apply ``steps`` to a fresh cluster (min ISR 2, every write fsynced), checking the
    invariants after each; then heal, and check that every acks=all record is committed."""
    sim = SimCluster(Path(root), brokers=3, config={
        "min.insync.replicas": "2", "log.flush.interval.messages": "1",
        "replica.lag.time.max.ms": "1000", **rules})
    sim.create_topic("t", replication_factor=3)
    acked_all: dict[bytes, int] = {}
    pending = []
    hw_seen: dict[tuple[int, int], int] = {}
    for n, (op, arg) in enumerate(steps):
        if op == "produce":
            pending.append((sim.produce(TP, [f"v{n}"], acks=arg), arg))
        elif op == "fetch" and sim.is_running(arg):
            sim.fetch_round(arg)
        elif op == "truncate" and sim.is_running(arg):
            sim.truncate_followers(arg)  # became follower; the first fetch is late
        elif op == "fence" and not sim.is_running(arg):
            sim.controller.fence_broker(arg, "its session expired")
        elif op == "advance":
            sim.advance(arg)
        elif op in ("crash", "power_loss") and sim.is_running(arg):
            sim.crash(arg, power_loss=op == "power_loss")
        elif op == "stop" and sim.is_running(arg):
            sim.stop(arg)
        elif op == "restart" and not sim.is_running(arg):
            sim.start(arg)
        for send, acks in pending:
            if acks == -1 and send.acknowledged:
                acked_all[send.values[0]] = send.result.base_offset
        check_invariants(sim, hw_seen)
        # KIP-966's promise: an ELR member holds every record acknowledged with acks=all
        # (they needed min ISR members, and it left an ISR below min ISR).
        for member in sim.registration(TP).elr:
            if sim.has_replica(member, TP):
                held = dict(sim.log_values(member, TP))
                for value, offset in acked_all.items():
                    assert held.get(offset) == value, f"ELR member {member} lacks {value!r}"

    # Heal: every broker back, replicate until the ISR is full again. A restarted broker
    # registers once its previous incarnation's session has expired (3 s).
    for broker_id in BROKERS:
        if not sim.is_running(broker_id):
            sim.start(broker_id)
    for _ in range(50):
        sim.replicate()
        sim.advance(100)
    check_invariants(sim, hw_seen)
    assert len(sim.registration(TP).isr) == 3
    committed = {value: offset for offset, value in sim.read_committed(TP)}
    for value, offset in acked_all.items():
        assert committed.get(value) == offset, f"acknowledged {value!r} lost"
    return sim


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, min_size=5, max_size=40))
def test_random_faults_keep_invariants_and_lose_no_acknowledged_record(steps) -> None:
    with tempfile.TemporaryDirectory() as root:
        sim = run_steps(root, KAFKA_3_7, steps)
    assert sim.controller.unclean_elections == 0


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, min_size=5, max_size=40))
def test_with_elr_every_election_is_from_the_isr_or_elr_and_loses_nothing(steps) -> None:
    with tempfile.TemporaryDirectory() as root:
        sim = run_steps(root, KAFKA_4_2, steps)
    kinds = {e["kind"] for e in sim.events() if e["type"] == "leader_election"}
    assert kinds <= ELECTIONS_WITHOUT_LOSS, f"elections {sorted(kinds)}"
