"""`HistoryBuilder`: a small history in the format of docs/history-format.md, written record
by record, so that a test can plant each anomaly by hand and know every expected count without
running the checker. (The benchmarks' generator of millions of sends is
`benchmarks/scaled_history.py`.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from undertow_history.schema import EVENTS

START = 1_763_830_000.0
EVENT_FIELDS = EVENTS.names


@dataclass
class HistoryBuilder:
    """A small history written record by record; times are seconds after `start`."""

    start: float = START
    duration: float = 60.0
    idempotent: bool = False
    expect: str = "clean"
    experiment: str = "synthetic"
    sends: list[dict] = field(default_factory=list)
    reads: list[dict] = field(default_factory=list)
    faults: list[dict] = field(default_factory=list)
    cluster: list[dict] = field(default_factory=list)
    events: list[dict] | None = None  # None: no events.jsonl (a history from before them)
    acks: str = "all"
    drain: dict[str, dict] | None = None  # meta.json's drain (partition -> end, read_to)
    groups: list[dict] | None = None  # None: no groups.jsonl (an assign-mode run)
    consumer_group: dict | None = None  # meta.json's consumer_group
    txns: list[dict] | None = None  # None: no txns.jsonl (no transactional producer)
    transaction_timeout_s: float | None = None  # meta.json's transactions.timeout_s
    pipeline: tuple[str, str] | None = None  # meta.json's pipeline: (input, output topic)

    def send(
        self,
        value: str,
        status: str = "ok",
        *,
        t: float,
        partition: int | None = 0,
        offset: int | None = None,
        latency: float = 0.010,
        topic: str = "t",
        error: str | None = None,
        txn: str | None = None,
    ) -> None:
        """One send attempt of `value`, invoked at `t` and completed `latency` later (in
        transaction `txn`: its status is the transaction's outcome)."""
        self.sends.append({
            "producer": value.split("-")[0],
            "value": value,
            "topic": topic,
            "partition": partition,
            "status": status,
            "offset": offset if status == "ok" else None,
            "error": error,
            "t_invoke": self.start + t,
            "t_complete": self.start + t + latency,
            "txn": txn,
        })

    def read(
        self,
        value: str,
        partition: int,
        offset: int,
        *,
        phase: str = "drain",
        t: float | None = None,
        topic: str = "t",
        consumer: str | None = None,
        isolation: str | None = None,
    ) -> None:
        """One record a consumer returned (by default c0 during the run, the drain after
        it); drain reads default to the end of the run."""
        when = self.duration + 1.0 if t is None else t
        self.reads.append({
            "consumer": consumer or ("drain" if phase == "drain" else "c0"),
            "phase": phase,
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "value": value,
            "t": self.start + when,
            "generation": None,
            "isolation": isolation,
        })

    def transaction(self, txn: str, values: list[str], status: str, *, t_begin: float,
                    t_end_invoke: float | None, t_complete: float,
                    intent: str = "commit", error: str | None = None,
                    offsets: dict[str, int] | None = None) -> None:
        """One txns.jsonl line: transaction `txn` of producer `txn`'s prefix, its values
        (their sends are the caller's), its outcome and times (a pipeline member's: the input
        offsets committed with it)."""
        if self.txns is None:
            self.txns = []
        producer = txn.rsplit("-t", 1)[0]
        self.txns.append({
            "producer": producer, "txn": txn, "transactional_id": f"undertow-{producer}",
            "intent": intent, "status": status, "error": error, "values": values,
            "t_begin": self.start + t_begin,
            "t_end_invoke": None if t_end_invoke is None else self.start + t_end_invoke,
            "t_complete": self.start + t_complete, "offsets": offsets})

    def poll(self, member: str, value: str, partition: int, offset: int, *, generation: int,
             t: float, topic: str = "t") -> None:
        """One record a member of the consumer group returned, in its generation."""
        self.read(value, partition, offset, phase="run", t=t, topic=topic)
        self.reads[-1].update(consumer=member, generation=generation)

    def group(self, member: str, type_: str, partition: int, *, t: float,
              generation: int | None = None, offset: int | None = None,
              status: str | None = None, error: str | None = None,
              t_invoke: float | None = None, topic: str = "t") -> None:
        """One groups.jsonl line: a member's assign, revoke, committed or commit."""
        if self.groups is None:
            self.groups = []
        if self.consumer_group is None:
            self.consumer_group = {"group_id": "g", "offsets_topic": "__consumer_offsets",
                                   "offsets_partition": 7}
        self.groups.append({
            "member": member, "member_id": f"{member}-{generation}", "generation": generation,
            "type": type_, "topic": topic, "partition": partition, "offset": offset,
            "status": status, "error": error,
            "t_invoke": None if t_invoke is None else self.start + t_invoke,
            "t": self.start + t,
        })

    def assign(self, member: str, partition: int, *, t: float, generation: int,
               committed: int | None = None, topic: str = "t") -> None:
        """`member` is assigned `partition` in `generation` at `t`, and the coordinator
        returns `committed` for it 0.1 s later."""
        self.group(member, "assign", partition, t=t, generation=generation, topic=topic)
        self.group(member, "committed", partition, t=t + 0.1, generation=generation,
                   offset=committed, topic=topic)

    def commit(self, member: str, partition: int, offset: int, *, t: float, generation: int,
               status: str = "ok", topic: str = "t") -> None:
        """A manual commit of `offset`, called 0.05 s before its outcome at `t`."""
        error = {"ok": None, "fail": "REBALANCE_IN_PROGRESS"}.get(status, "REQUEST_TIMED_OUT")
        self.group(member, "commit", partition, t=t, generation=generation, offset=offset,
                   status=status, error=error, t_invoke=t - 0.05, topic=topic)

    def record(self, value: str, partition: int, offset: int, *, t: float,
               latency: float = 0.010, topic: str = "t") -> None:
        """A healthy record: acknowledged, seen by a run consumer and by the drain."""
        self.send(value, "ok", t=t, partition=partition, offset=offset, latency=latency,
                  topic=topic)
        self.read(value, partition, offset, phase="run", t=t + 0.5, topic=topic)
        self.read(value, partition, offset, phase="drain", topic=topic)

    def fault(self, fault: str, target: str, action: str, *, t: float, role: str = "") -> None:
        self.faults.append({
            "fault": fault, "target": target, "role": role, "action": action, "t": self.start + t,
        })

    def sample(
        self, *, t: float, partition: int, leader: int, isr: list[int], topic: str = "t",
        elr: list[int] | None = None, high_watermark: int | None = 0,
        last_stable_offset: int | None = None,
    ) -> None:
        """One cluster.jsonl sample of a partition's leader, ISR and ELR (KIP-966), HW and
        LSO."""
        self.cluster.append({
            "t": self.start + t, "topic": topic, "partition": partition, "leader": leader,
            "leader_epoch": 0, "isr": isr, "high_watermark": high_watermark,
            "log_end_offsets": {str(b): 0 for b in isr}, "elr": elr or [],
            "last_known_elr": [], "leader_recovery_state": "RECOVERED",
            "last_stable_offset": last_stable_offset,
        })

    def event(self, type_: str, *, t: float, node: str, topic: str | None = "t",
              partition: int | None = 0, **fields: object) -> None:
        """One events.jsonl line: every field of the schema, null unless given."""
        row = {name: None for name in EVENT_FIELDS}
        row.update(t=self.start + t, node=node, type=type_, topic=topic, partition=partition,
                   **fields)
        if self.events is None:
            self.events = []
        self.events.append(row)

    def write(self, directory: str | Path, extra_lines: dict[str, list[str]] | None = None) -> Path:
        """Write the history; `extra_lines` appends raw (possibly malformed) lines per file."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        meta = {
            "experiment": self.experiment, "spec": {"workload": {"acks": self.acks}},
            "seed": 0, "start": self.start,
            "end": self.start + self.duration, "idempotent": self.idempotent, "expect": self.expect,
            "incomplete": False, "incomplete_reason": None,
            "consumer_group": self.consumer_group, "faults_skipped": [], "consumers_not_closed": [],
            "transactions": None if self.transaction_timeout_s is None else {
                "timeout_s": self.transaction_timeout_s},
            "pipeline": None if self.pipeline is None else {
                "input_topic": self.pipeline[0], "output_topic": self.pipeline[1],
                "members": 2, "drain": None},
        }
        if self.drain is not None:
            meta["drain"] = self.drain
            meta["spec"]["topic"] = {"name": "t"}
        (out / "meta.json").write_text(json.dumps(meta))
        files = {"sends": self.sends, "reads": self.reads, "faults": self.faults,
                 "cluster": self.cluster}
        if self.events is not None:
            files["events"] = self.events
        if self.groups is not None:
            files["groups"] = self.groups
        if self.txns is not None:
            files["txns"] = self.txns
        for name, rows in files.items():
            lines = [json.dumps(row) for row in rows] + (extra_lines or {}).get(name, [])
            (out / f"{name}.jsonl").write_text("".join(line + "\n" for line in lines))
        return out
