"""`undertow_history.checker`, the Spark analysis's verdict in plain Python: each anomaly kind
and loss mechanism on a hand-built history, and the same answers as the Spark job on
simulated runs (`undertow.sim`) and on a hand-planted history with every kind, malformed and
oddly shaped lines included.

Long (about 560 lines): the checker mirrors the Spark job kind by kind, and so do its
tests, one hand-built history per kind or mechanism beside the comparisons with the job."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from analysis_histories import group_history, pipeline_history, txn_history
from history_builder import START, HistoryBuilder
from library_sims import library_history, shared_root

from undertow.runner.verdict import disagreement, report_summary
from undertow_analysis import anomalies, checks, io, precheck
from undertow_analysis.explain import MAX_INCIDENTS
from undertow_analysis.job import analyze
from undertow_history import checker
from undertow_history.checker import Summary, check_history

pytestmark = pytest.mark.long  # run first (tests/conftest.py)

C = "controller"


def summary_of(h: HistoryBuilder, tmp_path: Path, extra: dict[str, list[str]] | None = None
               ) -> Summary:
    return check_history(h.write(tmp_path / "history", extra))


def nonzero(summary: Summary) -> dict[str, int]:
    return {k: n for k, n in summary.counts.items() if n}


# ---- the tables the checker mirrors -------------------------------------------------------


def test_the_kinds_and_files_are_the_analysis_s():
    assert [(k.name, k.count, k.loss, k.only_if_idempotent) for k in checker.KINDS] == [
        (k.name, k.count, k.loss, k.only_if_idempotent) for k in anomalies.KINDS]
    assert checker.COUNTS == anomalies.COUNTS
    assert (checker.MAX_PARTITION, checker.MAX_OFFSET) == (checks.MAX_PARTITION,
                                                           checks.MAX_OFFSET)
    assert checker.OPTIONAL == precheck.OPTIONAL_FILES
    for name, mine in checker._FILES.items():
        spec = io.FILES[name]
        assert (mine.file, mine.required, mine.required_if_ok) == (
            spec.file, spec.required, spec.required_if_ok)
        assert mine.ranges == tuple(n for n, _, _ in spec.ranges)
        assert all(hi == checker._RANGES.get(n, checker.MAX_OFFSET) for n, _, hi in spec.ranges)
    uses = [v for v in vars(checker).values() if isinstance(v, checker._Use)]
    for use in uses:  # a use parses only what the job reads of the file
        name = use.spec.file.name
        assert set(use.fields) <= set(io.FILES[name].read), name


# ---- each anomaly kind, alone, on a hand-built history --------------------------------------


def healthy(**kw) -> HistoryBuilder:
    """Two records of t-0, acknowledged, read during the run and drained."""
    h = HistoryBuilder(**kw)
    h.record("p0-0", 0, 0, t=1.0)
    h.record("p0-1", 0, 1, t=1.1)
    return h


def lost(h: HistoryBuilder) -> None:
    h.send("p0-2", t=2.0, offset=2)


def misplaced(h: HistoryBuilder) -> None:
    h.send("p0-2", t=2.0, offset=2)
    h.read("p0-2", 0, 5)


def phantom_read(h: HistoryBuilder) -> None:  # indeterminate: not itself an anomaly
    h.send("p0-2", "info", t=2.0, error="REQUEST_TIMED_OUT")
    h.read("p0-2", 0, 2, phase="run", t=2.5)


def inconsistent_offset(h: HistoryBuilder) -> None:
    h.record("p0-2", 0, 2, t=2.0)
    h.read("p0-1", 0, 2, phase="run", t=2.6)  # t-0@2 read as p0-2 and as p0-1


def duplicate(h: HistoryBuilder) -> None:
    h.record("p0-2", 0, 2, t=2.0)
    h.read("p0-2", 0, 3)


def aborted_read(h: HistoryBuilder) -> None:
    h.send("p0-2", "fail", t=2.0, error="NOT_ENOUGH_REPLICAS")
    h.read("p0-2", 0, 2)


def unexpected(h: HistoryBuilder) -> None:
    h.read("zz-1", 0, 2)


def skipped(h: HistoryBuilder) -> None:
    h.assign("c0", 0, t=0.5, generation=1)
    h.send("p0-2", t=2.0, offset=2)
    h.read("p0-2", 0, 2)  # drained, never returned to the member
    h.commit("c0", 0, 3, t=3.0, generation=1)


def committed_offset_lost(h: HistoryBuilder) -> None:
    h.assign("c0", 0, t=0.5, generation=1)
    h.commit("c0", 0, 2, t=2.0, generation=1)
    h.assign("c1", 0, t=3.0, generation=2, committed=None)  # 2 was acknowledged


def member_reads(h: HistoryBuilder, *polls: tuple[str, int, str, int, float]) -> None:
    """Records p1-0..2 at t-1@0..2, acknowledged and drained; `polls` are the members' reads
    of them: (member, generation, value, offset, t)."""
    for i in range(3):
        h.send(f"p1-{i}", t=1.0, partition=1, offset=i)
        h.read(f"p1-{i}", 1, i)
    for member, generation, value, offset, t in polls:
        h.poll(member, value, 1, offset, generation=generation, t=t)


def redelivered_past_commit(h: HistoryBuilder) -> None:
    h.assign("c0", 1, t=0.5, generation=1)
    member_reads(h, ("c0", 1, "p1-0", 0, 1.5), ("c0", 1, "p1-1", 1, 1.6),
                 ("c0", 1, "p1-2", 2, 1.7), ("c1", 2, "p1-0", 0, 3.5))
    h.commit("c0", 1, 3, t=2.0, generation=1)
    h.assign("c1", 1, t=3.0, generation=2, committed=3)  # and c1 reads 0 again


def non_monotonic_poll(h: HistoryBuilder) -> None:
    h.assign("c0", 1, t=0.5, generation=1)
    member_reads(h, ("c0", 1, "p1-1", 1, 1.5), ("c0", 1, "p1-0", 0, 1.6),
                 ("c0", 1, "p1-2", 2, 1.7))


def committed_txn(h: HistoryBuilder, *records: tuple[str, int], t: float = 2.0,
                  end: float = 2.5) -> None:
    """Transaction p5-t0 (timeout 10 s), committed at `end` + 0.1: its records (value,
    offset of t-0)."""
    h.transaction_timeout_s = 10.0
    for value, offset in records:
        h.send(value, t=t, offset=offset, txn="p5-t0", latency=end + 0.1 - t)
    h.transaction("p5-t0", [v for v, _ in records], "ok", t_begin=t, t_end_invoke=end,
                  t_complete=end + 0.1)


def read_past_lso(h: HistoryBuilder) -> None:
    committed_txn(h, ("p5-0", 2), end=3.0)
    h.read("p5-0", 0, 2, phase="run", t=2.5, isolation="read_committed")  # before EndTxn
    h.read("p5-0", 0, 2)


def torn_transaction(h: HistoryBuilder) -> None:
    committed_txn(h, ("p5-0", 2), ("p5-1", 3), ("p5-2", 4))
    for value, offset in (("p5-0", 2), ("p5-2", 4)):  # c0 reads past p5-1 at 3
        h.read(value, 0, offset, phase="run", t=3.0, isolation="read_committed")
    for value, offset in (("p5-0", 2), ("p5-1", 3), ("p5-2", 4)):
        h.read(value, 0, offset)


def hanging_transaction(h: HistoryBuilder) -> None:
    committed_txn(h, ("p5-0", 2))
    h.read("p5-0", 0, 2)
    for i in range(53):  # the LSO held at 2 for 26 s: past 10 s and 15 s more
        h.sample(t=3.0 + i * 0.5, partition=0, leader=0, isr=[0], high_watermark=3,
                 last_stable_offset=2)


def transformed(h: HistoryBuilder, *inputs: tuple[str, int, int], txn: str,
                out_offset: int) -> None:
    """Pipeline member `txn`'s prefix returned inputs (value, partition, offset) of t in
    generation 1, and transaction `txn` committed their outputs to `out` from `out_offset`,
    with the offsets past them; the drain read the outputs."""
    h.pipeline, h.transaction_timeout_s = ("t", "out"), 10.0
    member = txn.rsplit("-t", 1)[0]
    outputs = []
    for i, (value, partition, offset) in enumerate(inputs):
        h.poll(member, value, partition, offset, generation=1, t=2.0)
        out = f"{value}/{txn}"
        h.send(out, t=2.1, partition=partition, offset=out_offset + i, topic="out", txn=txn,
               latency=0.5)
        h.read(out, partition, out_offset + i, topic="out")
        outputs.append(out)
    h.transaction(txn, outputs, "ok", t_begin=2.0, t_end_invoke=2.5, t_complete=2.6,
                  offsets={str(inputs[-1][1]): inputs[-1][2] + 1})
    h.commit(member, inputs[-1][1], inputs[-1][2] + 1, t=2.6, generation=1)


def duplicate_output(h: HistoryBuilder) -> None:
    transformed(h, ("p0-0", 0, 0), ("p0-1", 0, 1), txn="c0.0-t0", out_offset=0)
    transformed(h, ("p0-1", 0, 1), txn="c0.1-t0", out_offset=3)  # p0-1 again


def missing_output(h: HistoryBuilder) -> None:
    transformed(h, ("p0-0", 0, 0), ("p0-1", 0, 1), txn="c0.0-t0", out_offset=0)
    h.reads = [r for r in h.reads if r["value"] != "p0-1/c0.0-t0"]  # (and lost)


KIND_CASES = {
    "lost": (lost, {"lost": 1}, "loss"),
    "misplaced": (misplaced, {"misplaced": 1}, "loss"),
    "phantom_read": (phantom_read, {"phantom_reads": 1}, "loss"),
    "inconsistent_offset": (inconsistent_offset, {"inconsistent_offsets": 1}, "loss"),
    "duplicate": (duplicate, {"duplicates": 1}, "clean"),  # no idempotence: no anomaly
    "aborted_read": (aborted_read, {"aborted_reads": 1}, "anomalies"),
    "unexpected": (unexpected, {"unexpected": 1}, "anomalies"),
    "skipped": (skipped, {"skipped": 1}, "loss"),
    "committed_offset_lost": (committed_offset_lost, {"committed_offsets_lost": 1}, "loss"),
    "redelivered_past_commit": (redelivered_past_commit, {"redelivered_past_commit": 1},
                                "anomalies"),
    "non_monotonic_poll": (non_monotonic_poll, {"non_monotonic_polls": 1}, "anomalies"),
    "read_past_lso": (read_past_lso, {"reads_past_lso": 1}, "anomalies"),
    "torn_transaction": (torn_transaction, {"torn_transactions": 1}, "anomalies"),
    "hanging_transaction": (hanging_transaction, {"hanging_transactions": 1}, "anomalies"),
    "duplicate_output": (duplicate_output, {"duplicate_outputs": 1}, "anomalies"),
    "missing_output": (missing_output, {"missing_outputs": 1, "lost": 1}, "loss"),
}


def test_every_kind_has_a_case():
    assert set(KIND_CASES) == {k.name for k in checker.KINDS}


@pytest.mark.parametrize("kind", KIND_CASES)
def test_each_kind_alone(tmp_path, kind):
    plant, counts, verdict = KIND_CASES[kind]
    h = healthy()
    plant(h)
    s = summary_of(h, tmp_path)
    assert (nonzero(s), s.verdict) == (counts, verdict)


def test_a_clean_history(tmp_path):
    s = summary_of(healthy(), tmp_path)
    assert s == Summary(verdict="clean", counts=dict.fromkeys(anomalies.COUNTS, 0), attempted=2,
                        acked=2, failed=0, indeterminate=0, mechanisms={})


def test_a_duplicate_is_an_anomaly_only_with_an_idempotent_producer(tmp_path):
    h = healthy(idempotent=True)
    duplicate(h)
    s = summary_of(h, tmp_path)
    assert (nonzero(s), s.verdict) == ({"duplicates": 1}, "anomalies")


def test_send_totals_count_values_not_attempts(tmp_path):
    h = healthy()
    h.send("p1-0", "info", t=2.0, error="REQUEST_TIMED_OUT")  # retried, then acknowledged
    h.send("p1-0", t=3.0, offset=2)
    h.read("p1-0", 0, 2)
    h.send("p1-1", "fail", t=2.0, error="NOT_ENOUGH_REPLICAS")
    h.send("p1-1", "info", t=3.0, error="REQUEST_TIMED_OUT")  # indeterminate, not drained
    h.send("p1-2", "fail", t=2.0, error="NOT_ENOUGH_REPLICAS")
    s = summary_of(h, tmp_path)
    assert (s.attempted, s.acked, s.failed, s.indeterminate, s.verdict) == (5, 3, 1, 1, "clean")


def test_an_acks0_record_has_no_position_to_be_misplaced_from(tmp_path):
    h = healthy(acks="0")
    h.send("p0-2", t=2.0, offset=None)
    h.read("p0-2", 0, 2)
    h.send("p0-3", t=2.0, offset=None)  # never drained
    s = summary_of(h, tmp_path)
    assert (nonzero(s), s.acked) == ({"lost": 1}, 4)


def test_a_record_read_during_the_run_and_missing_from_the_drain_is_still_lost(tmp_path):
    """Acknowledged is acknowledged: a run consumer's read does not make up for its absence
    from the drain (`anomalies.lost`); it is a phantom read as well."""
    h = healthy()
    h.send("p0-2", t=2.0, offset=2)
    h.read("p0-2", 0, 2, phase="run", t=2.5)
    s = summary_of(h, tmp_path)
    assert (nonzero(s), s.verdict) == ({"lost": 1, "phantom_reads": 1}, "loss")


def test_the_drain_of_another_topic_does_not_place_a_record(tmp_path):
    h = healthy()
    h.send("p0-2", t=2.0, offset=2)
    h.read("p0-2", 0, 2, topic="u")  # same partition and offset, other topic
    s = summary_of(h, tmp_path)
    assert nonzero(s) == {"misplaced": 1}


def test_a_history_the_job_refuses(tmp_path):
    h = healthy()
    history = h.write(tmp_path / "history")
    meta = json.loads((history / "meta.json").read_text())
    (history / "meta.json").write_text(json.dumps({**meta, "incomplete": True}))
    with pytest.raises(ValueError, match="incomplete"):
        check_history(history)
    (history / "meta.json").write_text(json.dumps({**meta, "start": "soon"}))
    with pytest.raises(ValueError, match="start"):
        check_history(history)
    (history / "meta.json").write_text(json.dumps(meta))
    (history / "reads.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match=r"reads\.jsonl"):
        check_history(history)


# ---- malformed lines: skipped as Spark's reader and the job's checks skip them ------------


def send_line(value: str, offset: int, /, **fields: object) -> str:
    row = {"producer": "x", "value": value, "topic": "t", "partition": 0, "status": "ok",
           "offset": offset, "error": None, "t_invoke": START + 20, "t_complete": START + 20.01}
    return json.dumps({**row, **fields})


def read_line(value: str, offset: int, /, phase: str = "drain", **fields: object) -> str:
    row = {"consumer": "drain" if phase == "drain" else "c0", "phase": phase, "topic": "t",
           "partition": 0, "offset": offset, "value": value, "t": START + 30,
           "generation": None}
    return json.dumps({**row, **fields})


# Each acknowledged and never drained: lost if the line is read, nothing if it is skipped.
ODD_SENDS = {
    "x1": (send_line("x1", 50) + " trailing", True),  # Jackson stops after the value
    "x2": ("[" + send_line("x2", 51) + "," + send_line("x3", 52) + "]", True),  # two rows
    "x4": ("[" + send_line("x4", 55) + "," + send_line("x5", 56, partition="0") + "]", False),
    "x6": (send_line("x6", 54)[:-1] + ', "offset": "x"}', False),  # a duplicate unreadable
    "x8": (send_line("x8", 58, t_invoke="nan"), False),  # "NaN" is a double, "nan" is not
    "x9": (send_line("x9", 59)[:40], False),  # torn
    "x10": (send_line("x10", 60, status="maybe"), False),
    "x11": (send_line("x11", 61, partition=2**23), False),  # past a packed position
    "x12": (send_line("x12", 62, producer=5, error=3), True),  # fields the job never parses
    "x13": (send_line("x13", 63).replace(": ", " : "), True),
    "x14": (send_line("x14", 64, t_invoke=1763830020), True),  # an integer is a double
    "x15": (send_line("x15", 65, offset=2**40), False),
    "x17": ("\ufeff" + send_line("x17", 67), True),  # a byte order mark is skipped
    "x30": ("[" + send_line("x30", 80) + "," + send_line("x31", 81, status="maybe") + "]",
            True),  # x31 alone fails a check: x30 stays
    "x32": (send_line("x32", 82).replace('"error": null', '"error": +INF'), True),
    "x33": (send_line("x33", 83).replace('"offset": 83', '"offset": 83.0'), False),
    "x35": (send_line("x35", 85, value=None), False),
}
ODD_LINES = {
    "sends": [line for line, _ in ODD_SENDS.values()] + [
        "", "   ", "[]", "null", "5", '"str"', "{",
        send_line("x0", 53).replace('"value": "x0"', '"value": 7.50'),  # read as "7.50"
    ],
    "reads": [
        read_line("7.50", 53),  # drains the send of value 7.50
        read_line("x20", 70, phase="run", generation="g"),  # not parsed by the main pass
        read_line("x21", 71, phase="run", consumer=5),
        read_line("x23", 73, phase="run", t="INF"),  # not a double to Spark
        read_line("x1", 50, phase="drain").replace('"offset": 50', '"offset": 5.0'),
        read_line("x24", 74, phase="peek"),
    ],
}


def test_odd_lines_are_read_or_skipped_as_spark_does(tmp_path):
    s = summary_of(healthy(), tmp_path, ODD_LINES)
    read_sends = sum(2 if v == "x2" else 1 for v, (_, ok) in ODD_SENDS.items() if ok)
    assert (s.attempted, s.acked) == (2 + read_sends + 1, 2 + read_sends + 1)
    # x20 and x21: read during the run only, never sent (x23 is skipped).
    assert nonzero(s) == {"lost": read_sends, "phantom_reads": 2, "unexpected": 2}


def test_bytes_that_are_not_utf8_make_a_line_malformed(tmp_path):
    history = healthy().write(tmp_path / "history")
    with (history / "sends.jsonl").open("ab") as f:
        f.write(send_line("x33", 83).replace("x33", "x33\xff").encode("latin-1") + b"\n")
        f.write(send_line("x34", 84).replace("x34", "x34\u00e9").encode() + b"\r\n")
    s = check_history(history)
    assert (s.attempted, s.counts["lost"]) == (3, 1)


def test_nan_and_infinite_times_do_not_stop_the_checker(tmp_path):
    """(The Spark job fails on them: its send series casts floor(time) to a long.)"""
    s = summary_of(healthy(), tmp_path, {"sends": [
        send_line("x1", 50, t_complete="NaN"), send_line("x2", 51, t_invoke=float("inf"))]})
    assert (s.attempted, s.counts["lost"]) == (4, 2)


# ---- loss mechanisms (the scenarios test_attribution checks against the Spark job) ----------


def attribution_base(acks: str = "all", healthy_records: int = 10) -> HistoryBuilder:
    """Broker 1 leads t-0 from the start; records at 0.. acknowledged, read and drained."""
    h = HistoryBuilder(expect="loss", acks=acks)
    h.event("become_leader", t=0.1, node="broker-1", broker=1, leader_epoch=0,
            log_end_offset=0, high_watermark=0, isr=[1, 2, 3])
    for i in range(healthy_records):
        h.record(f"p0-{i}", 0, i, t=1 + i * 0.1)
    return h


def acked_on_broker_1(h: HistoryBuilder, offsets: range, t: float = 5.0) -> None:
    for i in offsets:
        h.send(f"p1-{i}", t=t, offset=i)


def elected(h: HistoryBuilder, *, t: float, epoch: int, leader: int, kind: str, isr: list[int],
            end: int) -> None:
    h.event("leader_election", t=t, node=C, leader_epoch=epoch, leader=leader,
            previous_leader=-1, kind=kind, reason="leader_fenced", isr=isr)
    h.event("become_leader", t=t + 0.1, node=f"broker-{leader}", broker=leader,
            leader_epoch=epoch, log_end_offset=end, high_watermark=end, isr=[leader])


def acks1_before_replication(h: HistoryBuilder) -> None:
    h.acks = "1"
    elected(h, t=6.0, epoch=1, leader=2, kind="clean", isr=[1, 2, 3], end=10)
    h.event("truncation", t=9.0, node="broker-1", broker=1, leader_epoch=1, from_offset=13,
            to_offset=10, reason="offset_for_leader_epoch")


def unclean_election(h: HistoryBuilder) -> None:
    elected(h, t=8.0, epoch=2, leader=3, kind="unclean", isr=[1], end=10)


def power_loss(h: HistoryBuilder) -> None:
    for b in (1, 2, 3):
        h.event("power_loss", t=6.0, node=f"broker-{b}", broker=b, leader_epoch=0,
                log_end_offset=13)
        h.event("log_recovery", t=8.0, node=f"broker-{b}", broker=b, log_end_offset=10)
        h.event("truncation", t=8.0, node=f"broker-{b}", broker=b, leader_epoch=0,
                from_offset=13, to_offset=10, reason="log_recovery")
    elected(h, t=9.0, epoch=1, leader=2, kind="clean", isr=[1, 2, 3], end=10)


def high_watermark_truncation(h: HistoryBuilder) -> None:
    elected(h, t=6.0, epoch=1, leader=2, kind="clean", isr=[1, 2, 3], end=13)
    h.event("truncation", t=6.2, node="broker-3", broker=3, leader_epoch=1, from_offset=13,
            to_offset=10, reason="high_watermark")
    elected(h, t=7.0, epoch=2, leader=3, kind="clean", isr=[2, 3], end=10)


def disk_lost(h: HistoryBuilder) -> None:
    h.event("broker_fenced", t=8.0, node=C, topic=None, partition=None, broker=2,
            broker_epoch=3, reason="restarted")
    elected(h, t=9.5, epoch=1, leader=2, kind="clean", isr=[2], end=10)


def last_known_leader(h: HistoryBuilder) -> None:
    elected(h, t=9.5, epoch=1, leader=2, kind="last_known_leader", isr=[], end=10)


def deposed_leader(h: HistoryBuilder, *, truncated_by: int = 1, new_end: int = 10,
                   cut_at: float = 6.0) -> None:
    """Broker 2 was elected (epoch 1) at 4.0 s, before broker 1, deposed but not yet told,
    acknowledged 10-12 (at 5.0 s, acks=1); at `cut_at` broker `truncated_by` cut 13 -> 10 on
    becoming broker 2's follower."""
    h.acks = "1"
    elected(h, t=4.0, epoch=1, leader=2, kind="clean", isr=[2, 3], end=new_end)
    h.event("truncation", t=cut_at, node=f"broker-{truncated_by}", broker=truncated_by,
            leader_epoch=1, from_offset=13, to_offset=10, reason="offset_for_leader_epoch")


