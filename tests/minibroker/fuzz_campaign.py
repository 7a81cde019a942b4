"""A schema-aware fuzzing campaign against a live ``minibroker cluster``, watched whole.

Shared by ``test_schema_fuzz.py`` (20,000 frames, one broker, in CI) and
``benchmarks/protocol_fuzz.py`` (a million, three brokers). The frames come from
``schema_fuzz.FrameGenerator``; they go out over several connections per broker, one
request in flight on each (as a Kafka client's in-flight request waits for its answer
before the connection is judged), and a connection the broker closes is opened again.
Meanwhile ``fuzz_cluster.Watcher`` samples each process's RSS and scheduling and a
Metadata probe to each broker once a second; the controller's replication events give the
fences, and the brokers' log the handler failures. The campaign ends with a round trip
through a stock client on a topic made after the fuzzing, so that nothing the fuzzer did to
its own topics decides it.

What each frame got is judged against what the broker owes it (``schema_fuzz.Expect``): a
valid request closed without an answer is a handler that failed on a request the protocol
allows, the kind of bug this campaign exists to find; its frame index reproduces it.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import socket
import struct
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fuzz_cluster import Cluster, Watch, Watcher, prepare_pools, round_trip, running_cluster
from schema_fuzz import Expect, Frame, FrameGenerator

from minibroker.network.codec import (
    ApiKey,
    KafkaProtocolError,
    decode_response,
    response_schema,
)

HOLD_S = 2.0  # how long a request may go unanswered before its connection is dropped
MAX_EXAMPLES = 200  # violations and held requests kept for the report
SESSION_TIMEOUT_S = 3.0  # broker.session.timeout.ms, minibroker's default
CONNECT_TIMEOUT_S = 60.0  # a live broker refusing connections this long stops the campaign
_SIZE = struct.Struct(">i")
_HANDLER_FAILURE = re.compile(r"closing connection from \S+: (\S+ v\d+) \(correlation_id=(\d+)")
_LOGGER = "(minibroker.network.kafka_server)"
# ERROR records Kafka writes too, for a state a client may lead a group into: static
# members that do not rejoin hold a rebalance open until their sessions expire (Kafka's
# GroupCoordinator.onCompleteJoin logs "could not complete rebalance because no members
# rejoined" and waits again).
_KAFKAS_OWN_ERRORS = ("could not complete its rebalance: no member rejoined",)


# -- the senders ----------------------------------------------------------------------------

@dataclass
class Tally:
    """Frames by API and by what became of them."""

    sent: Counter[str] = field(default_factory=Counter)  # API name -> frames
    versions: set[tuple[int, int]] = field(default_factory=set)
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)  # (valid|corrupt, ..)
    held: Counter[str] = field(default_factory=Counter)  # API -> requests unanswered in HOLD_S
    held_examples: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)  # frames not treated as owed
    violation_count: int = 0  # all of them; the list keeps the first MAX_EXAMPLES
    connect_failures: int = 0
    bytes_sent: int = 0
    # API -> (seconds, frame index, answer bytes) of its slowest answered valid request:
    # the wait for the broker's loop to come round, and the request's own work
    slowest: dict[str, tuple[float, int, int]] = field(default_factory=dict)
    largest: dict[str, tuple[int, int]] = field(default_factory=dict)  # API -> (bytes, frame)

    def time_answer(self, frame: Frame, seconds: float, size: int) -> None:
        name = _api_name(frame.api_key)
        if seconds > self.slowest.get(name, (0.0, -1, 0))[0]:
            self.slowest[name] = (seconds, frame.index, size)
        if size > self.largest.get(name, (0, -1))[0]:
            self.largest[name] = (size, frame.index)

    @property
    def frames(self) -> int:
        return sum(self.sent.values())


class _Source:
    def __init__(self, generator: FrameGenerator, frames: int, deadline: float | None) -> None:
        self._generator = generator
        self._next = 0
        self._frames = frames
        self._deadline = deadline

    def take(self) -> Frame | None:
        if self._next >= self._frames:
            return None
        if self._deadline is not None and time.monotonic() > self._deadline:
            return None
        index = self._next
        self._next += 1
        return self._generator.frame(index)


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> _Connection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 22)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Closed by us, a connection is reset rather than left in TIME_WAIT: a million
        # frames open hundreds of thousands of connections from one address.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return cls(reader, writer)

    def close(self) -> None:
        self.writer.transport.abort()


async def _answer(conn: _Connection, hold: float) -> tuple[str, bytes | None]:
    """("answered", the response frame), ("closed", None) or ("held", None)."""
    try:
        async with asyncio.timeout(hold):
            (size,) = _SIZE.unpack(await conn.reader.readexactly(4))
            body = await conn.reader.readexactly(size)
    except TimeoutError:
        return "held", None
    except (asyncio.IncompleteReadError, OSError):
        return "closed", None
    return "answered", body


async def _until_closed(conn: _Connection, hold: float) -> tuple[str, bytes | None]:
    """After a single-use frame: whether anything came back before the broker closed."""
    received = b""
    try:
        async with asyncio.timeout(hold):
            while chunk := await conn.reader.read(65536):
                received += chunk
    except TimeoutError:
        return "held", None
    except OSError:
        pass
    return ("answered", None) if received else ("closed", None)


def _judge(frame: Frame, outcome: str, response: bytes | None, tally: Tally) -> None:
    """Count what became of ``frame``; note it if the broker did not do what it owed."""
    name = _api_name(frame.api_key)
    kind = "corrupt" if frame.mutation is not None else "valid"
    tally.outcomes[kind, outcome] += 1
    what = (f"frame {frame.index} ({name} v{frame.api_version}, "
            f"{frame.mutation or 'valid'}): {outcome}")
    if outcome == "held":
        tally.held[name] += 1
        if len(tally.held_examples) < MAX_EXAMPLES:
            tally.held_examples.append(what)
    if frame.expect is Expect.ANSWER and outcome == "closed":
        _violation(tally, f"{what}, expected an answer")
    elif frame.expect is Expect.CLOSE and outcome == "answered":
        _violation(tally, f"{what}, expected the connection closed")
    elif frame.expect is Expect.NOTHING and outcome == "answered":
        _violation(tally, f"{what}, expected no answer (acks=0)")
    elif frame.expect is Expect.ANSWER and response is not None:
        problem = _unreadable(frame, response)
        if problem is not None:
            _violation(tally, f"{what}, but {problem}")


def _violation(tally: Tally, what: str) -> None:
    tally.violation_count += 1
    if len(tally.violations) < MAX_EXAMPLES:
        tally.violations.append(what)


KIO_REFUSES = {ApiKey.DESCRIBE_TRANSACTIONS: "Cannot parse negative timestamp"}
"""Answers kio's parser refuses although Kafka's schema allows them: DescribeTransactions'
TransactionStartTimeMs is -1 while no transaction runs (Kafka's
``TransactionMetadata.txnStartTimestamp``; the Java admin reads it as "none"), and kio
reads a ``datetime_i64`` only from 0 on. Such an answer is checked for its correlation id
alone."""


def _unreadable(frame: Frame, response: bytes) -> str | None:
    """Why the answer to a valid request is not that version's response to it, if it is
    not: it must parse under the version's response schema and carry the correlation id."""
    try:
        correlation_id, _ = decode_response(
            response, response_schema(frame.api_key, frame.api_version))
    except KafkaProtocolError as exc:
        if KIO_REFUSES.get(frame.api_key, "\0") not in str(exc):
            return f"the answer does not parse: {exc}"
        correlation_id = int.from_bytes(response[:4], "big", signed=True)
    if correlation_id != frame.index & 0x7FFFFFFF:
        return f"the answer carries correlation id {correlation_id}"
    return None


