"""A virtual member of the workload's consumer group (``workload.consumer.mode: subscribe``).

The simulation's ``runner.group_member.GroupMember``: a consumer that subscribes to the topic
with Kafka's classic group protocol as librdkafka's consumer plays it (the eager ``range``
assignor), with the settings ``GroupSettings.client_config`` gives it, and the same lines in
the history: each partition assigned and revoked, each committed offset the coordinator
returned on an assignment and each commit with its outcome (groups.jsonl, classified by
``runner.group_member.commit_outcome``), each record returned with its generation
(reads.jsonl).

The member's model (librdkafka's ``rdkafka_cgrp.c``, with the workload's settings):

- **Coordinator.** A new consumer's first FindCoordinator waits ``sparse_connect_intvl``
  (50 ms) from its start: librdkafka drops its bootstrap connection once the first metadata
  names the brokers (KIP-899) and opens one to a named broker no sooner than that after the
  first (``rd_kafka_connect_any``); on local processes a new consumer's JoinGroup reaches
  the coordinator 60-140 ms after it is made. Then FindCoordinator to the bootstrap brokers in
  turn: at once, again
  ``retry.backoff.ms`` (100 ms) after an answer without one (COORDINATOR_NOT_AVAILABLE while
  ``__consumer_offsets`` is created or its partition has no leader), and every second while
  a question goes unanswered (a request lost on a cut link). NOT_COORDINATOR,
  COORDINATOR_NOT_AVAILABLE, or a request to the coordinator that times out or whose
  connection is reset or refused, makes the member look it up again; so does, every second,
  a coordinator whose connection waits to reopen (``reconnect.backoff.ms``).
- **Connections.** Besides the client's connection backoff (``sim/clients.py``): a request
  that times out closes the member's connection to that broker, failing every other request
  in flight on it as reset (``socket.max.fails`` 1), so that a member whose links heal is not
  left waiting for answers lost on them.
- **Join.** Once the coordinator is known, the join waits until the consumer's metadata has
  the topic unexpired (``metadata.max.age.ms``, three refresh intervals: join-state
  wait-metadata), so a member cut off from every broker sends no JoinGroup until an answer
  comes back. Then JoinGroup (protocol ``range``; the subscription is JSON naming the topic) with
  ``session.timeout.ms`` and ``max.poll.interval.ms`` as the rebalance timeout, the request
  bounded by that timeout plus 3 s. MEMBER_ID_REQUIRED (KIP-394) is answered by joining
  again with the id given; UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION and FENCED_INSTANCE_ID by
  joining afresh (no member id); NOT_COORDINATOR by finding the coordinator again; anything
  else by joining again after 100 ms. Member ids come from the coordinator, the generation
  from JoinGroup's answer. ``group.instance.id`` when the membership is static.
- **Sync.** The leader assigns the topic's partitions (their number from its metadata cache,
  ``topic.metadata.refresh.interval.ms`` 1 s) with the range assignor over the members
  sorted by member id (by instance id when every member is static), unless told to skip the
  assignment; followers send none. The request is bounded by ``session.timeout.ms`` plus
  3 s. On the answer the partitions are assigned; a REBALANCE_IN_PROGRESS answer joins
  again, UNKNOWN_MEMBER_ID and ILLEGAL_GENERATION join afresh.
- **Assigned.** ``assign`` lines, then OffsetFetch of the assigned partitions
  (``require_stable`` under ``read_committed``, retried while UNSTABLE_OFFSET_COMMIT):
  ``committed`` lines, and each partition resumes from its committed offset or, with none,
  from its log start (``auto.offset.reset=earliest``: ListOffsets -2; also on
  OFFSET_OUT_OF_RANGE). It fetches from each partition's leader as the assign-mode consumer
  does (``fetch.wait.max.ms`` 500), at the group's ``isolation.level``, dropping control
  batches and (read committed) aborted transactions' batches as it does.
- **Heartbeats** every ``heartbeat.interval.ms``, one at a time, each bounded by
  ``session.timeout.ms``. REBALANCE_IN_PROGRESS: the eager rebalance, the partitions revoked
  (``manual``: the application's synchronous commit first; ``auto``: librdkafka commits the
  positions as it unassigns), then JoinGroup once the commit is answered.
  UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, FENCED_INSTANCE_ID: the partitions are lost
  (``revoke`` lines, nothing committed) and the member joins afresh. No successful heartbeat
  for ``session.timeout.ms``: the same, the session timed out (checked at that moment, as
  librdkafka's main loop checks on every turn).
- **Commits.** ``auto``: every ``auto.commit.interval.ms`` the positions that moved since
  the last commit (``t_invoke`` null); ``manual``: the application's commit of the moved
  positions every commit interval, on revoke and on leaving (``t_invoke`` when called). A
  position is the offset after the last record returned (Kafka commits the next offset to
  read). An OffsetCommit carries the member id and generation of when it was made, so a
  commit of an earlier generation is refused, never stored. librdkafka's deferred commit:
  without a coordinator to send it to, or answered NOT_COORDINATOR,
  COORDINATOR_NOT_AVAILABLE or with its connection reset (``_TRANSPORT``), a commit waits
  once for the coordinator, up to ``session.timeout.ms``, and is sent again (else it fails
  with ``_WAIT_COORD``). A request that times out fails with ``_TIMED_OUT``. The outcome
  lines are written when the commit ends.
- **Leaving.** ``stop`` revokes (with its commit) and sends LeaveGroup (best effort, 5 s;
  not for a static member), as ``close`` does; ``rejoin`` does the same and then subscribes
  a new consumer, with no member id (``Workload``'s rebalancer). Both wait for the
  application's poll to return (the workload's loop polls ``POLL_S``, 0.2 s, and sees them
  between polls); the first consumer's polls start at a drawn point of that period (its
  thread's start), a new consumer's as it is made.

Not modelled: the rejoin librdkafka starts on an ILLEGAL_GENERATION answer to an
OffsetCommit (the next heartbeat, at most a second later, finds it); the application not
reading while its synchronous manual commit is in flight; the cooperative protocols; the
``roundrobin`` protocol librdkafka also offers; the jitter of librdkafka's timers (the
members' heartbeats keep the phase their assignment gave them).

Every callback runs on the member's client host; a new consumer (``rejoin``) and each
phase of its membership discard the answers meant for the ones before.

Long (about 830 lines): librdkafka's group member is one state machine (``rdkafka_cgrp.c``
is some 6,000 lines); each item above is a few methods of it here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from confluent_kafka import KafkaError

from minibroker.cluster.types import (
    ErrorCode,
    FetchPartition,
    FetchRequestData,
    FetchResult,
    TopicPartition,
)
from minibroker.environment import random_source
from undertow.runner.group_member import POLL_S, GroupSettings, commit_outcome
from undertow.runner.history import HistoryWriter
from undertow.runner.values import decode_value
from undertow.sim.clients import (
    FETCH_MAX_BYTES,
    FETCH_WAIT_MAX_MS,
    RECONNECT_BACKOFF_MS,
    RETRY_BACKOFF_MS,
    SOCKET_TIMEOUT_MS,
    Endpoint,
    LeaderWait,
    Metadata,
    NetworkError,
    committed_records,
)

PROTOCOL = "range"
SESSION_TIMEOUT_MS = 45_000
HEARTBEAT_INTERVAL_MS = 3000
"""librdkafka's defaults of session.timeout.ms and heartbeat.interval.ms."""
COORD_QUERY_INTERVAL_MS = 1000.0
"""librdkafka asks for the coordinator again this often while it has no answer."""
JOIN_GRACE_MS = 3000.0
"""A JoinGroup waits this much longer than the rebalance timeout, a SyncGroup than the session
timeout (librdkafka's grace)."""
LEAVE_TIMEOUT_MS = 5000.0
"""librdkafka's LeaveGroup is best effort: it waits this long for the answer."""
NO_MEMBER = ""
LOST = (ErrorCode.unknown_member_id, ErrorCode.illegal_generation,
        ErrorCode.fenced_instance_id)
