"""A virtual member of the workload's consumer group that speaks Kafka 4's consumer protocol
(KIP-848, ``workload.consumer.groupProtocol: consumer``) as librdkafka 2.16's consumer plays
it (``rdkafka_cgrp.c``'s ``rd_kafka_cgrp_consumer_*``, read at confluentinc/librdkafka
4c3b017). It shares the classic member's coordinator lookup, connections, reading and
commits (``group_member.SimGroupMember``) and writes the same history lines; the generation
of its reads and group lines is its member epoch, as librdkafka's group metadata carries it.

The member's model:

- **Member id.** The consumer makes its own (KIP-1082: a random UUID in base64, made when
  the consumer is) and keeps it for its lifetime, fenced or not; a new consumer (``rejoin``)
  makes a new one.
- **Heartbeats.** ConsumerGroupHeartbeat v1 to the coordinator, one at a time, every
  heartbeat interval the coordinator answers with (``group.consumer.heartbeat.interval.ms``),
  each bounded by that interval (the first by 45 s, librdkafka's ``session.timeout.ms``
  default). Joining: member epoch 0 and the full request (the rebalance timeout
  ``max.poll.interval.ms``, the subscribed topic, no server assignor, no owned partitions).
  Later ones carry the member epoch only, except the full request (with the owned
  partitions) after the coordinator was looked up again, and the acknowledgement of a
  reconciled assignment (its partitions). A heartbeat librdkafka expedites goes at once,
  after ``2^(n-1)`` ms when ``n`` are unanswered (``rd_kafka_cgrp_consumer_expedite_next_
  heartbeat``, up to ``retry.backoff.max.ms``); one due while no coordinator is known goes
  when one is found.
- **Answers.** None: the member id, epoch and interval are taken; an assignment that differs
  from the one being reconciled (or held) is the next target. UNKNOWN_MEMBER_ID and
  FENCED_MEMBER_EPOCH: the partitions are lost (``revoke`` lines, nothing committed) and the
  member joins again at epoch 0 with its member id, at once. NOT_COORDINATOR,
  COORDINATOR_NOT_AVAILABLE, a broken connection or a timeout: the coordinator is looked up
  again and the next heartbeat is the full request. COORDINATOR_LOAD_IN_PROGRESS, and any
  error before the first answer: sent again after ``retry.backoff.ms``. GROUP_MAX_SIZE_REACHED,
  UNSUPPORTED_ASSIGNOR, INVALID_REQUEST, UNSUPPORTED_VERSION, UNRELEASED_INSTANCE_ID,
  GROUP_ID_NOT_FOUND and GROUP_AUTHORIZATION_FAILED are fatal: the partitions are lost and
  the consumer reads nothing more. Others wait for the next interval.
- **No session on the client.** Under this protocol librdkafka's session timeout check does
  nothing (``rkcg_ts_session_timeout`` stays 0): a member that cannot reach its coordinator
  keeps its partitions, and reads them whenever it reaches their leaders, until an answer
  fences it. The coordinator meanwhile expires it after ``group.consumer.session.timeout.ms``
  and gives its partitions to others.
- **Reconciliation** (``rd_kafka_cgrp_consumer_handle_next_assignment``, incremental):
  partitions the target no longer has are revoked first (``manual``: the application's
  synchronous commit of every moved position in on_revoke, then ``revoke`` lines; ``auto``:
  ``revoke`` lines, and librdkafka commits their positions as it removes them and waits for
  that commit), then the new ones are assigned (``assign`` lines, OffsetFetch, read from the
  committed offset), then a heartbeat goes at once to acknowledge the target. The partitions
  kept are read on throughout. A target that arrives while one awaits its acknowledgement
  waits for it.
- **Commits** as the classic member's, by OffsetCommit v9 at the member's epoch when sent.
  STALE_MEMBER_EPOCH expedites the next heartbeat; an automatic commit is then sent again,
  with the epoch that heartbeat brings, for up to 45 s (librdkafka's
  ``rd_kafka_cgrp_consumer_defer_offset_commit``), a manual one fails. UNKNOWN_MEMBER_ID
  expedites the next heartbeat and fails the commit.
- **Leaving.** ``stop`` and ``rejoin`` revoke every partition (committing, as above), then
  send a heartbeat at epoch -1 (best effort, 5 s), as ``close`` does.

Not modelled: static membership and regex subscriptions (the spec refuses them), rack ids, a
server assignor of the member's choice (the coordinator's default serves), the Metadata
request librdkafka makes for an assigned topic id it does not know (a member subscribes to one
topic, so every partition assigned is of it), the backoffs' jitter, a pipeline's members
(the spec refuses a pipeline with this protocol in simulation).
"""

