"""Broker, controller and topic configuration, with Kafka's key names.

Defaults follow Kafka where a chaos run can afford them and are scaled down where Kafka's
would make an experiment wait for minutes (session and lag timeouts): every key can be
overridden with ``--config KEY=VALUE`` (cluster-wide) or per topic at creation time.

It is long because it is the one table of every broker and topic key (Kafka's KafkaConfig and
LogConfig definitions) with its parser and cross-key checks; a key lives in one row here rather than
beside its user.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CONFIG_DEFS",
    "ConfigDef",
    "ConfigError",
    "LogConfig",
    "parse_overrides",
    "resolve",
    "validate_topic_config",
]


class ConfigError(ValueError):
    """A configuration key or value that minibroker cannot use."""


def _bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


def _optional_int(value: str) -> int | None:
    if value.strip().lower() in ("", "none", "never", str(2**63 - 1)):
        return None
    number = int(value)
    if number < 1:
        raise ValueError(f"expected a positive integer, got {value!r}")
    return number


def _int_at_least(minimum: int) -> Callable[[str], int]:
    expected = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"

    def parse(value: str) -> int:
        number = int(value)
        if number < minimum:
            raise ValueError(f"expected {expected}, got {value!r}")
        return number

    return parse


def _one_of(*choices: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if value not in choices:
            raise ValueError(f"expected {' or '.join(choices)}, got {value!r}")
        return value

    return parse


def _transaction_version(value: str) -> int:
    number = int(value)
    if number not in (0, 1, 2):
        raise ValueError(f"expected 0, 1 or 2 (Kafka's TransactionVersion), got {value!r}")
    return number


def _acks(value: str) -> int:
    number = int(value)
    if number not in (-1, 0, 1):
        raise ValueError(f"expected -1 (all), 0 or 1, got {value!r}")
    return number


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)
_min_isr_rule = _one_of("strict", "legacy")
_truncation_mode = _one_of("leader-epoch", "high-watermark")
_cleanup_policy = _one_of("delete", "compact")


@dataclass(frozen=True)
class ConfigDef:
    name: str
    parse: Callable[[str], Any]
    default: Any
    topic_level: bool
    doc: str


def _names(value: str, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    """A comma-separated list of some of ``allowed``, at least one, each once."""
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    unknown = [n for n in names if n not in allowed]
    if not names or unknown or len(set(names)) != len(names):
        raise ValueError(f"expected a comma-separated list of distinct {what} from "
                         f"{', '.join(allowed)}, got {value!r}")
    return names


def _rebalance_protocols(value: str) -> tuple[str, ...]:
    return _names(value, ("classic", "consumer"), "group protocols")


def _assignors(value: str) -> tuple[str, ...]:
    return _names(value, ("uniform", "range"), "assignors")


def _bytes_or_unbounded(value: str) -> int:
    """A byte count, or -1 (Kafka's "no limit")."""
    number = int(value)
    if number != -1 and number < 1:
        raise ValueError(f"expected a positive integer or -1, got {value!r}")
    return number


def _ip_overrides(value: str) -> dict[str, int]:
    """Kafka's ``max.connections.per.ip.overrides``: ``host:count`` pairs, comma separated
    (an IPv6 address keeps its colons: the count follows the last one)."""
    overrides: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        host, sep, count = item.rpartition(":")
        if not sep or not host:
            raise ValueError(f"expected host:count, got {item!r}")
        overrides[host] = _non_negative_int(count)
    return overrides


# The Kafka listener's bounds (Kafka's SocketServerConfigs; docs/design.md, "Resource
# limits"): everything one client can make the broker hold has one.
_SOCKET_SERVER_DEFS = [
    ConfigDef("socket.request.max.bytes", _positive_int, 100 << 20, False,
              "The largest request frame the broker reads (Kafka's default); a larger size "
              "prefix closes the connection before a byte of the frame is read."),
    ConfigDef("queued.max.request.bytes", _bytes_or_unbounded, 200 << 20, False,
              "Bytes of request frames being read or parsed at once, all connections "
              "together (Kafka's MemoryPool, KIP-72): past it, connections whose next frame "
              "would need more wait, unread. Kafka's default is -1 (no bound); two "
              "socket.request.max.bytes here, so that a few clients declaring huge frames "
              "cannot make the broker hold gigabytes. -1 or at least socket.request.max.bytes "
              "(Kafka's rule)."),
    ConfigDef("connections.max.idle.ms", _positive_int, 600000, False,
              "A connection with no request in progress that receives nothing for this long, "
              "or whose answer the client leaves unread this long, is closed (Kafka's "
              "Selector; Kafka's default)."),
    ConfigDef("socket.request.read.timeout.ms", _positive_int, 30000, False,
              "minibroker's own (Kafka has none): a request frame must arrive whole within "
              "this long of its first byte, or its connection is closed and the bytes "
              "received are dropped. Kafka counts any byte as activity, so a client sending "
              "a byte a minute holds its half-read frame forever. Default: Kafka clients' "
              "request.timeout.ms, after which the sender has given up on it anyway."),
    ConfigDef("request.timeout.ms", _positive_int, 30000, False,
              "How long a broker's own request to another broker may wait: a "
              "WriteTxnMarkers append waits this long for its acks=-1 replication "
              "(Kafka's KafkaApis uses it there; Kafka's default)."),
    ConfigDef("max.connections", _positive_int, 500, False,
              "Connections the broker keeps open, all listeners together; more are closed "
              "as soon as accepted (Kafka: Integer.MAX_VALUE, and its Acceptor waits for a "
              "slot instead). Each holds a file descriptor: 500 keeps a broker well under "
              "the usual 1024 open files, so a flood of connections cannot make it fail to "
              "open a segment (which halts it, as a failed log directory does)."),
    ConfigDef("max.connections.per.ip", _positive_int, 200, False,
              "Connections one client address may keep open; more are closed as soon as "
              "accepted (Kafka's ConnectionQuotas; Kafka: Integer.MAX_VALUE). 200: no "
              "client host takes more than two fifths of max.connections, and far more "
              "than a local experiment's clients, proxies and brokers use together."),
    ConfigDef("max.connections.per.ip.overrides", _ip_overrides, {}, False,
              "Per-address exceptions to max.connections.per.ip, as Kafka writes them: "
              "'127.0.0.1:400,10.0.0.7:50'."),
    ConfigDef("message.max.bytes", _positive_int, 1048588, False,
              "The largest record batch a Produce may append (MESSAGE_TOO_LARGE beyond; "
              "Kafka's default; Kafka's topic-level max.message.bytes, which overrides it "
              "per topic, is not served). A fetch returns a partition's first batch whole "
              "however large, so this also bounds what one fetch can be made to hold."),
    ConfigDef("fetch.max.bytes", _positive_int, 57671680, False,
              "The most record bytes one Fetch answer holds, whatever the request asks "
              "(Kafka's default; the first partition's first batch is returned whole even "
              "when larger, so a consumer always progresses). Kafka bounds followers' "
              "fetches by replica.fetch.response.max.bytes instead; minibroker's followers "
              "ask for replica.fetch.max.bytes per partition, and this bound covers them "
              "too, so that no fetch, from whoever claims to be a follower, holds more."),
    ConfigDef("max.incremental.fetch.session.cache.slots", _non_negative_int, 1000, False,
              "Incremental fetch sessions (KIP-227) the broker keeps, all clients together "
              "(Kafka's default); a full Fetch past it gets no session when every cached one "
              "is worth more (a follower's more than a consumer's), and goes on sessionless. "
              "0 turns sessions off."),
    ConfigDef("min.incremental.fetch.session.eviction.ms", _positive_int, 120000, False,
              "A session unused this long may be evicted by any new one; younger sessions "
              "only by a new session worth more (Kafka's default)."),
    ConfigDef("max.request.elements", _positive_int, 10000, False,
              "minibroker's own: array elements and tagged fields one request may hold, "
              "nested arrays included; a request with more closes its connection before it "
              "is decoded. The broker serves every request on one event loop with its "
              "heartbeats, so a request's work must be bounded (Kafka gives requests "
              "threads of their own). At 10000, no request measured held the loop over "
              "150 ms, a tenth of half broker.session.timeout.ms."),
]


# ---- The controller listener (the controller channel, minibroker/rpc.py) ----------------------
# Kept apart from the Kafka listener's bounds above: Kafka names a listener's own limits
# listener.name.<listener>.<config>, and the controller's listener is CONTROLLER (KIP-631).
_CONTROLLER_LISTENER_DEFS = [
    ConfigDef("listener.name.controller.max.connections", _positive_int, 64, False,
              "Connections the controller's RPC port keeps open, authenticated or not; more "
              "are answered with an error and closed. Each broker holds one; 64 leaves room "
              "for reconnects and tools."),
    ConfigDef("listener.name.controller.max.in.flight.requests.per.connection", _positive_int,
              128, False,
              "Requests being answered at once on one controller connection (a broker's "
              "metadata long poll, heartbeat and one AlterPartition per partition it leads); "
              "past it each request is answered at once with an error, never queued. Kafka "
              "serves one request per connection at a time."),
    ConfigDef("listener.name.controller.socket.request.max.bytes", _positive_int, 1 << 20,
              False,
              "The longest request line the controller reads (its requests are a few hundred "
              "bytes); a longer one closes the connection. Kafka's socket.request.max.bytes, "
              "for the controller listener."),
    ConfigDef("controller.metadata.max.wait.ms", _non_negative_int, 2000, False,
              "minibroker's own: the longest a metadata long poll waits for a change; a "
              "larger wait_ms is clamped to it (brokers ask for 1000)."),
]

CONFIG_DEFS: dict[str, ConfigDef] = {
    d.name: d
    for d in [
        ConfigDef("min.insync.replicas", _positive_int, 1, True,
                  "acks=all writes need at least this many ISR members."),
        ConfigDef("unclean.leader.election.enable", _bool, False, True,
                  "Elect an out-of-sync replica when no ISR member is alive (may lose data)."),
        ConfigDef("eligible.leader.replicas.version", _one_of("0", "1"), "1", False,
                  "1: the controller keeps eligible leader replicas and elects from them, "
                  "tells clean from unclean shutdowns, and elects the last known leader when "
                  "the ISR and the ELR are empty (KIP-966; Kafka 4.1+'s default feature "
                  "level). 0: Kafka 3.7 to 4.0's rules: the ISR keeps its last member and "
                  "nothing else may lead but through an unclean election."),
        ConfigDef("replication.truncation.mode", _truncation_mode, "leader-epoch", True,
                  "leader-epoch (KIP-101/279) or high-watermark (the unsafe pre-KIP-101 rule)."),
        ConfigDef("high.watermark.min.isr.rule", _min_isr_rule, "strict", True,
                  "strict: the leader advances the high watermark only while the ISR has at "
                  "least min(min.insync.replicas, replicas) members (Kafka 3.7 onwards, "
                  "KAFKA-15583); legacy: whatever the ISR size (Kafka 0.9 to 3.6)."),
        ConfigDef("log.flush.interval.messages", _optional_int, None, True,
                  "fsync after this many messages; unset = never on the produce path."),
        ConfigDef("log.flush.interval.ms", _optional_int, None, True,
                  "fsync when this long passed since the last flush; unset = never."),
        ConfigDef("segment.bytes", _positive_int, 64 << 20, True, "Log segment size."),
        ConfigDef("replica.lag.time.max.ms", _positive_int, 10000, False,
                  "A follower not caught up for this long leaves the ISR (Kafka: 30000; "
                  "as in Kafka, longer than broker.session.timeout.ms, so a dead broker is "
                  "fenced before a leader drops it for lag)."),
        ConfigDef("replica.fetch.wait.max.ms", _positive_int, 500, False,
                  "How long a follower's fetch waits on the leader for new data."),
        ConfigDef("replica.fetch.min.bytes", _positive_int, 1, False,
                  "A follower's fetch waits on the leader (up to replica.fetch.wait.max.ms) "
                  "until this many bytes are there: larger values batch replication and "
                  "widen the window of records only the leader has."),
        ConfigDef("replica.fetch.max.bytes", _positive_int, 1 << 20, False,
                  "Bytes per partition per follower fetch."),
        ConfigDef("replica.high.watermark.checkpoint.interval.ms", _positive_int, 1000, False,
                  "How often the high watermarks are checkpointed (Kafka: 5000)."),
        ConfigDef("producer.id.expiration.ms", _positive_int, 86400000, False,
                  "A producer id with no transaction open whose last batch in a partition "
                  "is this old is forgotten there (Kafka's default, one day): what "
                  "idempotent producers, each with a fresh id, make a broker keep per "
                  "partition is bounded in time. A retry of an expired producer's batch is "
                  "taken as new."),
        ConfigDef("producer.id.expiration.check.interval.ms", _positive_int, 600000, False,
                  "How often producer ids are checked for expiry (Kafka's default)."),
        ConfigDef("log.flush.offset.checkpoint.interval.ms", _positive_int, 6000, False,
                  "How often each log's recovery point (everything below it fsynced) is "
                  "checkpointed; a restart after a crash trusts only that much of the log to "
                  "be durable (Kafka: 60000)."),
        ConfigDef("broker.heartbeat.interval.ms", _positive_int, 250, False,
                  "Broker heartbeat period to the controller (Kafka: 2000)."),
        ConfigDef("broker.session.timeout.ms", _positive_int, 3000, False,
                  "A broker silent for this long is fenced (Kafka: 9000). A broker waits "
                  "half of it for each heartbeat's answer (Kafka's heartbeat channel, "
                  "KAFKA-14392)."),
        ConfigDef("controlled.shutdown.enable", _bool, True, False,
                  "A clean stop (SIGTERM) is a controlled shutdown: the broker asks the "
                  "controller to move its leaderships and take it out of every ISR, and stops "
                  "once told to (Kafka's default, BrokerServer.shutdown). false: it stops at "
                  "once and is fenced later, by its session timeout or its next "
                  "registration, as a Kafka broker with controlled.shutdown.enable=false."),
        ConfigDef("controlled.shutdown.timeout.ms", _positive_int, 300000, False,
                  "How long a controlled shutdown waits for the controller's leave before the "
                  "broker stops anyway. Not a Kafka config: Kafka waits until its shutdown's "
                  "deadline, the 5 minutes of KafkaBroker.shutdown()."),
        ConfigDef("socket.connection.setup.timeout.ms", _positive_int, 10000, False,
                  "How long a broker's connection to the controller may take to set up, "
                  "its authentication included (Kafka's default)."),
        ConfigDef("auto.leader.rebalance.enable", _bool, True, False,
                  "Move leadership back to the preferred (first) replica when it is in sync."),
        ConfigDef("leader.imbalance.check.interval.ms", _positive_int, 60000, False,
                  "How often the controller checks for preferred leaders (Kafka: 300000; "
                  "longer than a typical run, so failovers are not undone mid-run)."),
        ConfigDef("cleanup.policy", _cleanup_policy, "delete", True,
                  "Recorded only: minibroker has no log cleaner, so it neither deletes nor "
                  "compacts (__consumer_offsets is created with compact, as in Kafka)."),
        # The group coordinator (Kafka's GroupCoordinatorConfig, classic protocol).
        ConfigDef("offsets.topic.replication.factor", _positive_int, 3, False,
                  "Replication factor of __consumer_offsets, created on the first "
                  "FindCoordinator for a group; as in Kafka, creation fails (and the "
                  "coordinator stays unavailable) while fewer brokers are live."),
        ConfigDef("offsets.topic.num.partitions", _positive_int, 10, False,
                  "Partitions of __consumer_offsets; a group's coordinator is the leader of "
                  "partition abs(hashCode(group.id)) % this (Kafka: 50; fewer here because "
                  "every partition is replicated by Python brokers whether groups use it or "
                  "not: beside an idle 50-partition RF=3 topic a 3-broker cluster produced "
                  "up to half fewer records/s, beside a 10-partition one about as "
                  "many (benchmarks/RESULTS.md), and any consumer with a group.id creates "
                  "the topic, so every experiment pays)."),
        ConfigDef("offsets.commit.required.acks", _acks, -1, False,
                  "The acks an OffsetCommit (and a group's metadata) is written with before "
                  "the coordinator answers; -1 = every ISR member. Deprecated in Kafka 3.8 "
                  "(KIP-1041) and removed in 4.0, which always use -1."),
        ConfigDef("offsets.commit.timeout.ms", _positive_int, 2000, False,
                  "How long an offset or group write waits for its acks before the member "
                  "gets REQUEST_TIMED_OUT (Kafka: 5000; as in Kafka, below "
                  "broker.session.timeout.ms)."),
        ConfigDef("group.min.session.timeout.ms", _positive_int, 2000, False,
                  "The shortest session.timeout.ms a member may ask for "
                  "(INVALID_SESSION_TIMEOUT below; Kafka: 6000)."),
        ConfigDef("group.max.session.timeout.ms", _positive_int, 600000, False,
                  "The longest session.timeout.ms a member may ask for (Kafka: 1800000)."),
        ConfigDef("group.initial.rebalance.delay.ms", _non_negative_int, 1000, False,
                  "How long the first rebalance of an empty group waits for more members, "
                  "extended by as much for each newcomer up to the rebalance timeout "
                  "(InitialDelayedJoin; Kafka: 3000)."),
        ConfigDef("group.max.size", _positive_int, 2**31 - 1, False,
                  "Members a group may have (GROUP_MAX_SIZE_REACHED beyond; Kafka: "
                  "Integer.MAX_VALUE)."),
        # The consumer group protocol (KIP-848; Kafka 4.2's GroupCoordinatorConfig).
        ConfigDef("group.coordinator.rebalance.protocols", _rebalance_protocols,
                  ("classic", "consumer"), False,
                  "The group protocols the coordinator speaks: classic (JoinGroup, SyncGroup) "
                  "and consumer (KIP-848's ConsumerGroupHeartbeat). Kafka 4.0+ enables both; "
                  "without consumer, ConsumerGroupHeartbeat and ConsumerGroupDescribe are not "
                  "advertised."),
        ConfigDef("group.consumer.session.timeout.ms", _positive_int, 45000, False,
                  "How long a consumer protocol member may go without a heartbeat before it "
                  "is fenced (the coordinator decides it, not the client)."),
        ConfigDef("group.consumer.heartbeat.interval.ms", _positive_int, 5000, False,
                  "The heartbeat interval the coordinator gives consumer protocol members."),
        ConfigDef("group.consumer.min.session.timeout.ms", _positive_int, 45000, False,
                  "The lowest group.consumer.session.timeout.ms may be (Kafka: 45000)."),
        ConfigDef("group.consumer.max.session.timeout.ms", _positive_int, 60000, False,
                  "The highest group.consumer.session.timeout.ms may be (Kafka: 60000)."),
        ConfigDef("group.consumer.min.heartbeat.interval.ms", _positive_int, 5000, False,
                  "The lowest group.consumer.heartbeat.interval.ms may be (Kafka: 5000)."),
        ConfigDef("group.consumer.max.heartbeat.interval.ms", _positive_int, 15000, False,
                  "The highest group.consumer.heartbeat.interval.ms may be (Kafka: 15000)."),
        ConfigDef("group.consumer.max.size", _positive_int, 2**31 - 1, False,
                  "Members a consumer group may have (GROUP_MAX_SIZE_REACHED beyond)."),
        ConfigDef("group.consumer.assignors", _assignors, ("uniform", "range"), False,
                  "The server-side assignors offered to consumer groups, the first the "
                  "default (uniform: balanced and sticky; range: per topic, co-partitioned)."),
        # The transaction coordinator (Kafka's TransactionLogConfig, TransactionStateManagerConfig).
        ConfigDef("transaction.state.log.replication.factor", _positive_int, 3, False,
                  "Replication factor of __transaction_state, created on the first "
                  "FindCoordinator for a transactional id; as in Kafka, creation fails (and "
                  "the coordinator stays unavailable) while fewer brokers are live."),
        ConfigDef("transaction.state.log.min.isr", _positive_int, 2, False,
                  "min.insync.replicas of __transaction_state: every coordinator write is "
                  "acks=all, so below it InitProducerId and the transaction's steps get "
                  "COORDINATOR_NOT_AVAILABLE."),
        ConfigDef("transaction.state.log.num.partitions", _positive_int, 10, False,
                  "Partitions of __transaction_state; a transactional id's coordinator is the "
                  "leader of partition abs(hashCode(transactional.id)) % this (Kafka: 50; "
                  "fewer here for the reason offsets.topic.num.partitions gives)."),
        ConfigDef("transaction.max.timeout.ms", _positive_int, 900000, False,
                  "The longest transaction.timeout.ms a producer may ask for "
                  "(INVALID_TRANSACTION_TIMEOUT above)."),
        ConfigDef("transactional.id.expiration.ms", _positive_int, 604800000, False,
                  "A transactional id with no transaction open that has not been updated for "
                  "this long expires: a tombstone in __transaction_state and out of the "
                  "coordinator's memory, so what clients make it hold is bounded in time "
                  "(a new instance of the id then gets a new producer id)."),
        ConfigDef("transaction.remove.expired.transaction.cleanup.interval.ms", _positive_int,
                  3600000, False, "How often the coordinator looks for expired ids."),
        ConfigDef("transaction.partition.verification.enable", _bool, True, False,
                  "KIP-890 part 1 (Kafka 3.6+): a leader asks the transaction's coordinator "
                  "whether a partition is in the transaction before it appends a client's "
                  "first transactional batch of it. false: Kafka 3.0 to 3.5, where a late "
                  "batch can open a transaction nobody ends (a hanging transaction)."),
        ConfigDef("transaction.version", _transaction_version, 2, False,
                  "Kafka's finalized feature transaction.version (KIP-890), advertised in "
                  "ApiVersions: 2 (Kafka 4.0+'s default) lets a client that speaks it "
                  "(EndTxn v5, Produce v12) bump the producer epoch on every transaction; "
                  "1 and 0 are Kafka 3.x's protocol, where a transaction keeps its producer's "
                  "epoch (0 also writes __transaction_state's value in its version 0). The "
                  "version of each request is the client's; this one governs the "
                  "coordinator's own aborts."),
        ConfigDef("transaction.abort.timed.out.transaction.cleanup.interval.ms",
                  _positive_int, 10000, False,
                  "How often the coordinator aborts transactions open longer than their "
                  "transaction.timeout.ms, fencing the producer's epoch (Kafka's default)."),
        ConfigDef("default.replication.factor", _positive_int, 1, False,
                  "Replication factor of CreateTopics requests that leave it unset."),
        ConfigDef("num.partitions", _positive_int, 1, False,
                  "Partition count of CreateTopics requests that leave it unset."),
        ConfigDef("delete.topic.enable", _bool, True, False,
                  "DeleteTopics deletes (Kafka's default); false answers every topic "
                  "TOPIC_DELETION_DISABLED (INVALID_REQUEST before DeleteTopics v3)."),
        *_SOCKET_SERVER_DEFS,
        *_CONTROLLER_LISTENER_DEFS,
    ]
}


def parse_overrides(pairs: Iterable[str]) -> dict[str, str]:
    """Turn ``KEY=VALUE`` strings into a dict, rejecting unknown keys and bad values."""
    overrides: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--config {pair!r}: expected KEY=VALUE")
        _validate(key, value)
        overrides[key] = value.strip()
    _check_request_memory(overrides)
    check_consumer_group_timeouts(overrides)
    return overrides


def check_consumer_group_timeouts(config: Mapping[str, str]) -> None:
    """Kafka 4.2's ``GroupCoordinatorConfig`` rules on the consumer protocol's session and
    heartbeat: each within its min and max, the heartbeat below the session, with Kafka's
    messages."""
    value = {key: resolve(f"group.consumer.{key}", config) for key in (
        "session.timeout.ms", "min.session.timeout.ms", "max.session.timeout.ms",
        "heartbeat.interval.ms", "min.heartbeat.interval.ms", "max.heartbeat.interval.ms")}
    rules = (("max.heartbeat.interval.ms", ">=", "min.heartbeat.interval.ms"),
             ("heartbeat.interval.ms", ">=", "min.heartbeat.interval.ms"),
             ("heartbeat.interval.ms", "<=", "max.heartbeat.interval.ms"),
             ("max.session.timeout.ms", ">=", "min.session.timeout.ms"),
             ("session.timeout.ms", ">=", "min.session.timeout.ms"),
             ("session.timeout.ms", "<=", "max.session.timeout.ms"),
             ("heartbeat.interval.ms", "<", "session.timeout.ms"))
    words = {">=": "greater than or equal to", "<=": "less than or equal to", "<": "less than"}
    for left, op, right in rules:
        a, b = value[left], value[right]
        if not (a >= b if op == ">=" else a <= b if op == "<=" else a < b):
            raise ConfigError(f"group.consumer.{left} must be {words[op]} "
                              f"group.consumer.{right}")


def _check_request_memory(config: Mapping[str, str]) -> None:
    """Kafka's KafkaConfig rule: a request memory pool smaller than one frame could never
    admit a frame of the largest size."""
    pool = resolve("queued.max.request.bytes", config)
    frame = resolve("socket.request.max.bytes", config)
    if 0 < pool < frame:
        raise ConfigError(f"queued.max.request.bytes ({pool}) must be -1 or at least "
                          f"socket.request.max.bytes ({frame})")


def _validate(key: str, value: str) -> Any:
    definition = CONFIG_DEFS.get(key)
    if definition is None:
        raise ConfigError(f"unknown config {key!r}; known: {', '.join(sorted(CONFIG_DEFS))}")
    try:
        return definition.parse(value)
    except ValueError as exc:
        raise ConfigError(f"config {key}={value!r}: {exc}") from None


def validate_topic_config(config: Mapping[str, str]) -> None:
    for key, value in config.items():
        _validate(key, value)
        if not CONFIG_DEFS[key].topic_level:
            raise ConfigError(f"config {key!r} is a broker config, not a topic config")


def resolve(key: str, *layers: Mapping[str, str]) -> Any:
    """The parsed value of ``key`` from the first layer that sets it (topic, then broker)."""
    for layer in layers:
        if key in layer:
            return CONFIG_DEFS[key].parse(layer[key])
    return CONFIG_DEFS[key].default


@dataclass(frozen=True)
class LogConfig:
    """Per-partition settings resolved from the topic config over the broker config."""

    min_insync_replicas: int
    truncation_mode: str
    high_watermark_min_isr_rule: str
    flush_interval_messages: int | None
    flush_interval_ms: int | None
    segment_bytes: int

    @classmethod
    def from_layers(cls, *layers: Mapping[str, str]) -> LogConfig:
        return cls(
            min_insync_replicas=resolve("min.insync.replicas", *layers),
            truncation_mode=resolve("replication.truncation.mode", *layers),
            high_watermark_min_isr_rule=resolve("high.watermark.min.isr.rule", *layers),
            flush_interval_messages=resolve("log.flush.interval.messages", *layers),
            flush_interval_ms=resolve("log.flush.interval.ms", *layers),
            segment_bytes=resolve("segment.bytes", *layers),
        )
