"""The demo's two experiments end to end, explanations included: `undertow run` on the local
platform (real brokers, a real Kafka client, real leader kills, the real Spark job).

acks1-leader-kill loses records; every one of them must be attributed to an election that
made a broker which had not fetched them leader (acks=1 before replication, as the
experiment's comment says), none unexplained. acksall-leader-kill is clean; its report must
list the truncations the kills caused and show that none cut an acknowledged record.

Neither test takes the job's word for the loss: each recounts, in plain Python from the
history, the acknowledged values the drain never read, and requires the report's count.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

pytestmark = pytest.mark.long  # run first (tests/conftest.py)

REPO = Path(__file__).resolve().parents[2]


def run(name: str, out: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "undertow", "run", str(REPO / "experiments" / f"{name}.yaml"),
         "--out", str(out), "--seed", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=400, start_new_session=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:] + broker_logs(out)
    return json.loads((out / "report.json").read_text())


def report_summary(out: Path) -> str:
    """The summary `undertow run` printed, as the analysis writes it from report.json."""
    from undertow_analysis.report import summary_text

    return summary_text(json.loads((out / "report.json").read_text()))


def recount_lost(out: Path) -> int:
    """Acknowledged values (some attempt `ok` in sends.jsonl) that no drain read returned:
    the definition of `lost` in docs/design.md, counted without Spark."""
    history = out / "history"
    acked = {send["value"] for send in map(json.loads, (history / "sends.jsonl").open())
             if send["status"] == "ok"}
    drained = {read["value"] for read in map(json.loads, (history / "reads.jsonl").open())
               if read["phase"] == "drain"}
    return len(acked - drained)


CHROMIUM = shutil.which("chromium-headless-shell") or shutil.which("chromium")
MAX_PAGE_PX = 5000
"""A report a reader takes in by scrolling a few screens (the acks=1 demo's)."""


def page_height(html: Path, tmp: Path) -> int:
    """report.html's height in pixels at 1280 px wide, as headless Chromium lays it out:
    the last row of a tall screenshot that is not the page's white background."""
    shot = tmp / "page.png"
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--hide-scrollbars",
                    f"--window-size=1280,{2 * MAX_PAGE_PX}", f"--screenshot={shot}",
                    html.as_uri()], check=True, capture_output=True, timeout=120)
    ink = Image.open(shot).convert("L").point(lambda v: 255 if v < 250 else 0)
    box = ink.getbbox()
    return 0 if box is None else box[3]


def broker_logs(out: Path, lines: int = 40) -> str:
    """The end of every node's log, so that a failed run says what the cluster did."""
    logs = sorted((out / "cluster" / "logs").glob("*.log"))
    return "".join(f"\n--- {log.name} ---\n" + "\n".join(
        log.read_text(errors="replace").splitlines()[-lines:]) for log in logs)


@pytest.mark.slow
def test_acks1_leader_kill_every_lost_record_is_explained_by_acks1(tmp_path: Path) -> None:
    report = run("acks1-leader-kill", tmp_path / "out")
    assert report["verdict"] == "loss"
    assert report["counts"]["lost"] == recount_lost(tmp_path / "out") > 0
    explained = report["explained"]
    assert explained["events"] and explained["unexplained"] == 0
    incidents = explained["incidents"]
    assert len(incidents) == explained["incident_count"] >= 1
    assert {i["mechanism"] for i in incidents} == {"acks1_before_replication"}
    counts = report["counts"]
    assert sum(i["lost"] for i in incidents) == counts["lost"] > 0
    assert sum(i["misplaced"] for i in incidents) == counts["misplaced"]
    for incident in incidents:
        # The new leader's log ended at or before the first record it dropped, the holder
        # was the leader the kill took away, and the holder truncated them on its return.
        assert incident["dropper_end"] <= incident["first_offset"]
        assert incident["election"]["previous_leader"] == incident["holder"]
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
    if CHROMIUM is None:
        pytest.skip("no headless Chromium to lay the page out (apt-get install "
                    "chromium-headless-shell)")
    assert page_height(tmp_path / "out" / "report.html", tmp_path) < MAX_PAGE_PX


@pytest.mark.slow
def test_acksall_leader_kill_lists_truncations_that_cut_nothing_acknowledged(
        tmp_path: Path) -> None:
    report = run("acksall-leader-kill", tmp_path / "out")
    assert report["verdict"] == "clean"
    assert report["counts"]["lost"] == recount_lost(tmp_path / "out") == 0
    explained = report["explained"]
    assert explained["events"] and explained["incidents"] == []
    assert explained["truncations_cut_acked"] == explained["truncations_lost"] == 0
    assert all(c["acked"] == 0 and c["lost"] == 0 for c in explained["truncations"])
    assert report_summary(tmp_path / "out").count("none of them acknowledged") == (
        1 if explained["truncations"] else 0)
    html = (tmp_path / "out" / "report.html").read_text()
    assert "Loss incidents" in html
    assert ("No replica truncated its log" in html) == (not explained["truncations"])