def unexplained(h: HistoryBuilder) -> None:
    h.event("broker_fenced", t=8.0, node=C, topic=None, partition=None, broker=2,
            broker_epoch=3, reason="session_expired")


MECHANISM_CASES: dict[str, Callable[[HistoryBuilder], None]] = {
    "acks1_before_replication": acks1_before_replication,
    "unclean_election": unclean_election,
    "power_loss": power_loss,
    "high_watermark_truncation": high_watermark_truncation,
    "disk_lost": disk_lost,
    "last_known_leader": last_known_leader,
    "deposed_leader": deposed_leader,
    "unexplained": unexplained,
}


@pytest.mark.parametrize("case", MECHANISM_CASES)
def test_each_loss_mechanism(tmp_path, case):
    h = attribution_base()
    acked_on_broker_1(h, range(10, 13))
    MECHANISM_CASES[case](h)
    s = summary_of(h, tmp_path)
    expected = "unclean_election" if case == "last_known_leader" else case
    assert (s.counts["lost"], s.verdict, s.mechanisms) == (3, "loss", {expected: 3})


@pytest.mark.parametrize("miss", [
    {"truncated_by": 3},  # broker 3 never led: no deposed leader
    {"new_end": 11},  # broker 2's log had offset 10 when it became leader
    {"cut_at": 4.5},  # the truncation came before the acknowledgement
])
def test_a_deposed_leader_needs_its_own_truncation_after_a_new_leader_without_the_offset(
        tmp_path, miss):
    h = attribution_base()
    acked_on_broker_1(h, range(10, 13))
    deposed_leader(h, **miss)
    expected = {"unexplained": 3}
    if "new_end" in miss:  # 11 and 12 were past broker 2's log: broker 1 still cut them
        expected = {"unexplained": 1, "deposed_leader": 2}
    assert summary_of(h, tmp_path).mechanisms == expected


