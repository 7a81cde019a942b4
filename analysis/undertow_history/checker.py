"""The Spark analysis's verdict in plain Python: one history directory in, the verdict, the
anomaly counts, the send totals and the loss mechanisms out (`check_history`).

Why a second checker: a schedule explorer runs thousands of simulated runs inside Spark tasks,
where a nested Spark job per run is impossible, so it needs the same verdict from plain Python
over the history files in well under a second. It is a pure function of the history, like
Jepsen's checkers, and it mirrors the Spark job definition by definition, never approximately:

- the anomaly kinds, their counts and the verdict: `undertow_analysis.anomalies` (`KINDS`,
  the value checks, the consumer group's checkers, `verdict`);
- the per-value aggregation they read: `undertow_analysis.checks` (`events`,
  `positions_by_value`, `inconsistent_offsets`, `classify`, `value_counts`) and `groups`
  (`committed_positions`), assembled as `job._counts` assembles report.json's counts;
- the loss mechanism of each lost acknowledged record: `undertow_analysis.attribution`
  (`subjects`, `attribute`, `_deposed_leader`, `_mechanism`), run only when the job runs it
  (events.jsonl there, something to explain);
- which lines count: `undertow_analysis.io`'s `FileSpec`s under Spark's JSON reader. A line
  Spark cannot read, or one a check of the file refuses (a field missing, out of range, not one
  of its values), is skipped, never fatal. Spark parses only the fields a query uses, so a
  wrong type in a field a query does not read does not make the line malformed to that query:
  each use below names the fields it parses (`_Use`).

Nothing here imports PySpark or the analysis package: this package is the history's contract,
imported by both sides. tests/analysis/test_checker.py holds the two to the same answers and
the tables below (`KINDS`, `_FILES`) to the analysis's.

One module, long (about 950 lines), because it is a line-by-line mirror: each definition sits
in the order of the Spark job's, so that a reviewer compares the two side by side; split, the
mirror would be five files against five.
"""

from __future__ import annotations

import bisect
import json
import math
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from json.decoder import scanstring
from pathlib import Path
from typing import Any

from undertow_history import schema

# ---- the anomaly kinds (`undertow_analysis.anomalies.KINDS`) --------------------------------


@dataclass(frozen=True)
class Kind:
    """What the verdict needs of one row of `anomalies.KINDS`: its name, its count's name in
    report.json, whether any makes the verdict `loss` (else `anomalies`), and whether it is an
    anomaly only when the producer was idempotent (KIP-98: only then can a broker recognise a
    retry)."""

    name: str
    count: str
    loss: bool
    only_if_idempotent: bool = False


KINDS = (
    Kind("lost", "lost", loss=True),
    Kind("misplaced", "misplaced", loss=True),
    Kind("phantom_read", "phantom_reads", loss=True),
    Kind("inconsistent_offset", "inconsistent_offsets", loss=True),
    Kind("duplicate", "duplicates", loss=False, only_if_idempotent=True),
    Kind("aborted_read", "aborted_reads", loss=False),
    Kind("unexpected", "unexpected", loss=False),
    Kind("skipped", "skipped", loss=True),
    Kind("committed_offset_lost", "committed_offsets_lost", loss=True),
    Kind("redelivered_past_commit", "redelivered_past_commit", loss=False),
    Kind("non_monotonic_poll", "non_monotonic_polls", loss=False),
    Kind("read_past_lso", "reads_past_lso", loss=False),
    Kind("torn_transaction", "torn_transactions", loss=False),
    Kind("hanging_transaction", "hanging_transactions", loss=False),
    Kind("duplicate_output", "duplicate_outputs", loss=False),
    Kind("missing_output", "missing_outputs", loss=True),
)
COUNTS = tuple(k.count for k in KINDS)
"""The anomaly counts of report.json, in its order."""


def verdict(counts: dict[str, int], idempotent: bool) -> str:
    """`anomalies.verdict`: `loss` if a loss kind has a count, `anomalies` if another has
    (duplicates only with an idempotent producer), else `clean`."""
    found = [k for k in KINDS if counts[k.count] and (idempotent or not k.only_if_idempotent)]
    if any(k.loss for k in found):
        return "loss"
    return "anomalies" if found else "clean"


@dataclass(frozen=True)
class Summary:
    """The Spark job's answer on one history: report.json's verdict (`clean`, `anomalies` or
    `loss`), its anomaly counts (`COUNTS`: kind count -> number), its send totals (distinct
    values sent; of them acknowledged, failed definitively, indeterminate), and the loss
    mechanisms (`MECHANISMS` codes) of the lost acknowledged records, each with
    how many it explains: {} when nothing is lost, or without events.jsonl (the job then
    explains nothing)."""

    verdict: str
    counts: dict[str, int]
    attempted: int
    acked: int
    failed: int
    indeterminate: int
    mechanisms: dict[str, int]
    faults_skipped: list[dict[str, Any]] = field(default_factory=list)
    """meta.json's planned faults the nemesis did not inject (`skipped_faults`)."""


MECHANISMS = {
    "acks1_before_replication": "acks=1 before replication",
    "unclean_election": "unclean election",
    "high_watermark_truncation": "truncation to the high watermark (pre-KIP-101)",
    "power_loss": "unflushed data lost to a power loss",
    "disk_lost": "a log lost with its disk",
    "coordinator_truncation": "a truncation of the group coordinator's log",
    "deposed_leader": "a deposed leader's acknowledgements before it learned of the new epoch",
    "retry_across_election": "a producer retry across a leader change",
    "retry_after_timeout": "a producer retry after a request timeout",
    "hanging_transaction": "a transaction nothing ended, which read_committed readers stop at",
    "unexplained": "unexplained",
}
"""Mechanism code -> its name in Kafka's terms (the report's wording): the codes both the
Spark job (`undertow_analysis.attribution`) and `check_history` give."""


# ---- reading lines as Spark's JSON reader does (`undertow_analysis.io`) ---------------------

MAX_PARTITION = 2**23 - 1  # checks.MAX_PARTITION: partition << 40 must stay a long
MAX_OFFSET = 2**40 - 1  # checks.MAX_OFFSET
_RANGES = {"partition": MAX_PARTITION, "offset": MAX_OFFSET}
OPTIONAL = ("groups", "txns", "faults", "cluster", "events")  # precheck.OPTIONAL_FILES
_JSON_WS = " \t\r\n"  # Jackson's whitespace: a line of only these is no record to Spark
_NON_NUMERIC = {"NaN": math.inf, "Infinity": math.inf, "+Infinity": math.inf, "+INF": math.inf,
                "-Infinity": -math.inf, "-INF": -math.inf}
"""The strings Spark's reader takes for a double (allowNonNumericNumbers), NaN as infinity
(see `_convert`)."""


