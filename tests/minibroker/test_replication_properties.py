"""Property test: random fault sequences on the step-by-step cluster keep Kafka's invariants
(the formal models' LeaderInIsr, StrongIsr, HW monotonicity, and no loss of acknowledged
records while elections are clean)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minibroker.cluster.types import NO_LEADER, TopicPartition
from minibroker.sim import SimCluster

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
)


def check_invariants(sim: SimCluster, hw_seen: dict[tuple[int, int], int]) -> None:
    reg = sim.registration(TP)
    if reg.leader != NO_LEADER:
        assert reg.leader in reg.isr, f"leader {reg.leader} not in ISR {reg.isr}"
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
            if member != broker_id and sim.is_running(member):
                prefix = [r for r in sim.log_values(member, TP) if r[0] < len(committed)]
                assert prefix == committed, f"ISR member {member} lacks committed records"
    running = [b for b in sim.brokers if TP in sim.brokers[b].partitions]
    for x in running:
        for y in running:
            bound = min(sim.replica(x, TP).high_watermark, sim.replica(y, TP).high_watermark)
            assert [r for r in sim.log_values(x, TP) if r[0] < bound] == \
                   [r for r in sim.log_values(y, TP) if r[0] < bound]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, min_size=5, max_size=40))
def test_random_faults_keep_invariants_and_lose_no_acknowledged_record(steps) -> None:
    with tempfile.TemporaryDirectory() as root:
        sim = SimCluster(Path(root), brokers=3, config={
            "min.insync.replicas": "2", "log.flush.interval.messages": "1"})
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
            elif op == "restart" and not sim.is_running(arg):
                sim.start(arg)
            for send, acks in pending:
                if acks == -1 and send.acknowledged:
                    acked_all[send.values[0]] = send.result.base_offset
            check_invariants(sim, hw_seen)

        # Heal: every broker back, replicate until the ISR is full again.
        for broker_id in BROKERS:
            if not sim.is_running(broker_id):
                sim.start(broker_id)
        for _ in range(20):
            sim.replicate()
            sim.advance(100)
        check_invariants(sim, hw_seen)
        assert len(sim.registration(TP).isr) == 3
        committed = {value: offset for offset, value in sim.read_committed(TP)}
        for value, offset in acked_all.items():
            assert committed.get(value) == offset, f"acknowledged {value!r} lost"
        assert sim.controller.unclean_elections == 0
