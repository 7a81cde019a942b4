"""Replication events: every replication state change of a broker or the controller, as data.

The log lines say what a node did in words for people; a harness that explains a loss needs
the same changes as data it can order and join (who became leader in which epoch, which
replica truncated how much and why, who was fenced). Each change is one JSON object on one
line of ``<data dir>/replication-events.jsonl``, and ``GET /v1/events`` serves the file so
that the harness collects it while the run goes on (``events.jsonl`` in
``docs/history-format.md``; the field names are the harness's schema,
``undertow_history.schema.EVENTS``, without ``node``, which the harness adds).

The file observes the broker; it is not part of the storage device the broker simulates.
Lines are appended and flushed, never fsynced, and the file is not registered with the
``DurabilityTracker``: a simulated power loss does not cut it, and the ``power_loss`` event
written just before one survives for the restarted broker to read. A write that fails is
logged and otherwise ignored: the observer must never change what it observes.

The first line holds the log's id, made when the file is created. Readers page through the
file by byte offset; one that names another id (the node came back with an empty disk, so a
new file) is answered from the start of the new file, with its id.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import parse_qs

from minibroker import environment

__all__ = [
    "EVENTS_FILE",
    "ElectionKind",
    "ElectionReason",
    "ElrChangeReason",
    "EndTxnOutcome",
    "EventType",
    "EventsQueryError",
    "FenceReason",
    "IsrChangeReason",
    "MemberRemovedReason",
    "RebalanceReason",
    "ReplicationEventLog",
    "TruncationReason",
    "parse_events_query",
]

log = logging.getLogger("minibroker.events")

EVENTS_FILE = "replication-events.jsonl"
MAX_EVENTS_PER_PAGE = 5000


class EventType(StrEnum):
    BECOME_LEADER = "become_leader"
    BECOME_FOLLOWER = "become_follower"
    TRUNCATION = "truncation"
    ISR_CHANGE = "isr_change"
    ELR_CHANGE = "elr_change"
    LEADER_ELECTION = "leader_election"
    LEADER_RECOVERY = "leader_recovery"  # KIP-704: RECOVERING after an unclean election
    BROKER_FENCED = "broker_fenced"
    BROKER_UNFENCED = "broker_unfenced"
    POWER_LOSS = "power_loss"
    LOG_RECOVERY = "log_recovery"
    # The group coordinator's (``minibroker.coordinator``).
    COORDINATOR_LOAD = "coordinator_load"
    COORDINATOR_UNLOAD = "coordinator_unload"
    GROUP_REBALANCE = "group_rebalance"
    GROUP_STABLE = "group_stable"
    GROUP_EMPTY = "group_empty"
    GROUP_MEMBER_REMOVED = "group_member_removed"
    # The transaction coordinator's (``minibroker.coordinator.transaction_coordinator``).
    END_TXN = "end_txn"


class TruncationReason(StrEnum):
    OFFSET_FOR_LEADER_EPOCH = "offset_for_leader_epoch"  # KIP-101/279
    HIGH_WATERMARK = "high_watermark"  # before KIP-101
    OUT_OF_RANGE = "out_of_range"  # the fetch offset is outside the leader's log
    LOG_RECOVERY = "log_recovery"  # what a power loss took, found at the restart


class IsrChangeReason(StrEnum):
    LAG = "lag"
    CAUGHT_UP = "caught_up"
    FENCED = "fenced"
    UNCLEAN_SHUTDOWN = "unclean_shutdown"  # re-registered without a clean shutdown
    CONTROLLED_SHUTDOWN = "controlled_shutdown"  # it asked to shut down (wantShutDown)


class ElrChangeReason(StrEnum):
    """Why the controller changed a partition's ELR or last known leader (KIP-966)."""

    ISR_BELOW_MIN = "isr_below_min"  # replicas left an ISR below min.insync.replicas
    UNCLEAN_SHUTDOWN = "unclean_shutdown"  # KAFKA-15586: removed on re-registration
    ELECTED = "elected"  # an ELR member became the leader (and the ISR)
    ISR_AT_MIN = "isr_at_min"  # the ISR reached min.insync.replicas again
    UNCLEAN_ELECTION = "unclean_election"  # an unclean election clears it
    MIN_ISR_CHANGED = "min_isr_changed"  # min.insync.replicas changed: cleared