@dataclass(frozen=True)
class _File:
    """`io.FileSpec` of a file the checker reads: the fields its checks refuse a line on."""

    file: schema.HistoryFile
    required: tuple[str, ...]
    required_if_ok: tuple[str, ...] = ()
    ranges: tuple[str, ...] = ("partition", "offset")  # each 0.._RANGES[name] (or the offset's)


_FILES = {
    "sends": _File(schema.SENDS, ("value", "topic", "status", "t_invoke", "t_complete"),
                   ("partition",)),
    "reads": _File(schema.READS, ("phase", "topic", "partition", "offset", "value", "t")),
    "groups": _File(schema.GROUPS, ("member", "type", "topic", "partition", "t")),
    "txns": _File(schema.TXNS, ("txn", "status", "values", "t_complete"), ranges=()),
    "cluster": _File(schema.CLUSTER, ("t", "topic", "partition", "leader", "isr")),
    "events": _File(schema.EVENTS, ("t", "node", "type"),
                    ranges=("partition", "from_offset", "to_offset", "log_end_offset")),
}


@dataclass(frozen=True)
class _Use:
    """One way the job reads a file: the fields its query parses (its own and those of the
    file's checks), which are the only ones whose type can make a line malformed to it."""

    spec: _File
    fields: tuple[str, ...]

    def __post_init__(self) -> None:
        checked = (self.spec.required + self.spec.required_if_ok + self.spec.ranges
                   + tuple(f.name for f in self.spec.file.fields if f.values))
        missing = [n for n in checked if n in self.spec.file.names and n not in self.fields]
        if missing:
            raise ValueError(f"{self.spec.file.filename}: a use must parse {missing}")


def _use(name: str, *fields: str) -> _Use:
    spec = _FILES[name]
    return _Use(spec, tuple(f for f in spec.file.names if f in fields))


_SENDS = _use("sends", "value", "topic", "partition", "status", "offset", "t_invoke",
              "t_complete", "txn")
_READS = _use("reads", "phase", "topic", "partition", "offset", "value", "t",
              "isolation")  # checks.events
_MEMBER_READS = _use("reads", "consumer", "phase", "topic", "partition", "offset", "value", "t",
                     "generation", "isolation")  # groups and transactions: every field
_TXNS = _use("txns", "producer", "txn", "intent", "status", "values", "t_begin", "t_end_invoke",
             "t_complete")  # transactions.txn_history
_SAMPLES = _use("cluster", "t", "topic", "partition", "leader", "isr", "high_watermark",
                "last_stable_offset")
_GROUP_COMMITS = _use("groups", "member", "type", "topic", "partition", "offset", "status", "t")
_GROUP_ACTIONS = _use("groups", "member", "generation", "type", "topic", "partition", "offset",
                      "status", "t_invoke", "t")  # committed_offset_lost's rows: every field
_GROUP_ASSIGNS = _use("groups", "member", "type", "topic", "partition", "offset", "status",
                      "t_invoke", "t")  # redelivered_past_commit's: not the generation
_LEADER_EVENTS = _use("events", "t", "node", "type", "kind", "topic", "partition", "broker",
                      "leader_epoch", "log_end_offset", "from_offset", "to_offset")
_CHANGE_EVENTS = _use("events", "t", "node", "type", "kind", "topic", "partition", "broker",
                      "leader_epoch", "log_end_offset", "from_offset", "to_offset", "reason",
                      "isr", "previous_leader")


class _Unreadable(ValueError):
    """A value Spark's reader cannot convert to its field's type: the line is corrupt."""


def _convert(kind: schema.JsonType, value: Any, raw: str) -> Any:
    """`value` (as json.loads gives it; `raw` its text in the line) as Spark's JSON reader
    reads it into a field of `kind`, or _Unreadable. A string field takes the text of any
    other JSON value; a number never becomes a string or a string a number, but for the
    non-numeric doubles; a double NaN compares as the largest double to Spark, and here is
    infinity, which keeps its order against every other value."""
    if value is None:
        return None
    k = kind.kind
    if k == "string":
        return value if type(value) is str else raw
    if k in ("int", "long"):
        bits = 31 if k == "int" else 63
        if type(value) is int and -(2**bits) <= value < 2**bits:
            return value
        raise _Unreadable(raw)
    if k == "double":
        if type(value) is float:
            return math.inf if value != value else value
        if type(value) is int:
            try:
                return float(value)
            except OverflowError:
                return math.copysign(math.inf, value)
        if type(value) is str and value in _NON_NUMERIC:
            return _NON_NUMERIC[value]
        raise _Unreadable(raw)
    if k == "boolean" and type(value) is bool:
        return value
    if k == "array" and type(value) is list:
        return [_convert(kind.element, v, json.dumps(v)) for v in value]
    raise _Unreadable(raw)


_scan = json.JSONDecoder().scan_once
_NOT_UTF8 = re.compile("[\udc80-\udcff]")
"""A byte that is not UTF-8, as the surrogateescape error handler reads it: Jackson refuses
the line."""
_BARE_NON_NUMERIC = ("+Infinity", "+INF", "-INF")
"""Jackson's non-numeric number tokens that json does not know (it knows NaN, Infinity and
-Infinity)."""


def _skip(s: str, i: int) -> int:
    while i < len(s) and s[i] in _JSON_WS:
        i += 1
    return i


def _pairs(s: str, i: int) -> tuple[list[tuple[str, Any, str]], int]:
    """The object at s[i] ('{') as its (key, value, raw text) pairs in order, duplicates kept,
    and the index past it (json.loads keeps only a duplicate's last value)."""
    pairs: list[tuple[str, Any, str]] = []
    i = _skip(s, i + 1)
    if s[i] == "}":
        return pairs, i + 1
    while True:
        if s[i] != '"':
            raise ValueError("expected a field name")
        key, i = scanstring(s, i + 1)
        i = _skip(s, i)
        if s[i] != ":":
            raise ValueError("expected ':'")
        i = _skip(s, i + 1)
        bare = next((t for t in _BARE_NON_NUMERIC if s.startswith(t, i)), None)
        value, end = (_NON_NUMERIC[bare], i + len(bare)) if bare else _scan(s, i)
        pairs.append((key, value, s[i:end]))
        i = _skip(s, end)
        if s[i] == "}":
            return pairs, i + 1
        if s[i] != ",":
            raise ValueError("expected ','")
        i = _skip(s, i + 1)


def _objects(s: str) -> list[list[tuple[str, Any, str]]] | None:
    """The rows Spark's reader makes of one line (without its leading whitespace), each as the
    pairs of its object: an object is one row, an array of objects one per element (none for
    []), and the text after the first value is ignored. None: one corrupt row (not JSON,
    another root value, an array with something else than objects, bytes that are not UTF-8
    in what it parses)."""
    try:
        if s[0] == "{":
            rows, end = [(pairs := _pairs(s, 0))[0]], pairs[1]
        elif s[0] == "[":
            rows, end = _array(s)
        else:
            return None
    except (ValueError, IndexError, StopIteration):
        return None
    if not s.isascii() and _NOT_UTF8.search(s, 0, end):
        return None
    return rows


