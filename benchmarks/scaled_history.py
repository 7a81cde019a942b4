"""`write_scaled_history`: synthetic histories of millions of sends in the format of
docs/history-format.md, for the analysis benchmarks (`analysis_scale.py`, and histories for
`analysis_floor.py` and `analysis_profile.py`).

Sends and reads are written with numpy (fixed-width lines, so a chunk of a million lines is one
byte matrix) with anomalies planted at fixed strides; the function returns the counts the
analysis must find, derived from the plan rather than from the checker. Send i goes to
partition i % PARTITIONS at offset i // PARTITIONS; its fate is decided by i % plant_every (the
residues below), every other send is a healthy record.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from undertow_history.schema import EVENTS

START = 1_763_830_000.0
PARTITIONS = 8
PRODUCERS = 4
RATE = 20_000.0  # sends per second, which sets the run's duration
MISPLACED_SHIFT = 10**10  # offsets far above any real one, so planted copies collide with nothing
DUPLICATE_SHIFT = 2 * 10**10
UNEXPECTED_SHIFT = 3 * 10**10

FAILED, IND_COMMITTED, IND_LOST, LOST, MISPLACED, DUPLICATE, INCONSISTENT, ABORTED, PHANTOM, \
    UNEXPECTED = range(10)
_STATUS_BY_RESIDUE = {FAILED: "fail", ABORTED: "fail", IND_COMMITTED: "info", IND_LOST: "info",
                      PHANTOM: "info"}

_SP = ord(" ")


def _lit(text: bytes, n: int) -> np.ndarray:
    return np.broadcast_to(np.frombuffer(text, dtype=np.uint8), (n, len(text)))


def _digits(x: np.ndarray, width: int, pad: int = _SP) -> np.ndarray:
    """Right-aligned decimal digits of non-negative ints as an (n, width) byte matrix.

    Leading positions hold `pad`: a space is JSON whitespace, so fixed-width numbers stay valid.
    """
    pows = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    x = x.astype(np.int64)[:, None]
    out = ((x // pows) % 10 + ord("0")).astype(np.uint8)
    lead = x < pows
    lead[:, -1] = False
    out[lead] = pad
    return out


def _time(ms: np.ndarray) -> np.ndarray:
    """Unix milliseconds as `1763830000.120`."""
    return np.concatenate(
        [_digits(ms // 1000, 10), _lit(b".", len(ms)), _digits(ms % 1000, 3, ord("0"))], axis=1
    )


def _choice(options: list[bytes], index: np.ndarray) -> np.ndarray:
    """Pick one of a few JSON tokens per row, padded with trailing spaces to one width."""
    width = max(len(o) for o in options)
    table = np.array([np.frombuffer(o.ljust(width), dtype=np.uint8) for o in options])
    return table[index]


def _values(i: np.ndarray, prefix: bytes = b"p") -> np.ndarray:
    """`p{producer}-{i:010d}`: unique per send."""
    return np.concatenate(
        [_lit(prefix, len(i)), _digits(i % PRODUCERS, 1), _lit(b"-", len(i)),
         _digits(i, 10, ord("0"))],
        axis=1,
    )


def _null_or_digits(x: np.ndarray, present: np.ndarray, width: int) -> np.ndarray:
    null = np.frombuffer(b"null".ljust(width), dtype=np.uint8)
    return np.where(present[:, None], _digits(x, width), null)


def _send_lines(i: np.ndarray, status: np.ndarray, start_ms: int) -> bytes:
    """sends.jsonl lines for sends `i`; status 0 ok, 1 fail, 2 info."""
    n = len(i)
    invoke = start_ms + i * 1000 // int(RATE)
    complete = invoke + 1 + (i * 37) % 100
    parts = [
        _lit(b'{"producer":"p', n), _digits(i % PRODUCERS, 1),
        _lit(b'","value":"', n), _values(i),
        _lit(b'","topic":"t","partition":', n), _digits(i % PARTITIONS, 4),
        _lit(b',"status":', n), _choice([b'"ok"', b'"fail"', b'"info"'], status),
        _lit(b',"offset":', n), _null_or_digits(i // PARTITIONS, status == 0, 12),
        _lit(b',"error":', n),
        _choice([b"null", b'"NOT_ENOUGH_REPLICAS"', b'"REQUEST_TIMED_OUT"'], status),
        _lit(b',"t_invoke":', n), _time(invoke),
        _lit(b',"t_complete":', n), _time(complete),
        _lit(b',"txn":null}\n', n),
    ]
    return np.concatenate(parts, axis=1).tobytes()


def _read_lines(
    value: np.ndarray, partition: np.ndarray, offset: np.ndarray, t_ms: np.ndarray, drain: bool,
    consumer: bytes = b"c0", generation: bytes = b"null",
) -> bytes:
    """reads.jsonl lines; `value` is a byte matrix from `_values`."""
    n = len(value)
    consumer, phase = (b"drain", b"drain") if drain else (consumer, b"run")
    parts = [
        _lit(b'{"consumer":"' + consumer + b'","phase":"' + phase + b'","topic":"t","partition":',
             n),
        _digits(partition, 4), _lit(b',"offset":', n), _digits(offset, 12),
        _lit(b',"value":"', n), value, _lit(b'","t":', n), _time(t_ms),
        _lit(b',"generation":' + (b"null" if drain else generation)
             + b',"isolation":"read_committed"}\n', n),
    ]
    return np.concatenate(parts, axis=1).tobytes()


def scaled_expected_counts(n_sends: int, plant_every: int, *, group: bool = False
                           ) -> dict[str, int]:
    """The counts `write_scaled_history(n_sends, plant_every, group=group)` plants, by the
    report's names. With a consumer group, the records drained but never returned (the
    indeterminate ones committed after all, those read though every send failed) are below its
    last commit: skipped. Nothing else of the group's is planted."""
    limit = max(n_sends - PARTITIONS, 0)
    c = [len(range(r, limit, plant_every)) for r in range(10)]
    failed = c[FAILED] + c[ABORTED]
    indeterminate = c[IND_COMMITTED] + c[IND_LOST] + c[PHANTOM]
    return {
        "attempted": n_sends, "acked": n_sends - failed - indeterminate, "failed": failed,
        "indeterminate": indeterminate, "lost": c[LOST], "misplaced": c[MISPLACED],
        "phantom_reads": c[PHANTOM], "inconsistent_offsets": c[INCONSISTENT],
        "duplicates": c[DUPLICATE], "aborted_reads": c[ABORTED], "unexpected": c[UNEXPECTED],
        "indeterminate_committed": c[IND_COMMITTED], "indeterminate_lost": c[IND_LOST] + c[PHANTOM],
        "skipped": c[IND_COMMITTED] + c[ABORTED] if group else 0,
        "committed_offsets_lost": 0, "redelivered_past_commit": 0, "non_monotonic_polls": 0,
        "reads_past_lso": 0, "torn_transactions": 0, "hanging_transactions": 0,
        "duplicate_outputs": 0, "missing_outputs": 0,
    }


