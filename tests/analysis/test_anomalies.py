"""The table of anomaly kinds is the one source of every list of kinds: counts, help, verdict,
the checkers' flags and counts, the attribution, the docs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from undertow_analysis import anomalies, attribution, checks, groups, offsets, report
from undertow_analysis.anomalies import FINDING, INCIDENT, KINDS, OFFSETS, RETRY
from undertow_analysis.io import FILES

DESIGN = Path(__file__).resolve().parents[2] / "docs" / "design.md"
REPORTED_COUNTS = (
    "attempted", "acked", "failed", "indeterminate",
    "lost", "misplaced", "phantom_reads", "inconsistent_offsets", "duplicates",
    "aborted_reads", "unexpected", "indeterminate_committed", "indeterminate_lost",
)
"""report.json's counts as users read them: a new kind may come anywhere, none may move."""
GROUP_COUNTS = ("skipped", "committed_offsets_lost", "redelivered_past_commit",
                "non_monotonic_polls")
TXN_COUNTS = ("reads_past_lso", "torn_transactions", "hanging_transactions",
              "duplicate_outputs", "missing_outputs")
TIMES = ("t_invoke", "t_acked", "t_read", "t_commit")  # anomalies/'s times (`FINDING`)


def test_every_kind_is_one_complete_row():
    assert len({k.name for k in KINDS}) == len(set(anomalies.COUNTS)) == len(KINDS)
    assert sorted(anomalies.VALUE_KINDS + anomalies.GROUP_KINDS + anomalies.TXN_KINDS,
                  key=KINDS.index) == list(KINDS)
    for kind in KINDS:
        assert kind.help, kind.name
        assert callable(kind.check) != callable(kind.checker), kind.name
        if kind.check:
            assert kind.at and set(kind.at) <= set(checks.POSITIONS), kind.name
            assert kind.detail is None or kind.detail, kind.name
        else:
            assert not kind.at and kind.detail is None and not kind.counts_by_value, kind.name
        assert kind.explained_by in (None, INCIDENT, RETRY, OFFSETS), kind.name
        assert {kind.held_at, kind.fault_at} <= set(TIMES), kind.name


def test_a_row_with_both_checks_or_neither_is_refused():
    with pytest.raises(ValueError, match="either a value check with its position"):
        anomalies.Kind("both", "both", loss=False, help="?", check=anomalies.lost,
                       at=("acked_at",), checker=anomalies.non_monotonic_poll)
    with pytest.raises(ValueError, match="either a value check with its position"):
        anomalies.Kind("none", "none", loss=False, help="?")
    with pytest.raises(ValueError, match="either a value check with its position"):
        anomalies.Kind("nowhere", "nowhere", loss=False, help="?", check=anomalies.lost)


def test_report_counts_and_help_come_from_the_table_in_its_order():
    derived = (*report.SEND_COUNTS, *anomalies.COUNTS, *report.INDETERMINATE_COUNTS)
    assert derived == report.COUNT_NAMES
    assert [c for c in report.COUNT_NAMES if c in REPORTED_COUNTS] == list(REPORTED_COUNTS)
    # The consumer group's counts, then the transactions', come after the record anomalies'.
    after_unexpected = REPORTED_COUNTS.index("unexpected") + 1
    assert (*REPORTED_COUNTS[:after_unexpected], *GROUP_COUNTS, *TXN_COUNTS,
            *REPORTED_COUNTS[after_unexpected:]) == report.COUNT_NAMES
    assert {k.count: k.help for k in KINDS}.items() <= report.COUNT_HELP.items()
    assert all(report.COUNT_HELP[name] for name in report.COUNT_NAMES)


@pytest.mark.parametrize("idempotent", [False, True])
@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
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


def test_the_group_kinds_verdicts():
    """A record the group skipped and an acknowledged commit lost are loss; a re-delivery
    past a commit and a poll going back are anomalies."""
    none = dict.fromkeys(report.COUNT_NAMES, 0)
    verdicts = {name: anomalies.verdict(none | {name: 3}, idempotent=False)
                for name in GROUP_COUNTS}
    assert verdicts == {"skipped": "loss", "committed_offsets_lost": "loss",
                        "redelivered_past_commit": "anomalies", "non_monotonic_polls": "anomalies"}


def test_the_attribution_explains_the_kinds_the_table_says():
    by_incident = tuple(k.name for k in KINDS if k.explained_by == INCIDENT)
    by_retry = tuple(k.name for k in KINDS if k.explained_by == RETRY)
    by_offsets = tuple(k.name for k in KINDS if k.explained_by == OFFSETS)
    assert (by_incident, by_retry, by_offsets) == (
        attribution.EXPLAINED_KINDS, attribution.RETRIED_KINDS, offsets.LOST_KINDS)
    assert by_incident == ("lost", "misplaced", "phantom_read", "skipped")
    assert by_offsets == ("committed_offset_lost",)


def test_the_checkers_apply_every_row(spark):
    """classify flags every kind with its check, value_counts counts every kind counted over
    values, value_anomalies gives each a position and a detail: on an empty history, so that
    Spark resolves every row's columns."""
    positions = spark.createDataFrame([], POSITIONS_SCHEMA)
    inconsistent = spark.createDataFrame([], "tk bigint, pos bigint")
    classified = checks.classify(positions, inconsistent)
    assert {k.name for k in anomalies.VALUE_KINDS} <= set(classified.columns)
    assert dict(classified.dtypes)["lost"] == "boolean"
    counted = classified.agg(*checks.value_counts(classified)).columns
    assert [c for c in counted if c in anomalies.COUNTS] == [
        k.count for k in KINDS if k.counts_by_value]
    rows = checks.value_anomalies(classified, {})
    assert rows.columns == ["kind", *FINDING] and rows.collect() == []


def test_the_group_checkers_apply_every_row(spark):
    """Each group checker gives anomalies/'s columns, on an empty group history."""
    reads = spark.createDataFrame([], FILES["reads"].schema).select(
        F.col("consumer").alias("member"), *groups.MEMBER_READ[1:],
        F.struct(F.lit(0).alias("split"), F.lit(0).alias("rank")).alias("line"))
    empty = anomalies.Group(reads=reads, actions=spark.createDataFrame([], FILES["groups"].schema),
                            start=0.0)
    found = groups.findings(empty)
    assert found.columns == ["kind", *FINDING] and found.collect() == []
    classified = checks.classify(spark.createDataFrame([], POSITIONS_SCHEMA),
                                 spark.createDataFrame([], "tk bigint, pos bigint"),
                                 groups.committed_positions(empty.actions))
    assert dict(classified.dtypes)["skipped"] == "boolean" and classified.collect() == []


POSITIONS_SCHEMA = ("value string, tk bigint, pos bigint, n_ok bigint, n_info bigint, "
                    "n_sends bigint, drained tinyint, run_read tinyint, t_invoke double, "
                    "t_acked double, t_read double")


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
