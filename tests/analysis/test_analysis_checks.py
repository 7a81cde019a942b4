"""The pure checkers, one by one, on DataFrames small enough to check by hand."""

from __future__ import annotations

import math

import pytest
from analysis_histories import PLANTED_ANOMALIES, PLANTED_COUNTS, planted_history

from undertow_analysis import anomalies, checks, report
from undertow_analysis.io import read_history
from undertow_analysis.topics import topic_keys


@pytest.fixture(scope="module")
def planted(spark, tmp_path_factory):
    """inconsistent_offsets, classify and value_anomalies on the planted history, collected."""
    history = read_history(spark, str(planted_history().write(tmp_path_factory.mktemp("h"))))
    by_value = checks.by_value(checks.events(history.lines("sends"), history.lines("reads")))
    inconsistent = checks.inconsistent_offsets(by_value)
    classified = checks.classify(checks.positions_by_value(by_value), inconsistent).cache()
    topics = topic_keys(spark, {"t", "u"})
    found = {
        "inconsistent": [(topics[r["tk"]], r["pos"] >> checks.OFFSET_BITS,
                          r["pos"] & checks.MAX_OFFSET) for r in inconsistent.collect()],
        "classified": classified.collect(),
        "anomalies": checks.value_anomalies(checks.noteworthy(classified), topics).collect(),
    }
    classified.unpersist()
    return found


def test_inconsistent_offsets_keys_on_topic_partition_offset(planted):
    # p0-2 (t-0@1) and p3-3 (u-0@1) share partition and offset but not the topic.
    assert planted["inconsistent"] == [("t", 1, 2)]


def test_classify_flags_each_planted_value(planted):
    flagged = {(k.name, r["value"]) for r in planted["classified"]
               for k in anomalies.VALUE_KINDS if r[k.name]}
    assert flagged == {(kind, value) for kind, value, *_ in PLANTED_ANOMALIES}
    outcomes = {r["value"]: r["outcome"] for r in planted["classified"]}
    assert (outcomes["p0-5"], outcomes["p1-4"], outcomes["p2-2"], outcomes["zz-1"]) == (
        "acked", "indeterminate", "failed", None)
    indeterminate = {k: {r["value"] for r in planted["classified"] if r[k]}
                     for k in ("indeterminate_committed", "indeterminate_lost")}
    assert indeterminate == {"indeterminate_committed": {"p3-1"},
                             "indeterminate_lost": {"p1-1", "p1-4"}}
    assert len(outcomes) == PLANTED_COUNTS["attempted"] + PLANTED_COUNTS["unexpected"]


def test_value_anomalies_positions(planted):
    rows = planted["anomalies"]
    got = {(r["kind"], r["value"], r["topic"], r["partition"], r["offset"]) for r in rows}
    assert got == PLANTED_ANOMALIES
    details = {(r["kind"], r["value"]): r["detail"] for r in rows}
    assert details[("misplaced", "p0-4")] == "drained at t-1@5"
    assert details[("duplicate", "p2-1")] == "drained at t-0@3 ... t-0@4 (2 positions)"


def test_fault_windows_pair_nth_inject_with_nth_recover(spark):
    rows = [
        ("kill", "broker-1", "leader", "inject", 10.0),
        ("kill", "broker-1", "leader", "recover", 12.0),
        ("kill", "broker-1", "leader", "inject", 20.0),
        ("kill", "broker-1", "leader", "recover", 25.0),
        ("pause", "broker-2", "follower", "inject", 30.0),  # the run died before recovering
    ]
    faults = spark.createDataFrame(rows, "fault string, target string, role string, "
                                         "action string, t double")
    windows = checks.fault_windows(faults, run_end=40.0).orderBy("start").collect()
    assert [(w["fault"], w["start"], w["end"], w["recovered"]) for w in windows] == [
        ("kill", 10.0, 12.0, True), ("kill", 20.0, 25.0, True), ("pause", 30.0, 40.0, False)]


