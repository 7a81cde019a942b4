"""The pure checkers, one by one, on DataFrames small enough to check by hand."""

from __future__ import annotations

import math

import pytest
from analysis_histories import PLANTED_ANOMALIES, PLANTED_COUNTS, planted_history

from undertow_analysis import anomalies, checks, grid, report
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


def test_fault_windows_pair_nth_inject_heal_and_recover(spark):
    rows = [
        ("kill", "broker-1", "leader", "inject", 10.0),
        ("kill", "broker-1", "leader", "heal", 14.0),
        ("kill", "broker-1", "leader", "recover", 14.6),
        ("kill", "broker-1", "leader", "inject", 20.0),
        ("kill", "broker-1", "leader", "heal", 24.0),
        ("kill", "broker-1", "leader", "recover", 25.0),
        ("pause", "broker-2", "follower", "inject", 30.0),  # the run died before healing
        ("pause", "broker-0", "follower", "inject", 32.0),  # an older history: no heal line
        ("pause", "broker-0", "follower", "recover", 33.0),
    ]
    faults = spark.createDataFrame(rows, "fault string, target string, role string, "
                                         "action string, t double")
    windows = checks.fault_windows(faults, run_end=40.0).orderBy("start").collect()
    assert [(w["fault"], w["start"], w["healed"], w["end"], w["recovered"])
            for w in windows] == [
        ("kill", 10.0, 14.0, 14.6, True), ("kill", 20.0, 24.0, 25.0, True),
        ("pause", 30.0, None, 40.0, False), ("pause", 32.0, None, 33.0, True)]


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


def test_isr_per_bucket_counts_the_eligible_leader_replicas(spark):
    """The smallest ISR and the largest ELR (KIP-966) of each bucket; a sample without
    `elr` (a history from before it: null) counts as none."""
    samples = [(0.2, 0, [1, 2, 3], []), (0.7, 0, [1], [2, 3]), (1.2, -1, [], [2]),
               (1.6, 1, [1], None), (2.5, 1, [1, 2], None)]
    cluster = spark.createDataFrame(
        [(t, "t", 0, leader, isr, elr, None, None) for t, leader, isr, elr in samples],
        "t double, topic string, partition int, leader int, isr array<int>, elr array<int>, "
        "high_watermark long, last_stable_offset long")
    got = sorted(tuple(r) for r in checks.isr_per_bucket(cluster, 0.0, 1.0).collect())
    assert got == [("t", 0, 0, 1, 2, False, False), ("t", 0, 1, 0, 1, True, False),
                   ("t", 0, 2, 2, 0, False, False)]


def test_isr_per_bucket_finds_the_last_stable_offset_held(spark):
    """A bucket whose samples all have one LSO below the HW is held; one where the LSO
    moved, reached the HW, or was not sampled is not."""
    samples = [(0.2, 10, 4), (0.7, 12, 4),  # held at 4
               (1.2, 12, 4), (1.7, 14, 9),  # moved
               (2.2, 14, 14),  # at the HW
               (3.2, None, None)]  # not sampled
    cluster = spark.createDataFrame(
        [(t, "t", 0, 1, [1], [], hw, lso) for t, hw, lso in samples],
        "t double, topic string, partition int, leader int, isr array<int>, elr array<int>, "
        "high_watermark long, last_stable_offset long")
    got = {r["bucket"]: r["lso_held"] for r in checks.isr_per_bucket(cluster, 0.0, 1.0).collect()}
    assert got == {0: True, 1: False, 2: False, 3: False}


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


def series(buckets, cells=(), width=0.1, column=0.1, t_ref=100.0) -> report.Series:
    return report.Series(grid.Grid(t_ref, width, column), sorted(buckets), sorted(cells))


def test_no_ack_windows_follow_attempts_in_flight_and_acks_completing():
    """Buckets of 0.1 s: (bucket, invoked, acked, failed, indeterminate completions)."""
    steady = [(b, 5, 5, 0, 0) for b in range(0, 10)]
    # 20 attempts invoked over 1.0-1.4 s complete, acknowledged, only at 2.55 s: 1.0-2.5 s
    # had attempts in flight (even the buckets without a row) and no acknowledgement.
    stuck = [(b, 4, 0, 0, 0) for b in range(10, 15)] + [(25, 5, 25, 0, 0)]
    # 3.0-3.5 s: attempts fail at once, then time out: no ack for 0.5 s, under the minimum.
    refused = [(b, 2, 0, 1, 1) for b in range(30, 35)] + [(35, 2, 2, 0, 0)]
    # 4.0-5.5 s: every attempt fails or times out, 1.5 s: a window counting them.
    down = [(b, 2, 0, 1, 1) for b in range(40, 55)] + [(55, 1, 1, 0, 0)]
    windows, in_flight_s = report.no_ack_windows(series(steady + stuck + refused + down),
                                                 t0=100.0)
    assert [(w["kind"], w["start_s"], w["duration_s"], w["failed"], w["indeterminate"])
            for w in windows] == [("no_acks", 1.0, 1.5, 0, 0), ("no_acks", 4.0, 1.5, 15, 15)]
    # In flight: 0-2.6 s, 3.0-3.6 s and 4.0-5.6 s (idle from 2.6 s to 3.0 s and 3.6-4.0 s).
    assert in_flight_s == pytest.approx(2.6 + 0.6 + 1.6)


