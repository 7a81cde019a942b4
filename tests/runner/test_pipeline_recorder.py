"""What a pipeline member process reports becomes history lines (`runner.pipeline`), and a
member that dies with its transaction open has it ended by the recorder: `fail` before the
commit was called (the coordinator can only abort it), `info` after."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from undertow.runner.history import HistoryWriter
from undertow.runner.pipeline import DIED, MemberRecorder
from undertow.runner.pipeline_member import output_value


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def feed(recorder: MemberRecorder, *messages: dict) -> None:
    for message in messages:
        recorder.line(json.dumps(message))


def transaction(txn: str, *, ending: bool) -> list[dict]:
    """Member c0.1 reads in-0@4 and @5, sends their outputs in `txn` (one acknowledged at
    out-0@7), and, when `ending`, calls the commit with offset 6."""
    out = [output_value(f"p0-{i}", txn) for i in (4, 5)]
    messages = [
        {"k": "read", "partition": 0, "offset": 4, "value": "p0-4", "t": 1.0, "generation": 3},
        {"k": "begin", "txn": txn, "t_begin": 1.0},
        {"k": "send", "txn": txn, "value": out[0], "partition": 0, "t_invoke": 1.1},
        {"k": "read", "partition": 0, "offset": 5, "value": "p0-5", "t": 1.2, "generation": 3},
        {"k": "send", "txn": txn, "value": out[1], "partition": 0, "t_invoke": 1.2},
        {"k": "acked", "value": out[0], "offset": 7, "error": None},
    ]
    if ending:
        messages.append({"k": "ending", "txn": txn, "intent": "commit", "t_end_invoke": 1.5,
                         "offsets": {"0": 6}})
    return messages


@pytest.fixture
def recorded(tmp_path: Path):
    history = HistoryWriter(tmp_path / "history")
    sends: list[dict] = []

    def record(send: dict) -> None:
        sends.append(send)
        history.send(**send)

    recorder = MemberRecorder("c0.1", "undertow-pipeline-c0", "in", "out", history, record)
    yield recorder, history, tmp_path / "history"
    history.close()


def test_a_committed_transaction_writes_its_sends_its_line_and_its_offset_commit(recorded):
    recorder, history, directory = recorded
    feed(recorder, *transaction("c0.1-t0", ending=True),
         {"k": "acked", "value": output_value("p0-5", "c0.1-t0"), "offset": 8, "error": None},
         {"k": "end", "txn": "c0.1-t0", "status": "ok", "error": None, "t_complete": 1.6})
    history.close()
    assert [(r["consumer"], r["topic"], r["offset"], r["generation"], r["isolation"])
            for r in lines(directory / "reads.jsonl")] == [
        ("c0.1", "in", 4, 3, "read_committed"), ("c0.1", "in", 5, 3, "read_committed")]
    assert [(s["value"], s["topic"], s["status"], s["offset"], s["txn"])
            for s in lines(directory / "sends.jsonl")] == [
        ("p0-4/c0.1-t0", "out", "ok", 7, "c0.1-t0"), ("p0-5/c0.1-t0", "out", "ok", 8, "c0.1-t0")]
    [txn] = lines(directory / "txns.jsonl")
    assert (txn["producer"], txn["transactional_id"], txn["status"], txn["offsets"],
            txn["values"]) == ("c0.1", "undertow-pipeline-c0", "ok", {"0": 6},
                               ["p0-4/c0.1-t0", "p0-5/c0.1-t0"])
    [commit] = lines(directory / "groups.jsonl")
    assert (commit["member"], commit["type"], commit["topic"], commit["partition"],
            commit["offset"], commit["status"], commit["t_invoke"], commit["t"]) == (
        "c0.1", "commit", "in", 0, 6, "ok", 1.5, 1.6)
    assert not recorder.mid_transaction()


def test_a_member_killed_before_its_commit_was_called_aborted_its_transaction(recorded):
    recorder, history, directory = recorded
    feed(recorder, *transaction("c0.1-t1", ending=False))
    assert recorder.mid_transaction()
    recorder.died(2.0)
    history.close()
    [txn] = lines(directory / "txns.jsonl")
    assert (txn["status"], txn["error"], txn["t_end_invoke"], txn["offsets"],
            txn["t_complete"]) == ("fail", DIED, None, None, 2.0)
    assert {(s["status"], s["offset"]) for s in lines(directory / "sends.jsonl")} == {
        ("fail", None)}
    assert lines(directory / "groups.jsonl") == []  # no offsets were sent


def test_a_member_killed_after_its_commit_was_called_left_it_indeterminate(recorded):
    recorder, history, directory = recorded
    feed(recorder, *transaction("c0.1-t2", ending=True))
    assert not recorder.mid_transaction()  # its end was called: no longer mid-transaction
    recorder.died(2.0)
    history.close()
    [txn] = lines(directory / "txns.jsonl")
    assert (txn["status"], txn["error"], txn["offsets"]) == ("info", DIED, {"0": 6})
    assert {(s["status"], s["offset"]) for s in lines(directory / "sends.jsonl")} == {
        ("info", None)}
    [commit] = lines(directory / "groups.jsonl")
    assert (commit["status"], commit["error"], commit["offset"]) == ("info", DIED, 6)


def test_a_member_that_died_between_transactions_leaves_nothing_to_end(recorded):
    recorder, history, directory = recorded
    feed(recorder, *transaction("c0.1-t3", ending=True),
         {"k": "end", "txn": "c0.1-t3", "status": "ok", "error": None, "t_complete": 1.6})
    recorder.died(2.0)
    history.close()
    assert [t["status"] for t in lines(directory / "txns.jsonl")] == ["ok"]