from __future__ import annotations

import base64
import logging
import math
from collections.abc import Callable
from typing import Any

from minibroker import environment
from minibroker.cluster.types import ErrorCode
from undertow.sim.clients import RETRY_BACKOFF_MS, NetworkError
from undertow.sim.group_member import (
    LEAVE_TIMEOUT_MS,
    NO_MEMBER,
    SESSION_TIMEOUT_MS,
    Address,
    SimGroupMember,
)

log = logging.getLogger("undertow.sim.group")

FENCED = (ErrorCode.unknown_member_id, ErrorCode.fenced_member_epoch)
"""Answers after which the member's partitions are lost and it joins again at epoch 0."""
FATAL = (ErrorCode.group_max_size_reached, ErrorCode.unsupported_assignor,
         ErrorCode.invalid_request, ErrorCode.unsupported_version,
         ErrorCode.unreleased_instance_id, ErrorCode.group_id_not_found,
         ErrorCode.group_authorization_failed)
"""Answers librdkafka raises as the consumer's fatal error."""
MOVED = (ErrorCode.not_coordinator, ErrorCode.coordinator_not_available)
RETRY_BACKOFF_MAX_MS = 1000.0
"""librdkafka's retry.backoff.max.ms: the longest an expedited heartbeat waits."""
LEAVE_EPOCH = -1


def _member_id() -> str:
    """librdkafka's ``rd_kafka_Uuid_base64str`` of a random UUID, from the node's source."""
    return base64.urlsafe_b64encode(environment.new_uuid().bytes).decode().rstrip("=")


