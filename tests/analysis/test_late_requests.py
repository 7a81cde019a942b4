"""Late EndTxn requests (`late_requests`): the coordinator's `end_txn` events paired with the
client's transactions, on planted rows (each rule of `pair` alone) and, through the Spark
job, on the simulated history of experiments/txn-delayed-endtxn-tv1.yaml."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from library_sims import library_history, shared_root

from undertow_analysis import late_requests
from undertow_analysis.job import analyze
from undertow_analysis.report import summary_text

TID = "undertow-p0"


def txn(n: int, begin: float, end: float | None, complete: float, *, intent: str = "commit",
        status: str = "ok", error: str | None = None) -> dict[str, Any]:
    return {"producer": "p0", "txn": f"p0-t{n}", "transactional_id": TID, "intent": intent,
            "status": status, "error": error, "t_begin": begin, "t_end_invoke": end,
            "t_complete": complete, "values": [f"v{n}-0", f"v{n}-1"]}


def end_txn(t: float, reason: str, *, decision: str = "commit", epoch: int = 0,
            txn_epoch: int = 0, version: int = 0) -> dict[str, Any]:
    return {"t": t, "node": "broker-3", "transactional_id": TID, "producer_id": 7,
            "producer_epoch": epoch, "decision": decision, "reason": reason,
            "txn_state": "Ongoing", "txn_epoch": txn_epoch, "transaction_version": version,
            "txn_partitions": ["t-0"] if reason in ("decided", "timed_out") else None}


# t0's commit took 2 s (its first EndTxn timed out); t1 and t2 ended at once; t3 was open
# when t0's first EndTxn came at 10.5 and committed it.
TXNS = [txn(0, 0.0, 1.0, 3.0), txn(1, 3.0, 3.2, 3.3), txn(2, 3.3, 3.5, 3.6),
        txn(3, 10.0, 11.0, 11.1, status="fail", error="INVALID_TXN_STATE")]
OWN = [end_txn(2.9, "decided"), end_txn(3.25, "decided"), end_txn(3.55, "decided")]


def test_a_request_that_came_before_the_open_transaction_asked_to_end_is_late() -> None:
    late = end_txn(10.5, "decided")
    [row] = late_requests.pair([*OWN, late], TXNS, [
        {"value": "v3-0", "kind": "aborted_read"}, {"value": "v3-1", "kind": "aborted_read"},
        {"value": "v3-0", "kind": "read_past_lso"}, {"value": "v2-0", "kind": "aborted_read"}])
    assert row["t"] == 10.5 and row["landed_in"]["txn"] == "p0-t3"
    assert (row["sent_by"]["txn"], row["sent_by_rule"]) == ("p0-t0", "slowest_end")
    assert row["anomalies"] == {"aborted_read": 2, "read_past_lso": 1}
    text = late_requests.sentence(row, 0.0, lambda t: "during #1 delay" if t < 2 else None)
    assert text.startswith("EndTxn (commit) with producer id 7 and epoch 0 reached the "
                           "coordinator (broker 3) at +10.50 s, while p0-t3 (begun at +10.00 "
                           "s, Ongoing) had not asked to end; the coordinator committed it "
                           "early, with the partitions it had then (t-0)")
    assert "p0 then aborted p0-t3 (INVALID_TXN_STATE): 2 aborted reads, 1 read past the " \
           "LSO." in text
    assert "most likely p0-t0's: its commit, called at +1.00 s during #1 delay, took 2.00 " \
           "s" in text


def test_a_transaction_s_own_end_its_retries_and_the_coordinator_s_aborts_are_not_late(
        ) -> None:
    ends = [*OWN, end_txn(3.4, "retry"),  # t2 open, before its end: late, answered as a retry
            end_txn(3.58, "retry"),  # t2's own retry, after its end was called
            end_txn(5.0, "retry"),  # between transactions: t2 had asked to end
            end_txn(10.2, "timed_out", decision="abort"),  # the coordinator's own
            end_txn(-1.0, "decided")]  # before any transaction of the id began
    assert [(r["t"], r["reason"], r["landed_in"]["txn"], r["sent_by"]["txn"])
            for r in late_requests.pair(ends, TXNS, [])] == [(3.4, "retry", "p0-t2", "p0-t0")]


def test_under_version_2_the_epoch_names_the_sender() -> None:
    """Each transaction has its epoch: the request's names the transaction whose own end
    the coordinator decided under it, not the slowest."""
    own = [end_txn(2.9, "decided", epoch=0, txn_epoch=0, version=2),
           end_txn(3.25, "decided", epoch=1, txn_epoch=1, version=2),
           end_txn(3.55, "decided", epoch=2, txn_epoch=2, version=2)]
    late = end_txn(10.5, "fenced", epoch=1, txn_epoch=3, version=2)
    [row] = late_requests.pair([*own, late], TXNS, [])
    assert (row["sent_by"]["txn"], row["sent_by_rule"]) == ("p0-t1", "epoch")
    text = late_requests.sentence(row, 0.0, lambda _t: None)
    assert "fenced it (PRODUCER_FENCED): its epoch 1 is older than the id's 3. It was " \
           "p0-t1's, which ran under that epoch (its commit, called at +3.20 s, took 0.10 s)" \
           in text


def test_a_late_request_no_earlier_transaction_sent_says_so() -> None:
    [row] = late_requests.pair([end_txn(10.5, "decided", decision="abort")], TXNS, [])
    assert row["sent_by"] is None
    assert late_requests.sentence(row, 0.0, lambda _t: None).endswith(
        "No earlier transaction of the producer ended that way: its sender is unknown.")


def test_the_report_names_the_late_end_txn_of_the_version_1_twin(spark, tmp_path_factory,
                                                                  tmp_path: Path) -> None:
    """Through the Spark job: the report's `late_requests`, its summary and report.html say
    which EndTxn landed where, and the aborted reads it caused are all the run's."""
    history = library_history(shared_root(tmp_path_factory), "txn-delayed-endtxn-tv1")
    report = analyze(spark, str(history), str(tmp_path / "report"))
    explained, counts = report["explained"], report["counts"]
    assert (explained["late_request_count"], explained["late_requests_decided"]) == (1, 1)
    [late] = explained["late_requests"]
    assert late["reason"] == "decided" and late["sent_by_rule"] == "slowest_end"
    assert late["anomalies"] == {"aborted_read": counts["aborted_reads"],
                                 "read_past_lso": counts["reads_past_lso"]}
    assert counts["aborted_reads"] > 0
    assert late["sentence"] in summary_text(report)
    html = (tmp_path / "report" / "report.html").read_text()
    assert "<h2>Late transaction requests</h2>" in html and late["landed_in"] in html


def test_lines_without_the_fields_the_pairing_needs_are_passed_over() -> None:
    """A txns line without its begin or transactional id, and an `end_txn` without its
    decision or with an outcome the coordinator does not write, are skipped, not fatal (the
    analysis reads them as usable: other checks need only their other fields)."""
    broken_txns = [*TXNS, {**txn(9, 10.2, None, 11.0), "t_begin": None},
                   {**txn(8, 10.1, None, 11.0), "transactional_id": None}]
    ends = [*OWN, end_txn(10.5, "decided"), {**end_txn(10.6, "decided"), "decision": None},
            {**end_txn(10.7, "decided"), "reason": "unknown"}]
    assert [(r["t"], r["landed_in"]["txn"]) for r in late_requests.pair(ends, broken_txns, [])] \
        == [(10.5, "p0-t3")]
