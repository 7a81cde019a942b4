"""acksall-leader-kill end to end: `undertow run` on the local platform, as `make demo` runs
it. The run is clean; its report must list the truncations the kills caused and show that
none cut an acknowledged record, and the plain-Python recount of the history agrees that
nothing acknowledged was lost (test_demo_explained.py runs the acks=1 half)."""

from __future__ import annotations

from pathlib import Path

import pytest
from demo_runs import recount_lost, report_summary, run

pytestmark = pytest.mark.long  # run first (tests/conftest.py)


@pytest.mark.slow
def test_acksall_leader_kill_lists_truncations_that_cut_nothing_acknowledged(
        tmp_path: Path) -> None:
    report = run("acksall-leader-kill", tmp_path / "out").report
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
