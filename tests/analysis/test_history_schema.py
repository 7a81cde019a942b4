"""The one history schema: the doc's tables are generated from it, a record's problems are found
as Spark's JSON reader would find them, the analysis reads only the fields it needs, and the
analysis package (its own image) needs nothing of the runner."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from undertow_analysis import io
from undertow_history import schema

DOC = Path(__file__).resolve().parents[2] / "docs" / "history-format.md"
FILES = {f.name: f for f in schema.FILES}


def test_the_doc_tables_are_the_schema() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert schema.render_doc(text) == text, (
        "docs/history-format.md's field tables differ from undertow_history/schema.py: run "
        ".venv/bin/python -m undertow_history.schema docs/history-format.md")


def test_a_drifted_or_missing_table_is_found() -> None:
    text = DOC.read_text(encoding="utf-8")
    drifted = text.replace("| `high_watermark` | long | yes |", "| `high_watermark` | int | no |")
    assert drifted != text and schema.render_doc(drifted) == text
    start = text.index("<!-- fields of faults.jsonl")
    end = text.index("<!-- end of fields -->", start) + len("<!-- end of fields -->")
    with pytest.raises(ValueError, match=r"without exactly one table: \[.faults\.jsonl.\]"):
        schema.render_doc(text[:start] + text[end:])


SAMPLE = {"t": 1.5, "topic": "t", "partition": 0, "leader": -1, "leader_epoch": 3,
          "isr": [1, 2], "high_watermark": None, "log_end_offsets": {"1": 120},
          "elr": [3], "last_known_elr": [], "leader_recovery_state": None,
          "last_stable_offset": None}


@pytest.mark.parametrize(("change", "problem"), [
    ({}, None),
    ({"t": 2}, None),  # a JSON integer is a number
    ({"topic": 1}, "field 'topic' must be a string"),
    ({"partition": 2**31}, "field 'partition' must be a 32-bit integer"),
    ({"partition": 1.0}, "field 'partition' must be a 32-bit integer"),
    ({"leader": True}, "field 'leader' must be a 32-bit integer"),
    ({"leader_epoch": None}, "field 'leader_epoch' must not be null"),
    ({"high_watermark": "7"}, "field 'high_watermark' must be a 64-bit integer or null"),
    ({"isr": [1, None]}, "field 'isr' must be an array of ints"),
    ({"log_end_offsets": {"1": 1.5}}, "field 'log_end_offsets' must be an object of longs"),
    ({"extra": 1}, "field 'extra' is not in the schema"),
    # KIP-966's fields: null is allowed (a controller from before them), not another type.
    ({"elr": None, "last_known_elr": None}, None),
    ({"elr": [], "last_known_elr": [1]}, None),
    ({"elr": [1, "2"]}, "field 'elr' must be an array of ints or null"),
    ({"last_known_elr": 1}, "field 'last_known_elr' must be an array of ints or null"),
])
def test_problems_of_a_cluster_sample(change: dict, problem: str | None) -> None:
    assert schema.CLUSTER.problems(SAMPLE | change) == ([problem] if problem else [])


def test_a_cluster_sample_without_the_elr_fields_misses_them() -> None:
    """The runner writes every field; an older history's lines lack KIP-966's, which the
    analysis then reads as null."""
    old = {k: v for k, v in SAMPLE.items() if k not in ("elr", "last_known_elr")}
    assert schema.CLUSTER.problems(old) == ["field 'elr' is missing",
                                            "field 'last_known_elr' is missing"]
    assert schema.CLUSTER.problems(old, partial=True) == []


EVENT = dict.fromkeys(schema.EVENTS.names) | {"t": 1.0, "node": "controller"}


@pytest.mark.parametrize(("change", "problem"), [
    ({"type": "elr_change", "topic": "t", "partition": 0, "leader_epoch": 4, "broker": 2,
      "elr": [2, 3], "old_elr": [3], "last_known_elr": [], "reason": "isr_below_min"}, None),
    ({"type": "elr_change", "topic": "t", "partition": 0, "leader_epoch": 5, "broker": 1,
      "elr": [], "old_elr": [1], "last_known_elr": [1], "reason": "unclean_shutdown"}, None),
    ({"type": "leader_election", "kind": "elr", "reason": "broker_unfenced"}, None),
    ({"type": "leader_election", "kind": "last_known_leader", "reason": "broker_unfenced"},
     None),
    ({"type": "leader_election", "kind": "clean", "reason": "unclean_shutdown"}, None),
    ({"type": "isr_change", "isr": [2], "old_isr": [1, 2], "reason": "unclean_shutdown"},
     None),
    ({"type": "leader_election", "kind": "eligible"},
     "field 'kind' must be one of clean, unclean, preferred, offline, elr, last_known_leader"),
    ({"type": "elr_change", "elr": [1.5]}, "field 'elr' must be an array of ints or null"),
    ({"type": "elr_changed"}, "field 'type' must be one of " + ", ".join(schema.EVENT_TYPES)),
])
def test_problems_of_a_kip_966_event(change: dict, problem: str | None) -> None:
    assert schema.EVENTS.problems(EVENT | change) == ([problem] if problem else [])


def test_a_missing_field_and_a_value_outside_its_set_are_problems() -> None:
    send = {"producer": "p0", "value": "p0-1", "topic": "t", "status": "maybe", "offset": None,
            "error": None, "t_invoke": 1.0, "t_complete": 2.0, "txn": None}
    assert schema.SENDS.problems(send) == ["field 'partition' is missing",
                                           "field 'status' must be one of ok, fail, info"]
    assert schema.SENDS.problems({"status": "ok"}, partial=True) == []
    # meta.json is open: the runner's extra context is no problem.
    meta = {"experiment": "e", "spec": {}, "seed": 2**40, "start": 1.0, "end": None,
            "idempotent": False, "expect": "clean", "incomplete": False,
            "incomplete_reason": None, "consumer_group": None, "faults_skipped": [],
            "consumers_not_closed": [],
            "transactions": None, "pipeline": None, "plan": []}
    assert schema.META.problems(meta) == []


def test_the_analysis_parses_only_the_fields_it_uses() -> None:
    """Parsing is most of the job's cost: the Spark schemas are projections of the history
    schema, with its types."""
    unused = {"sends": {"producer", "error"}, "reads": set(),
              "groups": {"member_id", "error"}, "faults": set(),
              "txns": {"offsets"},
              "cluster": {"leader_epoch", "log_end_offsets", "last_known_elr",
                          "leader_recovery_state"},
              "events": {"detail", "old_isr", "broker_epoch", "high_watermark", "members",
                         "member", "elr", "old_elr", "last_known_elr"}}
    for name, spec in io.FILES.items():
        file = FILES[name]
        assert set(spec.schema.names) == set(file.names) - unused[name], name
        assert all(f.dataType == io.spark_type(file.field(f.name).type)
                   for f in spec.schema.fields), name
    assert io.FILES["sends"].allowed == {"status": ("ok", "fail", "info")}


@pytest.mark.parametrize(("change", "message"), [
    ({"idempotent": "yes"}, "field 'idempotent' must be true or false"),
    ({"idempotent": 1}, "field 'idempotent' must be true or false"),
    ({"start": None}, "field 'start' must not be null"),
    ({"start": "1"}, "field 'start' must be a number"),
    ({"expect": "maybe"}, "field 'expect' must be one of clean, anomalies, loss"),
    ({"spec": []}, "field 'spec' must be a JSON object"),
])
def test_a_meta_field_the_analysis_reads_must_have_its_type(
        spark, tmp_path: Path, change: dict, message: str) -> None:
    meta = {"experiment": "e", "spec": {}, "seed": 1, "start": 1.0, "end": 2.0,
            "idempotent": False, "expect": "clean"}
    unread = meta | {"seed": "not read by the analysis"}
    (tmp_path / "meta.json").write_text(json.dumps(unread))
    assert io.read_meta(spark, str(tmp_path)) == unread
    (tmp_path / "meta.json").write_text(json.dumps(meta | change))
    with pytest.raises(ValueError, match=message):
        io.read_meta(spark, str(tmp_path))


def test_the_analysis_imports_nothing_of_the_runner() -> None:
    """The analysis image copies analysis/undertow_analysis alone and installs only PySpark and
    matplotlib: the job and the schema must import neither the runner nor the broker."""
    code = ("import sys, undertow_analysis.job, undertow_analysis.__main__; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'undertow', 'minibroker'}))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert run.stdout.strip() == "[]"


def test_the_hand_built_and_scaled_histories_are_in_the_schema(tmp_path: Path) -> None:
    """The analysis tests and benchmarks feed histories they write themselves: those must be
    histories the runner could have written, or the tests prove nothing about real runs."""
    from analysis_histories import (
        clean_history,
        group_history,
        pipeline_history,
        planted_history,
        txn_history,
    )
    from history_builder import HistoryBuilder
    from scaled_history import write_scaled_history

    written = [planted_history().write(tmp_path / "planted"),
               clean_history(idempotent=True).write(tmp_path / "clean"),
               group_history().write(tmp_path / "group"),
               txn_history().write(tmp_path / "txn"),
               pipeline_history().write(tmp_path / "pipeline")]
    write_scaled_history(tmp_path / "scaled", 500, plant_every=101)
    write_scaled_history(tmp_path / "scaled-group", 500, plant_every=101, group=True)
    written += [tmp_path / "scaled", tmp_path / "scaled-group"]
    with_events = HistoryBuilder()
    with_events.event("truncation", t=1.0, node="broker-1", broker=1, leader_epoch=1,
                      from_offset=12, to_offset=10, reason="offset_for_leader_epoch")
    with_events.event("group_stable", t=2.0, node="broker-1", topic=None, partition=None,
                      broker=1, group="g", generation=3, members=["c0-3", "c1-3"])
    with_events.event("elr_change", t=3.0, node="controller", leader_epoch=2, broker=1,
                      elr=[1], old_elr=[], last_known_elr=[], reason="isr_below_min")
    with_events.event("leader_election", t=4.0, node="controller", leader_epoch=3, leader=1,
                      previous_leader=-1, kind="elr", reason="broker_unfenced", isr=[])
    with_events.sample(t=4.0, partition=0, leader=1, isr=[1], elr=[2])
    written.append(with_events.write(tmp_path / "events"))
    for directory in written:
        for file in schema.FILES:
            if file in (schema.EVENTS, schema.GROUPS, schema.TXNS) \
                    and not (directory / file.filename).exists():
                continue  # optional: a history from before events, without a group or
                # transactions
            text = (directory / file.filename).read_text()
            records = ([json.loads(line) for line in text.splitlines()] if file.json_lines
                       else [json.loads(text)])
            for record in records:
                assert not file.problems(record), (directory.name, file.filename, record)