def test_with_active_fault_labels_overlaps_and_gaps(spark):
    faults = [
        {"id": 1, "fault": "kill", "target": "broker-1", "role": "", "start": 10.0, "end": 20.0},
        {"id": 2, "fault": "pause", "target": "broker-2", "role": "", "start": 15.0, "end": 30.0},
    ]
    intervals = spark.createDataFrame(report.fault_intervals(faults),
                                      "start double, end double, fault string")
    sends = spark.createDataFrame([(t,) for t in (5.0, 10.0, 14.9, 15.0, 25.0, 30.0)],
                                  "t_invoke double")
    got = sorted((r["t_invoke"], r["fault"])
                 for r in checks.with_active_fault(sends, intervals, width=4.0).collect())
    assert got == [
        (5.0, None), (10.0, "#1 kill broker-1"), (14.9, "#1 kill broker-1"),
        (15.0, "#1 kill broker-1 + #2 pause broker-2"), (25.0, "#2 pause broker-2"),
        (30.0, None),
    ]


def test_offline_windows_end_at_next_leader_or_last_sample(spark):
    samples = [(float(t), "t", 0, -1 if t in (2, 3, 6) else 1, [1]) for t in range(8)]
    samples += [(float(t), "t", 1, -1 if t >= 5 else 1, [1]) for t in range(8)]
    cluster = spark.createDataFrame(samples, "t double, topic string, partition int, "
                                             "leader int, isr array<int>")
    got = sorted(tuple(r) for r in checks.offline_windows(cluster).collect())
    assert got == [("t", 0, 2.0, 4.0), ("t", 0, 6.0, 7.0), ("t", 1, 5.0, 7.0)]


@pytest.mark.parametrize(("changes", "idempotent", "expected"), [
    ({}, False, "clean"),
    ({"duplicates": 3}, False, "clean"),
    ({"duplicates": 3}, True, "anomalies"),
    ({"unexpected": 1}, False, "anomalies"),
    ({"aborted_reads": 1}, False, "anomalies"),
    ({"indeterminate_lost": 5}, True, "clean"),
    ({"phantom_reads": 1, "duplicates": 1}, True, "loss"),
    ({"inconsistent_offsets": 1}, False, "loss"),
    ({"misplaced": 1}, False, "loss"),
    ({"lost": 1}, False, "loss"),
])
def test_verdict(changes, idempotent, expected):
    counts = dict.fromkeys(report.COUNT_NAMES, 0) | changes
    assert anomalies.verdict(counts, idempotent) == expected


def test_no_ack_windows_merge_consecutive_seconds():
    windows = report.no_ack_windows([4, 8, 9, 13], t_ref=100.0, t0=100.0)
    assert [(w["start_s"], w["duration_s"]) for w in windows] == [(4, 1), (8, 2), (13, 1)]


def test_send_series_decodes_negative_seconds_and_submillisecond_buckets(spark):
    """The series key packs a second or a latency bucket with its kind: seconds before t_ref
    and latencies under a millisecond are negative and must come back intact."""
    t_ref = 1_000.0
    rows = [  # value, tk, pos, code, t_invoke, t_complete
        ("a", 1, 0, checks.OK, t_ref - 1.5, t_ref - 1.4995),  # second -2, 0.5 ms
        ("b", 1, 1, checks.OK, t_ref + 3.2, t_ref + 3.21),  # second 3, 10 ms
        ("c", 1, None, checks.FAIL, t_ref + 3.9, t_ref + 4.0),  # second 3, not acked
        ("a", 1, 0, checks.RUN, None, t_ref + 9.0),
        (None, None, None, checks.BAD_READ, None, None),
    ]
    events = spark.createDataFrame(
        rows, "value string, tk long, pos long, code byte, t_invoke double, t_complete double")
    got = {(r["kind"], r["second"], r["bucket"]): r
           for r in checks.send_series(events, t_ref).collect()}

    def bucket(t_invoke: float, t_complete: float) -> int:
        return math.floor(math.log((t_complete - t_invoke) * 1000.0) / math.log(
            checks.LATENCY_RATIO))

    small, large = bucket(*rows[0][4:6]), bucket(*rows[1][4:6])
    assert small < 0 < large
    assert set(got) == {("second", -2, None), ("second", 3, None), ("latency", None, small),
                        ("latency", None, large), ("other", None, None)}
    assert (got["second", 3, None]["attempted"], got["second", 3, None]["acked"]) == (2, 1)
    assert got["second", -2, None]["first"] == t_ref - 1.5
    assert got["latency", None, small]["max_ms"] == pytest.approx(0.5)
    other = got["other", None, None]
    assert (other["last"], other["bad_reads"], other["bad_sends"]) == (t_ref + 9.0, 1, 0)
