"""The table of anomaly kinds is the one source of every list of kinds: counts, help, verdict,
the checkers' flags and counts, the attribution, the docs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from undertow_analysis import anomalies, attribution, checks, report
from undertow_analysis.anomalies import INCIDENT, KINDS, NAMES, RETRY

DESIGN = Path(__file__).resolve().parents[2] / "docs" / "design.md"
REPORTED_COUNTS = (
    "attempted", "acked", "failed", "indeterminate",
    "lost", "misplaced", "phantom_reads", "inconsistent_offsets", "duplicates",
    "aborted_reads", "unexpected", "indeterminate_committed", "indeterminate_lost",
)
"""report.json's counts as users read them: a new kind may come anywhere, none may move."""


def test_every_kind_is_one_complete_row():
    assert len(set(NAMES)) == len(set(anomalies.COUNTS)) == len(KINDS)
    for kind in KINDS:
        assert kind.help and callable(kind.check), kind.name
        assert kind.at and set(kind.at) <= set(checks.POSITIONS), kind.name
        assert kind.detail is None or kind.detail, kind.name
        assert kind.explained_by in (None, INCIDENT, RETRY), kind.name


def test_report_counts_and_help_come_from_the_table_in_its_order():
    derived = (*report.SEND_COUNTS, *anomalies.COUNTS, *report.INDETERMINATE_COUNTS)
    assert derived == report.COUNT_NAMES
    assert [c for c in report.COUNT_NAMES if c in REPORTED_COUNTS] == list(REPORTED_COUNTS)
    assert {k.count: k.help for k in KINDS}.items() <= report.COUNT_HELP.items()
    assert all(report.COUNT_HELP[name] for name in report.COUNT_NAMES)


@pytest.mark.parametrize("idempotent", [False, True])
@pytest.mark.parametrize("kind", KINDS, ids=NAMES)
def test_the_verdict_follows_each_kinds_row(kind, idempotent):
    none = dict.fromkeys(report.COUNT_NAMES, 0)
    counts = none | {kind.count: 1}
    if kind.loss:
        expected = "loss"
    elif kind.only_if_idempotent and not idempotent:
        expected = "clean"
    else:
        expected = "anomalies"
    assert anomalies.verdict(counts, idempotent) == expected
    assert anomalies.verdict(none, idempotent) == "clean"
    everything = dict.fromkeys(report.COUNT_NAMES, 1)
    assert anomalies.verdict(everything, idempotent) == (
        "loss" if any(k.loss for k in KINDS) else "anomalies")


def test_the_attribution_explains_the_kinds_the_table_says():
    by_incident = tuple(k.name for k in KINDS if k.explained_by == INCIDENT)
    by_retry = tuple(k.name for k in KINDS if k.explained_by == RETRY)
    assert (by_incident, by_retry) == (attribution.EXPLAINED_KINDS, attribution.RETRIED_KINDS)


def test_the_checkers_apply_every_row(spark):
    """classify flags every kind with its check, value_counts counts every kind counted over
    values, value_anomalies gives each a position and a detail: on an empty history, so that
    Spark resolves every row's columns."""
    positions = spark.createDataFrame(
        [], "value string, tk bigint, pos bigint, n_ok bigint, n_info bigint, n_sends bigint, "
            "drained tinyint, run_read tinyint, t_invoke double, t_acked double, "
            "t_read double")
    inconsistent = spark.createDataFrame([], "tk bigint, pos bigint")
    classified = checks.classify(positions, inconsistent)
    assert set(NAMES) <= set(classified.columns)
    assert dict(classified.dtypes)["lost"] == "boolean"
    counted = classified.agg(*checks.value_counts(classified)).columns
    assert [c for c in counted if c in anomalies.COUNTS] == [
        k.count for k in KINDS if k.counts_values]
    rows = checks.value_anomalies(classified, {})
    assert rows.columns[:4] == ["kind", "topic", "partition", "offset"] and rows.collect() == []


def test_the_docs_list_every_kind_with_its_count():
    rows = re.findall(r"^\| `(\w+)` \| `(\w+)` \|", DESIGN.read_text(), re.MULTILINE)
    assert rows == [(k.name, k.count) for k in KINDS]


def test_the_table_the_report_reads_needs_no_pyspark():
    """The runner prints the summary (report.py) where PySpark may not be installed."""
    code = ("import sys, undertow_analysis.report, undertow_analysis.html; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pyspark'))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert run.stdout.strip() == "[]"
