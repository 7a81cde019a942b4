"""A run whose nemesis did not inject every planned fault (meta.json `faults_skipped`: a
target that never came back in time, an injection that failed) did not test the
experiment's schedule. Its verdict may be the expected one by luck: a clean run with its
kill missing. Every place that gives the verdict says so, and none calls it as expected: the
checker's summary, the runner's first verdict, report.json, the summary on stdout,
report.html under the verdict, `undertow run`'s exit code and the operator's status."""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path

import pytest
from analysis_histories import clean_history

from undertow.cli import EXIT_AS_EXPECTED, EXIT_UNEXPECTED, _verdict
from undertow.kube.status import Observation, advance
from undertow.runner.verdict import disagreement, verdict_text
from undertow.spec import load_experiment
from undertow_analysis import main
from undertow_history.checker import SKIPPED_NOTE, check_history

SKIPPED = [{"index": 2, "kind": "kill", "reason": "start of fault 1 did not come in time"}]
EXPERIMENT = Path(__file__).parents[2] / "experiments" / "acksall-leader-kill.yaml"


def skipped_history(root: Path, skipped: object = SKIPPED) -> Path:
    """A clean history (nothing lost, expect clean) whose meta.json says ``skipped`` (no
    `faults_skipped` at all for None: a history from before it existed)."""
    history = clean_history().write(root / "history")
    meta = json.loads((history / "meta.json").read_text()) | {"expect": "clean"}
    if skipped is not None:
        meta["faults_skipped"] = skipped
    (history / "meta.json").write_text(json.dumps(meta))
    return history


def banner(out: Path) -> str | None:
    found = re.search(r'<div class="incomplete" id="faults-skipped">(.*?)</div>',
                      (out / "report.html").read_text(), re.DOTALL)
    return unescape(re.sub(r"<[^>]+>", "", found[1])) if found else None


def test_the_checker_and_the_first_verdict_say_the_run_is_not_the_experiment(
        tmp_path: Path) -> None:
    summary = check_history(skipped_history(tmp_path))
    assert summary.verdict == "clean" and summary.faults_skipped == SKIPPED
    text = verdict_text(summary, "clean", 0.1)
    assert text.splitlines()[0] == "VERDICT: CLEAN   (expected clean: UNEXPECTED)"
    assert text.splitlines()[1] == (f"  FAULTS SKIPPED: {SKIPPED_NOTE} (fault 2 (kill): start "
                                    f"of fault 1 did not come in time)")


def test_a_history_without_skipped_faults_says_nothing_of_them(tmp_path: Path) -> None:
    for skipped in (None, []):
        summary = check_history(skipped_history(tmp_path / str(skipped), skipped))
        assert summary.faults_skipped == []
        assert "(expected clean: as expected)" in verdict_text(summary, "clean", 0.1)
        assert "SKIPPED" not in verdict_text(summary, "clean", 0.1)


@pytest.mark.parametrize("skipped", [{"index": 2}, [{"index": "2", "kind": "kill"}],
                                     [{"index": 2}], ["fault 2"]])
def test_a_malformed_faults_skipped_is_a_clear_error(tmp_path: Path, skipped: object) -> None:
    with pytest.raises(ValueError, match="faults_skipped"):
        check_history(skipped_history(tmp_path, skipped))


def test_the_report_says_so_under_the_verdict_and_agrees_with_the_checker(
        spark, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    history, out = skipped_history(tmp_path), tmp_path / "out"
    assert main([str(history), "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["faults_skipped"] == SKIPPED
    assert (report["verdict"], report["as_expected"]) == ("clean", False)
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "VERDICT: CLEAN   (expected clean: UNEXPECTED)"
    assert lines[3].startswith(f"FAULTS SKIPPED: {SKIPPED_NOTE} (fault 2 (kill)")
    seen = banner(out)
    assert seen is not None and seen.startswith("Faults skipped: ") and "fault 2 (kill)" in seen
    assert disagreement(check_history(history), report) is None

    assert _verdict(report, load_experiment(EXPERIMENT), out) == EXIT_UNEXPECTED
    assert "NOT as expected: 1 planned fault(s) not injected" in capsys.readouterr().out
    assert _verdict({**report, "faults_skipped": []}, load_experiment(EXPERIMENT),
                    out) == EXIT_AS_EXPECTED


def test_the_operator_does_not_call_it_a_success() -> None:
    step = advance(Observation("Analyzing", analysis="succeeded", report={
        "verdict": "clean", "expect": "clean", "faults_skipped": SKIPPED}))
    assert (step.phase, step.reason) == ("Completed", "FaultsSkipped")
    assert "fault 2 (kill): start of fault 1 did not come in time" in step.message
