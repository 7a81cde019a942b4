"""The runner's HistoryWriter writes the files and fields of the history schema, and importing the
runner pulls in no Spark (the operator image, which runs it in Kubernetes, has none).

The writer does not check its lines at runtime (it is on the workload's hot path); these tests
do, and tests/analysis/test_real_history.py does for every line of a real run. On a full disk
it stops the history at the first line that does not fit (issue 22)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from small_disk import fill, mounted_tmpfs

from undertow.cluster_view import PartitionView
from undertow.runner.abort import Abort, HistoryWriteError
from undertow.runner.events import to_event
from undertow.runner.history import RESERVE_MIN_BYTES, RESERVE_NAME, HistoryWriter
from undertow.runner.sampler import to_sample
from undertow_history import schema


def test_the_writer_creates_every_json_lines_file_of_the_schema(tmp_path: Path) -> None:
    HistoryWriter(tmp_path).close()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f.filename for f in schema.FILES if f.json_lines)


def test_every_line_the_writer_writes_has_the_schema_fields_and_types(tmp_path: Path) -> None:
    writer = HistoryWriter(tmp_path)
    writer.send(producer="p0", value="p0-1", topic="t", partition=0, status="ok", offset=2**40,
                error=None, t_invoke=1763830000.1, t_complete=1763830000.2)
    # Never assigned a partition, no offset: the nullable fields as null.
    writer.send(producer="p1", value="p1-7", topic="t", partition=None, status="info",
                offset=None, error="_MSG_TIMED_OUT", t_invoke=1763830001.0, t_complete=1763830031.0)
    writer.read(consumer="drain", phase="drain", topic="t", partition=2, offset=5, value="p0-1",
                t=1763830040.0)
    writer.group(member="c1", member_id="c1-5e1c", generation=4, type="commit", topic="t",
                 partition=2, offset=6, status="ok", t_invoke=1763830041.0, t=1763830041.1)
    writer.group(member="c1", member_id=None, generation=None, type="assign", topic="t",
                 partition=2, t=1763830039.0)
    writer.transaction(producer="p2", txn="p2-t0", transactional_id="undertow-p2",
                       intent="commit", status="ok", error=None, values=["p2-0", "p2-1"],
                       t_begin=1763830000.0, t_end_invoke=1763830000.3,
                       t_complete=1763830000.4)
    writer.send(producer="p2", value="p2-0", topic="t", partition=1, status="ok", offset=7,
                error=None, t_invoke=1763830000.1, t_complete=1763830000.4, txn="p2-t0")
    writer.read(consumer="c0", phase="run", topic="t", partition=1, offset=7, value="p2-0",
                t=1763830000.5, isolation="read_committed")
    writer.fault(fault="partition", target="broker-0|broker-1,broker-2", role="split",
                 action="inject")
    # A node's event as it served it: the writer's line has every field, and the node.
    writer.event(to_event("broker-1", {
        "t": 1763830002.0, "type": "truncation", "topic": "t", "partition": 0, "broker": 1,
        "leader_epoch": 3, "from_offset": 12, "to_offset": 10, "reason": "offset_for_leader_epoch",
        "a_field_of_a_newer_broker": 1}))
    # KIP-966: the controller's ELR change keeps its ELR lists; a sample carries the ELR.
    writer.event(to_event("controller", {
        "t": 1763830003.0, "type": "elr_change", "topic": "t", "partition": 0,
        "leader_epoch": 4, "broker": 2, "elr": [2], "old_elr": [], "last_known_elr": [],
        "reason": "isr_below_min", "detail": "ISR [1] below min.insync.replicas 2: 2 joins"}))
    writer.cluster_sample(to_sample(PartitionView(
        topic="t", partition=0, leader=1, leader_epoch=4, isr=(1,), replicas=(1, 2, 3),
        elr=(2,)), 1763830003.1))
    writer.close()

    written = {f: [json.loads(line) for line in (tmp_path / f.filename).read_text().splitlines()]
               for f in schema.FILES if f.json_lines}
    assert {f.name: len(lines) for f, lines in written.items()} == {
        "sends": 3, "reads": 2, "groups": 2, "txns": 1, "faults": 1, "cluster": 1,
        "events": 2}
    elr_change = written[schema.EVENTS][1]
    assert (elr_change["type"], elr_change["elr"], elr_change["old_elr"],
            elr_change["last_known_elr"], elr_change["node"]) == (
        "elr_change", [2], [], [], "controller")
    assert (written[schema.CLUSTER][0]["elr"], written[schema.CLUSTER][0]["last_known_elr"]) \
        == ([2], [])
    for file, lines in written.items():
        for line in lines:
            assert file.problems(line) == [], (file.filename, line)


def test_importing_the_runner_imports_no_spark() -> None:
    code = ("import sys, undertow.runner.run; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'pyspark', 'py4j'}))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert run.stdout.strip() == "[]"


def test_the_first_failed_write_stops_the_history_and_the_last_meta_still_fits(
        tmp_path: Path) -> None:
    """On a real full file system: the write that does not fit is reported once, naming its
    file, and cut back, so every line left is whole; later lines are dropped without a second
    error; the last meta.json goes into the room the first one set aside."""
    with mounted_tmpfs(tmp_path / "disk", "1m") as disk:
        abort = Abort()
        history = disk / "history"
        writer = HistoryWriter(history, abort)
        writer.write_meta({"experiment": "e", "end": None})
        assert (history / RESERVE_NAME).stat().st_size >= RESERVE_MIN_BYTES
        fill(disk / "filler")
        sent = 0
        while not abort.is_set():  # the pages already allocated take a few lines more
            writer.send(producer="p0", value=f"p0-{sent}", topic="t", partition=0, status="ok",
                        offset=sent, error=None, t_invoke=1.0, t_complete=2.0)
            sent += 1
            assert sent < 100_000, "the full disk never refused a line"
        first = abort.reason
        assert isinstance(first, HistoryWriteError)
        assert str(first) == (f"history: could not write {history / 'sends.jsonl'}: "
                              f"[Errno 28] No space left on device")

        sizes = {p.name: p.stat().st_size for p in history.iterdir()}
        writer.send(producer="p0", value="late", topic="t", partition=0, status="ok", offset=0,
                    error=None, t_invoke=1.0, t_complete=2.0)
        writer.read(consumer="c0", phase="run", topic="t", partition=0, offset=0, value="p0-0",
                    t=1.0)
        writer.fault(fault="kill", target="broker-0", role="leader of t-0", action="recover")
        writer.cluster_sample({"t": 1.0})
        assert {p.name: p.stat().st_size for p in history.iterdir()} == sizes
        assert abort.reason is first

        values = [json.loads(line)["value"]
                  for line in (history / "sends.jsonl").read_text().splitlines()]
        assert values == [f"p0-{i}" for i in range(sent - 1)]

        writer.finish({"experiment": "e", "end": 3.0, "incomplete": True,
                       "incomplete_reason": str(first)})
        meta = json.loads((history / "meta.json").read_text())
        assert (meta["incomplete"], meta["incomplete_reason"]) == (True, str(first))
        assert sorted(p.name for p in history.iterdir()) == sorted(
            f.filename for f in schema.FILES)
        assert abort.reason is first


def test_a_meta_json_that_does_not_fit_is_the_failure(tmp_path: Path) -> None:
    """A disk full before the run: the first meta.json is the write that fails (the runner
    then refuses to start), and no half-written temporary file is left."""
    with mounted_tmpfs(tmp_path / "disk", "1m") as disk:
        fill(disk / "filler")
        abort = Abort()
        writer = HistoryWriter(disk / "history", abort)
        writer.write_meta({"experiment": "e", "spec": {"padding": "x" * 10_000}})
        writer.close()
        assert str(abort.reason) == (f"history: could not write {disk / 'history/meta.json'}: "
                                     f"[Errno 28] No space left on device")
        assert sorted(p.name for p in (disk / "history").iterdir()) == sorted(
            f.filename for f in schema.FILES if f.json_lines)
