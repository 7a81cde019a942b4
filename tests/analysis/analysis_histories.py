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
    "phantom_reads": 2,  # p1-1 p2-3
    "inconsistent_offsets": 1,  # t-1@2 (p1-2 and p1-3)
    "duplicates": 1,  # p2-1
    "aborted_reads": 1,  # p2-2
    "unexpected": 1,  # zz-1
    "indeterminate_committed": 1,  # p3-1
    "indeterminate_lost": 2,  # p1-1 p1-4
    # No consumer group (no groups.jsonl): none of its anomalies.
    "skipped": 0, "committed_offsets_lost": 0, "redelivered_past_commit": 0,
    "non_monotonic_polls": 0,
    # No transactions (no txns.jsonl): none of theirs.
    "reads_past_lso": 0, "torn_transactions": 0, "hanging_transactions": 0,
    "duplicate_outputs": 0, "missing_outputs": 0,
}
PLANTED_ANOMALIES = {
    ("lost", "p0-3", "t", 0, 2),
    ("lost", "p2-3", "t", 0, 7),
    ("misplaced", "p0-4", "t", 1, 0),
    ("phantom_read", "p1-1", "t", 1, 1),
    ("phantom_read", "p2-3", "t", 0, 7),
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
    # lost while both faults were active, though a run consumer read it: read is not kept.
    h.send("p2-3", t=17.0, partition=0, offset=7, latency=0.010)
    h.read("p2-3", 0, 7, phase="run", t=17.5)
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


# A consumer group (members c0, c1 of group g) over t-0 and t-1, each group anomaly planted,
# with the at-least-once re-deliveries and the commits that must not count beside them.
GROUP_COUNTS = {
    "skipped": 5,  # p0-10 .. p0-14: drained at t-0@10..14, never returned, below commit 17
    "committed_offsets_lost": 1,  # c1 was given 2 for t-1 after 4 was acknowledged
    "redelivered_past_commit": 2,  # c1 returned t-1@2 and @3 again, below that 4
    "non_monotonic_polls": 1,  # c1 returned t-0@7 after t-0@9 in generation 2
}
GROUP_ANOMALIES = {
    *{("skipped", f"p0-{i}", "t", 0, i) for i in range(10, 15)},
    ("committed_offset_lost", None, "t", 1, 2),
    ("redelivered_past_commit", "p1-2", "t", 1, 2),
    ("redelivered_past_commit", "p1-3", "t", 1, 3),
    ("non_monotonic_poll", "p0-7", "t", 0, 7),
}


def group_history() -> HistoryBuilder:
    h = HistoryBuilder(expect="loss")
    # Generation 1: c0 holds both partitions, nothing committed yet.
    for p in (0, 1):
        h.assign("c0", p, t=1.0, generation=1)
    for i in range(10):
        h.send(f"p0-{i}", t=1.5, partition=0, offset=i)
        h.poll("c0", f"p0-{i}", 0, i, generation=1, t=2.0 + i * 0.01)
        h.read(f"p0-{i}", 0, i)
    for i in range(4):
        h.send(f"p1-{i}", t=1.5, partition=1, offset=i)
        h.poll("c0", f"p1-{i}", 1, i, generation=1, t=2.0 + i * 0.01)
        h.read(f"p1-{i}", 1, i)
    h.commit("c0", 0, 5, t=3.0, generation=1)
    h.commit("c0", 1, 4, t=3.0, generation=1)
    h.commit("c0", 0, 10, t=4.0, generation=1, status="fail")  # refused: not committed
    for p in (0, 1):
        h.group("c0", "revoke", p, t=5.0, generation=1)
    # Generation 2: c1 gets both. t-0 resumes at 5: c1 returns 5-9 again, inside the
    # at-least-once window (not past a commit), then 7 once more (going back). t-1's
    # acknowledged 4 is lost: the coordinator gives 2, and c1 returns 2 and 3 again.
    h.assign("c1", 0, t=5.5, generation=2, committed=5)
    h.assign("c1", 1, t=5.5, generation=2, committed=2)
    for i in (5, 6, 7, 8, 9, 7):
        h.poll("c1", f"p0-{i}", 0, i, generation=2, t=6.0 + i * 0.01)
    for i in (2, 3):
        h.poll("c1", f"p1-{i}", 1, i, generation=2, t=6.0 + i * 0.01)
    h.commit("c1", 0, 10, t=7.0, generation=2)
    h.commit("c1", 1, 4, t=7.0, generation=2)
    # c1 returns 8 once more after committing 10: past its own commit, but that commit came
    # after its assignment (no rebalance window to judge), and 8 is above the 7 before it.
    h.poll("c1", "p0-8", 0, 8, generation=2, t=7.5)
    h.commit("c1", 0, 20, t=8.0, generation=2, status="info")  # indeterminate: not committed
    # Generation 3: c0 again. The coordinator gives 10 for t-0 (the info 20 never counted)
    # and 6 for t-1, above every acknowledged commit (fine). Records 10-14 of t-0 are
    # written but never returned: c0 reads 15 and 16 and commits 17 past them.
    h.assign("c0", 0, t=9.0, generation=3, committed=10)
    h.assign("c0", 1, t=9.0, generation=3, committed=6)
    for i in range(10, 18):
        h.send(f"p0-{i}", t=10.0, partition=0, offset=i)
        h.read(f"p0-{i}", 0, i)
    for i in (15, 16):
        h.poll("c0", f"p0-{i}", 0, i, generation=3, t=11.0 + i * 0.01)
    h.commit("c0", 0, 17, t=13.0, generation=3)  # p0-17 stays above it: not skipped
    # Generation 4: c1 holds t-0 again, from 17; its re-reads in generation 2 are judged by
    # its assignment then, not by this later one.
    h.assign("c1", 0, t=14.0, generation=4, committed=17)
    return h


def _transaction(h: HistoryBuilder, txn: str, records: list[tuple[str, int, int]], status: str,
                 *, t: float, end: float | None = None) -> None:
    """Transaction `txn` begun at t, its records (value, partition, offset) sent at once, its
    end called at `end` (t + 0.5 by default) and known 0.1 s later: each send's line has
    the transaction's outcome (ok: committed, fail: aborted)."""
    end = t + 0.5 if end is None else end
    for value, partition, offset in records:
        h.send(value, status, t=t, partition=partition, offset=offset, txn=txn,
               latency=end + 0.1 - t, error=None if status == "ok" else "aborted")
    h.transaction(txn, [v for v, _, _ in records], status, t_begin=t, t_end_invoke=end,
                  t_complete=end + 0.1, intent="commit" if status == "ok" else "abort")


def txn_history() -> HistoryBuilder:
    """A transactional producer's history over t-0 and t-1, with every transaction check's
    anomaly planted once or twice and derived by hand (transaction.timeout.ms 10 s):

    - read_past_lso 1: c0 returns c0 of p0-t2 at 3.8 s, before its commit was called at 4.0;
    - aborted_reads 1: the drain returns d0 of the aborted p0-t3;
    - lost 1: e1 of the committed p0-t4 is missing from the drain (a lost committed write);
    - torn_transactions 2: p0-t4, whose e0 the drain returns while it reads t-1 from 0 to 11
      without e1 at 7; and p0-t5, whose f0 c0 returns while it reads t-1 at 3 and 11 but not
      f1 at 9 (which the drain has: c0 alone saw it torn);
    - hanging_transactions 1: t-0's LSO stays at 3 below the HW for 30 s (past 10 + 15 s);
      t-1's for 12 s, then 11 s more after an 18 s gap in the samples (an outage, which
      counts 1 s): 24 s seen stuck, not past 25.
    """
    h = HistoryBuilder(expect="loss", transaction_timeout_s=10.0, duration=100.0)
    committed = "read_committed"
    _transaction(h, "p0-t0", [("a0", 0, 0), ("a1", 1, 0)], "ok", t=2.0)
    _transaction(h, "p0-t1", [("b0", 0, 1), ("b1", 1, 1)], "fail", t=3.0)
    _transaction(h, "p0-t2", [("c0", 0, 3), ("c1", 1, 3)], "ok", t=3.5, end=4.0)
    _transaction(h, "p0-t3", [("d0", 0, 5)], "fail", t=5.0)
    _transaction(h, "p0-t4", [("e0", 0, 7), ("e1", 1, 7)], "ok", t=6.0)
    _transaction(h, "p0-t5", [("f0", 0, 9), ("f1", 1, 9)], "ok", t=7.0)
    _transaction(h, "p0-t6", [("g1", 1, 11)], "ok", t=8.0)
    for value, partition, offset, t in [("a0", 0, 0, 3.0), ("c0", 0, 3, 3.8),
                                        ("c1", 1, 3, 4.5), ("f0", 0, 9, 8.0),
                                        ("g1", 1, 11, 9.0)]:
        h.read(value, partition, offset, phase="run", t=t, isolation=committed)
    for value, partition, offset in [("a0", 0, 0), ("a1", 1, 0), ("c0", 0, 3), ("c1", 1, 3),
                                     ("d0", 0, 5), ("e0", 0, 7), ("f0", 0, 9), ("f1", 1, 9),
                                     ("g1", 1, 11)]:
        h.read(value, partition, offset, isolation=committed)
    for i in range(61):  # t-0: 10 .. 40 s
        h.sample(t=10.0 + i * 0.5, partition=0, leader=0, isr=[0], high_watermark=10,
                 last_stable_offset=3)
    for start, n in ((10.0, 25), (40.0, 23)):  # t-1: 10 .. 22 s, then 40 .. 51 s
        for i in range(n):
            h.sample(t=start + i * 0.5, partition=1, leader=0, isr=[0], high_watermark=12,
                     last_stable_offset=3)
    return h


def _pipeline_txn(h: HistoryBuilder, txn: str, inputs: list[tuple[str, int, int]],
                  outputs: list[int], status: str, *, t: float, commit: int | None,
                  drained: bool = True) -> None:
    """Pipeline member `txn`'s prefix transforms inputs (value, partition, offset) of `in`
    into `out` at `outputs` (offsets, same partition) in transaction `txn`, begun at t, its
    commit called at t + 0.5 with the input offset `commit` (None: never called) and its
    outcome known 0.1 s later; the drain reads the outputs when `drained`."""
    member = txn.rsplit("-t", 1)[0]
    values = []
    for (value, partition, offset), out_offset in zip(inputs, outputs, strict=True):
        h.poll(member, value, partition, offset, generation=int(member[-1]) + 1, t=t,
               topic="in")
        out = f"{value}/{txn}"
        h.send(out, status, t=t + 0.1, partition=partition, offset=out_offset, topic="out",
               txn=txn, latency=0.5, error=None if status == "ok" else "MEMBER_DIED")
        if drained:
            h.read(out, partition, out_offset, topic="out")
        values.append(out)
    partition = inputs[0][1] if inputs else 1
    h.transaction(txn, values, status, t_begin=t,
                  t_end_invoke=None if commit is None else t + 0.5, t_complete=t + 0.6,
                  error=None if status == "ok" else "MEMBER_DIED",
                  offsets=None if commit is None else {str(partition): commit})
    if commit is not None:
        h.commit(member, partition, commit, t=t + 0.6, generation=int(member[-1]) + 1,
                 status=status, topic="in")


def pipeline_history() -> HistoryBuilder:
    """A consume-transform-produce pipeline from `in` (two partitions) to `out`, its member
    c0 killed twice and c1 replaced by a zombie-like process, with each pipeline check's
    anomaly planted and derived by hand:

    - duplicate_outputs 1: p1-1 is in out twice, from c1.0-t0 (out-1@1) and c1.1-t0
      (out-1@3), both committed. p1-0's output read twice at one position (out-1@0) is not
      a duplicate;
    - missing_outputs 1: c1.1-t1 commits in-1 up to 4 with no output, so p1-3 (in-1@3) has
      none; p0-4 (in-0@4), without output either, lies at in-0's acknowledged commit, 4, not
      below it (c0.1-t1's 5 is indeterminate), and p0-5 past it;
    - skipped 1: p1-3, never returned to a member, below in-1's committed 4;
    - redelivered_past_commit 1: c1.1 returns p1-1 again, below the 2 committed before its
      assignment;
    - unexpected 2: the strays `/stray-a` and `/stray-b` at out-1@9 and @10, never sent (and,
      with nothing before their `/`, the output of no input: not duplicates of one
      another).

    c0.0-t1 died before its commit was called (`fail`) and c0.1-t1 after (`info`): the
    outputs of neither were drained.
    """
    h = HistoryBuilder(expect="loss", transaction_timeout_s=10.0, duration=30.0)
    h.pipeline = ("in", "out")
    for partition, n in ((0, 6), (1, 4)):
        for i in range(n):
            h.send(f"p{partition}-{i}", t=1.0, partition=partition, offset=i, topic="in")
            h.read(f"p{partition}-{i}", partition, i, topic="in")
    h.assign("c0.0", 0, t=1.5, generation=1, topic="in")
    h.assign("c1.0", 1, t=1.5, generation=1, topic="in")
    _pipeline_txn(h, "c0.0-t0", [("p0-0", 0, 0), ("p0-1", 0, 1)], [0, 1], "ok", t=2.0,
                  commit=2)
    _pipeline_txn(h, "c1.0-t0", [("p1-0", 1, 0), ("p1-1", 1, 1)], [0, 1], "ok", t=2.0,
                  commit=2)
    h.read("p1-0/c1.0-t0", 1, 0, topic="out")  # the drain reads out-1@0 again
    _pipeline_txn(h, "c0.0-t1", [("p0-2", 0, 2), ("p0-3", 0, 3)], [2, 3], "fail", t=3.0,
                  commit=None, drained=False)
    h.assign("c0.1", 0, t=4.0, generation=2, committed=2, topic="in")
    _pipeline_txn(h, "c0.1-t0", [("p0-2", 0, 2), ("p0-3", 0, 3)], [5, 6], "ok", t=5.0,
                  commit=4)
    _pipeline_txn(h, "c0.1-t1", [("p0-4", 0, 4)], [8], "info", t=6.0, commit=5,
                  drained=False)
    h.assign("c1.1", 1, t=4.0, generation=2, committed=2, topic="in")
    _pipeline_txn(h, "c1.1-t0", [("p1-1", 1, 1), ("p1-2", 1, 2)], [3, 4], "ok", t=5.0,
                  commit=3)
    _pipeline_txn(h, "c1.1-t1", [], [], "ok", t=6.0, commit=4)
    for value, offset in (("/stray-a", 9), ("/stray-b", 10)):
        h.read(value, 1, offset, topic="out")
    return h