def _array(s: str) -> tuple[list[list[tuple[str, Any, str]]], int]:
    """The objects of the array at s[0], and the index past it; ValueError for an element
    that is not an object."""
    rows, i = [], _skip(s, 1)
    if s[i] == "]":
        return rows, i + 1
    while True:
        if s[i] != "{":
            raise ValueError("an array element that is not an object")
        pairs, i = _pairs(s, i)
        rows.append(pairs)
        i = _skip(s, i)
        if s[i] == "]":
            return rows, i + 1
        if s[i] != ",":
            raise ValueError("expected ','")
        i = _skip(s, i + 1)


def _parsed(use: _Use, pairs: list[tuple[str, Any, str]]) -> dict[str, Any] | None:
    """The fields `use` parses of one row, or None when one cannot be converted: the row is
    corrupt (any of a name's duplicates: Spark converts each, and the last one wins)."""
    file = use.spec.file
    row: dict[str, Any] = dict.fromkeys(use.fields)
    try:
        for key, value, raw in pairs:
            if key in row:
                row[key] = _convert(file.field(key).type, value, raw)
    except _Unreadable:
        return None
    return row


def _usable(use: _Use, rows: list[list[tuple[str, Any, str]]]) -> list[dict[str, Any] | None]:
    """The rows of one line as `use` reads them, each None when Spark skips it: corrupt, or
    refused by a check of the file (`_checks_pass`). One corrupt element of an array line
    makes Spark report every element of it corrupt."""
    parsed = [_parsed(use, pairs) for pairs in rows]
    if any(row is None for row in parsed):
        return [None] * len(parsed)
    return [row if _checks_pass(use, row) else None for row in parsed]


def _checks_pass(use: _Use, row: dict[str, Any]) -> bool:
    """`io.FileSpec.reason` is null: required fields there, enumerated ones within their
    values, an ok send with its partition, positions within what a packed position holds."""
    spec = use.spec
    if any(row[n] is None for n in spec.required):
        return False
    for f in spec.file.fields:
        if f.values and f.name in row and row[f.name] is not None and row[f.name] not in f.values:
            return False
    if row.get("status") == "ok" and any(row[n] is None for n in spec.required_if_ok):
        return False
    for n in spec.ranges:
        v = row.get(n)
        if v is not None and not 0 <= v <= _RANGES.get(n, MAX_OFFSET):
            return False
    return True


