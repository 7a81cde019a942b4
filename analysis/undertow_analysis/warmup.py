"""A warm-up for a session that will analyse a run's history once the run is over.

The first analysis on a new JVM costs several seconds more than the next ones: classes load,
the JIT compiles, and Spark generates and compiles the code of every stage (it caches the
classes by their source). A whole analysis of a tiny history shaped like the run's pays that
while the run is still going: the same topic and start time (literals in the generated code),
the same acks, and an incident (an acknowledged record truncated away after an election), so
that the attribution and the report's every part take the paths a real loss takes. A run
whose consumers are a consumer group (meta.json's consumer_group) gets a group history too,
with a committed offset lost and records re-delivered past it, so that the group checks are
warm as well; any other leaves groups.jsonl empty, as the run does.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from undertow_history.schema import EVENTS

WARM_UP_SECONDS = 15.0
"""The tiny history's length: long enough for every timed part of the report."""


def warm_up(spark: SparkSession, run_meta: Mapping[str, Any] | None,
            analyze: Callable[[SparkSession, str, str], Any]) -> None:
    """Run `analyze` once on a tiny history shaped like `run_meta` (the run's first
    meta.json; None: a generic one), in a temporary directory removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="undertow-warm-up-") as tmp:
        history = write_tiny_history(Path(tmp) / "history", run_meta or {})
        analyze(spark, str(history), str(Path(tmp) / "out"))


def write_tiny_history(directory: Path, run_meta: Mapping[str, Any]) -> Path:
    """A history of a few dozen lines: broker 1 leads; 10 records are acknowledged, read and
    drained; 3 more, acknowledged by broker 1 alone, are lost when broker 2 is elected after a
    kill and broker 1 truncates them; one send fails, one is indeterminate and one record is
    drained twice. With a consumer group, c0 is its member: it commits 10, the coordinator
    returns 8 after a rebalance, and c0 returns 8 and 9 again."""
    start = float(run_meta.get("start") or time.time())
    group = run_meta.get("consumer_group") if isinstance(run_meta.get("consumer_group"),
                                                         dict) else None
    spec = run_meta.get("spec")
    topic_spec = spec.get("topic") if isinstance(spec, dict) else None
    topic = topic_spec.get("name") if isinstance(topic_spec, dict) else None
    topic = topic if isinstance(topic, str) else "t"
    lines: dict[str, list[dict[str, Any]]] = {
        "sends": [], "reads": [], "groups": [], "txns": [], "faults": [], "cluster": [],
        "events": []}

    def read(value: str, offset: int, at: float, consumer: str = "c0") -> None:
        run = consumer != "drain"
        generation = (1 if at < REBALANCE_AT else 2) if group and run else None
        lines["reads"].append({"consumer": consumer, "phase": "run" if run else "drain",
                               "topic": topic, "partition": 0, "offset": offset,
                               "value": value, "t": start + at, "generation": generation,
                               "isolation": "read_committed"})

    def record(value: str, offset: int, t: float, *, drained: bool = True) -> None:
        lines["sends"].append(_send(value, topic, "ok", offset, start + t))
        if drained:
            read(value, offset, t + 0.5)
            read(value, offset, 14.0, "drain")

    def event(type_: str, t: float, node: str, **fields: Any) -> None:
        row = {**dict.fromkeys(EVENTS.names), "topic": topic, "partition": 0}
        row.update(t=start + t, node=node, type=type_, **fields)
        lines["events"].append(row)

    event("become_leader", 0.1, "broker-1", broker=1, leader_epoch=0, log_end_offset=0,
          high_watermark=0, isr=[1, 2, 3])
    for i in range(10):
        record(f"p0-{i}", i, 1 + i * 0.1)
    for i in range(10, 13):
        record(f"p1-{i}", i, 5.0, drained=False)
    lines["sends"] += [_send("p0-10", topic, "fail", None, start + 5.2),
                       _send("p0-11", topic, "info", None, start + 5.3)]
    lines["faults"] += [
        {"fault": "kill", "target": "broker-1", "role": f"leader of {topic}-0",
         "action": action, "t": start + t}
        for action, t in (("inject", 5.5), ("heal", 10.5), ("recover", 11.0))]
    event("broker_fenced", 6.0, "controller", topic=None, partition=None, broker=1,
          broker_epoch=3, reason="session_expired")
    event("leader_election", 6.0, "controller", leader_epoch=1, leader=2, previous_leader=1,
          kind="clean", reason="leader_fenced", isr=[1, 2, 3])
    event("become_leader", 6.1, "broker-2", broker=2, leader_epoch=1, log_end_offset=10,
          high_watermark=10, isr=[2, 3])
    for i in range(10, 13):
        record(f"p2-{i}", i, 7.0)
    record("p2-13", 13, 7.5)  # written twice: a duplicate, drained at 13 and 14
    lines["reads"].append({**lines["reads"][-1], "offset": 14})
    event("truncation", 12.0, "broker-1", broker=1, leader_epoch=1, from_offset=13,
          to_offset=10, reason="offset_for_leader_epoch")
    if group is not None:
        lines["groups"] = _group_lines(topic, start)
        for i in (8, 9):
            read(f"p0-{i}", i, REBALANCE_AT + 0.2)
        offsets = {"topic": group.get("offsets_topic"), "partition": group.get(
            "offsets_partition")}
        event("become_leader", 0.1, "broker-1", broker=1, leader_epoch=0, log_end_offset=0,
              high_watermark=0, isr=[1, 2, 3], **offsets)
        event("coordinator_load", 0.2, "broker-1", broker=1, leader_epoch=0, log_end_offset=0,
              **offsets)
        for type_, t, generation in (("group_rebalance", 6.5, 1), ("group_stable", 7.0, 2)):
            event(type_, t, "broker-1", topic=None, partition=None, broker=1,
                  group=group.get("group_id"), generation=generation)
    for t, leader, epoch, isr in ((1.0, 1, 0, [1, 2, 3]), (5.8, -1, 0, [2, 3]),
                                  (6.5, 2, 1, [2, 3]), (12.5, 2, 1, [1, 2, 3])):
        lines["cluster"].append({"t": start + t, "topic": topic, "partition": 0,
                                 "leader": leader, "leader_epoch": epoch, "isr": isr,
                                 "high_watermark": 0,
                                 "log_end_offsets": {str(b): 0 for b in isr},
                                 "elr": [], "last_known_elr": [],
                                 "leader_recovery_state": "RECOVERED",
                                 "last_stable_offset": 0})

    directory.mkdir(parents=True)
    meta = {**run_meta, "start": start, "end": start + WARM_UP_SECONDS, "incomplete": False,
            "incomplete_reason": None, "faults_skipped": [],
            "consumers_not_closed": [],
            "transactions": run_meta.get("transactions"),
            "pipeline": None}  # no transaction planted: the pipeline's checks never run
    (directory / "meta.json").write_text(json.dumps(meta))
    for name, rows in lines.items():
        (directory / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return directory


REBALANCE_AT = 7.0
"""When the warm-up's consumer group, if any, is in its second generation."""


