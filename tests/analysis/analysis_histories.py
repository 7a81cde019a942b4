"""Hand-planted histories the analysis tests check, with their expected findings."""

from __future__ import annotations

from history_builder import HistoryBuilder

# The planted history, every anomaly kind once (lost twice), small enough to check by hand.
# Each entry: what was planted, so the expected counts below can be verified line by line.
PLANTED_COUNTS = {
    # p0-1 p0-2 p0-3 p0-4 p0-5 p1-1 p1-2 p1-3 p1-4 p2-1 p2-2 p2-3 p3-1 p3-2 p3-3
    "attempted": 15,
    # p0-1 p0-2 p0-3 p0-4 p0-5 p1-2 p1-3 p2-1 p2-3 p3-3
    "acked": 10,
    "failed": 2,  # p2-2 p3-2
    "indeterminate": 3,  # p1-1 p1-4 p3-1
    "lost": 2,  # p0-3 p2-3
    "misplaced": 1,  # p0-4
    "phantom_reads": 1,  # p1-1
    "inconsistent_offsets": 1,  # t-1@2 (p1-2 and p1-3)
    "duplicates": 1,  # p2-1
    "aborted_reads": 1,  # p2-2
    "unexpected": 1,  # zz-1
    "indeterminate_committed": 1,  # p3-1
    "indeterminate_lost": 2,  # p1-1 p1-4
}
PLANTED_ANOMALIES = {
    ("lost", "p0-3", "t", 0, 2),
    ("lost", "p2-3", "t", 0, 7),
    ("misplaced", "p0-4", "t", 1, 0),
    ("phantom_read", "p1-1", "t", 1, 1),
    ("inconsistent_offset", "p1-2", "t", 1, 2),
    ("inconsistent_offset", "p1-3", "t", 1, 2),
    ("duplicate", "p2-1", "t", 0, 3),
    ("aborted_read", "p2-2", "t", 0, 5),
    ("unexpected", "zz-1", "u", 0, 0),
}
KILL = "#1 kill broker-1 (leader of t-0)"
PARTITION = "#2 partition broker-2 (follower of t-0)"


def planted_history() -> HistoryBuilder:
    h = HistoryBuilder(expect="loss")
    # Healthy records, acknowledgement latencies 1..10 ms over the ten ok attempts.
    h.record("p0-1", 0, 0, t=1.0, latency=0.001)
    h.record("p0-2", 0, 1, t=2.0, latency=0.002)
    h.record("p3-3", 0, 1, t=2.5, latency=0.003, topic="u")  # same partition/offset, topic u
    # misplaced: acknowledged at t-1@0, drained at t-1@5.
    h.send("p0-4", t=3.0, partition=1, offset=0, latency=0.004)
    h.read("p0-4", 1, 0, phase="run", t=3.5)
    h.read("p0-4", 1, 5)
    # phantom read of an indeterminate send: a run consumer saw it, the drain did not.
    h.send("p1-1", "info", t=4.0, partition=1, error="REQUEST_TIMED_OUT")
    h.read("p1-1", 1, 1, phase="run", t=4.5)
    # inconsistent offset t-1@2: p1-2 lives there, a run consumer also read p1-3 there.
    h.record("p1-2", 1, 2, t=5.0, latency=0.005)
    h.record("p1-3", 1, 3, t=6.0, latency=0.006)
    h.read("p1-3", 1, 2, phase="run", t=6.5)
    # duplicate: drained at its offset and at the next one.
    h.record("p2-1", 0, 3, t=7.0, latency=0.007)
    h.read("p2-1", 0, 4)
    # aborted read: the send failed definitively, the drain found it anyway.
    h.send("p2-2", "fail", t=8.0, error="NOT_ENOUGH_REPLICAS")
    h.read("p2-2", 0, 5)
    # indeterminate, committed after all (not an anomaly); then a plain failure.
    h.send("p3-1", "info", t=9.0, error="REQUEST_TIMED_OUT")
    h.read("p3-1", 0, 6)
    h.send("p3-2", "fail", t=9.5, error="NOT_ENOUGH_REPLICAS")
    # lost during the kill of the leader of t-0 (10 s .. 20 s).
    h.send("p0-3", t=12.0, partition=0, offset=2, latency=0.008)
    # a retried send: timed out, then acknowledged (healthy).
    h.send("p0-5", "info", t=13.0, partition=1, error="REQUEST_TIMED_OUT")
    h.send("p0-5", t=14.0, partition=1, offset=4, latency=0.009)
    h.read("p0-5", 1, 4)
    # failed then timed out: indeterminate, never drained (not loss).
    h.send("p1-4", "fail", t=15.0, error="NOT_ENOUGH_REPLICAS")
    h.send("p1-4", "info", t=16.0, error="REQUEST_TIMED_OUT")
    # lost while both faults were active.
    h.send("p2-3", t=17.0, partition=0, offset=7, latency=0.010)
    # a value nobody sent.
    h.read("zz-1", 0, 0, topic="u")
    h.fault("kill", "broker-1", "inject", t=10.0, role="leader of t-0")
    h.fault("kill", "broker-1", "recover", t=20.0, role="leader of t-0")
    h.fault("partition", "broker-2", "inject", t=15.0, role="follower of t-0")  # never recovered
    for second in range(31):
        if 10 <= second < 12:
            h.sample(t=second, partition=0, leader=-1, isr=[2, 3])
        elif 12 <= second <= 20:
            h.sample(t=second, partition=0, leader=2, isr=[2, 3])
        else:
            h.sample(t=second, partition=0, leader=1, isr=[1, 2, 3])
        h.sample(t=second, partition=1, leader=2, isr=[1, 2, 3])
    return h


def clean_history(idempotent: bool = False) -> HistoryBuilder:
    h = HistoryBuilder(idempotent=idempotent, expect="clean")
    for i in range(6):
        h.record(f"p0-{i}", i % 2, i // 2, t=1.0 + i)
    h.fault("kill", "broker-0", "inject", t=2.0, role="follower of t-1")
    h.fault("kill", "broker-0", "recover", t=4.0, role="follower of t-1")
    for second in range(10):
        for p in (0, 1):
            h.sample(t=second, partition=p, leader=1, isr=[1, 2])
    return h
