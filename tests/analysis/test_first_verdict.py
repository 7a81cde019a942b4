"""The verdict `undertow run` prints the moment the history closes (`undertow.runner.verdict`):
what the history checker found, in words a reader checks against the report, and every way
the Spark report can differ from it named. (The two agree on real reports: test_checker's
Spark tests; on a real run: test_demo_explained.)"""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import pytest
from history_builder import HistoryBuilder

from undertow.runner.verdict import disagreement, first_verdict, report_summary
from undertow_history.checker import COUNTS, Summary, check_history


def lossy(tmp_path: Path) -> Path:
    """Ten records acknowledged by broker 1 and drained; three more it acknowledged with
    acks=1 and truncated after a clean election of broker 2 (acks=1 before replication); one
    read at an offset its value was not acknowledged at (misplaced)."""
    h = HistoryBuilder(expect="loss", acks="1")
    h.event("become_leader", t=0.1, node="broker-1", broker=1, leader_epoch=0,
            log_end_offset=0, high_watermark=0, isr=[1, 2, 3])
    for i in range(10):
        h.record(f"p0-{i}", 0, i, t=1 + i * 0.1)
    for i in range(10, 13):
        h.send(f"p1-{i}", t=5.0, offset=i)
    h.event("leader_election", t=6.0, node="controller", leader_epoch=1, leader=2,
            previous_leader=-1, kind="clean", reason="leader_fenced", isr=[1, 2, 3])
    h.event("become_leader", t=6.1, node="broker-2", broker=2, leader_epoch=1,
            log_end_offset=10, high_watermark=10, isr=[2])
    h.event("truncation", t=9.0, node="broker-1", broker=1, leader_epoch=1, from_offset=13,
            to_offset=10, reason="offset_for_leader_epoch")
    h.send("p2-0", t=7.0, offset=10)
    h.read("p2-0", 0, 11)
    return h.write(tmp_path / "history")


def report_of(summary: Summary, incidents: list[dict] | None = None) -> dict:
    """report.json's part the runner compares, as the job would write it for `summary`."""
    if incidents is None:
        incidents = [{"kind": "records", "mechanism": m, "lost": n}
                     for m, n in summary.mechanisms.items()]
    return {"verdict": summary.verdict,
            "counts": {**summary.counts, "attempted": summary.attempted, "acked": summary.acked,
                       "failed": summary.failed, "indeterminate": summary.indeterminate},
            "explained": {"incident_count": len(incidents), "incidents": incidents}}


def test_the_verdict_says_what_was_lost_how_and_by_whom_it_was_found(tmp_path, capsys):
    summary = first_verdict(lossy(tmp_path), "loss")
    assert summary == check_history(tmp_path / "history")
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "VERDICT: LOSS   (expected loss: as expected)",
        "  3 of 14 acknowledged records lost: 3 by acks=1 before replication; 1 misplaced",
        lines[2], ""]
    assert lines[2].startswith("  (the history checker, in ")
    assert lines[2].endswith(" s; the Spark analysis writes the report and must agree)")


def test_an_unexpected_clean_verdict(tmp_path, capsys):
    h = HistoryBuilder()
    h.record("p0-0", 0, 0, t=1.0)
    first_verdict(h.write(tmp_path / "history"), "loss")
    assert capsys.readouterr().out.splitlines()[:2] == [
        "VERDICT: CLEAN   (expected loss: UNEXPECTED)",
        "  none of 1 acknowledged records lost"]


def test_a_history_the_checker_cannot_read_leaves_the_verdict_to_the_report(tmp_path, capsys,
                                                                            caplog):
    with caplog.at_level(logging.WARNING):
        assert first_verdict(tmp_path / "nothing-here", "loss") is None
    assert capsys.readouterr().out == ""
    assert "no verdict before the Spark report" in caplog.text


def test_a_report_that_agrees(tmp_path):
    summary = check_history(lossy(tmp_path))
    assert disagreement(summary, report_of(summary)) is None
    assert report_summary(report_of(summary))["mechanisms"] == {"acks1_before_replication": 3}


@pytest.mark.parametrize("change, named", [
    (lambda r: r["counts"].update(lost=2), "lost: report 2, checker 3"),
    (lambda r: r["counts"].update(duplicates=1), "duplicates: report 1, checker 0"),
    (lambda r: r.update(verdict="anomalies"), "verdict: report anomalies, checker loss"),
    (lambda r: r["counts"].update(acked=13), "acked: report 13, checker 14"),
    (lambda r: r["counts"].update(indeterminate=1), "indeterminate: report 1, checker 0"),
    (lambda r: r["explained"]["incidents"][0].update(mechanism="unclean_election"),
     "mechanisms: report {'unclean_election': 3}, checker {'acks1_before_replication': 3}"),
])
def test_every_difference_is_named(tmp_path, change, named):
    summary = check_history(lossy(tmp_path))
    report = copy.deepcopy(report_of(summary))
    change(report)
    assert disagreement(summary, report) == named


def test_the_mechanisms_are_compared_only_when_the_report_lists_every_incident(tmp_path):
    summary = check_history(lossy(tmp_path))
    report = report_of(summary, [{"kind": "records", "mechanism": "unclean_election",
                                  "lost": 1}])
    report["explained"]["incident_count"] = 101  # the first 100 listed
    assert report_summary(report)["mechanisms"] is None
    assert disagreement(summary, report) is None
    report["counts"]["skipped"] = 4
    assert disagreement(summary, report) == "skipped: report 4, checker 0"
    assert set(COUNTS) <= set(report["counts"])