"""Answers after which the member's partitions are lost and it joins with no member id."""
COORDINATOR_MOVED = (ErrorCode.not_coordinator, ErrorCode.coordinator_not_available)
BUSY_RETRY_MS = 10.0
"""A pipeline member's fetch answered while its transaction ends is fetched again after
this."""
SPARSE_CONNECT_INTERVAL_MS = RECONNECT_BACKOFF_MS / 2
"""librdkafka's ``sparse_connect_intvl`` (``reconnect.backoff.ms`` / 2, at least 11 ms): a new
client's bootstrap connection is dropped once its first metadata names the brokers (KIP-899,
librdkafka 2.10), and its coordinator query waits for a connection to one of them, which
``rd_kafka_connect_any`` opens no sooner than this after the bootstrap one."""

Address = tuple[str, int]


class TransactionalCommits(Protocol):
    """A pipeline member's transactional side (`sim.pipeline`), which a member in
    `commit: transaction` mode hands each record it returns and its commits to, as the real
    member (`runner.pipeline_member`) does: each commit is its transaction's end with the
    offsets in it, a lost partition aborts it."""

    @property
    def busy(self) -> bool:
        """Ending a transaction (or not ready): the member reads nothing meanwhile, as the
        real member's loop is in its synchronous commit."""

    def transform(self, partition: int, offset: int, value: str) -> None: ...

    def commit(self, offsets: dict[int, int], then: Callable[[bool], None]) -> None:
        """End the open transaction with ``offsets``; ``then(committed)``."""

    def abort(self) -> None: ...