def test_availability_is_measured_on_completions():
    """Availability, rates and latency points of one series: the in-flight time, the
    unavailable time and the windows' faults."""
    s = series([(0, 10, 10, 0, 0), (10, 10, 0, 0, 0), (30, 0, 10, 0, 0), (31, 10, 10, 0, 0)],
               cells=[(0, 50, "acked", 10), (30, 120, "acked", 10), (31, 51, "acked", 10)])
    faults = [{"id": 1, "start": 100.9, "end": 102.5}, {"id": 2, "start": 104.0, "end": 105.0}]
    summary, windows = report._availability(s, 100.0, [], faults)
    assert [(w["start_s"], w["duration_s"], w["faults"]) for w in windows] == [(1.0, 2.0, [1])]
    # In flight: 0-0.1 s and 1.0-3.2 s (idle between).
    assert (summary["in_flight_s"], summary["unavailable_s"], summary["fraction"]) == (
        2.3, 2.0, pytest.approx(1 - 2.0 / 2.3, abs=1e-6))
    assert (summary["attempts"], summary["acked_attempts"], summary["no_ack_windows"],
            summary["longest_s"]) == (30, 30, 1, 2.0)
    assert "0.1 s" in summary["definition"]
    # By completion: nothing acknowledged from 0.1 s to 3.0 s, then the backlog at once.
    rates = report.completion_rates(s, 100.0, 0.5)
    assert rates[0] == (0.0, 20.0, 0.0, 0.0) and rates[1][1:] == (0.0, 0.0, 0.0)
    assert rates[6] == (3.0, 40.0, 0.0, 0.0) and len(rates) == 7
    points = report.latency_points(s, 100.0)
    assert [(round(t, 2), o, n) for t, _, o, n in points] == [
        (0.05, "acked", 10), (3.05, "acked", 10), (3.15, "acked", 10)]
    ms = [p[1] for p in points]
    assert ms[0] == pytest.approx(grid.CELL_RATIO ** 50.5)
    quantiles = report.latency_quantiles(s, 100.0, window=1.0)
    assert [(t, [round(q, 3) for q in qs]) for t, qs in quantiles] == [
        (0.5, [round(ms[0], 3)] * 2), (3.5, [round(ms[2], 3), round(ms[1], 3)])]


def test_series_grid_widens_with_the_run():
    assert grid.series_grid(0.0, 36.0) == grid.Grid(0.0, 0.1, 0.1)
    hour = grid.series_grid(0.0, 3600.0)
    assert (hour.width, hour.column) == (0.1, pytest.approx(3.6))
    week = grid.series_grid(5.0, 7 * 86400.0)
    assert week.width == 10.0 and 604_800 / week.width <= grid.MAX_SERIES_BUCKETS
    assert week.column / week.width == math.ceil(604.8 / 10)
    assert grid.series_grid(0.0, None).width == 1.0


def test_send_series_decodes_negative_buckets_and_submillisecond_latencies(spark):
    """The series key packs a bucket, a latency bucket or a cell with its kind: buckets before
    t_ref and latencies under a millisecond are negative and must come back intact."""
    t_ref = 1_000.0
    rows = [  # value, tk, pos, code, t_invoke, t_complete
        ("a", 1, 0, checks.OK, t_ref - 1.55, t_ref - 1.5495),  # bucket -16, 0.5 ms
        ("b", 1, 1, checks.OK, t_ref + 3.25, t_ref + 3.26),  # bucket 32, 10 ms
        ("c", 1, None, checks.INFO, t_ref + 3.22, t_ref + 4.02),  # 32 to 40, timed out
        ("a", 1, 0, checks.RUN, None, t_ref + 9.0),
        (None, None, None, checks.BAD_READ, None, None),
    ]
    events = spark.createDataFrame(
        rows, "value string, tk long, pos long, code byte, t_invoke double, t_complete double")
    got = {(r["kind"], r["bucket"], r["column"]): r
           for r in checks.send_series(events, grid.Grid(t_ref, 0.1, 0.5)).collect()}

    def bucket(ratio: float, t_invoke: float, t_complete: float) -> int:
        return math.floor(math.log((t_complete - t_invoke) * 1000.0) / math.log(ratio))

    small, large = (bucket(checks.LATENCY_RATIO, *r[4:6]) for r in rows[:2])
    cells = [bucket(grid.CELL_RATIO, *r[4:6]) for r in rows[:3]]
    assert small < 0 < large and cells[0] < 0
    assert set(got) == {
        ("time", -16, None), ("time", 32, None), ("time", 40, None),
        ("latency", small, None), ("latency", large, None),
        ("cell", cells[0], -4), ("cell", cells[1], 6), ("cell", cells[2], 8),
        ("other", None, None)}
    counts = {k: (r["attempted"], r["acked"], r["failed"], r["indeterminate"])
              for k, r in got.items() if k[0] != "other"}
    assert counts[("time", 32, None)] == (2, 1, 0, 0)  # b and c invoked, b acknowledged
    assert counts[("time", 40, None)] == (0, 0, 0, 1)  # c timed out
    assert counts[("cell", cells[2], 8)] == (0, 0, 0, 1)
    assert counts[("latency", small, None)] == (0, 1, 0, 0)
    assert got["time", -16, None]["first"] == t_ref - 1.55
    assert got["latency", small, None]["max_ms"] == pytest.approx(0.5)
    other = got["other", None, None]
    assert (other["last"], other["bad_reads"], other["bad_sends"]) == (t_ref + 9.0, 1, 0)
