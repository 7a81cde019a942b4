"""The anomaly kinds: one row each in `KINDS`, the one place a kind is defined.

Jepsen's model: an anomaly is one checker plus one entry in one table. A row gives the kind's
name (anomalies/'s `kind`, and `checks.classify`'s flag column), its count in report.json,
what it does to the verdict, its meaning in report.html, the position and detail of its
anomalies/ rows and whether the loss attribution explains it; its check is a function of one
value's columns (`Value`). Everything that lists the kinds derives from the table: the flags
and counts of `checks`, the verdict, the counts of report.json and the summary, report.html's
help, the kinds `attribution` explains. docs/design.md ("Anomaly kinds") lists them for users.

No PySpark here: report.py and html.py read the table in processes without it (the runner
prints the summary). A check only combines the `Value` columns it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column


@dataclass(frozen=True)
class Value:
    """One value's columns, as `checks.classify` aggregates them, that a check reads: each
    attribute is the column of its name (`checks.value_columns`). outcome is `acked`,
    `indeterminate`, `failed` or null (never sent); n_drained counts the positions the drain
    read it at; placed is 1 if it was drained where an acknowledgement put it; the rest are
    positions (structs of tk and pos, pos null when there is none): the first acknowledged,
    the first read during the run, the first read at all, the first read where another value
    was read too."""

    outcome: Column
    n_drained: Column
    placed: Column
    acked_at: Column
    run_read_at: Column
    read_at: Column
    inconsistent_at: Column


def _acked(v: Value) -> Column:
    return v.outcome == "acked"


def _drained(v: Value) -> Column:
    return v.n_drained > 0


def _known(at: Column) -> Column:
    return at["pos"].isNotNull()


def lost(v: Value) -> Column:
    """Acknowledged, nowhere in the drain."""
    return _acked(v) & ~_drained(v)


def misplaced(v: Value) -> Column:
    """Acknowledged and drained, but never at a position an acknowledgement gave (an acks=0
    send gets none, so it is never misplaced)."""
    return _acked(v) & _drained(v) & (v.placed == 0) & _known(v.acked_at)


def phantom_read(v: Value) -> Column:
    """Read during the run, nowhere in the drain."""
    return _known(v.run_read_at) & ~_drained(v)


def inconsistent_offset(v: Value) -> Column:
    """Read at a position where another value was read too (`checks.inconsistent_offsets`)."""
    return _known(v.inconsistent_at)


def duplicate(v: Value) -> Column:
    """Drained at two or more positions."""
    return v.n_drained > 1


def aborted_read(v: Value) -> Column:
    """Every send attempt failed definitively, yet it was read."""
    return (v.outcome == "failed") & _known(v.read_at)


def unexpected(v: Value) -> Column:
    """Read, never sent."""
    return v.outcome.isNull() & _known(v.read_at)


INCIDENT, RETRY = "incident", "retry"
"""How the attribution explains a kind's records: in loss incidents (`attribution.incidents`),
or as producer retries in duplicate groups (`attribution.duplicate_groups`)."""


@dataclass(frozen=True)
class Kind:
    """One anomaly kind (see the module docstring)."""

    name: str
    """anomalies/'s `kind` and `checks.classify`'s flag column."""
    count: str
    """Its count in report.json (the table's order is the counts' order)."""
    loss: bool
    """Any makes the verdict `loss`; otherwise any makes it `anomalies`."""
    help: str
    """What the count counts (report.html)."""
    check: Callable[[Value], Column]
    """True for a value with this anomaly."""
    at: tuple[str, ...]
    """The position anomalies/ gives it: the first of these (`checks.POSITIONS`) that is
    known, else the last."""
    detail: str | None
    """anomalies/'s detail; None: the positions it was drained at."""
    explained_by: str | None = None
    """INCIDENT, RETRY, or None: the attribution does not explain it."""
    only_if_idempotent: bool = False
    """An anomaly only when the producer was idempotent (the broker should have recognised
    the retry, KIP-98); otherwise it makes no verdict."""
    counts_values: bool = True
    """False: the count is of what its own checker finds, not of values (positions, for
    inconsistent_offset: `checks.inconsistent_offsets`)."""


KINDS = (
    Kind("lost", "lost", loss=True, check=lost, at=("acked_at",),
         help="acked values missing from the drain",
         detail="acknowledged, missing from the drain", explained_by=INCIDENT),
    Kind("misplaced", "misplaced", loss=True, check=misplaced, at=("acked_at",),
         help="acked values drained, but not where their acknowledgement put them",
         detail=None, explained_by=INCIDENT),
    Kind("phantom_read", "phantom_reads", loss=True, check=phantom_read, at=("run_read_at",),
         help="values read during the run, missing from the drain",
         detail="read during the run, missing from the drain", explained_by=INCIDENT),
    Kind("inconsistent_offset", "inconsistent_offsets", loss=True, check=inconsistent_offset,
         at=("inconsistent_at",), help="positions at which reads saw two or more values",
         detail="another value was read at this offset", counts_values=False),
    Kind("duplicate", "duplicates", loss=False, check=duplicate,
         at=("acked_at", "drained_at"), help="values drained at more than one position",
         detail=None, explained_by=RETRY, only_if_idempotent=True),
    Kind("aborted_read", "aborted_reads", loss=False, check=aborted_read, at=("read_at",),
         help="values whose every send failed, yet were read",
         detail="every send attempt failed, yet it was read"),
    Kind("unexpected", "unexpected", loss=False, check=unexpected, at=("read_at",),
         help="values read but never sent", detail="read, but never sent"),
)
NAMES = tuple(k.name for k in KINDS)
COUNTS = tuple(k.count for k in KINDS)
"""The anomaly counts of report.json, in its order."""


def explained_by(how: str) -> tuple[Kind, ...]:
    """The kinds the attribution explains `how` (INCIDENT or RETRY)."""
    return tuple(k for k in KINDS if k.explained_by == how)


def verdict(counts: Mapping[str, int], idempotent: bool) -> str:
    """`loss` if a kind that is loss has a count (an acknowledged record gone or moved, a read
    later contradicted); `anomalies` if another has (reads of records never successfully sent,
    duplicates despite an idempotent producer); otherwise `clean`."""
    found = [k for k in KINDS if counts[k.count] and (idempotent or not k.only_if_idempotent)]
    if any(k.loss for k in found):
        return "loss"
    return "anomalies" if found else "clean"
