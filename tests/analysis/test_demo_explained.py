"""acks1-leader-kill end to end, explanations included: `undertow run` on the local platform
(real brokers, a real Kafka client, real leader kills, the real Spark job), as `make demo`
runs it (test_demo_clean.py runs the other half of the demo).

It loses records; every one of them must be attributed to an election that made a broker
which had not fetched them leader (acks=1 before replication, as the experiment's comment
says), none unexplained. The test does not take the job's word for the loss: it recounts, in
plain Python from the history, the acknowledged values the drain never read, and requires
the report's count.

The same run also holds the analysis started with the run (the default): its report and
summary are those `undertow analyze` gives for the same history, it waited for the history
instead of warming up while the workload ran, and neither it nor its JVM outlived the run.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import tools
from demo_runs import REPO, DemoRun, recount_lost, run
from PIL import Image
from procs import analysis_processes
from pyspark.sql import SparkSession

from undertow import cli
from undertow.runner.phases import to_verdict
from undertow.spec import load_experiment

pytestmark = pytest.mark.long  # run first (tests/conftest.py)


@pytest.fixture(scope="module")
def acks1(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """One run of acks1-leader-kill for the tests of this file that read it."""
    return run("acks1-leader-kill", tmp_path_factory.mktemp("acks1") / "out")


MAX_PAGE_PX = 5000
"""A report a reader takes in by scrolling a few screens (the acks=1 demo's)."""


def page_height(chromium: str, html: Path, tmp: Path) -> int:
    """report.html's height in pixels at 1280 px wide, as headless Chromium lays it out:
    the last row of a tall screenshot that is not the page's white background."""
    shot = tmp / "page.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--hide-scrollbars",
                    f"--window-size=1280,{2 * MAX_PAGE_PX}", f"--screenshot={shot}",
                    html.as_uri()], check=True, capture_output=True, timeout=120)
    ink = Image.open(shot).convert("L").point(lambda v: 255 if v < 250 else 0)
    box = ink.getbbox()
    return 0 if box is None else box[3]


def had_them(incident: dict, out: Path) -> bool:
    """The dropping election's previous leader had the incident's records: it is the holder,
    or it became leader after they were acknowledged and before that election with a log
    past the last of them (a preferred election from the holder, the kill right after)."""
    election = incident["election"]
    previous, elected_t = election["previous_leader"], election["t"]
    if previous == incident["holder"]:
        return True
    last_t = elected_t - election["t_s"] + incident["last_t_s"]  # report.json's times: from t0
    events = map(json.loads, (out / "history" / "events.jsonl").open())
    return any(e["type"] == "become_leader" and e["broker"] == previous
               and (e["topic"], e["partition"]) == (incident["topic"], incident["partition"])
               and last_t < e["t"] < elected_t
               and e["log_end_offset"] > incident["last_offset"] for e in events)


@pytest.mark.slow
def test_acks1_leader_kill_every_lost_record_is_explained_by_acks1(acks1: DemoRun) -> None:
    report = acks1.report
    assert report["verdict"] == "loss"
    assert report["counts"]["lost"] == recount_lost(acks1.out) > 0
    explained = report["explained"]
    assert explained["events"] and explained["unexplained"] == 0
    incidents = explained["incidents"]
    assert len(incidents) == explained["incident_count"] >= 1
    # Most by acks=1 before replication; at times a few by a deposed leader: when a killed
    # broker returns, the controller may move leadership back to it (auto.leader.rebalance),
    # and the live leader it replaces acknowledges for some milliseconds more with acks=1.
    lost_by: dict[str, int] = {}
    for i in incidents:
        lost_by[i["mechanism"]] = lost_by.get(i["mechanism"], 0) + i["lost"]
    assert set(lost_by) <= {"acks1_before_replication", "deposed_leader"}, lost_by
    assert lost_by["acks1_before_replication"] > lost_by.get("deposed_leader", 0), lost_by
    counts = report["counts"]
    assert sum(i["lost"] for i in incidents) == counts["lost"] > 0
    assert sum(i["misplaced"] for i in incidents) == counts["misplaced"]
    for incident in incidents:
        if incident["mechanism"] == "deposed_leader":
            # Its holder led the epoch before the election that replaced it, alive.
            assert incident["election"]["previous_leader"] == incident["holder"]
            assert incident["election"]["kind"] == "preferred", incident
            continue
        # The new leader's log ended at or before the first record it dropped, the leader
        # the kill took away had them (the holder, or a leader that had fetched them from it
        # and took over before the kill), and the holder truncated them on its return.
        assert incident["dropper_end"] <= incident["first_offset"]
        assert had_them(incident, acks1.out), incident
        assert incident["holder"] in incident["removals"]
        assert incident["fault"] and " kill broker-" in incident["fault"], incident["fault"]
    # The truncation table adds up: its lost column is the lost count (the holder cut
    # every lost record on its return), and each row's acknowledged records are lost for
    # good, lost and counted above, or kept elsewhere.
    truncations = explained["truncations"]
    assert sum(c["lost"] for c in truncations) == explained["truncations_lost"] \
        == counts["lost"]
    for c in truncations:
        assert c["acked"] == c["lost"] + c["lost_before"] + c["kept"], c
        assert c["acked"] <= c["from_offset"] - c["to_offset"], c