@pytest.mark.parametrize(("bad", "mechanism"), [
    ("become_leader", "unclean_election"),  # its isr is not in the leaders' join
    ("leader_election", "unexplained"),  # the election's is: no election, no kind
])
def test_an_event_s_wrong_type_counts_where_the_join_parses_it(tmp_path, bad, mechanism):
    """(As the Spark job reads them: checked by hand on a simulated unclean election.)"""
    h = attribution_base()
    acked_on_broker_1(h, range(10, 13))
    unclean_election(h)
    [e for e in h.events if e["type"] == bad][-1]["isr"] = ["x"]  # the dropping epoch's
    assert summary_of(h, tmp_path).mechanisms == {mechanism: 3}


def test_no_events_explain_nothing_and_no_loss_needs_no_mechanism(tmp_path):
    h = attribution_base()
    acked_on_broker_1(h, range(10, 13))
    h.events = None
    assert summary_of(h, tmp_path / "a").mechanisms == {}
    h = attribution_base()
    unclean_election(h)
    assert summary_of(h, tmp_path / "b").mechanisms == {}


# ---- the same answers as the Spark job ------------------------------------------------------

SIMULATED = {
    "acks1-leader-kill": "loss",  # acks=1 before replication, 18,002 sends
    "hw-truncation-double-crash": "loss",  # pre-KIP-101 truncation, phantom reads
    "pod-delete-ephemeral": "loss",  # a log lost with its disk, 3,199 records
}


