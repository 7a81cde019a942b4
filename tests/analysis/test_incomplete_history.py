"""A history whose run a failure stopped (meta.json `incomplete`, issue 22) is refused with a
clear message and exit 2, and analysed only when asked, its report saying so first: in
report.json, in the summary on stdout and under the verdict of report.html."""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path

import pytest
from analysis_histories import clean_history

from undertow import cli
from undertow_analysis import main, report

REASON = ("history: could not write /runs/x/history/sends.jsonl: [Errno 28] No space left on "
          "device")


def incomplete_banner(out: Path) -> str | None:
    """The text of report.html's incomplete-history notice, None when there is none."""
    found = re.search(r'<div class="incomplete" id="incomplete">(.*?)</div>',
                      (out / "report.html").read_text(), re.DOTALL)
    return unescape(re.sub(r"<[^>]+>", "", found[1])) if found else None


def test_an_incomplete_history_is_refused_unless_allowed_and_then_says_so(
        spark, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    history = clean_history().write(tmp_path / "history")
    meta = json.loads((history / "meta.json").read_text())
    (history / "meta.json").write_text(json.dumps(
        meta | {"incomplete": True, "incomplete_reason": REASON}))
    out = tmp_path / "out"

    assert main([str(history), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"undertow analyze: history {history} is incomplete: {REASON}; ")
    assert "--allow-incomplete" in err and len(err.splitlines()) == 1
    assert not out.exists(), "a refused history must leave no report"

    assert cli.main(["analyze", str(history), "--out", str(out), "--allow-incomplete"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert (report["incomplete"], report["incomplete_reason"]) == (True, REASON)
    stdout = capsys.readouterr().out
    assert "HISTORY INCOMPLETE: a failure stopped the run" in stdout and REASON in stdout
    banner = incomplete_banner(out)
    assert banner is not None and banner.startswith("Incomplete history: ") and REASON in banner


def test_a_complete_history_says_nothing_of_it(spark, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    history = clean_history().write(tmp_path / "history")
    meta = json.loads((history / "meta.json").read_text())
    (history / "meta.json").write_text(json.dumps(
        meta | {"incomplete": False, "incomplete_reason": None}))
    out = tmp_path / "out"
    assert main([str(history), "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert (report["incomplete"], report["incomplete_reason"]) == (False, None)
    assert "INCOMPLETE" not in capsys.readouterr().out
    assert incomplete_banner(out) is None


@pytest.mark.parametrize(("drain", "short"), [
    (None, []),  # a history from before meta.json's drain
    ({"0": {"end": 12, "read_to": 12}, "1": {"end": 0, "read_to": 0}}, []),
    ({"1": {"end": 12, "read_to": 7}, "0": {"end": None, "read_to": 0}},
     [{"topic": "t", "partition": 0, "end": None, "read_to": 0},
      {"topic": "t", "partition": 1, "end": 12, "read_to": 7}]),
])
def test_drain_shortfalls_are_the_partitions_not_read_to_their_end(drain, short) -> None:
    assert report.drain_shortfalls(drain, "t") == short


@pytest.mark.parametrize(("drain", "message"), [
    ([1, 2], "meta.json's drain must be an object of partition -> {end, read_to}"),
    ({"p0": {"end": 1, "read_to": 1}}, "meta.json's drain['p0'] must be"),
    ({"0": {"end": "12", "read_to": 1}}, "meta.json's drain['0'] must be"),
    ({"0": {"end": 12}}, "meta.json's drain['0'] must be"),
])
def test_a_malformed_drain_is_a_clear_error(spark, tmp_path: Path, drain, message,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    history = clean_history().write(tmp_path / "history")
    meta = json.loads((history / "meta.json").read_text())
    (history / "meta.json").write_text(json.dumps(meta | {"drain": drain}))
    assert main([str(history), "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err


def test_a_short_drain_is_said_first_in_the_summary(spark, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    history = clean_history().write(tmp_path / "history")
    meta = json.loads((history / "meta.json").read_text())
    (history / "meta.json").write_text(json.dumps(
        meta | {"spec": {"topic": {"name": "t"}},
                "drain": {"0": {"end": None, "read_to": 0}}}))
    assert main([str(history), "--out", str(tmp_path / "out")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[3] == (
        f"DRAIN INCOMPLETE: {report.SHORT_DRAIN_NOTE} (t-0: end unknown (no reachable leader "
        f"after healing), not read)")