def _api_name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name
    except ValueError:
        return str(api_key)


async def _worker(port: int, source: _Source, tally: Tally, alive: Callable[[], bool],
                  hold: float) -> None:
    conn: _Connection | None = None
    while (frame := source.take()) is not None:
        tally.sent[_api_name(frame.api_key)] += 1
        tally.versions.add((frame.api_key, frame.api_version))
        tally.bytes_sent += len(frame.data)
        refused_until = time.monotonic() + CONNECT_TIMEOUT_S
        while conn is None:
            try:
                conn = await _Connection.open(port)
            except OSError as exc:
                tally.connect_failures += 1
                if not alive():
                    return
                if time.monotonic() > refused_until:
                    raise TimeoutError(f"port {port} refused connections for "
                                       f"{CONNECT_TIMEOUT_S:g} s, its broker alive") from exc
                await asyncio.sleep(0.05)
        sent_at = time.monotonic()
        try:
            conn.writer.write(frame.data)
            if frame.single_use:
                conn.writer.write_eof()
            await conn.writer.drain()
        except OSError:
            pass  # closed under us: the read below says so
        if frame.single_use:
            outcome, response = await _until_closed(conn, hold)
        else:
            outcome, response = await _answer(conn, hold)
        _judge(frame, outcome, response, tally)
        if outcome == "answered" and frame.mutation is None:
            tally.time_answer(frame, time.monotonic() - sent_at, len(response or b""))
        if frame.single_use or outcome != "answered":
            conn.close()
            conn = None
    if conn is not None:
        conn.close()


