"""Late EndTxn requests: each EndTxn the transaction coordinator received while the
producer's transaction then open had not asked to end, paired with the transaction that sent
it and the one it landed in (Jepsen's 2024 analysis of Kafka's transaction protocol; KIP-890).

The protocol assumes that a producer's requests arrive in order, but an EndTxn travels on the
connection to the coordinator, with timeouts and retries of its own. A first attempt held on a
slow link, after its retry completed the transaction, reaches the coordinator during the next
transaction. Under transaction version 1 that transaction has the same producer id and epoch
(`TransactionCoordinator.endTransactionWithTV1`), so the coordinator ends it early with the
partitions it had then: read_committed readers see records the producer then aborts (aborted
reads), or part of a transaction (torn). Under version 2 every EndTxn bumps the epoch
(`TransactionMetadata.prepareAbortOrCommit`), and the late request is fenced.

The coordinator's `end_txn` events (events.jsonl) say what each EndTxn met and what it did;
txns.jsonl says when each of the client's transactions began and first asked to end. An
`end_txn` of a client (not the coordinator's own timeout abort) at t is *late* when the
transaction of its transactional id open at t (the last begun at or before t) had not asked to
end by t: it landed in that transaction. Which earlier transaction sent it:

- under version 2, exactly: the transaction whose own end the coordinator decided under the
  request's producer id and epoch (each transaction has its epoch);
- under version 1, where every transaction has the same epoch, the history cannot say
  exactly; the sender is the earlier transaction of the same decision whose end took the
  longest (a late first attempt means its transaction ended by a retry, after at least one
  request timeout). The report says which rule named it (`sent_by_rule`).

Plain Python over few rows (one event and one transaction line per transaction), like
`explain`, once the job collected them (`queries`); no PySpark at import.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

_NAMES = {"aborted_read": ("aborted read", "aborted reads"),
          "read_past_lso": ("read past the LSO", "reads past the LSO"),
          "torn_transaction": ("torn transaction", "torn transactions")}
TXN_ANOMALIES = tuple(_NAMES)
"""The anomaly kinds a late EndTxn causes in the transaction it lands in, counted per
transaction (each a row of anomalies/ with the value)."""
_END_TXN_COLUMNS = ("t", "node", "transactional_id", "producer_id", "producer_epoch",
                    "decision", "reason", "txn_state", "txn_epoch", "transaction_version",
                    "txn_partitions")
_TXN_COLUMNS = ("producer", "txn", "transactional_id", "intent", "status", "error",
                "t_begin", "t_end_invoke", "t_complete", "values")
_OUTCOMES = {
    "decided": "{ended}",
    "retry": "answered it as a retry of the last decision: nothing changed",
    "fenced": "fenced it (PRODUCER_FENCED): its epoch {epoch} is older than the id's {current}",
    "invalid_state": "refused it (INVALID_TXN_STATE): nothing changed",
}


def queries(events: DataFrame, txns: DataFrame, anomaly_rows: DataFrame
            ) -> tuple[DataFrame, DataFrame, DataFrame]:
    """What `pair` reads, as queries to collect: events.jsonl's `end_txn` lines, txns.jsonl's
    lines and the (value, kind) rows of anomalies/ a late EndTxn causes."""
    from pyspark.sql import functions as F

    return (events.filter(F.col("type") == "end_txn").select(*_END_TXN_COLUMNS),
            txns.select(*_TXN_COLUMNS),
            anomaly_rows.filter(F.col("kind").isin(*TXN_ANOMALIES)).select("value", "kind"))


def pair(ends: list[dict[str, Any]], txns: list[dict[str, Any]],
         anomalies: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each late `end_txn` of `ends` (events.jsonl's rows) as a row: the event's fields,
    `landed_in` and `sent_by` (txns.jsonl's rows, `sent_by` None when no earlier transaction
    qualifies), `sent_by_rule` (`epoch` or `slowest_end`) and `anomalies`, the counts by
    kind of `anomalies` (anomalies/'s rows: value, kind) among the values of the transaction
    it landed in. Ordered by time."""
    by_id: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for txn in txns:  # a line without these fields (malformed, yet usable to others) says nothing
        if txn["transactional_id"] is not None and txn["t_begin"] is not None:
            by_id[txn["transactional_id"]].append(txn)
    for group in by_id.values():
        group.sort(key=lambda x: x["t_begin"])
    begins = {tid: [x["t_begin"] for x in group] for tid, group in by_id.items()}
    kinds_of: dict[str, list[str]] = defaultdict(list)
    for row in anomalies:
        kinds_of[row["value"]].append(row["kind"])
    decided = [e for e in ends if e["reason"] == "decided"]
    late = []
    for end in sorted(ends, key=lambda e: e["t"]):
        if end["reason"] not in _OUTCOMES or end["decision"] not in ("commit", "abort"):
            continue  # the coordinator's own abort (`timed_out`: no request of the client's)
        group = by_id.get(end["transactional_id"], [])
        begun = bisect.bisect_right(begins.get(end["transactional_id"], []), end["t"])
        if not begun:
            continue
        landed = group[begun - 1]
        if landed["t_end_invoke"] is not None and landed["t_end_invoke"] <= end["t"]:
            continue  # the open transaction had asked to end: its own request, or a retry
        sender, rule = _sender(end, group[:begun - 1], decided)
        counts: dict[str, int] = {}
        for value in landed["values"] or ():
            for kind in kinds_of.get(value, ()):
                counts[kind] = counts.get(kind, 0) + 1
        late.append({**end, "landed_in": landed, "sent_by": sender, "sent_by_rule": rule,
                     "anomalies": counts})
    return late


