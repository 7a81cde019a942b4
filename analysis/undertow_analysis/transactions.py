"""The transactions' history (`workload.transactions`), as the transaction checks read it.

A run whose producers are transactional writes txns.jsonl (each transaction's values, intent
and outcome), names each send's transaction in sends.jsonl (`txn`) and each read's isolation
level in reads.jsonl, and samples each partition's last stable offset into cluster.jsonl. The
checks of `anomalies.TXN_KINDS` are pure functions of those (`anomalies.Transactions`); the
value checks see a transactional send with its transaction's outcome already (the runner
writes it so), and split lost records into `lost` and `lost_committed_write` by `txn`. A
history without transaction lines plans none of it: its counts are 0 at no cost.
"""

from __future__ import annotations

from functools import reduce
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from undertow_analysis.anomalies import FINDING, TXN_KINDS, Transactions
from undertow_analysis.io import History
from undertow_analysis.report import clock_zero
from undertow_history.checker import pipeline_topics, transaction_timeout_s


def reader(consumer: Any, generation: Any) -> Any:
    """A `read_committed` reader's name: the consumer, with its generation when it is a group
    member (`c0 (generation 3)`), whose reads of one partition are one contiguous stretch."""
    return F.when(generation.isNull(), consumer).otherwise(
        F.format_string("%s (generation %d)", consumer, generation))


def txn_history(history: History) -> Transactions | None:
    """The transactions' history, or None when txns.jsonl has no line."""
    if not history.has_lines("txns"):
        return None
    committed_reads = (F.col("isolation") == "read_committed") | (F.col("phase") == "drain")
    reads = (history.usable("reads").filter(committed_reads)
             .select(reader(F.col("consumer"), F.col("generation")).alias("reader"), "phase",
                     "topic", "partition", "offset", "value", "t"))
    samples = (history.usable("cluster")
               .filter(F.col("high_watermark").isNotNull()
                       & F.col("last_stable_offset").isNotNull())
               .select("t", "topic", "partition", "high_watermark", "last_stable_offset"))
    return Transactions(
        txns=history.usable("txns"),
        sends=history.usable("sends").filter(F.col("txn").isNotNull())
        .select("txn", "value", "topic", "partition", "offset", "status"),
        reads=reads, samples=samples, timeout_s=transaction_timeout_s(history.meta),
        start=clock_zero(history.meta, None), pipeline=pipeline_topics(history.meta),
        commits=history.usable("groups").filter(
            (F.col("type") == "commit") & (F.col("status") == "ok")
            & F.col("offset").isNotNull()).select("topic", "partition", "offset", "t"))


def findings(tx: Transactions) -> DataFrame:
    """Every transaction checker's rows (`anomalies.TXN_KINDS`) with their kind first:
    anomalies/'s columns but the fault."""
    return reduce(DataFrame.unionByName, [
        k.checker(tx).select(F.lit(k.name).alias("kind"), *FINDING) for k in TXN_KINDS])