class ElectionKind(StrEnum):
    CLEAN = "clean"  # an ISR member
    ELR = "elr"  # an eligible leader replica, the ISR being empty (KIP-966)
    LAST_KNOWN_LEADER = "last_known_leader"  # ISR and ELR empty (KIP-966, Kafka 4.1+)
    UNCLEAN = "unclean"  # a replica outside the ISR
    PREFERRED = "preferred"  # the auto leader rebalance
    OFFLINE = "offline"  # no leader could be elected


class ElectionReason(StrEnum):
    LEADER_FENCED = "leader_fenced"
    BROKER_UNFENCED = "broker_unfenced"
    PREFERRED = "preferred"
    UNCLEAN_SHUTDOWN = "unclean_shutdown"  # the leader re-registered after an unclean one
    CONTROLLED_SHUTDOWN = "controlled_shutdown"  # the leader began a controlled shutdown


class FenceReason(StrEnum):
    SESSION_EXPIRED = "session_expired"
    RESTARTED = "restarted"
    CONTROLLED_SHUTDOWN = "controlled_shutdown"  # its controlled shutdown was granted


class RebalanceReason(StrEnum):
    """Why a group began a rebalance (``group_rebalance``)."""

    MEMBER_JOINED = "member_joined"
    MEMBER_LEFT = "member_left"
    SESSION_EXPIRED = "session_expired"
    METADATA_CHANGED = "metadata_changed"  # a member's protocols changed
    LEADER_REJOINED = "leader_rejoined"  # the leader's JoinGroup in a Stable group
    SYNC_FAILED = "sync_failed"  # SyncGroups missing, or the assignment not written


class MemberRemovedReason(StrEnum):
    """Why a member left its group (``group_member_removed``)."""

    LEFT = "left"  # LeaveGroup
    SESSION_EXPIRED = "session_expired"
    REBALANCE_TIMEOUT = "rebalance_timeout"  # did not rejoin, or sync, in time


class EndTxnOutcome(StrEnum):
    """What the transaction coordinator made of an EndTxn (``end_txn``): the request's
    producer id and epoch and the transaction's state decide it (Kafka 4.2's
    ``endTransaction``/``endTransactionWithTV1``). A harness pairs each with the client's
    transactions to find a request that landed in a later transaction than the one that
    sent it (Jepsen 2024, KIP-890)."""

    DECIDED = "decided"  # it ended the Ongoing transaction (PrepareCommit/PrepareAbort)
    TIMED_OUT = "timed_out"  # the coordinator's own abort, with a fenced epoch
    RETRY = "retry"  # a retry of a decision already taken: answered NONE, nothing changed
    FENCED = "fenced"  # PRODUCER_FENCED: an older epoch (or not the current instance's)
    INVALID_STATE = "invalid_state"  # INVALID_TXN_STATE: nothing to end that way


class EventsQueryError(ValueError):
    """A ``/v1/events`` query the endpoint cannot answer (HTTP 400); names the parameter."""


def parse_events_query(query: str) -> tuple[str | None, int]:
    """``log_id=ID&offset=N``, both optional, as ``GET /v1/events`` takes them."""
    params = parse_qs(query, keep_blank_values=True)
    for name, values in params.items():
        if name not in ("log_id", "offset"):
            raise EventsQueryError(f"unknown parameter {name!r}: /v1/events takes log_id and "
                                   f"offset")
        if len(values) > 1:
            raise EventsQueryError(f"parameter {name!r} is given {len(values)} times")
    log_id = params.get("log_id", [None])[0]
    if log_id == "":
        raise EventsQueryError("parameter 'log_id' is empty")
    offset = params.get("offset", ["0"])[0]
    if not (offset.isascii() and offset.isdigit()):
        raise EventsQueryError(f"parameter 'offset' must be a byte offset (an integer >= 0), "
                               f"not {offset!r}")
    return log_id, int(offset)