def write_scaled_history(
    directory: str | Path,
    n_sends: int,
    *,
    plant_every: int = 10_007,
    chunk: int = 1_000_000,
    idempotent: bool = False,
    group: bool = False,
) -> dict[str, int]:
    """Write a history of `n_sends` sends, a run read and a drain read per healthy record.

    Send i with i % plant_every == r < 10 carries the anomaly of residue r (FAILED ... UNEXPECTED
    above); returns the expected counts (see `scaled_expected_counts`). With `group`, the run's
    consumers are a consumer group (`_write_groups`): c0 returns the records in generation 1
    and commits past them, c1 the inconsistent reads.
    """
    if plant_every < 10 + PARTITIONS:
        raise ValueError(f"plant_every must be >= {10 + PARTITIONS}, got {plant_every}")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    start_ms = int(START * 1000)
    duration = n_sends / RATE
    limit = n_sends - PARTITIONS
    with open(out / "sends.jsonl", "wb") as sends, open(out / "reads.jsonl", "wb") as reads:
        for lo in range(0, n_sends, chunk):
            i = np.arange(lo, min(lo + chunk, n_sends), dtype=np.int64)
            r = np.where(i < limit, i % plant_every, -1)
            status = np.zeros(len(i), dtype=np.int64)
            for residue, name in _STATUS_BY_RESIDUE.items():
                status[r == residue] = {"fail": 1, "info": 2}[name]
            sends.write(_send_lines(i, status, start_ms))
            seen = np.isin(r, [LOST, FAILED, IND_COMMITTED, IND_LOST, ABORTED], invert=True)
            t_run = start_ms + i * 1000 // int(RATE) + 150
            member = {"generation": b"   1"} if group else {}
            _write_reads(reads, i[seen], i[seen], t_run[seen], drain=False, **member)
            extra = i[r == INCONSISTENT]  # the next record of the partition, read at this offset
            _write_reads(reads, extra + PARTITIONS, extra, t_run[r == INCONSISTENT], drain=False,
                         **member, consumer=b"c1")
        t_drain = start_ms + int(duration * 1000) + 1000
        for lo in range(0, n_sends, chunk):
            i = np.arange(lo, min(lo + chunk, n_sends), dtype=np.int64)
            r = np.where(i < limit, i % plant_every, -1)
            drained = np.isin(r, [LOST, FAILED, IND_LOST, PHANTOM, MISPLACED], invert=True)
            t = np.full(len(i), t_drain, dtype=np.int64)
            _write_reads(reads, i[drained], i[drained], t[drained], drain=True)
            for residue, shift in ((MISPLACED, MISPLACED_SHIFT), (DUPLICATE, DUPLICATE_SHIFT)):
                planted = i[r == residue]
                _write_reads(reads, planted, planted, t[r == residue], drain=True, shift=shift)
            planted = i[r == UNEXPECTED]
            _write_reads(reads, planted, planted, t[r == UNEXPECTED], drain=True,
                         shift=UNEXPECTED_SHIFT, prefix=b"x")
    _write_run_context(out, start_ms, duration, idempotent, group)
    if group:
        _write_groups(out, n_sends, start_ms / 1000, duration)
    return scaled_expected_counts(n_sends, plant_every, group=group)