def spark_summary(report: dict) -> dict:
    """What of the report the checker gives, as the runner compares them on every run
    (`undertow.runner.verdict.report_summary`): here the report lists all its incidents, so
    the mechanisms are compared too."""
    explained = report["explained"]
    assert explained["incident_count"] == len(explained["incidents"]) <= MAX_INCIDENTS
    return report_summary(report)


def as_dict(s: Summary) -> dict:
    return {"verdict": s.verdict, "counts": s.counts, "attempted": s.attempted,
            "acked": s.acked, "failed": s.failed, "indeterminate": s.indeterminate,
            "mechanisms": s.mechanisms, "faults_skipped": s.faults_skipped}


@pytest.mark.parametrize("name", SIMULATED)
def test_a_simulated_run_gets_the_spark_job_s_answer(spark, tmp_path_factory, tmp_path, name):
    # The deterministic simulator's history (seed 1), which test_sim_verdicts checks too.
    history = library_history(shared_root(tmp_path_factory), name)
    report = analyze(spark, str(history), str(tmp_path / "report"))
    assert report["malformed"]["skipped"] == 0
    mine = as_dict(check_history(history))
    assert mine == spark_summary(report)
    assert disagreement(check_history(history), report) is None
    assert mine["verdict"] == SIMULATED[name]
    assert mine["mechanisms"] or mine["counts"]["lost"] == 0  # a loss is explained