def range_assignment(members: Sequence[tuple[str, str | None, bytes]], topic: str,
                     partitions: int) -> dict[str, list[int]]:
    """The range assignor (librdkafka's and Kafka's ``RangeAssignor``) over one topic: the
    members subscribed to it, sorted by member id (by instance id when all are static),
    take consecutive ranges, the first ``partitions % n`` one more each. Every member gets
    an entry, empty when it has nothing."""
    static = all(instance is not None for _, instance, _ in members)
    subscribed = sorted((instance if static and instance is not None else member_id, member_id)
                        for member_id, instance, metadata in members
                        if topic in _subscription(metadata))
    assignment: dict[str, list[int]] = {member_id: [] for member_id, _, _ in members}
    n = len(subscribed)
    for i, (_, member_id) in enumerate(subscribed):
        start = i * (partitions // n) + min(i, partitions % n)
        assignment[member_id] = list(range(start, start + partitions // n
                                           + (1 if i < partitions % n else 0)))
    return assignment


def _subscription(metadata: bytes) -> list[str]:
    try:
        return list(json.loads(metadata)["topics"])
    except (ValueError, KeyError, TypeError):
        return []


def _assigned_partitions(assignment: bytes, topic: str) -> list[int]:
    if not assignment:
        return []
    return sorted(json.loads(assignment).get(topic, []))


def _network_error(error: NetworkError) -> int:
    return KafkaError._TIMED_OUT if error.reason == "timeout" else KafkaError._TRANSPORT


class SimGroupMember:
    """One member (``c0``, ``c1``, ...) and its consecutive consumers (``rejoin``)."""

    def __init__(self, name: str, client: Endpoint, topic: str, settings: GroupSettings,
                 history: HistoryWriter, clock_s: Callable[[], float], first: int = 0,
                 transactional: TransactionalCommits | None = None, poll_s: float = POLL_S
                 ) -> None:
        """`transactional`: a pipeline member's transactional side (`commit: transaction`);
        `poll_s`: the application loop's poll wait (the pipeline member's is shorter)."""
        self.name = name
        self._poll_s = poll_s
        self.transactional = transactional
        self._client = client
        self._topic = topic
        self._settings = settings
        self._history = history
        self._clock_s = clock_s
        self._first = first
        config = settings.client_config(name, ",".join(f"{h}:{p}" for h, p in client.bootstrap))
        self._client_id: str = config["client.id"]
        self._instance_id: str | None = config.get("group.instance.id")
        self._session_ms: int = config.get("session.timeout.ms", SESSION_TIMEOUT_MS)
        """The member's session; also how long a deferred commit waits (librdkafka's
        ``group_session_timeout_ms``, its default when the consumer protocol sets none)."""
        self._heartbeat_ms: int = config.get("heartbeat.interval.ms", HEARTBEAT_INTERVAL_MS)
        self._rebalance_timeout_ms: int = config["max.poll.interval.ms"]
        self._auto = bool(config["enable.auto.commit"])
        self._commit_ms: int = settings.commit_interval_ms
        self._isolation_level = settings.isolation_level
        self._isolation = 1 if settings.isolation_level == "read_committed" else 0
        self._require_stable = self._isolation == 1
        self.closed = False
        """It was stopped and has left the group (or given up trying)."""
        self._stopping = False
        self._rejoining = False
        self._instance = 0
        """One per consumer (``subscribe``): timers and answers of an older one do nothing."""
        self._token = 0
        """One per phase of a consumer's membership: answers of an earlier phase do nothing."""
        self._phase = "closed"
        self._close_then: Callable[[], None] | None = None
        self._metadata: Metadata | None = None
        self._leader_wait: LeaderWait | None = None
        self._reset_consumer()

    # ---- what the workload calls --------------------------------------------------------------

    def start(self) -> None:
        self._subscribe()

    def stop(self) -> None:
        """Revoke (committing), leave the group; ``closed`` once done. A second call does
        nothing."""
        if self._stopping:
            return
        self._stopping = True
        self._between_polls(lambda: self._close(self._closed))

    def rejoin(self) -> None:
        """Leave the group and join it again as a new consumer (the group rebalances)."""
        if self._stopping or self._rejoining:
            return
        self._rejoining = True
        self._between_polls(lambda: None if self._stopping else self._close(self._resubscribe))

    def _between_polls(self, action: Callable[[], None]) -> None:
        """``action`` when the application's current poll returns (its loop sees the
        rebalancer's rejoin and the run's stop only between polls: ``poll_s``, counted from
        when its consumer started); at once while it has no consumer."""
        if self._phase == "closed":
            action()
            return
        poll_ms = self._poll_s * 1000
        polled = (self._now() - self._started_ms - self._poll_phase_ms) % poll_ms
        self._client.later(poll_ms - polled if polled else 0.0, action)

    @property
    def stopping(self) -> bool:
        return self._stopping

    def with_coordinator(self, action: Callable[[Address], None]) -> None:
        """``action(address)`` once the group's coordinator is known (a pipeline member's
        TxnOffsetCommit goes there)."""
        self._with_coordinator(action)

    @property
    def instance_id(self) -> str | None:
        return self._instance_id

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def member_id(self) -> str | None:
        return self._member_id or None

    @property
    def generation(self) -> int | None:
        return self._generation if self._generation >= 0 else None

    @property
    def assignment(self) -> list[int]:
        return list(self._assignment)

    # ---- one consumer's lifetime ---------------------------------------------------------------

    def _reset_consumer(self) -> None:
        self._member_id = NO_MEMBER
        self._generation = -1
        self._coordinator: Address | None = None
        self._looking = False
        self._queries = 0
        self._waiters: list[Callable[[Address], None]] = []
        """What waits for the coordinator (``_with_coordinator``), in order."""
        self._rechecking = False
        self._assignment: list[int] = []
        self._fetch_positions: dict[int, int] = {}
        self._positions: dict[int, int] = {}
        """The next offset to read after the last record returned, per partition held (what
        a commit stores)."""
        self._committed: dict[int, int] = {}
        """The last offset committed (acknowledged), per partition held."""
        self._heartbeat_busy = False
        self._last_heartbeat_ok = 0.0
        self._in_flight: dict[Address, dict[int, Callable[[Any, NetworkError | None], None]]] = {}
        """This consumer's requests waiting for an answer, per connection (``_call``)."""
        self._requests = 0
        self._started_ms = 0.0
        """When this consumer was made: its polls and its first broker connection count
        from here."""
        self._poll_phase_ms = 0.0

    def _subscribe(self) -> None:
        self._instance += 1
        self._reset_consumer()
        self._started_ms = self._now()
        # The first loop's polls start when its thread does, at no set point of the
        # rebalancer's period (a draw); a new consumer's right after the old one closed.
        self._poll_phase_ms = (random_source().uniform(0, self._poll_s * 1000)
                               if self._instance == 1 else 0.0)
        self._metadata = Metadata(self._client, self._topic,
                                  first=self._first + self._instance - 1)
        self._leader_wait = LeaderWait(self._client, self._metadata)
        self._metadata.start()
        instance = self._instance
        self._later(self._commit_ms, lambda: self._commit_tick(instance))
        self._join()

    def _resubscribe(self) -> None:
        self._rejoining = False
        if not self._stopping:
            self._subscribe()

    def _closed(self) -> None:
        self.closed = True

    def _close(self, then: Callable[[], None]) -> None:
        """Revoke what is held (with its commit), then leave the group, then ``then``."""
        self._close_then = then
        if self._phase == "up":
            self._revoke()  # ... then _join, which leaves instead
        elif self._phase in ("joining", "syncing"):
            self._leave()
        elif self._phase == "closed":
            self._close_then = None
            then()
        # revoking: its end leaves; leaving: its end calls the new `then`

    def _set_phase(self, phase: str) -> int:
        self._phase = phase
        self._token += 1
        return self._token

    def _later(self, delay_ms: float, callback: Callable[[], None]) -> None:
        """``callback`` after ``delay_ms``, unless a new consumer has started meanwhile."""
        instance = self._instance
        self._client.later(delay_ms, lambda: instance == self._instance and callback())

    def _now(self) -> float:
        return self._client.now_ms()

    def _call(self, address: Address, message: Any, timeout_ms: float,
              on_answer: Callable[[Any, NetworkError | None], None]) -> None:
        """A request on this consumer's connection to ``address``. When one times out the
        connection is closed and every other request in flight on it fails as reset
        (librdkafka's ``socket.max.fails`` 1)."""
        in_flight = self._in_flight.setdefault(address, {})
        key = self._requests = self._requests + 1

        def answered(answer: Any, error: NetworkError | None) -> None:
            if in_flight.pop(key, None) is None:
                return  # failed already, with its connection
            broken = []
            if error is not None and error.reason == "timeout":
                broken = sorted(in_flight.items())
                in_flight.clear()
            on_answer(answer, error)
            for _, callback in broken:
                callback(None, NetworkError("reset", address))

        in_flight[key] = on_answer
        self._client.call(address, message, timeout_ms, answered)

    # ---- the coordinator --------------------------------------------------------------------

    def _with_coordinator(self, action: Callable[[Address], None]) -> None:
        """``action(address)`` once the coordinator is known and its connection may open."""
        self._waiters.append(action)
        self._serve_waiters()

    def _serve_waiters(self) -> None:
        address = self._coordinator
        if not self._waiters:
            return
        if address is None:
            self._lookup()
            return
        retry_at = self._client.connectable(address)
        if not retry_at:
            waiters, self._waiters = self._waiters, []
            for action in waiters:
                action(address)
            return
        if self._rechecking:
            return
        # Its connection waits to reopen (reconnect.backoff.ms): librdkafka asks again
        # for the coordinator every second meanwhile, which may have moved.
        self._rechecking = True

        def recheck() -> None:
            self._rechecking = False
            if self._coordinator == address and self._client.connectable(address):
                self._coordinator = None
            self._serve_waiters()

        self._later(min(retry_at - self._now(), COORD_QUERY_INTERVAL_MS), recheck)

    def _coordinator_failed(self, address: Address) -> None:
        if self._coordinator == address:
            self._coordinator = None
        self._serve_waiters()

    def _lookup(self) -> None:
        if self._looking or self._coordinator is not None or self._phase == "closed":
            return
        self._looking = True
        self._query()

    def _query(self) -> None:
        """One FindCoordinator, to the next bootstrap broker that may be connected to; a new
        consumer's first waits for its first connection to a broker the metadata named
        (``SPARSE_CONNECT_INTERVAL_MS``)."""
        if self._coordinator is not None or self._phase == "closed":
            self._looking = False
            return
        connect_at = self._started_ms + SPARSE_CONNECT_INTERVAL_MS
        if self._now() < connect_at:
            queries = self._queries
            self._later(connect_at - self._now(),
                        lambda: queries == self._queries and self._query())
            return
        self._queries += 1
        query = self._queries
        bootstrap = self._client.bootstrap
        candidates = [bootstrap[(self._first + query + i) % len(bootstrap)]
                      for i in range(len(bootstrap))]
        address = next((a for a in candidates if not self._client.connectable(a)), None)

        def again(delay_ms: float) -> None:
            self._later(delay_ms, lambda: query == self._queries and self._query())

        if address is None:
            again(min(self._client.connectable(a) for a in candidates) - self._now())
            return

        def answered(answer: Any, error: NetworkError | None) -> None:
            if self._coordinator is not None or not self._looking:
                return
            if error is None and answer[0] == ErrorCode.none:
                self._found(answer[2])
            elif query == self._queries:
                again(RETRY_BACKOFF_MS)

        instance = self._instance
        self._call(address, ("find_coordinator", self._settings.group_id), SOCKET_TIMEOUT_MS,
                   lambda a, e: instance == self._instance and answered(a, e))
        again(COORD_QUERY_INTERVAL_MS)

    def _found(self, address: Address) -> None:
        self._coordinator = address
        self._looking = False
        self._serve_waiters()

    def _coordinator_call(self, address: Address, name: str, body: dict[str, Any],
                          timeout_ms: float,
                          on_answer: Callable[[Any, NetworkError | None], None]) -> None:
        """A request to the coordinator at ``address``; a network error forgets it."""
        instance = self._instance

        def answered(answer: Any, error: NetworkError | None) -> None:
            if error is not None and instance == self._instance:
                self._coordinator_failed(address)
            on_answer(answer, error)

        self._call(address, (name, {"group_id": self._settings.group_id, **body}), timeout_ms,
                   answered)

    # ---- JoinGroup and SyncGroup ---------------------------------------------------------------

    def _join(self) -> None:
        if self._close_then is not None:
            self._leave()
            return
        token = self._set_phase("joining")
        self._with_coordinator(lambda address: self._when_cached(
            lambda: self._send_join(token, address)))

    def _when_cached(self, then: Callable[[], None]) -> None:
        """``then()`` once the consumer's metadata has the topic unexpired: a member cut off
        from every broker does not join until a metadata answer comes back."""
        assert self._metadata is not None, "a consumer joins after it subscribed"
        instance = self._instance
        self._metadata.when_cached(lambda: instance == self._instance and then())

    def _rejoin_later(self, token: int) -> None:
        self._later(RETRY_BACKOFF_MS, lambda: token == self._token and self._join())

    def _send_join(self, token: int, address: Address) -> None:
        if token != self._token:
            return

        def answered(result: Any, error: NetworkError | None) -> None:
            if token != self._token:
                return
            if error is not None:
                self._join()
                return
            code = result.error
            if code == ErrorCode.none:
                self._member_id, self._generation = result.member_id, result.generation_id
                leader = result.leader_id == self._member_id and not result.skip_assignment
                self._sync(token, list(result.members) if leader else None)
            elif code == ErrorCode.member_id_required:
                self._member_id = result.member_id
                self._join()
            elif code in LOST:
                self._member_id, self._generation = NO_MEMBER, -1
                self._rejoin_later(token)
            elif code in COORDINATOR_MOVED:
                self._coordinator_failed(address)
                self._join()
            else:  # COORDINATOR_LOAD_IN_PROGRESS, REBALANCE_IN_PROGRESS, ...
                self._rejoin_later(token)

        subscription = json.dumps({"topics": [self._topic]}).encode()
        self._coordinator_call(address, "join_group", {
            "member_id": self._member_id, "instance_id": self._instance_id,
            "client_id": self._client_id, "rebalance_timeout_ms": self._rebalance_timeout_ms,
            "session_timeout_ms": self._session_ms, "protocols": [(PROTOCOL, subscription)]},
            self._rebalance_timeout_ms + JOIN_GRACE_MS, answered)

    def _sync(self, token: int, members: list[tuple[str, str | None, bytes]] | None) -> None:
        """SyncGroup; ``members`` when this member leads and assigns."""
        if token != self._token:
            return
        assert self._metadata is not None
        assignments: dict[str, bytes] = {}
        if members is not None:
            topic = self._metadata.image.topics.get(self._topic)
            if topic is None or not topic.partitions:  # waiting for the topic's metadata
                self._metadata.refresh()
                self._later(RETRY_BACKOFF_MS, lambda: self._sync(token, members))
                return
            assignments = {
                member_id: json.dumps({self._topic: partitions}).encode()
                for member_id, partitions in sorted(range_assignment(
                    members, self._topic, len(topic.partitions)).items())}
        token = self._set_phase("syncing")
        generation = self._generation
        self._with_coordinator(lambda address: self._send_sync(token, address, generation,
                                                               assignments))

    def _send_sync(self, token: int, address: Address, generation: int,
                   assignments: dict[str, bytes]) -> None:
        if token != self._token:
            return

        def answered(result: Any, error: NetworkError | None) -> None:
            if token != self._token:
                return
            if error is not None:
                self._join()
                return
            code = result.error
            if code == ErrorCode.none:
                self._assigned(_assigned_partitions(result.assignment, self._topic))
            elif code in LOST:
                self._member_id, self._generation = NO_MEMBER, -1
                self._rejoin_later(token)
            elif code in COORDINATOR_MOVED:
                self._coordinator_failed(address)
                self._join()
            elif code == ErrorCode.rebalance_in_progress:
                self._join()
            else:
                self._rejoin_later(token)

        self._coordinator_call(address, "sync_group", {
            "generation_id": generation, "member_id": self._member_id,
            "protocol_name": PROTOCOL, "instance_id": self._instance_id,
            "assignments": assignments}, self._session_ms + JOIN_GRACE_MS, answered)

    # ---- assigned ---------------------------------------------------------------------------

    def _assigned(self, partitions: list[int]) -> None:
        token = self._set_phase("up")
        self._assignment = partitions
        self._heartbeat_busy = False
        self._session_alive(token)
        for p in partitions:
            self._group("assign", p)
        self._later(self._heartbeat_ms, lambda: self._heartbeat(token))
        if partitions:
            self._fetch_committed(token, partitions)

    def rewind(self) -> None:
        """Read every assigned partition again from the group's committed offset (a
        pipeline member after an aborted transaction: `runner.pipeline_member`'s seek)."""
        if self._phase != "up":
            return
        token = self._set_phase("up")
        self._heartbeat_busy = False  # the one in flight answers the old phase: dropped
        for p in self._assignment:
            self._positions.pop(p, None)
        self._later(self._heartbeat_ms, lambda: self._heartbeat(token))
        if self._assignment:
            self._fetch_committed(token, self._assignment, record=False)

    def _fetch_committed(self, token: int, partitions: list[int], record: bool = True) -> None:
        """OffsetFetch: a ``committed`` line per partition (`record`), which then resumes
        from it."""
        if not any(self._holds(token, p) for p in partitions):
            return

        def retry() -> None:
            self._later(RETRY_BACKOFF_MS,
                        lambda: self._fetch_committed(token, partitions, record))

        def answered(answer: Any, error: NetworkError | None, address: Address) -> None:
            if not any(self._holds(token, p) for p in partitions):
                return
            if error is not None:
                retry()
                return
            code, offsets = answer
            if code != ErrorCode.none:
                if code in COORDINATOR_MOVED:
                    self._coordinator_failed(address)
                retry()
                return
            unstable = []
            for p in partitions:
                if not self._holds(token, p):
                    continue
                committed = offsets.get(TopicPartition(self._topic, p))
                if committed is None or committed.error != ErrorCode.none:
                    unstable.append(p)
                    continue
                offset = committed.offset if committed.offset >= 0 else None
                if record:
                    self._group("committed", p, offset=offset)
                if offset is None:
                    self._reset(token, p)
                else:
                    self._fetch_positions[p] = offset
                    self._fetch(token, p)
            if unstable:
                self._later(RETRY_BACKOFF_MS,
                            lambda: self._fetch_committed(token, unstable, record))

        def send(address: Address) -> None:
            if not any(self._holds(token, p) for p in partitions):
                return
            self._coordinator_call(
                address, "offset_fetch", {
                    "require_stable": self._require_stable,
                    "partitions": [TopicPartition(self._topic, p) for p in partitions]},
                SOCKET_TIMEOUT_MS, lambda a, e: answered(a, e, address))

        self._with_coordinator(send)

    # ---- reading ----------------------------------------------------------------------------

    def _holds(self, token: int, p: int) -> bool:
        """Whether a read of partition ``p`` started under ``token`` goes on: here while the
        phase it started in lasts (the eager protocol gives up every partition at once)."""
        return token == self._token

    def _leader(self, token: int, p: int, then: Callable[[int, int], None]
                ) -> tuple[int, Address] | None:
        """The partition's leader, or None after asking for metadata and retrying later."""
        assert self._metadata is not None
        leader = self._metadata.leader(p)
        if leader is None:
            self._metadata.refresh()
            self._later(RETRY_BACKOFF_MS, lambda: then(token, p))
            return None
        retry_at = self._client.connectable(leader[1])
        if retry_at:
            instance = self._instance
            assert self._leader_wait is not None
            self._leader_wait.park(p, leader[0], retry_at,
                                   lambda: instance == self._instance and then(token, p))
            return None
        return leader

    def _retry(self, token: int, p: int, then: Callable[[int, int], None]) -> None:
        assert self._metadata is not None
        self._metadata.refresh()
        self._later(RETRY_BACKOFF_MS, lambda: then(token, p))

    def _reset(self, token: int, p: int) -> None:
        """auto.offset.reset=earliest: the log start (ListOffsets -2), then fetch."""
        if not self._holds(token, p):
            return
        leader = self._leader(token, p, self._reset)
        if leader is None:
            return

        def answered(answer: Any, error: NetworkError | None) -> None:
            if not self._holds(token, p):
                return
            if error is not None or answer[0] != ErrorCode.none:
                self._retry(token, p, self._reset)
                return
            self._fetch_positions[p] = answer[1]
            self._fetch(token, p)

        self._call(leader[1], ("list_offset", (TopicPartition(self._topic, p), -2, -1, 0, -1)),
                   SOCKET_TIMEOUT_MS, answered)

    def _fetch(self, token: int, p: int) -> None:
        if not self._holds(token, p):
            return
        leader = self._leader(token, p, self._fetch)
        if leader is None:
            return
        tp = TopicPartition(self._topic, p)
        request = FetchRequestData(
            replica_id=-1, max_wait_ms=FETCH_WAIT_MAX_MS, min_bytes=1, max_bytes=FETCH_MAX_BYTES,
            partitions=[FetchPartition(tp, self._fetch_positions[p], max_bytes=FETCH_MAX_BYTES)],
            isolation_level=self._isolation)

        def answered(results: Any, error: NetworkError | None) -> None:
            if not self._holds(token, p):
                return
            if error is not None:
                self._retry(token, p, self._fetch)
                return
            result: FetchResult = results[tp]
            if self.transactional is not None and self.transactional.busy:
                self._later(BUSY_RETRY_MS, lambda: self._fetch(token, p))  # read it again
                return
            if result.error == ErrorCode.offset_out_of_range:
                self._reset(token, p)
                return
            if result.error != ErrorCode.none:
                self._retry(token, p, self._fetch)
                return
            now = self._clock_s()
            records, end = committed_records(result.records, result.aborted_transactions)
            for offset, value in records:
                if offset >= self._fetch_positions[p]:
                    self._history.read(consumer=self.name, phase="run", topic=self._topic,
                                       partition=p, offset=offset, value=decode_value(value),
                                       t=now, generation=self._generation,
                                       isolation=self._isolation_level)
                    self._fetch_positions[p] = self._positions[p] = offset + 1
                    if self.transactional is not None:
                        self.transactional.transform(p, offset, decode_value(value))
            if end is not None and end > self._fetch_positions[p]:  # past markers, aborts
                self._fetch_positions[p] = self._positions[p] = end
            self._fetch(token, p)

        self._call(leader[1], ("fetch", request), FETCH_WAIT_MAX_MS + SOCKET_TIMEOUT_MS,
                   answered)

    # ---- heartbeats, rebalances, losses ---------------------------------------------------------

    def _heartbeat(self, token: int) -> None:
        if token != self._token:
            return
        self._later(self._heartbeat_ms, lambda: self._heartbeat(token))
        if not self._heartbeat_busy:  # one at a time
            self._heartbeat_busy = True
            self._with_coordinator(lambda address: self._send_heartbeat(token, address))

    def _session_alive(self, token: int) -> None:
        """A heartbeat answered (or the assignment): the member loses its partitions if no
        other is answered within ``session.timeout.ms``, checked at that moment as
        librdkafka's main loop checks it on each turn (``rd_kafka_cgrp_session_timeout_check``),
        not at the next heartbeat."""
        alive = self._last_heartbeat_ok = self._now()

        def check() -> None:
            if token == self._token and self._last_heartbeat_ok == alive:
                self._lose()  # the session timed out

        self._later(self._session_ms, check)

    def _send_heartbeat(self, token: int, address: Address) -> None:
        if token != self._token:
            return

        def answered(code: Any, error: NetworkError | None) -> None:
            if token != self._token:
                return
            self._heartbeat_busy = False
            if error is not None:
                return  # the coordinator is looked up again by the next one
            if code == ErrorCode.none:
                self._session_alive(token)
            elif code == ErrorCode.rebalance_in_progress:
                self._session_alive(token)
                self._revoke()
            elif code in LOST:
                self._lose()
            elif code in COORDINATOR_MOVED:
                self._coordinator_failed(address)

        self._coordinator_call(address, "heartbeat", {
            "member_id": self._member_id, "instance_id": self._instance_id,
            "generation_id": self._generation}, self._session_ms, answered)

    def _revoke(self) -> None:
        """The eager rebalance (and a close): stop reading, commit and revoke, then join."""
        token = self._set_phase("revoking")
        partitions, self._assignment = self._assignment, []
        offsets = self._moved(partitions)

        def rejoin() -> None:
            if token == self._token:
                self._join()

        if not self._auto:  # the application's on_revoke: commit, then give up
            def revoked() -> None:
                self._give_up(partitions)
                rejoin()

            self._commit(offsets, self._clock_s(), revoked)
        else:  # on_revoke gives up; librdkafka commits as it unassigns
            self._give_up(partitions)
            self._commit(offsets, None, rejoin)

    def _lose(self) -> None:
        """The partitions are lost: nothing is committed (a pipeline member aborts its
        transaction), the member joins afresh."""
        if self.transactional is not None:
            self.transactional.abort()
        self._give_up(self._assignment)
        self._assignment = []
        self._member_id, self._generation = NO_MEMBER, -1
        self._join()

    def _give_up(self, partitions: list[int]) -> None:
        for p in partitions:
            self._group("revoke", p)
            self._positions.pop(p, None)
            self._committed.pop(p, None)
            self._fetch_positions.pop(p, None)

    def _leave(self) -> None:
        """LeaveGroup (a dynamic member with a coordinator known), then the close's end."""
        token = self._set_phase("leaving")
        member_id = self._member_id

        def left() -> None:
            if token != self._token:
                return
            self._set_phase("closed")
            if self._metadata is not None:
                self._metadata.stop()
            then, self._close_then = self._close_then, None
            if then is not None:
                then()

        self._send_leave(member_id, left)

    def _send_leave(self, member_id: str, left: Callable[[], None]) -> None:
        """LeaveGroup, best effort: ``left`` once answered, failed or not sent (no member
        id, a static member, no coordinator known)."""
        address = self._coordinator
        if not member_id or self._instance_id is not None or address is None:
            left()
            return
        self._coordinator_call(address, "leave_group", {
            "members": [(member_id, self._instance_id)]}, LEAVE_TIMEOUT_MS,
            lambda _answer, _error: left())

    # ---- commits ----------------------------------------------------------------------------

    def _moved(self, partitions: list[int]) -> dict[int, int]:
        return {p: self._positions[p] for p in partitions
                if p in self._positions and self._committed.get(p) != self._positions[p]}

    def _commit_tick(self, instance: int) -> None:
        """The auto-commit timer, or the application's commit every interval (manual)."""
        if instance != self._instance or self._phase == "closed":
            return
        self._later(self._commit_ms, lambda: self._commit_tick(instance))
        if self._phase == "up":
            self._commit(self._moved(self._assignment),
                         None if self._auto else self._clock_s(), lambda: None)

    def _commit(self, offsets: dict[int, int], t_invoke: float | None,
                then: Callable[[], None]) -> None:
        """OffsetCommit of ``offsets`` with this generation and member id; a ``commit`` line
        per partition once answered (or given up), then ``then``. Without a coordinator to
        send it to, or when the coordinator moved or its connection broke, it waits once
        for one, up to ``session.timeout.ms`` (librdkafka's deferred commit)."""
        if not offsets:
            then()
            return
        if self.transactional is not None:
            instance = self._instance

            def ended(committed: bool) -> None:
                if committed and instance == self._instance:
                    self._committed.update({p: o for p, o in offsets.items()
                                            if p in self._positions})
                then()

            self.transactional.commit(offsets, ended)
            return
        member_id, generation, instance = self._member_id, self._generation, self._instance
        done = deferred = sent = False

        def finish(errors: dict[int, int | None]) -> None:
            nonlocal done
            if done:
                return
            done = True
            for p, offset in sorted(offsets.items()):
                self._record_commit(p, offset, errors[p], t_invoke, instance)
            then()

        def defer() -> None:
            nonlocal deferred, sent
            if not deferred:
                self._client.later(self._session_ms, lambda: sent or finish(
                    dict.fromkeys(offsets, KafkaError._WAIT_COORD)))
            deferred, sent = True, False
            self._commit_resend(send)

        def send(address: Address) -> None:
            nonlocal sent
            if done:
                return
            sent = True

            def answered(answer: Any, error: NetworkError | None) -> None:
                if error is not None:
                    errors = dict.fromkeys(offsets, _network_error(error))
                else:
                    errors = {p: answer[TopicPartition(self._topic, p)] for p in offsets}
                    if instance == self._instance and any(e in COORDINATOR_MOVED
                                                          for e in errors.values()):
                        self._coordinator_failed(address)
                if instance == self._instance and self._commit_defers(errors, deferred,
                                                                      t_invoke is None):
                    defer()
                else:
                    finish(errors)

            self._coordinator_call(address, "offset_commit", {
                **self._commit_identity(member_id, generation),
                "offsets": {TopicPartition(self._topic, p): o
                            for p, o in sorted(offsets.items())}},
                SOCKET_TIMEOUT_MS, answered)

        address = self._coordinator
        if address is not None and not self._client.connectable(address):
            send(address)
        else:
            defer()

    def _commit_identity(self, member_id: str, generation: int) -> dict[str, Any]:
        """OffsetCommit's member fields: the member id and generation the commit was made
        in, so that a commit of an earlier generation is refused."""
        return {"member_id": member_id, "instance_id": self._instance_id,
                "generation_id": generation}

    def _commit_defers(self, errors: dict[int, int | None], deferred: bool,
                       auto: bool) -> bool:
        """Whether a commit answered with ``errors`` waits and is sent again (librdkafka's
        deferred commit, once: the coordinator moved or its connection broke)."""
        return not deferred and any(e in COORDINATOR_MOVED or e == KafkaError._TRANSPORT
                                    for e in errors.values())

    def _commit_resend(self, send: Callable[[Address], None]) -> None:
        """A deferred commit is sent again once a coordinator is known."""
        self._with_coordinator(send)

    def _record_commit(self, p: int, offset: int, code: int | None, t_invoke: float | None,
                       instance: int) -> None:
        status, error = commit_outcome(None if not code else KafkaError(int(code)))
        if status == "ok" and instance == self._instance and p in self._positions:
            self._committed[p] = offset
        self._group("commit", p, offset=offset, status=status, error=error, t_invoke=t_invoke)

    def _group(self, type_: str, partition: int, **fields: Any) -> None:
        self._history.group(member=self.name, member_id=self.member_id,
                            generation=self.generation, type=type_, topic=self._topic,
                            partition=partition, t=self._clock_s(), **fields)