def _write_reads(
    f, values: np.ndarray, slots: np.ndarray, t_ms: np.ndarray, *, drain: bool, shift: int = 0,
    prefix: bytes = b"p", **member: bytes,
) -> None:
    """Reads of the records `values` found at the log positions of sends `slots` (+ shift);
    `member`: a run read's consumer and generation."""
    if len(values):
        f.write(_read_lines(_values(values, prefix), slots % PARTITIONS,
                            slots // PARTITIONS + shift, t_ms, drain, **member))


COMMIT_EVERY = 1000
"""Offsets between two commits of a partition in a history with a consumer group."""
GROUP = {"group_id": "g", "offsets_topic": "__consumer_offsets", "offsets_partition": 7}


def _write_groups(out: Path, n_sends: int, start: float, duration: float) -> None:
    """groups.jsonl of a consumer group whose members c0 and c1 are assigned every partition
    in generation 1 (nothing committed yet) and c0 commits each partition every COMMIT_EVERY
    offsets as it goes, then past its end. Few lines: one per commit."""
    def line(member: str, type_: str, p: int, t: float, offset: int | None = None) -> str:
        commit = type_ == "commit"
        return json.dumps({"member": member, "member_id": f"{member}-1", "generation": 1,
                           "type": type_, "topic": "t", "partition": p, "offset": offset,
                           "status": "ok" if commit else None, "error": None,
                           "t_invoke": t - 0.01 if commit else None, "t": t}) + "\n"

    end = -(-n_sends // PARTITIONS)  # past the last offset of every partition
    with open(out / "groups.jsonl", "w") as f:
        for p in range(PARTITIONS):
            for member in ("c0", "c1"):
                f.write(line(member, "assign", p, start))
                f.write(line(member, "committed", p, start + 0.01))
            for offset in [*range(COMMIT_EVERY, end, COMMIT_EVERY), end]:
                t = start + min(offset * PARTITIONS / RATE + 0.5, duration)
                f.write(line("c0", "commit", p, t, offset))


def _write_run_context(out: Path, start_ms: int, duration: float, idempotent: bool,
                       group: bool = False) -> None:
    """meta.json, a kill every 30 s lasting 10 s (with its events), and 4 cluster samples a
    second per partition."""
    start = start_ms / 1000
    meta = {"experiment": "scaled", "spec": {}, "seed": 0, "start": start,
            "end": start + duration + 2, "idempotent": idempotent, "expect": "loss",
            "incomplete": False, "incomplete_reason": None,
            "consumer_group": GROUP if group else None, "faults_skipped": [],
            "consumers_not_closed": [],
            "transactions": None, "pipeline": None}
    (out / "meta.json").write_text(json.dumps(meta))
    kills = [(k, 5.0 + 30 * k) for k in range(int(duration // 30) + 1) if 5.0 + 30 * k < duration]
    with open(out / "faults.jsonl", "w") as f:
        for k, t in kills:
            for action, at in (("inject", t), ("heal", t + 9.5), ("recover", t + 10)):
                f.write(json.dumps({"fault": "kill", "target": f"broker-{k % 3}",
                                    "role": f"leader of t-{k % PARTITIONS}", "action": action,
                                    "t": start + at}) + "\n")
    _write_events(out, start, kills)
    with open(out / "cluster.jsonl", "w") as f:
        for step in range(int(duration * 4) + 1):
            t = step / 4
            down = next((k for k, at in kills if at <= t < at + 10), None)
            for p in range(PARTITIONS):
                isr = [b for b in range(3) if down is None or b != down % 3]
                f.write(json.dumps({"t": start + t, "topic": "t", "partition": p,
                                    "leader": isr[p % len(isr)], "leader_epoch": 0, "isr": isr,
                                    "high_watermark": 0, "log_end_offsets": {}, "elr": [],
                                    "last_known_elr": [], "leader_recovery_state": "RECOVERED",
                                    "last_stable_offset": 0}) + "\n")


def _event(t: float, node: str, type_: str, **fields: object) -> str:
    row = dict.fromkeys(name for name in EVENTS.names if name not in ("t", "node", "type"))
    return json.dumps({"t": t, "node": node, "type": type_, **row, **fields}) + "\n"


def _write_events(out: Path, start: float, kills: list[tuple[int, float]]) -> None:
    """events.jsonl as the brokers and the controller log a leader kill: the controller fences
    the leader and elects another, which becomes leader; the old leader, back 10 s later,
    truncates the 100 offsets only it had. (Planted losses fall anywhere, so most stay
    unexplained: these events are for the cost of the attribution, not its findings.)"""
    with open(out / "events.jsonl", "w") as f:
        for p in range(PARTITIONS):
            f.write(_event(start, f"broker-{p % 3}", "become_leader", topic="t", partition=p,
                           leader_epoch=0, broker=p % 3, log_end_offset=0, high_watermark=0,
                           isr=[0, 1, 2]))
        for epoch, (k, at) in enumerate(kills, start=1):
            p, old, new = k % PARTITIONS, k % 3, (k + 1) % 3
            end = int(at * RATE / PARTITIONS)
            t = start + at
            f.write(_event(t + 3, "controller", "broker_fenced", broker=old, broker_epoch=k,
                           reason="session_expired"))
            f.write(_event(t + 3, "controller", "leader_election", topic="t", partition=p,
                           leader_epoch=epoch, leader=new, previous_leader=old, kind="clean",
                           reason="leader_fenced", isr=[0, 1, 2]))
            f.write(_event(t + 3.1, f"broker-{new}", "become_leader", topic="t", partition=p,
                           leader_epoch=epoch, broker=new, log_end_offset=end,
                           high_watermark=end, isr=[b for b in range(3) if b != old]))
            f.write(_event(t + 10.5, f"broker-{old}", "truncation", topic="t", partition=p,
                           leader_epoch=epoch, broker=old, from_offset=end + 100, to_offset=end,
                           reason="offset_for_leader_epoch"))