class SimConsumerMember(SimGroupMember):
    """One member (``c0``, ``c1``, ...) of the consumer protocol and its consecutive
    consumers (``rejoin``)."""

    # ---- one consumer's lifetime ---------------------------------------------------------------

    def _reset_consumer(self) -> None:
        super()._reset_consumer()
        self._session_ms = SESSION_TIMEOUT_MS  # what a deferred commit waits for
        self._epoch = 0
        self._interval_ms = 0
        """The coordinator's heartbeat interval; 0 until its first answer."""
        self._due = 0.0
        """When the next heartbeat may go."""
        self._timer = 0
        self._unanswered = 0
        self._full = True
        self._current: list[int] = []
        """The assignment last acknowledged (librdkafka's ``rkcg_current_assignment``)."""
        self._target: list[int] | None = None
        """The assignment being reconciled, until its acknowledgement is answered."""
        self._next_target: list[int] | None = None
        self._acknowledge = False
        """The target is reconciled: the next heartbeat carries it."""
        self._step = 0
        """One per reconciliation: a step of an abandoned one does nothing."""
        self._topic_id: str | None = None
        self._tokens: dict[int, int] = {}
        """Per partition held, the token its reads carry (``_holds``)."""
        self._reads = 0
        self._after_heartbeat: list[Callable[[], None]] = []

    def _join(self) -> None:
        """Join at epoch 0 (first, or after being fenced), or leave when closing."""
        if self._close_then is not None:
            self._leave()
            return
        if self._phase != "up":
            self._set_phase("up")
        if not self._member_id:
            self._member_id = _member_id()
        self._epoch, self._generation = 0, -1
        self._full = True
        self._expedite()

    def _close(self, then: Callable[[], None]) -> None:
        """Revoke what is held (with its commit), then leave the group, then ``then``."""
        self._close_then = then
        if self._phase == "up":
            token = self._set_phase("revoking")  # no heartbeat from here (will_leave)
            self._step += 1
            self._revoke_partitions(list(self._assignment),
                                    lambda: token == self._token and self._leave())
        elif self._phase == "closed":
            self._close_then = None
            then()
        # revoking: its end leaves; leaving: its end calls the new `then`

    def _send_leave(self, member_id: str, left: Callable[[], None]) -> None:
        """A heartbeat at epoch -1 (``rd_kafka_cgrp_consumer_leave``), best effort."""
        address = self._coordinator
        if self._epoch <= 0 or address is None:
            left()
            return
        self._coordinator_call(address, "consumer_group_heartbeat", {
            "member_id": member_id, "member_epoch": LEAVE_EPOCH}, LEAVE_TIMEOUT_MS,
            lambda _answer, _error: left())

    def _found(self, address: Address) -> None:
        super()._found(address)
        if self._phase == "up" and self._full:
            self._expedite()  # the coordinator changed: the full request goes at once

    # ---- heartbeats -----------------------------------------------------------------------

    def _expedite(self) -> None:
        backoff = (min(2.0 ** (self._unanswered - 1), RETRY_BACKOFF_MAX_MS)
                   if self._unanswered else 0.0)
        self._due = self._now() + backoff
        self._serve()

    def _serve(self) -> None:
        """``rd_kafka_cgrp_consumer_serve``'s heartbeat: send one when due and none is in
        flight, else wake up when it is due."""
        if self._phase != "up" or self._heartbeat_busy:
            return
        wait = self._due - self._now()
        if wait > 0:
            if wait != math.inf:
                self._arm(wait)
            return
        # Before the first answer there is no interval: the next one goes when this one
        # is answered (or retried).
        self._due = self._now() + (self._interval_ms or math.inf)
        if self._interval_ms:
            self._arm(self._interval_ms)
        self._heartbeat_busy = True
        self._unanswered += 1
        token = self._token
        self._with_coordinator(lambda address: self._send_heartbeat(token, address))

    def _arm(self, delay_ms: float) -> None:
        self._timer += 1
        timer = self._timer
        self._later(delay_ms, lambda: timer == self._timer and self._serve())

    def _send_heartbeat(self, token: int, address: Address) -> None:
        if token != self._token:
            return
        acknowledging = self._acknowledge and self._target is not None
        full = self._full
        body: dict[str, Any] = {"member_id": self._member_id, "member_epoch": self._epoch}
        if full:
            body.update(rebalance_timeout_ms=self._rebalance_timeout_ms, topics=[self._topic],
                        owned=self._owned(self._current if self._epoch else []))
        if acknowledging:
            assert self._target is not None
            body["owned"] = self._owned(self._target)

        def answered(answer: Any, error: NetworkError | None) -> None:
            if token != self._token:
                return
            self._heartbeat_busy = False
            if error is not None:  # the coordinator is looked up again (_coordinator_call)
                self._full = True
                self._retry_first()
            elif answer.error == ErrorCode.none:
                self._heartbeat_answered(answer, acknowledging)
            elif answer.error in FENCED:
                log.info("%s: ConsumerGroupHeartbeat failed: %s: will rejoin the group",
                         self.name, answer.error.name)
                self._fenced()
            elif answer.error in MOVED:
                self._full = True
                self._coordinator_failed(address)
                self._retry_first()
            elif answer.error == ErrorCode.coordinator_load_in_progress:
                self._due = self._now() + RETRY_BACKOFF_MS
            elif answer.error in FATAL:
                self._fatal(answer.error)
            else:
                self._retry_first()
            self._resend_deferred()
            self._serve()  # librdkafka serves the group on every answer

        self._coordinator_call(address, "consumer_group_heartbeat", body,
                               self._interval_ms or SESSION_TIMEOUT_MS, answered)

    def _resend_deferred(self) -> None:
        waiting, self._after_heartbeat = self._after_heartbeat, []
        for action in waiting:
            action()

    def _retry_first(self) -> None:
        """Before its first answer a heartbeat is sent again after retry.backoff.ms; later
        ones wait for the interval (or the coordinator's return)."""
        if not self._interval_ms:
            self._due = self._now() + RETRY_BACKOFF_MS

    def _heartbeat_answered(self, answer: Any, acknowledging: bool) -> None:
        self._unanswered = 0
        self._full = False
        if answer.member_id:
            self._member_id = answer.member_id
        self._epoch = answer.member_epoch
        self._generation = self._epoch if self._epoch > 0 else -1
        if answer.heartbeat_interval_ms > 0 and answer.heartbeat_interval_ms != self._interval_ms:
            self._interval_ms = answer.heartbeat_interval_ms
            self._due = self._now() + self._interval_ms
        if acknowledging and self._target is not None:
            self._current, self._target, self._acknowledge = self._target, None, False
        self._resend_deferred()  # at the new epoch, before what this answer reconciles
        if answer.assignment is not None:
            if answer.assignment:
                self._topic_id = next(iter(answer.assignment))
            assigned = sorted(p for ps in answer.assignment.values() for p in ps)
            held = self._target if self._target is not None else self._current
            self._next_target = assigned if assigned != held else None
        if self._target is None and self._next_target is not None:
            self._reconcile()
        elif self._acknowledge and not acknowledging:
            self._expedite()  # reconciled while this one was in flight

    def _owned(self, partitions: list[int]) -> dict[str, list[int]]:
        return {self._topic_id: sorted(partitions)} if self._topic_id and partitions else {}

    # ---- reconciliation, fencing ------------------------------------------------------------

    def _reconcile(self) -> None:
        """Revoke what the target drops, assign what it adds, then acknowledge it."""
        target, self._next_target = self._next_target, None
        assert target is not None
        self._target, self._acknowledge = target, False
        self._step += 1
        step = self._step
        revoked = [p for p in self._assignment if p not in target]
        added = [p for p in target if p not in self._assignment]

        def assign() -> None:
            if step != self._step or self._phase != "up":
                return
            self._take(added)
            self._acknowledge = True
            self._expedite()

        if revoked:
            self._revoke_partitions(revoked, assign)
        else:
            assign()

    def _take(self, partitions: list[int]) -> None:
        self._reads += 1
        for p in partitions:
            self._tokens[p] = self._reads
            self._group("assign", p)
        self._assignment = sorted(self._assignment + partitions)
        if partitions:
            self._fetch_committed(self._reads, partitions)

    def _holds(self, token: int, p: int) -> bool:
        return self._tokens.get(p) == token

    def _revoke_partitions(self, partitions: list[int], then: Callable[[], None]) -> None:
        """Stop reading ``partitions``, commit (the application every moved position,
        ``manual``; librdkafka the revoked ones', ``auto``) and give them up, then ``then``."""
        offsets = self._moved(self._assignment if not self._auto else partitions)
        for p in partitions:
            self._tokens.pop(p, None)
        self._assignment = [p for p in self._assignment if p not in partitions]
        if not self._auto:  # the application's on_revoke: commit, then give up
            def revoked() -> None:
                self._give_up(partitions)
                then()

            self._commit(offsets, self._clock_s(), revoked)
        else:  # on_revoke gives up; librdkafka commits as it removes them
            self._give_up(partitions)
            self._commit(offsets, None, then)

    def _lose_all(self) -> None:
        self._step += 1
        for p in self._assignment:
            self._tokens.pop(p, None)
        self._give_up(self._assignment)
        self._assignment = []
        self._current, self._target, self._next_target = [], None, None
        self._acknowledge = False

    def _fenced(self) -> None:
        """The partitions are lost and the member joins again, keeping its member id."""
        self._lose_all()
        self._join()

    def _fatal(self, code: ErrorCode) -> None:
        log.warning("%s: ConsumerGroupHeartbeat fatal error: %s: the consumer reads no more",
                    self.name, code.name)
        self._lose_all()
        self._member_id = NO_MEMBER
        self._set_phase("closed")
        if self._metadata is not None:
            self._metadata.stop()

    # ---- commits ----------------------------------------------------------------------------

    def _commit_identity(self, member_id: str, generation: int) -> dict[str, Any]:
        """OffsetCommit v9 at the member's epoch when sent (librdkafka builds the request
        then)."""
        return {"member_id": self._member_id, "instance_id": None,
                "generation_id": self._epoch, "api_version": 9}

    def _commit_defers(self, errors: dict[int, int | None], deferred: bool,
                       auto: bool) -> bool:
        codes = set(errors.values())
        if codes & {ErrorCode.stale_member_epoch, ErrorCode.unknown_member_id}:
            self._expedite()
        if auto and ErrorCode.stale_member_epoch in codes:
            return True
        return super()._commit_defers(errors, deferred, auto)

    def _commit_resend(self, send: Callable[[Address], None]) -> None:
        """Sent again once the next heartbeat is answered (with the epoch it brings), before
        the partitions that answer revokes are committed: librdkafka re-serves its deferred
        commits on its main thread as the answer comes (``rkcg_wait_coord_q``), while a
        revocation's commit waits for the application's poll (its rebalance callback).
        With no heartbeat going (the member leaves), once a coordinator is known."""
        if self._phase == "up":
            self._after_heartbeat.append(lambda: self._with_coordinator(send))
        else:
            super()._commit_resend(send)