def test_a_deposed_leader_and_its_near_misses_get_the_spark_job_s_answer(spark, tmp_path):
    # A deposed leader and one near miss: the checker's own test above has the others, each
    # a rule both sides share (one Spark analysis costs seconds).
    for i, miss in enumerate([{}, {"new_end": 11}]):
        h = attribution_base()
        acked_on_broker_1(h, range(10, 13))
        deposed_leader(h, **miss)
        history = h.write(tmp_path / f"history-{i}")
        report = analyze(spark, str(history), str(tmp_path / f"report-{i}"))
        assert as_dict(check_history(history)) == spark_summary(report), miss


def v(line: str) -> str:
    return line.replace('"topic": "t"', '"topic": "v"')


# On topic v, each value kind the group history lacks (and no position of a group member).
VALUE_KIND_LINES = {
    "sends": [v(send_line("vm", 0)), v(send_line("vd", 1)),
              v(send_line("va", 0, status="fail", offset=None)), v(send_line("vi", 4)),
              v(send_line("vc", 0, status="info", offset=None)),
              v(send_line("vl", 0, status="info", offset=None)),
              v(send_line("v0", 0, offset=None)),  # acks=0: lost, at no position
              v(send_line("v1", 0, offset=None))],  # acks=0, drained: nothing to misplace
    "reads": [v(read_line("vm", 5)), v(read_line("vd", 1)), v(read_line("vd", 2)),
              v(read_line("va", 3)), v(read_line("vi", 4)), v(read_line("vd", 4, "run")),
              v(read_line("vc", 6)), v(read_line("v1", 7))],
}