def _sender(end: dict[str, Any], earlier: list[dict[str, Any]],
            decided: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, str]:
    """The earlier transaction (of `earlier`, by begin time) that sent `end`, and the rule
    that named it."""
    if end["transaction_version"] is not None and end["transaction_version"] >= 2:
        own = [d["t"] for d in decided if d["transactional_id"] == end["transactional_id"]
               and d["producer_id"] == end["producer_id"]
               and d["producer_epoch"] == end["producer_epoch"] and d["t"] < end["t"]]
        if own:
            begun = bisect.bisect_right([x["t_begin"] for x in earlier], own[0])
            return (earlier[begun - 1] if begun else None), "epoch"
        return None, "epoch"
    ended = [x for x in earlier if x["t_end_invoke"] is not None
             and (x["intent"] == end["decision"]
                  or (end["decision"] == "abort" and x["status"] == "fail"))]
    if not ended:
        return None, "slowest_end"
    return max(ended, key=lambda x: (x["t_complete"] - x["t_end_invoke"], x["t_begin"])), \
        "slowest_end"


def sentence(late: dict[str, Any], t0: float, fault_at: Callable[[float], str | None]
             ) -> str:
    """One late request in words: what arrived, where it landed and what the coordinator
    did, what became of that transaction, and which transaction sent it (`fault_at`: the
    fault active when it was sent, in `explain._fault_at`'s words, or None)."""
    landed, sender = late["landed_in"], late["sent_by"]
    decision = late["decision"]
    coordinator = late["node"].replace("-", " ") if late.get("node") else "the coordinator"
    version = late["transaction_version"]
    partitions = ", ".join(late["txn_partitions"] or ()) or "none"
    ended = (f"{'committed' if decision == 'commit' else 'aborted'} it early, with the "
             f"partitions it had then ({partitions}): " + (
                 f"below transaction version 2 (this request's is {version}) the epoch is the "
                 f"same in every transaction, so the request passed for {landed['txn']}'s own"
                 if version is None or version < 2 else
                 f"under transaction version {version} its epoch should have been fenced"))
    did = _OUTCOMES[late["reason"]].format(ended=ended, epoch=late["producer_epoch"],
                                           current=late["txn_epoch"])
    text = (f"EndTxn ({decision}) with producer id {late['producer_id']} and epoch "
            f"{late['producer_epoch']} reached the coordinator ({coordinator}) at "
            f"+{late['t'] - t0:.2f} s, while {landed['txn']} (begun "
            f"at +{landed['t_begin'] - t0:.2f} s, {late['txn_state']}) had not asked to end; "
            f"the coordinator {did}.")
    if late["reason"] == "decided":
        outcome = {"ok": "committed", "fail": "aborted", "info": "left indeterminate"}[
            landed["status"]]
        error = f" ({landed['error']})" if landed.get("error") else ""
        text += f" {landed['producer']} then {outcome} {landed['txn']}{error}"
        found = ", ".join(f"{n} {_NAMES[kind][n != 1]}"
                          for kind, n in sorted(late["anomalies"].items()))
        text += f": {found}." if found else "."
    if sender is None:
        return text + " No earlier transaction of the producer ended that way: its sender " \
                      "is unknown."
    during = fault_at(sender["t_end_invoke"])
    sent = (f"its {decision}, called at +{sender['t_end_invoke'] - t0:.2f} s"
            f"{' ' + during if during else ''}, took "
            f"{sender['t_complete'] - sender['t_end_invoke']:.2f} s")
    if late["sent_by_rule"] == "epoch":
        return text + f" It was {sender['txn']}'s, which ran under that epoch ({sent})."
    return text + (f" It was most likely {sender['txn']}'s: {sent}, the longest end of the "
                   f"producer's earlier transactions (a late first attempt means its "
                   f"transaction ended by a retry).")