async def _send_all(cluster: Cluster, source: _Source, tally: Tally, connections: int,
                    alive: Callable[[], bool], hold: float) -> None:
    await asyncio.gather(*(
        _worker(cluster.port(1 + i % cluster.brokers), source, tally, alive, hold)
        for i in range(connections * cluster.brokers)))


# -- the broker's own account ---------------------------------------------------------------

@dataclass
class LogSummary:
    handler_failures: Counter[str] = field(default_factory=Counter)  # request: exception
    errors: Counter[str] = field(default_factory=Counter)  # ERROR records, by their text
    codec_closes: int = 0  # connections closed for a frame the codec refused
    examples: dict[str, str] = field(default_factory=dict)  # a failure -> its log record


def read_log(log: Path) -> LogSummary:
    """The cluster's log records: a handler that raised on a parsed request logs "closing
    connection from ...: <request> (correlation_id=...) failed" and the traceback; the
    codec's refusals log what was wrong with the frame."""
    summary = LogSummary()
    record: list[str] = []
    with log.open(errors="replace") as lines:  # a million frames log hundreds of MiB
        for line in itertools.chain((raw.rstrip("\n") for raw in lines), ["[end]"]):
            if not line.startswith("[") and record:
                record.append(line)
                continue
            if record:
                _summarise(record, summary)
            record = [line]
    return summary


def _summarise(record: list[str], summary: LogSummary) -> None:
    first = record[0]
    if " WARNING closing connection from " in first:
        match = _HANDLER_FAILURE.search(first)
        if match and first.endswith(f"failed {_LOGGER}"):
            raised = next((line for line in reversed(record[1:])
                           if line and not line.startswith(" ")), "?")
            key = f"{match[1]}: {raised[:200]}"
            summary.handler_failures[key] += 1
            summary.examples.setdefault(key, "\n".join(record)[:4000])
        else:
            summary.codec_closes += 1
    elif (" ERROR " in first or " CRITICAL " in first) and not any(
            expected in first for expected in _KAFKAS_OWN_ERRORS):
        key = re.sub(r"\d+", "N", first.split("] ", 1)[-1])[:200]
        summary.errors[key] += 1
        summary.examples.setdefault(key, "\n".join(record)[:4000])


# -- the campaign ---------------------------------------------------------------------------