def odd_group_history() -> tuple[HistoryBuilder, dict[str, list[str]]]:
    """The consumer group history of test_groups, with the odd lines above, the value kinds
    it lacks, and lines of groups.jsonl whose wrong type only some of the job's queries
    parse: an ok commit with a `t_invoke` that is no number (to the committed positions,
    p0-17 is now skipped; to committed_offset_lost it is no commit, or the coordinator's 17
    would be lost), and one with a `generation` that is no number (redelivered_past_commit
    does not parse it: c1 reads p1-5 again below its 30)."""
    h = group_history()
    h.group("c1", "committed", 0, t=21.0, generation=4, offset=17)
    h.send("p1-5", t=19.0, partition=1, offset=5)
    h.poll("c0", "p1-5", 1, 5, generation=3, t=19.5)
    h.read("p1-5", 1, 5)
    h.assign("c1", 1, t=22.0, generation=5, committed=30)
    h.poll("c1", "p1-5", 1, 5, generation=5, t=23.0)
    commit = {"member": "c0", "member_id": "m", "generation": 3, "type": "commit", "topic": "t",
              "offset": 30, "status": "ok", "error": None, "t": START + 20}
    groups = [json.dumps({**commit, "partition": 0, "t_invoke": "x"}),
              json.dumps({**commit, "partition": 1, "generation": "3", "t_invoke": START})]
    return h, {name: ODD_LINES[name] + VALUE_KIND_LINES[name] for name in ODD_LINES} | {
        "groups": groups}


