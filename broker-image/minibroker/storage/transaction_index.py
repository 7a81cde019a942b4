"""A segment's aborted-transaction index: Kafka's ``TransactionIndex`` and ``AbortedTxn``.

Each entry is a transaction aborted by a marker in this segment: the producer, the
transaction's first offset in the partition, the marker's offset, and the LSO once it was
aborted. A ``read_committed`` fetch collects the entries that overlap what it returns, from
the segment of its fetch offset on, and sends them with the records: the consumer drops a
producer's batches from the aborted transaction's first offset up to its marker. The LSO
stored with each entry ends the search early (Kafka's ``TxnIndexSearchResult.isComplete``):
every later entry starts at or past it.

Kafka keeps it in a ``.txnindex`` file beside each segment; here it is in memory and
rebuilt with the producer state when the log is opened (``Log``), both being functions of
the log's batches.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["AbortedTxn", "TransactionIndex", "collect_aborted_txns"]


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


class TransactionIndex:
    """The aborted transactions whose markers lie in one segment, in marker order."""

    def __init__(self) -> None:
        self.entries: list[AbortedTxn] = []

    def append(self, txn: AbortedTxn) -> None:
        self.entries.append(txn)

    def truncate_to(self, offset: int) -> None:
        """Drop the entries whose markers are at or past ``offset`` (the log was cut)."""
        self.entries = [txn for txn in self.entries if txn.last_offset < offset]

    def collect(self, fetch_offset: int, upper_bound: int, into: list[AbortedTxn]) -> bool:
        """Add the entries overlapping [fetch_offset, upper_bound); True once the search is
        complete (an entry's LSO reaches the bound)."""
        for txn in self.entries:
            if txn.last_offset >= fetch_offset and txn.first_offset < upper_bound:
                into.append(txn)
            if txn.last_stable_offset >= upper_bound:
                return True
        return False


def collect_aborted_txns(indexes: Iterable[TransactionIndex], fetch_offset: int,
                         upper_bound: int) -> list[AbortedTxn]:
    """Kafka's ``LocalLog.collectAbortedTransactions`` over the indexes of the segments
    from the one holding ``fetch_offset`` on."""
    found: list[AbortedTxn] = []
    for index in indexes:
        if index.collect(fetch_offset, upper_bound, found):
            break
    return found