class ReplicationEventLog:
    """One node's events file: ``emit`` appends, ``read`` pages through it by byte offset.

    ``clock`` gives ``t`` (wall-clock seconds: by default the wall clock of the node's
    environment when the log is made, the virtual one in simulation; the tests'
    step-by-step cluster, ``tests/minibroker/stepper.py``, passes its manual clock so that
    tests can assert events exactly), and ``on_event`` sees each event as written.
    """

    def __init__(self, data_dir: Path, *, clock: Callable[[], float] | None = None,
                 on_event: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.path = data_dir / EVENTS_FILE
        self._clock = clock or environment.current().wall_clock
        self._on_event = on_event
        self._failing = False
        self.log_id, self._first_event_offset = self._open_or_create()

    # ---- the file ---------------------------------------------------------------------

    def _open_or_create(self) -> tuple[str, int]:
        """The id of the file there, and where its events start; a new file when there is
        none (or its first line is not a header, which no complete file lacks)."""
        try:
            with self.path.open("rb") as f:
                header = f.readline()
            log_id = json.loads(header)["log_id"] if header.endswith(b"\n") else None
            if isinstance(log_id, str) and log_id:
                self._drop_torn_line()
                return log_id, len(header)
            log.warning("%s has no header line: starting a new events log", self.path)
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("%s is unreadable (%s): starting a new events log", self.path, exc)
        log_id = environment.new_uuid().hex
        header = (json.dumps({"log_id": log_id}) + "\n").encode()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("wb") as f:
                f.write(header)
        except OSError as exc:
            self._write_failed(exc)
        return log_id, len(header)

    def _drop_torn_line(self) -> None:
        """Cut a last line without its newline (the process died writing it): no reader was
        given it, and the next event would be glued to it."""
        with self.path.open("r+b") as f:
            end = f.seek(0, os.SEEK_END)
            f.seek(max(end - 1, 0))
            if f.read(1) == b"\n":
                return
            f.seek(0)
            keep = f.read().rfind(b"\n") + 1
            f.truncate(keep)
        log.warning("%s: cut a torn last line (%d bytes)", self.path, end - keep)

    def _write_failed(self, exc: OSError) -> None:
        if not self._failing:
            log.warning("Could not write replication events to %s (%s); they are lost until "
                        "a write succeeds", self.path, exc)
        self._failing = True

    # ---- writing ------------------------------------------------------------------------

    def emit(self, event_type: EventType, /, **fields: Any) -> None:
        """Append one event: ``t``, ``type`` and ``fields`` (those that apply)."""
        line = json.dumps({"t": self._clock(), "type": event_type, **fields},
                          separators=(",", ":")) + "\n"
        try:
            with self.path.open("a", encoding="utf-8") as f:
                f.write(line)
        except OSError as exc:
            self._write_failed(exc)
        else:
            if self._failing:
                log.warning("Writing replication events to %s again", self.path)
            self._failing = False
        if self._on_event is not None:
            self._on_event(json.loads(line))

    # ---- reading ------------------------------------------------------------------------

    def read(self, log_id: str | None = None, offset: int = 0,
             max_events: int = MAX_EVENTS_PER_PAGE) -> dict[str, Any]:
        """``{"log_id", "events", "next_offset"}``: at most ``max_events`` events from byte
        ``offset`` on, and where the next page starts. Another log's id reads this log from
        its start. Only whole lines are served: one being appended waits for the next page."""
        if log_id is not None and log_id != self.log_id:
            offset = 0
        offset = max(offset, self._first_event_offset)
        events: list[dict[str, Any]] = []
        try:
            with self.path.open("rb") as f:
                self._check_offset(f, offset)
                f.seek(offset)
                while len(events) < max_events:
                    line = f.readline()
                    if not line.endswith(b"\n"):
                        break
                    offset += len(line)
                    try:
                        events.append(json.loads(line))
                    except ValueError:
                        log.warning("%s: skipped an unreadable line before byte %d", self.path,
                                    offset)
        except FileNotFoundError:
            pass  # the file could not be created: nothing to serve
        return {"log_id": self.log_id, "events": events, "next_offset": offset}

    def _check_offset(self, f: BinaryIO, offset: int) -> None:
        end = f.seek(0, os.SEEK_END)
        if offset > end:
            raise EventsQueryError(f"parameter 'offset': {offset} is past the end of events "
                                   f"log {self.log_id} ({end} bytes)")
        if offset > self._first_event_offset:
            f.seek(offset - 1)
            if f.read(1) != b"\n":
                raise EventsQueryError(f"parameter 'offset': {offset} is not where an event "
                                       f"of events log {self.log_id} starts")

    def events(self) -> Iterator[dict[str, Any]]:
        """Every event in the file, oldest first."""
        offset = 0
        while True:
            page = self.read(self.log_id, offset)
            if not page["events"]:
                return
            yield from page["events"]
            offset = page["next_offset"]