def _lines(path: Path) -> Iterator[str]:
    """The file's lines without a byte order mark (Jackson skips one at the start of each
    line's bytes) and leading whitespace, blank ones left out (Spark's reader makes no row of
    them). Universal newlines: Hadoop's line reader ends a line at \\n, \\r\\n or \\r
    alike."""
    with path.open(encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            s = (line[1:] if line[0] == "\ufeff" else line).lstrip(_JSON_WS)
            if s:
                yield s


def _rows(path: Path, *uses: _Use) -> Iterator[tuple[dict[str, Any] | None, ...]]:
    """Every row of a (small) file as each of `uses` reads it (None: skipped by that use). An
    array line whose elements one use cannot all read is corrupt to it in every element, as
    Spark reports it."""
    for s in _lines(path):
        rows = _objects(s)
        if rows is None:
            yield (None,) * len(uses)
            continue
        yield from zip(*[_usable(use, rows) for use in uses], strict=True)


# ---- sends and reads: one pass each, per value (`checks.events` .. `checks.classify`) -------

_STATUS = {"ok", "fail", "info"}
_PHASES = {"run", "drain"}
_ISOLATION = set(schema.READS.field("isolation").values)


def _fast_send(obj: dict[str, Any]) -> tuple[str, str, int | None, str, int | None, float,
                                             str | None] | None:
    """A send line as `_SENDS` reads it, when every field it parses has its plain type (the
    runner's lines): value, topic, partition, status, offset, t_complete, txn. None: anything
    else, which `_usable` decides exactly."""
    value, topic, status = obj.get("value"), obj.get("topic"), obj.get("status")
    partition, offset = obj.get("partition"), obj.get("offset")
    t_invoke, t_complete, txn = obj.get("t_invoke"), obj.get("t_complete"), obj.get("txn")
    if (type(value) is str and type(topic) is str and status in _STATUS
            and (txn is None or type(txn) is str)
            and type(t_invoke) is float and t_invoke == t_invoke
            and type(t_complete) is float and t_complete == t_complete
            and (partition is None or (type(partition) is int and 0 <= partition <= MAX_PARTITION))
            and (offset is None or (type(offset) is int and 0 <= offset <= MAX_OFFSET))
            and (partition is not None or status != "ok")):
        return value, topic, partition, status, offset, t_complete, txn
    return None


def _fast_read(obj: dict[str, Any]) -> tuple[str, str, str, int, int, float, Any, Any,
                                             Any] | None:
    """A read line as `_MEMBER_READS` (and so `_READS`) reads it, when every field has its
    plain type: value, phase, topic, partition, offset, t, consumer, generation, isolation.
    None: anything else, which `_usable` decides exactly."""
    value, phase, topic = obj.get("value"), obj.get("phase"), obj.get("topic")
    partition, offset, t = obj.get("partition"), obj.get("offset"), obj.get("t")
    consumer, generation = obj.get("consumer"), obj.get("generation")
    isolation = obj.get("isolation")
    if (type(value) is str and phase in _PHASES and type(topic) is str
            and (isolation is None or isolation in _ISOLATION)
            and type(partition) is int and 0 <= partition <= MAX_PARTITION
            and type(offset) is int and 0 <= offset <= MAX_OFFSET
            and type(t) is float and t == t
            and (consumer is None or type(consumer) is str)
            and (generation is None or (type(generation) is int
                                        and -(2**31) <= generation < 2**31))):
        return value, phase, topic, partition, offset, t, consumer, generation, isolation
    return None


def _plain(obj: Any, s: str) -> bool:
    """A line json.loads read as one object whose keys are all distinct (each key of a
    compact or `": `-separated object is followed by `":`, so as many of those as keys, with
    no whitespace before a colon, leaves no room for a duplicate), all ASCII (so no byte that
    is not UTF-8): what the runner writes. Any other line takes the exact path."""
    return (type(obj) is dict and s.isascii() and s.count('":') == len(obj)
            and '" ' not in s and '"\t' not in s)


_decode = json.JSONDecoder().raw_decode


def _read_rows(path: Path, fast: Any, uses: tuple[_Use, ...]) -> Iterator[Any]:
    """Per row of sends.jsonl or reads.jsonl: `fast`'s tuple when the line is plain (nearly
    every line), else a tuple of each of `uses`' dict (None: skipped by it). Most lines cost
    one json.loads and a few type checks."""
    for s in _lines(path):
        try:
            obj, _ = _decode(s)
        except ValueError:
            obj = None
        if obj is not None and _plain(obj, s):
            row = fast(obj)
            if row is not None:
                yield row
                continue
        rows = _objects(s)
        if rows is None:
            continue  # one corrupt row, which no use reads
        yield from zip(*[_usable(use, rows) for use in uses], strict=True)


@dataclass
class _Sent:
    """A value's send attempts (`checks.positions_by_value` summed over its positions): ok
    ones, info ones, the first acknowledgement's time, and the positions (topic, partition,
    offset) an ok attempt gave (one without an offset gives none). A value with an attempt
    is sent, whatever its outcome: `attempted` counts values."""

    n_ok: int = 0
    n_info: int = 0
    t_acked: float | None = None
    acked_at: set[tuple[str, int, int]] | None = None


_TxnSend = tuple[str, str, str, int | None, int | None, str]
"""A send in a transaction as `transactions.txn_history` keeps it: txn, value, topic,
partition, offset, status."""


def _sends(path: Path, txn_sends: list[_TxnSend] | None) -> dict[str, _Sent]:
    """Every value's attempts; each send with a `txn` also goes to `txn_sends` when given."""
    sent: dict[str, _Sent] = {}
    for row in _read_rows(path, _fast_send, (_SENDS,)):
        if type(row[0]) is str:
            value, topic, partition, status, offset, t_complete, txn = row
        elif row[0] is None:
            continue
        else:
            r = row[0]
            value, topic, partition, status, offset, t_complete, txn = (
                r["value"], r["topic"], r["partition"], r["status"], r["offset"], r["t_complete"],
                r["txn"])
        s = sent.get(value)
        if s is None:
            s = sent[value] = _Sent()
        if txn is not None and txn_sends is not None:
            txn_sends.append((txn, value, topic, partition, offset, status))
        if status == "ok":
            s.n_ok += 1
            if s.t_acked is None or t_complete < s.t_acked:
                s.t_acked = t_complete
            if offset is not None:  # partition is there: a check refuses an ok without it
                if s.acked_at is None:
                    s.acked_at = set()
                s.acked_at.add((topic, partition, offset))
        elif status == "info":
            s.n_info += 1
    return sent


@dataclass
class _Reads:
    """What reads.jsonl tells per value and per position: the positions each value was
    drained at; the values read during the run; the positions at which reads saw two values
    or more (`checks.inconsistent_offsets`); the consumer group's member reads (member,
    generation, topic, partition, offset, value, t), in the file's order; and, for a history
    with transactions, the `read_committed` reads (`transactions.txn_history`: reader, phase,
    topic, partition, offset, value, t)."""

    drained: dict[str, set[tuple[str, int, int]]]
    run_read: set[str]
    inconsistent: set[tuple[str, int, int]]
    member_reads: list[tuple[str, int, str, int, int, str, float]]
    committed_reads: list[tuple[str | None, str, str, int, int, str, float]]


def _reader(consumer: str | None, generation: int | None) -> str | None:
    """`transactions.reader`."""
    return consumer if generation is None or consumer is None else \
        f"{consumer} (generation {generation})"


def _reads(path: Path, grouped: bool, transactional: bool) -> _Reads:
    drained: dict[str, set[tuple[str, int, int]]] = {}
    run_read: set[str] = set()
    seen: dict[tuple[str, int, int], str] = {}
    inconsistent: set[tuple[str, int, int]] = set()
    member_reads: list[tuple[str, int, str, int, int, str, float]] = []
    committed_reads: list[tuple[str | None, str, str, int, int, str, float]] = []
    for row in _read_rows(path, _fast_read, (_READS, _MEMBER_READS)):
        if type(row[0]) is str:
            value, phase, topic, partition, offset, t, consumer, generation, isolation = row
            member = True
        elif row[0] is None:
            continue
        else:
            r, m = row
            value, phase, topic, partition, offset, t = (
                r["value"], r["phase"], r["topic"], r["partition"], r["offset"], r["t"])
            member = m is not None
            consumer, generation, isolation = (
                (m["consumer"], m["generation"], m["isolation"]) if member else (None,) * 3)
        if transactional and member and (isolation == "read_committed" or phase == "drain"):
            committed_reads.append((_reader(consumer, generation), phase, topic, partition,
                                    offset, value, t))
        pos = (topic, partition, offset)
        first = seen.setdefault(pos, value)
        if first != value:
            inconsistent.add(pos)
        if phase == "drain":
            at = drained.get(value)
            if at is None:
                drained[value] = {pos}
            else:
                at.add(pos)
            continue
        run_read.add(value)
        if grouped and member and consumer is not None and generation is not None:
            member_reads.append((consumer, generation, topic, partition, offset, value, t))
    return _Reads(drained, run_read, inconsistent, member_reads, committed_reads)


# ---- the consumer group (`undertow_analysis.groups`, the group checkers of `anomalies`) ----


def _group_lines(path: Path) -> tuple[list[dict[str, Any]], ...]:
    """groups.jsonl's usable lines, in the file's order, as each of its readers parses them:
    the committed positions (`_GROUP_COMMITS`), committed_offset_lost (`_GROUP_ACTIONS`) and
    redelivered_past_commit (`_GROUP_ASSIGNS`)."""
    uses = (_GROUP_COMMITS, _GROUP_ACTIONS, _GROUP_ASSIGNS)
    found: tuple[list[dict[str, Any]], ...] = tuple([] for _ in uses)
    for rows in _rows(path, *uses):
        for lines, row in zip(found, rows, strict=True):
            if row is not None:
                lines.append(row)
    return found


def _ok_commit(line: dict[str, Any]) -> bool:
    """An acknowledged commit with its offset (`groups._ok_commits`)."""
    return line["type"] == "commit" and line["status"] == "ok" and line["offset"] is not None


def _committed_positions(lines: list[dict[str, Any]]) -> dict[tuple[str, int], int]:
    """(topic, partition) -> the highest offset an ok commit gave (`groups.committed_positions`):
    a drained record below it that no member returned was skipped."""
    highest: dict[tuple[str, int], int] = {}
    for line in lines:
        if _ok_commit(line):
            key = (line["topic"], line["partition"])
            highest[key] = max(highest.get(key, line["offset"]), line["offset"])
    return highest


def _commit_before(actions: list[dict[str, Any]], line_type: str
                   ) -> list[tuple[dict[str, Any], int | None]]:
    """`anomalies._commit_before`: each `line_type` line with the highest offset an ok commit
    of its partition gave before it (None: none). Ordered by time, then with the ok commits
    last among equal times: a commit that completed at the line's time does not count."""
    by_partition: dict[tuple[str, int], list[tuple[float, bool, dict[str, Any]]]] = {}
    for line in actions:
        ok = _ok_commit(line)
        if ok or line["type"] == line_type:
            by_partition.setdefault((line["topic"], line["partition"]), []).append(
                (line["t"], ok, line))
    found = []
    for lines in by_partition.values():
        past: int | None = None
        for _, ok, line in sorted(lines, key=lambda x: (x[0], x[1])):
            if ok:
                past = line["offset"] if past is None else max(past, line["offset"])
            else:
                found.append((line, past))
    return found


def _committed_offsets_lost(actions: list[dict[str, Any]]) -> int:
    """`anomalies.committed_offset_lost`: `committed` lines whose offset (or none) is below
    the highest an ok commit of the partition gave before: a lost acknowledged write to
    __consumer_offsets."""
    return sum(1 for line, past in _commit_before(actions, "committed")
               if past is not None and (line["offset"] is None or past > line["offset"]))


def _redelivered_past_commit(actions: list[dict[str, Any]],
                            reads: list[tuple[str, int, str, int, int, str, float]]) -> int:
    """`anomalies.redelivered_past_commit`: reads of a record (position and value) a member
    had returned before (by time, then the file's order), below an offset an ok commit gave
    before the reading member's last assignment of the partition before this read: outside
    the at-least-once window of a rebalance."""
    assigns: dict[tuple[str, str, int], list[tuple[float, int | None]]] = {}
    for line, past in _commit_before(actions, "assign"):
        assigns.setdefault((line["member"], line["topic"], line["partition"]), []).append(
            (line["t"], past))
    times = {}
    for key, at in assigns.items():
        at.sort(key=lambda x: x[0])
        times[key] = [a[0] for a in at]
    ordered = sorted(range(len(reads)), key=lambda i: (reads[i][2:6], reads[i][6], i))
    found, previous = 0, None
    for i in ordered:
        member, _, topic, partition, offset, value, t = reads[i]
        record = (topic, partition, offset, value)
        again, previous = record == previous, record
        if not again:
            continue
        key = (member, topic, partition)
        n = bisect.bisect_right(times.get(key, []), t)
        if n:  # the last assignment at or before the read (equal times share their commit)
            past = assigns[key][n - 1][1]
            if past is not None and past > offset:
                found += 1
    return found


def _non_monotonic_polls(reads: list[tuple[str, int, str, int, int, str, float]]) -> int:
    """`anomalies.non_monotonic_poll`: reads at an offset not above the previous read of their
    member, generation and partition, in the file's order."""
    last: dict[tuple[str, int, str, int], int] = {}
    found = 0
    for member, generation, topic, partition, offset, _, _ in reads:
        key = (member, generation, topic, partition)
        previous = last.get(key)
        if previous is not None and offset <= previous:
            found += 1
        last[key] = offset
    return found


# ---- loss attribution (`undertow_analysis.attribution`) --------------------------------------

_CHANGE_TYPES = ("leader_election", "truncation", "log_recovery", "broker_fenced")


@dataclass
class _Events:
    """events.jsonl as `attribution.attribute` joins it: per partition, its `become_leader`
    events in time order (t, broker, leader_epoch, log_end_offset) and their times, and its
    truncations as the leaders' join reads them (t, broker, from_offset, to_offset); per
    (topic, partition), or None for the events of no topic (which join every partition), the
    other changes it reads: elections by epoch, truncations, recoveries and fences by
    broker."""

    leaders: dict[tuple[str, int], list[tuple[float, int | None, int | None, int | None]]]
    cuts: dict[tuple[str, int], list[tuple[float, int | None, int | None, int | None]]]
    elections: dict[tuple[str, int] | None, dict[int, list[tuple[float, str | None]]]]
    by_broker: dict[tuple[str, int] | None, dict[int, list[dict[str, Any]]]]
    leader_times: dict[tuple[str, int], list[float]] = field(init=False)

    def __post_init__(self) -> None:
        for rows in self.leaders.values():
            rows.sort(key=lambda r: r[0])  # stable: equal times keep the file's order
        self.leader_times = {k: [r[0] for r in rows] for k, rows in self.leaders.items()}


def _events(path: Path) -> _Events:
    leaders: dict[tuple[str, int], list[tuple[float, int | None, int | None, int | None]]] = {}
    cuts: dict[tuple[str, int], list[tuple[float, int | None, int | None, int | None]]] = {}
    elections: dict[tuple[str, int] | None, dict[int, list[tuple[float, str | None]]]] = {}
    by_broker: dict[tuple[str, int] | None, dict[int, list[dict[str, Any]]]] = {}
    for leader, change in _rows(path, _LEADER_EVENTS, _CHANGE_EVENTS):
        if leader is not None and leader["topic"] is not None \
                and leader["partition"] is not None:
            key = (leader["topic"], leader["partition"])
            if leader["type"] == "become_leader":
                leaders.setdefault(key, []).append(
                    (leader["t"], leader["broker"], leader["leader_epoch"],
                     leader["log_end_offset"]))
            elif leader["type"] == "truncation":
                cuts.setdefault(key, []).append(
                    (leader["t"], leader["broker"], leader["from_offset"], leader["to_offset"]))
        if change is None or change["type"] not in _CHANGE_TYPES:
            continue
        topic, partition = change["topic"], change["partition"]
        if topic is None:
            key = None
        elif partition is None:
            continue  # joins no partition (topic = x and partition = null is null)
        else:
            key = (topic, partition)
        if change["type"] == "leader_election" and change["leader_epoch"] is not None:
            elections.setdefault(key, {}).setdefault(change["leader_epoch"], []).append(
                (change["t"], change["kind"]))
        if change["broker"] is not None:
            by_broker.setdefault(key, {}).setdefault(change["broker"], []).append(change)
    return _Events(leaders, cuts, elections, by_broker)


def _mechanism(events: _Events, topic: str, partition: int, offset: int, t: float,
              acks_one: bool, stuck: dict[tuple[str, int], int]) -> str:
    """`attribution.attribute` and `_mechanism` for one record at `offset` of the partition,
    surely on its leader at `t`: the first `become_leader` after t whose log ended at or
    below the offset dropped it; that broker's own truncation over it in between (a power
    loss's `log_recovery`, the pre-KIP-101 `high_watermark` rule), the election's kind, or a
    restart of that broker in between (its disk lost) says why. With none, a deposed leader
    may have acknowledged it (`_deposed`). Before all that, a record at or past its
    partition's stuck last stable offset (`stuck`, `attribution.stuck_offsets`) is behind a
    hanging transaction."""
    if offset >= stuck.get((topic, partition), MAX_OFFSET + 1):
        return "hanging_transaction"
    leaders = events.leaders.get((topic, partition), [])
    start = bisect.bisect_right(events.leader_times.get((topic, partition), []), t)
    drop = next((r for r in leaders[start:] if r[3] is not None and r[3] <= offset), None)
    if drop is None:
        deposed = start > 0 and _deposed(events, leaders[:start], topic, partition, offset, t)
        return "deposed_leader" if deposed else "unexplained"
    if drop[1] is None:
        return "unexplained"
    drop_t, dropper, drop_epoch, _ = drop
    keys = ((topic, partition), None)
    kind = None
    if drop_epoch is not None:
        votes = [e for k in keys for e in events.elections.get(k, {}).get(drop_epoch, [])]
        if votes:
            kind = max(votes, key=lambda e: e[0])[1]  # the last election of that epoch
    cause: dict[str, Any] | None = None
    restarted = False
    for k in keys:
        for e in events.by_broker.get(k, {}).get(dropper, []):
            if not t < e["t"] <= drop_t:
                continue
            if (e["type"] == "truncation" and e["from_offset"] is not None
                    and e["to_offset"] is not None
                    and e["from_offset"] > offset and e["to_offset"] <= offset
                    and (cause is None or e["t"] < cause["t"])):
                cause = e
            if ((e["type"] == "log_recovery" and e["log_end_offset"] is not None
                 and e["log_end_offset"] <= offset)
                    or (e["type"] == "broker_fenced" and e["reason"] == "restarted")):
                restarted = True
    reason = cause["reason"] if cause is not None else None
    if reason == "log_recovery":
        return "power_loss"
    if reason == "high_watermark":
        return "high_watermark_truncation"
    if kind == "unclean" or (kind == "last_known_leader" and cause is None and not restarted):
        return "unclean_election"
    if acks_one and cause is None:
        return "acks1_before_replication"
    return "disk_lost" if restarted else "unexplained"


def _deposed(events: _Events, led: list[tuple[float, int | None, int | None, int | None]],
             topic: str, partition: int, offset: int, t: float) -> bool:
    """`attribution._deposed_leader` is not null: with no `become_leader` after t dropping
    the offset and `led` the partition's `become_leader` events at or before t, the leader by
    time (the last of them) had a log ending at or below the offset, and a truncation after t
    covering it was by another broker whose last `become_leader` by t was for an earlier
    epoch: a deposed leader acknowledged the record."""
    # The leader by time (`_holder`; of equal times the file's first, as for `drop`).
    _, holder, epoch, end = next(r for r in led if r[0] == led[-1][0])
    if holder is None or epoch is None or end is None or end > offset:
        return False
    for cut_t, broker, from_offset, to_offset in events.cuts.get((topic, partition), []):
        if (broker is None or broker == holder or not cut_t > t or from_offset is None
                or to_offset is None or not from_offset > offset >= to_offset):
            continue
        # Its last become_leader by t (Spark's array_max of (t, broker, epoch) structs: a
        # null epoch orders first).
        its = [(r[0], r[2] is not None, r[2]) for r in led if r[1] == broker]
        if its and max(its)[1] and max(its)[2] < epoch:
            return True
    return False


# ---- transactions (`undertow_analysis.transactions`, the transaction checkers of `anomalies`)

HANGING_GRACE_S = 15.0  # anomalies.HANGING_GRACE_S
OUTPUT_SEPARATOR = "/"  # anomalies.OUTPUT_SEPARATOR
SAMPLE_GAP_S = 1.0  # anomalies.SAMPLE_GAP_S
DEFAULT_TIMEOUT_S = 60.0
"""Kafka's `transaction.timeout.ms` default, for a history whose meta.json does not say."""


def transaction_timeout_s(meta: dict[str, Any]) -> float:
    """meta.json's `transactions.timeout_s` (DEFAULT_TIMEOUT_S when absent), which the Spark
    job reads too (`undertow_analysis.transactions`); another shape is a clear error."""
    txns = meta.get("transactions")
    if txns is None:
        return DEFAULT_TIMEOUT_S
    timeout = txns.get("timeout_s") if isinstance(txns, dict) else None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise ValueError(f"meta.json's transactions must be {{timeout_s: positive number}}, "
                         f"got {txns!r}")
    return float(timeout)


def pipeline_topics(meta: dict[str, Any]) -> tuple[str, str] | None:
    """meta.json's pipeline (`workload.pipeline`) as (input topic, output topic), None
    without one; another shape is a clear error."""
    pipeline = meta.get("pipeline")
    if pipeline is None:
        return None
    topics = tuple(pipeline.get(k) for k in ("input_topic", "output_topic")) \
        if isinstance(pipeline, dict) else ()
    if len(topics) != 2 or not all(isinstance(t, str) for t in topics):
        raise ValueError(f"meta.json's pipeline must be {{input_topic: string, output_topic: "
                         f"string, ...}}, got {pipeline!r}")
    return topics[0], topics[1]


def _transaction_counts(history: Path, meta: dict[str, Any], txns_path: Path,
                        sends: list[_TxnSend],
                        reads: list[tuple[str | None, str, str, int, int, str, float]],
                        committed: dict[tuple[str, int], int], counts: dict[str, int]) -> None:
    """The transaction checkers' counts (`anomalies.read_past_lso`, `torn_transaction`,
    `hanging_transaction`, `duplicate_output`, `missing_output`), as their joins count
    rows; `committed`: the group's committed positions."""
    txns = [row for (row,) in _rows(txns_path, _TXNS) if row is not None]
    timeout_s = transaction_timeout_s(meta)
    counts["reads_past_lso"] = _reads_past_lso(txns, sends, reads)
    counts["torn_transactions"] = _torn_transactions(txns, sends, reads)
    counts["hanging_transactions"] = _hanging_transactions(_samples(history), timeout_s)
    pipeline = pipeline_topics(meta)
    if pipeline is not None:
        counts["duplicate_outputs"], counts["missing_outputs"] = _pipeline_outputs(
            pipeline, reads, committed)


def _pipeline_outputs(pipeline: tuple[str, str],
                      reads: list[tuple[str | None, str, str, int, int, str, float]],
                      committed: dict[tuple[str, int], int]) -> tuple[int, int]:
    """`anomalies.duplicate_output` and `missing_output`: of the drain's reads, the inputs
    whose output lies at two positions or more of the output topic, and the input records
    below their partition's committed offset (`committed`) with no output."""
    input_topic, output_topic = pipeline
    positions: dict[str, set[tuple[int, int]]] = {}
    for _reader, phase, topic, partition, offset, value, _t in reads:
        if phase == "drain" and topic == output_topic:
            head, separator, _txn = value.rpartition(OUTPUT_SEPARATOR)
            if separator and head:
                positions.setdefault(head, set()).add((partition, offset))
    duplicates = sum(1 for found in positions.values() if len(found) > 1)
    missing = sum(1 for _reader, phase, topic, partition, offset, value, _t in reads
                  if phase == "drain" and topic == input_topic
                  and offset < committed.get((topic, partition), -1) and value not in positions)
    return duplicates, missing


def _reads_past_lso(txns: list[dict[str, Any]], sends: list[_TxnSend],
                    reads: list[tuple[str | None, str, str, int, int, str, float]]) -> int:
    """`anomalies.read_past_lso`: run reads joined with the distinct (txn, value) of the
    sends and the transactions whose commit was called, read before it."""
    ends: dict[str, list[float]] = {}
    for t in txns:
        if t["t_end_invoke"] is not None:
            ends.setdefault(t["txn"], []).append(t["t_end_invoke"])
    txns_of: dict[str, set[str]] = {}
    for txn, value, *_ in sends:
        txns_of.setdefault(value, set()).add(txn)
    return sum(1 for _reader, phase, _tp, _p, _o, value, t in reads if phase == "run"
               for txn in txns_of.get(value, ()) for end in ends.get(txn, ()) if t < end)


def _torn_transactions(txns: list[dict[str, Any]], sends: list[_TxnSend],
                       reads: list[tuple[str | None, str, str, int, int, str, float]]) -> int:
    """`anomalies.torn_transaction`: the committed transactions some reader returned part of
    while reading past another of their acknowledged records (joins on the reader drop a
    null one)."""
    committed = {t["txn"] for t in txns if t["status"] == "ok"}
    records = [(txn, value, topic, partition, offset)
               for txn, value, topic, partition, offset, status in sends
               if status == "ok" and offset is not None and txn in committed]
    txns_of: dict[str, set[str]] = {}
    for txn, value, *_ in records:
        txns_of.setdefault(value, set()).add(txn)
    seen: set[tuple[str, str]] = set()
    read_by: set[tuple[str, str]] = set()
    span: dict[tuple[str, str, int], tuple[int, int]] = {}
    for reader, _phase, topic, partition, offset, value, _t in reads:
        if reader is None:
            continue
        read_by.add((reader, value))
        seen.update((reader, txn) for txn in txns_of.get(value, ()))
        lo, hi = span.get((reader, topic, partition), (offset, offset))
        span[(reader, topic, partition)] = (min(lo, offset), max(hi, offset))
    by_txn: dict[str, list[tuple[str, str, int, int]]] = {}
    for txn, value, topic, partition, offset in records:
        by_txn.setdefault(txn, []).append((value, topic, partition, offset))
    torn = set()
    for reader, txn in seen:
        for value, topic, partition, offset in by_txn[txn]:
            lo, hi = span.get((reader, topic, partition), (offset + 1, offset))
            if lo <= offset < hi and (reader, value) not in read_by:
                torn.add(txn)
    return len(torn)


def _samples(history: Path) -> list[dict[str, Any]]:
    """cluster.jsonl's usable samples with a high watermark and a last stable offset."""
    cluster = _file(history, "cluster")
    return [] if cluster is None else [
        row for (row,) in _rows(cluster, _SAMPLES) if row is not None
        and row["high_watermark"] is not None and row["last_stable_offset"] is not None]


def _stuck_offsets(history: Path) -> dict[tuple[str, int], int]:
    """`attribution.stuck_offsets`: per partition whose last sample (by time; of equal
    times, the last in the file) has its LSO below its HW, that LSO."""
    last: dict[tuple[str, int], dict[str, Any]] = {}
    for row in _samples(history):
        key = (row["topic"], row["partition"])
        if key not in last or row["t"] >= last[key]["t"]:
            last[key] = row
    return {key: row["last_stable_offset"] for key, row in last.items()
            if row["last_stable_offset"] < row["high_watermark"]}


def _hanging_transactions(samples: list[dict[str, Any]], timeout_s: float) -> int:
    """`anomalies.hanging_transaction`: per partition in time order, the stretches of samples
    with the last stable offset below the high watermark at one offset, each counting the
    time between its samples (at most SAMPLE_GAP_S a gap), longer than the timeout and
    HANGING_GRACE_S."""
    by_partition: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in samples:
        by_partition.setdefault((row["topic"], row["partition"]), []).append(row)
    found = 0
    for rows in by_partition.values():
        rows.sort(key=lambda r: r["t"])
        held: float | None = None  # the current stretch's time, None outside one
        previous: dict[str, Any] | None = None
        for row in rows:
            lso, stuck = row["last_stable_offset"], \
                row["last_stable_offset"] < row["high_watermark"]
            held_on = (stuck and previous is not None and previous["stuck"]
                       and previous["lso"] == lso)
            if not held_on:
                found += held is not None and held > timeout_s + HANGING_GRACE_S
                held = 0.0 if stuck else None
            else:
                held = (held or 0.0) + min(row["t"] - previous["t"], SAMPLE_GAP_S)
            previous = {"lso": lso, "stuck": stuck, "t": row["t"]}
        found += held is not None and held > timeout_s + HANGING_GRACE_S
    return found


# ---- the history -------------------------------------------------------------------------


def skipped_faults(value: Any, history: Path | str) -> list[dict[str, Any]]:
    """meta.json's `faults_skipped` ([] for a history from before it existed), each
    `{index, kind, reason}`; another shape is a clear error. A run with one did not test
    its whole schedule: its verdict is not the experiment's (`skipped_text`)."""
    if value is None:
        return []
    if not (isinstance(value, list) and all(
            isinstance(f, dict) and isinstance(f.get("index"), int)
            and isinstance(f.get("kind"), str) and isinstance(f.get("reason"), str | None)
            for f in value)):
        raise ValueError(f"{history}/meta.json: faults_skipped must be a list of {{index: int, "
                         f"kind: string, reason: string}}, got {value!r}")
    return [{"index": f["index"], "kind": f["kind"], "reason": f.get("reason")} for f in value]


def skipped_text(skipped: list[dict[str, Any]]) -> str:
    """e.g. `fault 2 (kill): start of fault 1 did not come in time`."""
    return "; ".join(f"fault {f['index']} ({f['kind']})" + (f": {f['reason']}" if f["reason"]
                                                            else "") for f in skipped)


def as_expected(verdict: str, expect: str | None, skipped: list[dict[str, Any]]) -> bool:
    """Whether a run passes: the verdict its experiment expects, with every planned fault
    injected (a run whose fault was skipped did not test the experiment, whatever it found)."""
    return verdict == expect and not skipped


SKIPPED_NOTE = ("the nemesis did not inject every planned fault, so the run did not test the "
                "experiment's whole schedule and its verdict is not the experiment's")


def _meta(history: Path) -> dict[str, Any]:
    """meta.json, refused as the job refuses it (`io.read_meta`, `job.analyze`,
    `report.drain_shortfalls`, `groups.consumer_group`): not a JSON object, a field it reads
    of the wrong type, an incomplete run (acknowledged records look lost: no verdict), a
    `drain` or `consumer_group` of another shape."""
    path = history / "meta.json"
    if not path.is_file():
        raise FileNotFoundError(f"history {history} has no meta.json")
    try:
        meta = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from e
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: expected a JSON object")
    read = ("experiment", "spec", "start", "end", "idempotent", "expect", "incomplete",
            "incomplete_reason", "consumer_group", "transactions", "faults_skipped")
    problems = schema.META.problems({k: meta[k] for k in read if k in meta}, partial=True)
    if problems:
        raise ValueError(f"{path}: {'; '.join(problems)}")
    if meta.get("incomplete"):
        raise ValueError(f"history {history} is incomplete: {meta.get('incomplete_reason')}; "
                         f"records are missing from then on and there was no drain")
    drain = meta.get("drain")
    if drain is not None and not (isinstance(drain, dict) and all(
            key.isdigit() and isinstance(e, dict) and isinstance(e.get("read_to"), int)
            and (e.get("end") is None or isinstance(e["end"], int)) for key, e in drain.items())):
        raise ValueError(f"{path}: drain must be an object of partition -> {{end, read_to}}")
    group = meta.get("consumer_group")
    if group is not None and not (
            isinstance(group, dict) and isinstance(group.get("group_id"), str)
            and isinstance(group.get("offsets_topic"), str)
            and isinstance(group.get("offsets_partition"), int)
            and not isinstance(group.get("offsets_partition"), bool)):
        raise ValueError(f"{path}: consumer_group must be {{group_id: string, offsets_topic: "
                         f"string, offsets_partition: int}}, got {group!r}")
    return meta


def _acks_one(meta: dict[str, Any]) -> bool:
    """The producers used acks=1 (`job._acks_one`)."""
    spec = meta.get("spec")
    workload = spec.get("workload") if isinstance(spec, dict) else None
    return isinstance(workload, dict) and str(workload.get("acks")) == "1"


def _file(history: Path, name: str) -> Path | None:
    path = history / f"{name}.jsonl"
    if path.is_file():
        return path
    if name in OPTIONAL:
        return None
    raise FileNotFoundError(f"history file {path} does not exist")


def _by_value(sent: dict[str, _Sent], reads: _Reads, committed: dict[tuple[str, int], int],
              counts: dict[str, int]) -> tuple[int, int, list[tuple[str, int, int, float]]]:
    """Add each value's anomalies to `counts` (`checks.classify`, the value checks of
    `anomalies`), and return the values failed and indeterminate, and the lost ones with a
    position (topic, partition, offset, when first acknowledged): the attribution's
    subjects. A position is a value's lowest by partition, then offset, as `checks._at`
    packs and orders them."""
    failed = indeterminate = 0
    lost: list[tuple[str, int, int, float]] = []
    for value in sent.keys() | reads.drained.keys() | reads.run_read:
        s = sent.get(value)
        drained = reads.drained.get(value)
        n_drained = len(drained) if drained else 0
        run_read = value in reads.run_read
        if s is None:
            outcome = None
        elif s.n_ok:
            outcome = "acked"
        elif s.n_info:
            indeterminate += 1
            outcome = "indeterminate"
        else:
            failed += 1
            outcome = "failed"
        if outcome == "acked" and not n_drained:
            counts["lost"] += 1
            if s.acked_at:
                topic, partition, offset = min(s.acked_at, key=_packed)
                lost.append((topic, partition, offset, s.t_acked))
        if outcome == "acked" and n_drained and s.acked_at and not (s.acked_at & drained):
            counts["misplaced"] += 1
        if run_read and not n_drained:
            counts["phantom_reads"] += 1
        if n_drained > 1:
            counts["duplicates"] += 1
        if outcome == "failed" and (run_read or n_drained):
            counts["aborted_reads"] += 1
        if outcome is None:  # in the reads only: read, never sent
            counts["unexpected"] += 1
        if committed and n_drained and not run_read:
            topic, partition, offset = min(drained, key=_packed)
            passed = committed.get((topic, partition))
            if passed is not None and offset < passed:
                counts["skipped"] += 1
    return failed, indeterminate, lost


def _packed(position: tuple[str, int, int]) -> tuple[int, int, str]:
    """A position's order in `checks.packed_position` (partition, then offset; between two
    topics at one position, which Spark leaves to chance, the name's)."""
    topic, partition, offset = position
    return partition, offset, topic


def check_history(history_dir: Path) -> Summary:
    """The Spark analysis's verdict, anomaly counts, send totals and loss mechanisms on the
    history in `history_dir` (see `Summary`). Raises FileNotFoundError without meta.json,
    sends.jsonl or reads.jsonl, and ValueError where the job refuses the history (an
    incomplete run among them)."""
    history = Path(history_dir)
    meta = _meta(history)
    sends, reads = _file(history, "sends"), _file(history, "reads")
    groups, events = _file(history, "groups"), _file(history, "events")
    # A consumer group's history (`groups.group_history`): groups.jsonl with any byte.
    grouped = groups is not None and groups.stat().st_size > 0
    txns = _file(history, "txns")
    # A transactions' history (`transactions.txn_history`): txns.jsonl with any byte.
    transactional = txns is not None and txns.stat().st_size > 0
    txn_sends: list[_TxnSend] | None = [] if transactional else None
    sent, read = _sends(sends, txn_sends), _reads(reads, grouped, transactional)
    counts = dict.fromkeys(COUNTS, 0)
    committed: dict[tuple[str, int], int] = {}
    if grouped:
        commit_lines, actions, assigns = _group_lines(groups)
        committed = _committed_positions(commit_lines)
        counts["committed_offsets_lost"] = _committed_offsets_lost(actions)
        counts["redelivered_past_commit"] = _redelivered_past_commit(assigns, read.member_reads)
        counts["non_monotonic_polls"] = _non_monotonic_polls(read.member_reads)
    if transactional:
        assert txn_sends is not None
        _transaction_counts(history, meta, txns, txn_sends, read.committed_reads, committed,
                            counts)
    counts["inconsistent_offsets"] = len(read.inconsistent)
    failed, indeterminate, lost = _by_value(sent, read, committed, counts)
    mechanisms: Counter[str] = Counter()
    if events is not None and lost:  # `job._explain`: no attribution without events.jsonl
        explained, acks_one = _events(events), _acks_one(meta)
        stuck = _stuck_offsets(history) if transactional else {}
        for topic, partition, offset, t in lost:
            mechanisms[_mechanism(explained, topic, partition, offset, t, acks_one,
                                  stuck)] += 1
    attempted = len(sent)
    return Summary(verdict=verdict(counts, bool(meta.get("idempotent", False))), counts=counts,
                   attempted=attempted, acked=attempted - failed - indeterminate, failed=failed,
                   indeterminate=indeterminate, mechanisms=dict(mechanisms),
                   faults_skipped=skipped_faults(meta.get("faults_skipped"), history))
