"""The consumer group's checks on hand-built histories: exact counts and anomalies/ rows of
each kind, the re-deliveries and commits that must not count, and a history without a group."""

from __future__ import annotations

import json
from html import escape

import pytest
from analysis_histories import GROUP_ANOMALIES, GROUP_COUNTS, clean_history, group_history
from history_builder import HistoryBuilder

from undertow_analysis import groups, plots, run_analysis
from undertow_analysis.anomalies import KINDS
from undertow_analysis.grid import Grid
from undertow_analysis.io import read_history
from undertow_analysis.report import COUNT_NAMES, Series

BAD_GROUP_LINE = '{"member": "c9", "type": "joined", "topic": "t", "partition": 0, "t": 1.0}'


@pytest.fixture(scope="module")
def grouped(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("grouped")
    history = group_history().write(root / "history", {"groups": [BAD_GROUP_LINE]})
    result = run_analysis(str(history), str(root / "out"))
    rows = [r.asDict() for r in spark.read.parquet(str(root / "out" / "anomalies")).collect()]
    return result, rows, root


def test_group_counts_are_exact(grouped):
    result, _, _ = grouped
    assert result["counts"] == dict.fromkeys(COUNT_NAMES, 0) | {
        "attempted": 22, "acked": 22, **GROUP_COUNTS}
    assert (result["verdict"], result["as_expected"]) == ("loss", True)
    assert result["consumer_group"] == {"group_id": "g", "offsets_topic": "__consumer_offsets",
                                        "offsets_partition": 7}


def test_anomalies_lists_each_group_finding(grouped):
    _, rows, _ = grouped
    assert {(r["kind"], r["value"], r["topic"], r["partition"], r["offset"])
            for r in rows} == GROUP_ANOMALIES
    assert len(rows) == len(GROUP_ANOMALIES)


def _by_kind(rows: list[dict], kind: str) -> list[dict]:
    return sorted((r for r in rows if r["kind"] == kind), key=lambda r: (r["offset"] or -1))


def test_a_skipped_record_names_the_commit_that_passed_it(grouped):
    _, rows, _ = grouped
    skipped = _by_kind(rows, "skipped")
    start = HistoryBuilder().start
    # The ok commit of 10 (at 7 s) is not past 10-14; the one of 17 (at 13 s) is.
    assert [(r["offset"], r["committed"], r["t_commit"] - start) for r in skipped] == [
        (o, 17, 13.0) for o in range(10, 15)]
    assert skipped[0]["detail"] == (
        "drained, never returned to a group member, below an offset the group committed")
    # p0-17 was drained at 17, never returned either, but no commit passed it.
    assert "p0-17" not in {r["value"] for r in rows}


def test_a_lost_committed_offset_is_one_row_per_committed_line(grouped):
    _, rows, _ = grouped
    (lost,) = _by_kind(rows, "committed_offset_lost")
    start = HistoryBuilder().start
    assert (lost["topic"], lost["partition"], lost["offset"], lost["committed"]) == ("t", 1, 2, 4)
    assert (lost["t_commit"] - start, lost["t_read"] - start, lost["t_invoke"] - start) == (
        pytest.approx(3.0), pytest.approx(5.6), pytest.approx(2.95))
    assert lost["detail"] == ("c1 (generation 2) was given 2 by the coordinator at +5.6 s, "
                              "though 4 had been acknowledged as committed at +3.0 s")
    # Not lost: 5 for t-0 after the refused (fail) commit of 10; 10 for t-0 after the
    # indeterminate (info) 20; 6 for t-1, above the acknowledged 4.


def test_a_redelivery_past_a_commit_is_outside_the_rebalance_window(grouped):
    _, rows, _ = grouped
    again = _by_kind(rows, "redelivered_past_commit")
    assert [(r["value"], r["offset"], r["committed"]) for r in again] == [
        ("p1-2", 2, 4), ("p1-3", 3, 4)]
    assert again[0]["detail"] == (
        "c1 (generation 2) returned it again at +6.0 s (c0 had returned it first); 4 had been "
        "acknowledged as committed at +3.0 s, before c1 was assigned t-1 at +5.5 s")
    # c1 returned t-0@5..9 again too, from the committed 5: at least once, not past a commit.
    assert not {r["value"] for r in again} & {f"p0-{i}" for i in range(5, 10)}


def test_a_poll_going_back_within_a_generation(grouped):
    _, rows, _ = grouped
    (back,) = _by_kind(rows, "non_monotonic_poll")
    assert (back["value"], back["offset"]) == ("p0-7", 7)
    assert back["detail"] == "c1 (generation 2) returned offset 7 at +6.1 s after offset 9"


def test_a_malformed_group_line_is_counted_and_located(grouped):
    result, _, root = grouped
    where = str(root / "history" / "groups.jsonl")
    malformed = result["malformed"]
    assert (malformed["skipped"], malformed["by_file"]) == (1, {where: 1})
    lines = len((root / "history" / "groups.jsonl").read_text().splitlines())
    assert [(m["file"], m["line"], m["reason"]) for m in malformed["lines"]] == [
        (where, lines, "type must be one of assign, revoke, committed, commit")]


def test_the_report_shows_the_group_counts_their_help_and_findings(grouped):
    _, _, root = grouped
    page = (root / "out" / "report.html").read_text()
    for kind in KINDS:
        if kind.count in GROUP_COUNTS:
            assert f"<td>{kind.count}</td>" in page and escape(kind.help) in page
    assert "c1 (generation 2) returned offset 7 at +6.1 s after offset 9" in page


def test_the_summary_lists_the_group_counts(grouped):
    from undertow_analysis.report import summary_text
    text = summary_text(grouped[0])
    assert "  redelivered_past_commit          2" in text
    assert "  committed_offsets_lost           1" in text


def only_polls_going_back() -> HistoryBuilder:
    """A member returns t-0@2 before t-0@1 in one poll (one time: only the order of
    reads.jsonl says which came first), then t-0@3 in the next generation before t-0@4; nothing
    is lost."""
    h = HistoryBuilder(expect="clean")
    h.assign("c0", 0, t=1.0, generation=1)
    for i in range(5):
        h.send(f"p0-{i}", t=1.5, offset=i)
        h.read(f"p0-{i}", 0, i)
    for i in (0, 2, 1):
        h.poll("c0", f"p0-{i}", 0, i, generation=1, t=2.0)
    h.commit("c0", 0, 3, t=3.0, generation=1)
    h.assign("c0", 0, t=4.0, generation=2, committed=3)
    for i in (3, 4):
        h.poll("c0", f"p0-{i}", 0, i, generation=2, t=5.0 + i * 0.1)
    return h


def test_anomalies_that_are_not_loss_make_the_verdict_anomalies(tmp_path):
    result = run_analysis(str(only_polls_going_back().write(tmp_path / "history")),
                          str(tmp_path / "out"))
    counts = {name: result["counts"][name] for name in GROUP_COUNTS}
    assert counts == {"skipped": 0, "committed_offsets_lost": 0, "redelivered_past_commit": 0,
                      "non_monotonic_polls": 1}
    assert result["verdict"] == "anomalies"


@pytest.mark.parametrize("groups_file", ["absent", "empty"])
def test_a_history_without_group_lines_has_no_group_anomaly(spark, tmp_path, groups_file):
    """An assign-mode run: no groups.jsonl (or an empty one) plans none of the group checks.
    Its reads have no generation, and values never read during the run stay unflagged."""
    h = clean_history()
    h.send("p0-9", t=8.0, partition=0, offset=3)
    h.read("p0-9", 0, 3)  # drained, never read during the run: not skipped without a group
    history = h.write(tmp_path / "history")
    if groups_file == "empty":
        (history / "groups.jsonl").write_text("")
    assert groups.group_history(read_history(spark, str(history))) is None
    result = run_analysis(str(history), str(tmp_path / "out"))
    assert result["counts"] == dict.fromkeys(COUNT_NAMES, 0) | {"attempted": 7, "acked": 7}
    assert (result["verdict"], result["consumer_group"]) == ("clean", None)


def test_a_consumer_group_of_another_shape_is_bad_input(tmp_path):
    history = only_polls_going_back().write(tmp_path / "history")
    meta = json.loads((history / "meta.json").read_text())
    (history / "meta.json").write_text(json.dumps(meta | {"consumer_group": {"group_id": 1}}))
    with pytest.raises(ValueError, match="consumer_group must be"):
        run_analysis(str(history), str(tmp_path / "out"))


def test_the_timeline_marks_rebalances_generations_and_the_coordinator():
    marks = [
        {"type": "group_rebalance", "group": "g", "generation": 1, "broker": 2, "t_s": 5.0},
        {"type": "group_stable", "group": "g", "generation": 2, "broker": 2, "t_s": 5.4},
        {"type": "coordinator_load", "group": None, "generation": None, "broker": 3,
         "t_s": 9.0},
    ]
    # The group gets a lane of its own; the coordinator's broker its lane.
    assert plots.fault_lanes([], marks, brokers=3) == [
        "controller", "broker-0", "broker-1", "broker-2", "broker-3", "group"]
    fig = timeline(marks)
    legend = {t.get_text() for ax in fig.axes if ax.get_legend()
              for t in ax.get_legend().get_texts()}
    assert {"group rebalancing", "group generation stable",
            "group coordinator moved here"} <= legend
    png = plots.timeline_png(**timeline_args(marks))
    assert png[:4] == b"\x89PNG"
    banded = plots.timeline_figure(**timeline_args(marks), unconsumed=[(2.0, 4.5)])
    legend = {t.get_text() for ax in banded.axes if ax.get_legend()
              for t in ax.get_legend().get_texts()}
    assert "a partition unconsumed (a record waiting, no group member reading it)" in legend


def timeline_args(events: list[dict]) -> dict:
    """A 10 s run with steady sends and no fault, marking `events`."""
    grid = Grid(0.0, 0.1, 0.1)
    return {"series": Series(grid, [(b, 1, 1, 0, 0) for b in range(100)],
                             [(b, 60, "acked", 1) for b in range(100)]),
            "t0": 0.0, "t_end": 10.0, "clock": None, "isr": [], "isr_width": 1.0,
            "faults": [], "unavailable": [], "lost_t": [], "events": events, "brokers": 3}


def timeline(events: list[dict]):
    return plots.timeline_figure(**timeline_args(events))


def test_the_consumption_of_each_partition_is_measured_from_the_history(grouped):
    """consumption.summary on the hand-built group (analysis_histories.group_history): t-0's
    first reads stop at 2.09 s and resume with p0-15 (acknowledged at 10.01 s) at 11.15 s;
    the re-reads of generation 2 and p0-8 at 7.5 s are no progress. Each partition was
    handed from c0 to c1 0.5 s after c0's revoke, and then assigned while c1 still held it."""
    result, _, _ = grouped
    consumed = result["consumption"]
    assert consumed["group_protocol"] == "classic"
    rows = {r["partition"]: r for r in consumed["partitions"]}
    assert rows[0] == {"topic": "t", "partition": 0, "unconsumed_s": 1.14, "stretches": 1,
                       "longest_s": 1.14, "returned_again": 7, "handovers": 3,
                       "overlapping_handovers": 2, "longest_pause_s": 0.5}
    assert rows[1] == {"topic": "t", "partition": 1, "unconsumed_s": 0, "stretches": 0,
                       "longest_s": None, "returned_again": 2, "handovers": 2,
                       "overlapping_handovers": 1, "longest_pause_s": 0.5}
    assert consumed["total"] == {"unconsumed_s": 1.14, "stretches": 1, "longest_s": 1.14,
                                 "returned_again": 9, "handovers": 5,
                                 "overlapping_handovers": 3, "longest_pause_s": 0.5}
    assert consumed["stretches"] == [{"topic": "t", "partition": 0, "start_s": 10.01,
                                      "end_s": 11.15, "length_s": 1.14}]
    html_text = (grouped[2] / "out" / "report.html").read_text()
    assert "Consumer group (classic protocol)" in html_text