def test_every_kind_and_odd_lines_get_the_spark_job_s_answer(spark, tmp_path):
    h, extra = odd_group_history()
    history = h.write(tmp_path / "history", extra)
    report = analyze(spark, str(history), str(tmp_path / "report"))
    mine = as_dict(check_history(history))
    assert mine == spark_summary(report)
    assert (mine["verdict"], {k: n for k, n in mine["counts"].items() if n}) == ("loss", {
        "lost": 10, "misplaced": 1, "phantom_reads": 2, "inconsistent_offsets": 1,
        "duplicates": 1, "aborted_reads": 1, "unexpected": 2, "skipped": 6,
        "committed_offsets_lost": 1, "redelivered_past_commit": 3, "non_monotonic_polls": 1})
    assert (mine["failed"], mine["indeterminate"]) == (1, 2)


# ---- transactions ------------------------------------------------------------------------

TXN_COUNTS = {"reads_past_lso": 1, "aborted_reads": 1, "lost": 1, "torn_transactions": 2,
              "hanging_transactions": 1}
"""txn_history's anomalies, derived by hand in its docstring."""


def test_each_transaction_check_on_a_hand_planted_history(tmp_path):
    s = summary_of(txn_history(), tmp_path)
    assert (nonzero(s), s.verdict) == (TXN_COUNTS, "loss")
    # Sends of p0-t1 and p0-t3 were aborted: failed; every other transaction committed.
    assert (s.attempted, s.acked, s.failed, s.indeterminate) == (12, 9, 3, 0)