@dataclass
class Report:
    frames: int
    seconds: float
    tally: Tally
    watch: Watch
    fences: list[dict]
    round_trip: str | None  # None: every record came back
    log: LogSummary
    versions_advertised: int

    @property
    def crashed(self) -> dict[str, float]:
        return self.watch.exited

    def fence_lines(self) -> list[str]:
        """Each fence, with what the fenced broker's and the controller's event loops did
        in the session timeout before it: a loop that waited for a CPU most of that time
        was starved by the machine, one that ran was held by its own work."""
        lines = []
        for fence in self.fences[:10]:
            broker, at = f"broker-{fence['broker']}", fence["t"]
            waited, ran = self.watch.sched_between(broker, at - SESSION_TIMEOUT_S, at)
            c_waited, c_ran = self.watch.sched_between("controller", at - SESSION_TIMEOUT_S, at)
            lines.append(
                f"fence of {broker} at {time.strftime('%H:%M:%S', time.localtime(at))}: in the "
                f"{SESSION_TIMEOUT_S:.0f} s before, its loop waited {waited:.1f} s for a CPU and "
                f"ran {ran:.1f} s; the controller's waited {c_waited:.1f} s, ran {c_ran:.1f} s")
        return lines

    def lines(self) -> list[str]:
        t, w = self.tally, self.watch
        rate = self.frames / self.seconds if self.seconds else 0.0
        out = [f"frames sent: {self.frames:,} in {self.seconds:.0f} s ({rate:,.0f}/s), "
               f"{t.bytes_sent / 2**20:,.1f} MiB; API versions covered: "
               f"{len(t.versions)} of {self.versions_advertised}",
               "per API: " + ", ".join(f"{name} {count:,}" for name, count
                                       in sorted(t.sent.items(), key=lambda kv: -kv[1])),
               "outcomes: " + ", ".join(f"{kind} {outcome} {count:,}" for (kind, outcome), count
                                        in sorted(t.outcomes.items())),
               f"held past {HOLD_S:.0f} s: " + (", ".join(
                   f"{name} {count:,}" for name, count in t.held.most_common()) or "none"),
               f"crashes (processes that exited): {dict(self.crashed) or 'none'}",
               f"fences: {len(self.fences)}",
               "peak RSS: " + ", ".join(
                   f"{name} {kib / 1024:.0f} MiB (end {w.last_rss_kib.get(name, 0) / 1024:.0f})"
                   for name, kib in sorted(w.peak_rss_kib.items())),
               "liveness probe worst latency: " + ", ".join(
                   f"{name} {s * 1000:.0f} ms ({_sched(w.worst_probe_sched.get(name))})"
                   for name, s in sorted(w.worst_probe_s.items()))
               + f"; {w.samples} rounds, {len(w.probe_failures)} failed",
               f"round trip (confluent-kafka): "
               f"{'ok' if self.round_trip is None else self.round_trip}",
               f"violations: {t.violation_count}; handler failures logged: "
               f"{sum(self.log.handler_failures.values())}; errors logged: "
               f"{sum(self.log.errors.values())}; connections closed for malformed frames: "
               f"{self.log.codec_closes:,}"]
        out.append("slowest valid answer per API: " + ", ".join(
            f"{name} {seconds * 1000:.0f} ms (frame {index}, {size:,} B)"
            for name, (seconds, index, size) in sorted(t.slowest.items(),
                                                       key=lambda kv: -kv[1][0])[:6]))
        out.append("largest answers: " + ", ".join(
            f"{name} {size:,} B (frame {index})"
            for name, (size, index) in sorted(t.largest.items(), key=lambda kv: -kv[1][0])[:4]))
        out += [f"  {line}" for line in self.fence_lines()]
        out += [f"  {v}" for v in t.violations[:10]]
        out += [f"  {count} x {key}" for key, count in self.log.handler_failures.most_common(10)]
        out += [f"  {count} x {key}" for key, count in self.log.errors.most_common(10)]
        out += [f"  probe: {f}" for f in w.probe_failures[:5]]
        out += [f"  held: {h}" for h in t.held_examples[:5]]
        return out


def run_campaign(workdir: Path, *, frames: int, seed: int, brokers: int,
                 connections_per_broker: int, time_limit_s: float | None = None,
                 hold: float = HOLD_S, config: tuple[str, ...] = (),
                 progress: Callable[[str], None] | None = None) -> Report:
    with running_cluster(workdir, brokers, config) as cluster:
        pools = prepare_pools(cluster)
        generator = FrameGenerator(seed, pools)
        fences_before = len(cluster.fences())
        tally = Tally()
        started = time.monotonic()
        deadline = None if time_limit_s is None else started + time_limit_s
        source = _Source(generator, frames, deadline)
        with Watcher(cluster) as watcher:
            def alive() -> bool:
                return cluster.process.poll() is None and not watcher.watch.exited

            async def main() -> None:
                sending = asyncio.ensure_future(_send_all(
                    cluster, source, tally, connections_per_broker, alive, hold))
                while not sending.done():
                    await asyncio.wait([sending], timeout=30)
                    if progress is not None and not sending.done():
                        elapsed = time.monotonic() - started
                        progress(f"{tally.frames:,} frames in {elapsed:.0f} s "
                                 f"({tally.frames / elapsed:,.0f}/s), "
                                 f"RSS {watcher.watch.last_rss_kib}, worst probe "
                                 f"{_rounded(watcher.watch.worst_probe_s)}, "
                                 f"violations {tally.violation_count}")
                await sending

            asyncio.run(main())
            seconds = time.monotonic() - started
        trip = round_trip(cluster) if alive() else "not tried: a process exited"
        fences = cluster.fences()[fences_before:]
        return Report(tally.frames, seconds, tally, watcher.watch, fences, trip,
                      read_log(cluster.log), len(generator.targets))


def _sched(waited_ran: tuple[float, float] | None) -> str:
    if waited_ran is None:
        return "?"
    waited, ran = waited_ran
    return f"meanwhile its loop waited {waited * 1000:.0f} ms for a CPU, ran {ran * 1000:.0f} ms"


def _rounded(values: dict[str, float]) -> dict[str, float]:
    return {name: round(value, 3) for name, value in values.items()}


def per_api_versions(tally: Tally) -> dict[str, list[int]]:
    by_api: dict[str, list[int]] = defaultdict(list)
    for api_key, version in sorted(tally.versions):
        by_api[_api_name(api_key)].append(version)
    return dict(by_api)