@pytest.fixture(scope="module")
def chromium() -> str:
    """Module-scoped and asked before ``acks1``: the page test run alone fails or skips
    before the experiment runs."""
    return tools.chromium()


@pytest.mark.slow
def test_the_acks1_report_is_a_few_screens_tall(chromium: str, acks1: DemoRun,
                                                tmp_path: Path) -> None:
    assert page_height(chromium, acks1.out / "report.html", tmp_path) < MAX_PAGE_PX


@pytest.mark.slow
def test_the_prestarted_analysis_reports_what_undertow_analyze_does(
        acks1: DemoRun, spark: SparkSession, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    out, stdout = acks1.out, acks1.stdout
    assert analysis_processes(acks1.mark) == [], "the analysis or its JVM outlived the run"
    log = (out / "analysis.log").read_text()
    assert "warmed up in" in log and "history closed after" in log, log
    # The workload waited for the warm-up: the analysis then waited for the history at
    # least as long as the workload ran, instead of warming up while it ran.
    waited = float(re.search(r"history closed after ([\d.]+) s of waiting", log)[1])
    workload = load_experiment(REPO / "experiments" / "acks1-leader-kill.yaml")
    assert waited >= workload.experiment.spec.workload.duration, log

    # `undertow analyze` of the same history, on this worker's warm session (the job takes
    # the process's session, as a notebook's: a JVM of its own costs half a minute of CPU).
    again = tmp_path / "again"
    capsys.readouterr()
    assert cli.main(["analyze", str(out / "history"), "--out", str(again)]) == 0
    expected = json.loads((again / "report.json").read_text().replace(str(again), str(out)))
    assert acks1.report == expected
    # The runner prints the summary run_analysis printed in `undertow analyze`, then its line.
    summary = capsys.readouterr().out.replace(str(again), str(out))
    assert summary.strip() and summary in stdout
    assert stdout.endswith(f"\nVerdict: loss (expected loss: as expected). "
                           f"Report: {out / 'report.html'}\n")
    # Before it, the history checker's verdict, printed the moment the history closed, which
    # the report agreed with; under it, where the time after the workload went, down to the
    # verdict and to the report; the analysis said how long its job took, and ended at once.
    first = re.search(r"\nVERDICT: LOSS   \(expected loss: as expected\)\n  ([\d,]+) of "
                      r"[\d,]+ acknowledged records lost: ([\d,]+) by acks=1 before "
                      r"replication(?:, ([\d,]+) by a deposed leader's acknowledgements before "
                      r"it learned of the new epoch)?\n"
                      r"  \(the history checker, in [\d.]+ s; the Spark analysis writes the "
                      r"report and must agree\)\n\n", stdout)
    assert first, stdout
    lost, by_acks1, by_deposed = (int((n or "0").replace(",", "")) for n in first.groups())
    assert lost == by_acks1 + by_deposed == acks1.report["counts"]["lost"], stdout
    assert first.end() <= stdout.index(summary), stdout
    agreed = stdout.index("\n\nThe Spark report agrees with the history checker (verdict, "
                          "anomaly counts, send totals, loss mechanisms).\n")
    assert agreed > stdout.index(summary)
    timings = json.loads((out / "timings.json").read_text())
    assert list(timings["phases"]) == ["healing", "last sends", "recovery", "drain", "history",
                                       "verdict", "report"]
    line = re.search(r"\ntime after the workload: healing [^\n]* = ([\d.]+) s \(the verdict "
                     r"at ([\d.]+) s; cluster stop [\d.]+ s, during the report\)\n", stdout)
    assert line and agreed < line.start(), stdout
    assert float(line[1]) == round(timings["total"], 1)
    assert float(line[2]) == round(to_verdict(timings), 1) < float(line[1])
    assert re.search(r"analysed in [\d.]+ s; exiting", log), log