def test_a_transaction_check_counts_only_with_transaction_lines(tmp_path):
    h = txn_history()
    h.txns = None  # the same sends and reads without txns.jsonl: no transaction check runs
    s = summary_of(h, tmp_path)
    assert nonzero(s) == {"aborted_reads": 1, "lost": 1}


PIPELINE_COUNTS = {"duplicate_outputs": 1, "missing_outputs": 1, "skipped": 1,
                   "redelivered_past_commit": 1, "unexpected": 2}
"""pipeline_history's anomalies, derived by hand in its docstring."""


def test_each_pipeline_check_on_a_hand_planted_history(tmp_path):
    s = summary_of(pipeline_history(), tmp_path)
    assert (nonzero(s), s.verdict) == (PIPELINE_COUNTS, "loss")
    # 10 inputs and 11 outputs sent; c0.0-t1's 2 failed, c0.1-t1's 1 indeterminate.
    assert (s.attempted, s.acked, s.failed, s.indeterminate) == (21, 18, 2, 1)


def test_the_pipeline_checks_get_the_spark_job_s_answer(spark, tmp_path):
    history = pipeline_history().write(tmp_path / "history")
    report = analyze(spark, str(history), str(tmp_path / "report"))
    assert as_dict(check_history(history)) == spark_summary(report)
    assert {k: n for k, n in report["counts"].items() if k in anomalies.COUNTS and n} == \
        PIPELINE_COUNTS
    rows = {(a.kind, a.value): a.detail
            for a in spark.read.parquet(str(tmp_path / "report" / "anomalies")).collect()
            if a.kind in ("duplicate_output", "missing_output")}
    assert rows == {
        ("duplicate_output", "p1-1"): "input p1-1 was transformed into 2 committed output "
                                      "records: p1-1/c1.0-t0 at out-1 offset 1 and "
                                      "p1-1/c1.1-t0 at offset 3",
        ("missing_output", "p1-3"): "the pipeline's group committed in-1 up to offset 4 at "
                                    "+6.6 s, past this record, and its output topic holds "
                                    "no record of it"}


def test_the_transaction_checks_get_the_spark_job_s_answer(spark, tmp_path):
    history = txn_history().write(tmp_path / "history")
    report = analyze(spark, str(history), str(tmp_path / "report"))
    assert as_dict(check_history(history)) == spark_summary(report)
    assert {k: n for k, n in report["counts"].items() if k in anomalies.COUNTS and n} == \
        TXN_COUNTS


def test_a_record_behind_a_stuck_last_stable_offset_is_lost_to_a_hanging_transaction(
        spark, tmp_path):
    """txn_history's lost e1 is at t-1@7, past t-1's last sampled LSO (3, below the HW 12):
    a transaction nothing ended holds read_committed readers there. Without samples that
    show it stuck, no event explains it."""
    h = txn_history()
    h.events = []
    history = h.write(tmp_path / "history")
    report = analyze(spark, str(history), str(tmp_path / "report"))
    assert as_dict(check_history(history)) == spark_summary(report)
    assert check_history(history).mechanisms == {"hanging_transaction": 1}
    [incident] = report["explained"]["incidents"]
    assert "t-1's last stable offset stayed at 3" in incident["sentence"]
    h.cluster = [c for c in h.cluster if c["partition"] != 1]
    assert summary_of(h, tmp_path / "unstuck").mechanisms == {"unexplained": 1}
