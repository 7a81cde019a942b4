"""The pre-started analysis's parts that need no run: the tiny history of the warm-up (valid,
and a loss, so that the warm-up takes a real loss's paths), the bounded wait for a run to close
its history, and the JVM set up for a small run. `undertow run` with the pre-started analysis,
killed or not: tests/runner/test_analysis_prestart.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from undertow_analysis.job import analyze
from undertow_analysis.prestart import HistoryNotClosed, wait_until_closed
from undertow_analysis.session import SMALL_RUN_SENDS, session_conf
from undertow_analysis.warmup import write_tiny_history
from undertow_history import schema

RUN_META = {"experiment": "acks1-leader-kill", "start": 1_763_830_000.0, "end": None,
            "spec": {"topic": {"name": "acks1"}, "workload": {"acks": "1"}}, "seed": 7,
            "idempotent": False, "expect": "loss", "incomplete": False,
            "incomplete_reason": None, "consumer_group": None}
GROUP = {"group_id": "g", "offsets_topic": "__consumer_offsets", "offsets_partition": 7}


@pytest.mark.parametrize("group", [None, GROUP], ids=["assign", "subscribe"])
def test_the_warm_up_history_is_valid_and_loses_what_it_plants(spark, tmp_path: Path,
                                                               group: dict | None) -> None:
    history = write_tiny_history(tmp_path / "history", RUN_META | {"consumer_group": group})
    for file in schema.FILES:
        text = (history / file.filename).read_text()
        rows = [json.loads(line) for line in text.splitlines()] if file.json_lines else [
            json.loads(text)]
        # The warm-up plants no transaction: a run with them warms up without their checks.
        assert rows or (file is schema.GROUPS and group is None) or file is schema.TXNS, \
            file.filename
        assert [p for r in rows for p in file.problems(r)] == [], file.filename

    report = analyze(spark, str(history), str(tmp_path / "out"))
    assert (report["verdict"], report["counts"]["lost"], report["experiment"]) == (
        "loss", 3, "acks1-leader-kill")
    assert report["counts"]["duplicates"] == len(report["explained"]["duplicates"]) == 1
    assert report["run"]["start"] == RUN_META["start"]  # the run's literals, the run's code
    # A consumer group's warm-up loses a committed offset (its own incident) and re-delivers.
    found = (report["counts"]["committed_offsets_lost"],
             report["counts"]["redelivered_past_commit"], report["explained"]["incident_count"])
    assert found == ((1, 2, 2) if group else (0, 0, 1))


def write_meta(history: Path, **fields: object) -> None:
    history.mkdir(exist_ok=True)
    (history / "meta.json").write_text(json.dumps({**RUN_META, **fields}))


def test_the_wait_ends_when_the_run_closes_its_history(spark, tmp_path: Path) -> None:
    history = tmp_path / "history"
    write_meta(history, end=RUN_META["start"] + 40)
    started = time.monotonic()
    wait_until_closed(spark, str(history), started + 30)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("meta", [False, True])
def test_a_history_never_closed_is_a_clear_error_at_the_deadline(spark, tmp_path: Path,
                                                                   meta: bool) -> None:
    history = tmp_path / "history"
    if meta:
        write_meta(history)
    started = time.monotonic()
    with pytest.raises(HistoryNotClosed, match="was not closed in the time given") as caught:
        wait_until_closed(spark, str(history), started + 1)
    assert 1 <= time.monotonic() - started < 10
    assert ("meta.json's end is still null" if meta else "no meta.json") in str(caught.value)


def test_a_small_planned_run_gets_a_jvm_for_small_jobs(no_class_archive) -> None:
    small = session_conf("local[*]", planned_sends=SMALL_RUN_SENDS)
    assert small["spark.driver.extraJavaOptions"] == (
        "-XX:+UseParallelGC -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m "
        "-XX:CompileThresholdScaling=0.1")
    for conf in (session_conf("local[*]", planned_sends=SMALL_RUN_SENDS + 1),
                 session_conf("local[*]")):
        assert conf["spark.driver.extraJavaOptions"] == "-XX:+UseParallelGC"
    assert "spark.driver.extraJavaOptions" not in session_conf("spark://head:7077",
                                                               planned_sends=10)