def _group_lines(topic: str, start: float) -> list[dict[str, Any]]:
    """c0 assigned partition 0 (generation 1), committing 10, and assigned it again
    (generation 2) to be given 8."""
    lines = []
    for type_, t, generation, offset, status in (
            ("assign", 0.5, 1, None, None), ("committed", 0.6, 1, None, None),
            ("commit", 3.0, 1, 10, "ok"), ("revoke", 6.5, 1, None, None),
            ("assign", REBALANCE_AT, 2, None, None), ("committed", REBALANCE_AT + 0.1, 2, 8,
                                                      None)):
        lines.append({"member": "c0", "member_id": f"c0-{generation}",
                      "generation": generation, "type": type_, "topic": topic, "partition": 0,
                      "offset": offset, "status": status, "error": None,
                      "t_invoke": start + t - 0.05 if type_ == "commit" else None,
                      "t": start + t})
    return lines


def _send(value: str, topic: str, status: str, offset: int | None, t: float
          ) -> dict[str, Any]:
    return {"producer": value.split("-")[0], "value": value, "topic": topic,
            "partition": 0 if status == "ok" else None, "status": status, "offset": offset,
            "error": {"ok": None, "fail": "NOT_ENOUGH_REPLICAS"}.get(status, "REQUEST_TIMED_OUT"),
            "t_invoke": t,
            "t_complete": t + 0.01, "txn": None}
