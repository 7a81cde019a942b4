"""Replication events (``minibroker.events``): what the brokers and the controller record of
each replication state change, asserted exactly on the step-by-step cluster, and served by a
real cluster's ``/v1/events`` across restarts and a power loss.

Long (about 510 lines): every kind of event is asserted to the field, each after the steps
that make it."""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from rule_sets import KAFKA_3_7
from stepper import SimCluster
from test_broker_processes import TOPIC, ProcessCluster, post, wait_for
from test_group_failover import CONFIG as GROUP_CONFIG
from test_group_failover import GROUP, OFFSETS_TP, join_and_sync
from test_txn_coordinator import GONE, TXN, Coordinator, run

from minibroker.cluster.types import TopicPartition
from minibroker.coordinator.group_metadata_manager import OFFSETS_TOPIC
from minibroker.events import EVENTS_FILE, EventType, ReplicationEventLog, parse_events_query
from undertow_history.schema import EVENT_TYPES, EVENTS

TP = TopicPartition("orders", 0)
SESSION_EXPIRED = "its session expired (3000 ms without heartbeat)"


def fill(sim: SimCluster, count: int) -> None:
    for i in range(count):
        assert sim.produce(TP, [f"m{i}"], acks=1).acknowledged
    sim.replicate()


def advance_with_fetches(sim: SimCluster, ms: int, fetchers: list[int], step: int = 100) -> None:
    """Time passes while only ``fetchers`` keep fetching."""
    for _ in range(ms // step):
        for broker_id in fetchers:
            sim.fetch_round(broker_id)
        sim.advance(step)


def partition_event(event_type: str, t: float, node: str, **fields: Any) -> dict[str, Any]:
    return {"t": t, "type": event_type, "topic": "orders", "partition": 0, **fields,
            "node": node}


def fenced(t: float, broker: int, broker_epoch: int, reason: str, detail: str
           ) -> dict[str, Any]:
    return {"t": t, "type": "broker_fenced", "broker": broker, "broker_epoch": broker_epoch,
            "reason": reason, "detail": detail, "node": "controller"}


def unfenced(t: float, broker: int, broker_epoch: int) -> dict[str, Any]:
    return {"t": t, "type": "broker_unfenced", "broker": broker, "broker_epoch": broker_epoch,
            "node": "controller"}


def isr_fenced(t: float, broker: int, leader_epoch: int, old_isr: list[int], isr: list[int],
               detail: str = SESSION_EXPIRED) -> dict[str, Any]:
    return partition_event("isr_change", t, "controller", leader_epoch=leader_epoch,
                           broker=broker, old_isr=old_isr, isr=isr, reason="fenced",
                           detail=f"broker {broker} was fenced because {detail}")


def election(t: float, leader_epoch: int, leader: int, previous: int, kind: str,
             isr: list[int], reason: str, detail: str) -> dict[str, Any]:
    return partition_event("leader_election", t, "controller", leader_epoch=leader_epoch,
                           leader=leader, previous_leader=previous, kind=kind, isr=isr,
                           reason=reason, detail=detail)


def leader(t: float, broker: int, leader_epoch: int, leo: int, hw: int, isr: list[int]
           ) -> dict[str, Any]:
    return partition_event("become_leader", t, f"broker-{broker}", leader_epoch=leader_epoch,
                           broker=broker, log_end_offset=leo, high_watermark=hw, isr=isr)


def follower(t: float, broker: int, leader_epoch: int, leader_id: int, leo: int, hw: int
             ) -> dict[str, Any]:
    return partition_event("become_follower", t, f"broker-{broker}",
                           leader_epoch=leader_epoch, broker=broker, leader=leader_id,
                           log_end_offset=leo, high_watermark=hw)


def recovery(t: float, broker: int, leo: int, recovery_point: int) -> dict[str, Any]:
    return partition_event("log_recovery", t, f"broker-{broker}", broker=broker,
                           log_end_offset=leo,
                           detail=f"loaded from the recovery point {recovery_point}: log start "
                                  f"offset 0, log end offset {leo}")


# ---- the step-by-step cluster ------------------------------------------------------------


@pytest.mark.parametrize(("mode", "reason", "detail"), [
    ("leader-epoch", "offset_for_leader_epoch", "leader epoch 0 ends at 3 on the leader"),
    ("high-watermark", "high_watermark", "pre-KIP-101 rule: truncate to the high watermark"),
])
def test_an_acks1_record_only_the_crashed_leader_held_is_truncated_when_it_follows(
        tmp_path: Path, mode: str, reason: str, detail: str) -> None:
    """Broker 1 acknowledges offset 3 alone and crashes; the controller fences it, takes it
    out of the ISR and elects broker 2 cleanly; broker 1 restarts, follows 2 and truncates
    offset 3 (KIP-101's OffsetForLeaderEpoch, or before it its checkpointed HW). Kafka 3.7's
    rules: the restart is not checked for a clean shutdown."""
    sim = SimCluster(tmp_path, config={**KAFKA_3_7, "replication.truncation.mode": mode})
    sim.create_topic("orders")
    fill(sim, 3)
    assert sim.produce(TP, ["only-on-the-leader"], acks=1).acknowledged
    for rm in sim.brokers.values():
        rm.checkpoint_high_watermarks()
    mark = len(sim.events())
    sim.crash(1)
    sim.advance(3500)
    sim.start(1)
    sim.truncate_followers(1)
    truncation = partition_event("truncation", 3.5, "broker-1", leader_epoch=1, broker=1,
                                 from_offset=4, to_offset=3, reason=reason, detail=detail)
    assert sim.events()[mark:] == [
        fenced(3.25, 1, 1, "session_expired", SESSION_EXPIRED),
        isr_fenced(3.25, 1, 0, [1, 2, 3], [2, 3]),
        election(3.25, 1, 2, 1, "clean", [2, 3], "leader_fenced",
                 f"leader changed from 1 to 2 at epoch 1: leader 1 was fenced because "
                 f"{SESSION_EXPIRED}"),
        leader(3.25, 2, 1, 3, 3, [2, 3]),
        follower(3.25, 3, 1, 2, 3, 3),
        recovery(3.5, 1, 4, 0),
        follower(3.5, 1, 1, 2, 4, 3),
        # Before KIP-101 the truncation comes as it becomes a follower (Kafka 0.10.2's
        # makeFollowers); with leader epochs, once it asks the leader (its fetcher's turn).
        *([truncation] if mode == "high-watermark" else []),
        unfenced(3.5, 1, sim.broker_epoch(1)),
        *([truncation] if mode == "leader-epoch" else []),
    ]


def test_a_power_loss_is_logged_before_and_its_lost_tail_after_the_restart(
        tmp_path: Path) -> None:
    """Broker 3 fsynced offsets 0-1 (its recovery point is 2) and held 0-4 when it lost
    power: at the restart it recovers 2 offsets and records the 3 the loss took."""
    sim = SimCluster(tmp_path)
    sim.create_topic("orders")
    fill(sim, 2)
    sim.replica(3, TP).log.flush()
    sim.brokers[3].checkpoint_recovery_points()
    fill(sim, 3)
    mark = len(sim.events())
    sim.crash(3, power_loss=True)
    sim.start(3)  # refused until the session of the incarnation that lost power expires
    sim.advance(3500)
    sim.replicate()
    assert sim.events()[mark:] == [
        partition_event("power_loss", 0.0, "broker-3", broker=3, log_end_offset=5,
                        leader_epoch=0),
        fenced(3.25, 3, 5, "session_expired", SESSION_EXPIRED),
        isr_fenced(3.25, 3, 0, [1, 2, 3], [1, 2]),
        recovery(3.25, 3, 2, 2),
        partition_event("truncation", 3.25, "broker-3", broker=3, from_offset=5, to_offset=2,
                        reason="log_recovery",
                        detail="the unflushed tail past the recovery point 2 was lost to the "
                               "power loss"),
        follower(3.25, 3, 0, 1, 2, 0),
        unfenced(3.25, 3, sim.broker_epoch(3)),
        partition_event("isr_change", 3.5, "broker-1", leader_epoch=0, broker=1,
                        old_isr=[1, 2], isr=[1, 2, 3], reason="caught_up",
                        detail="replica 3 caught up and rejoined ISR"),
    ]
    # The next restart, without a power loss, does not count the same loss again.
    mark = len(sim.events())
    sim.crash(3)
    sim.start(3)
    sim.advance(3500)
    assert [e["type"] for e in sim.events()[mark:] if e["node"] == "broker-3"] == [
        "log_recovery", "become_follower"]


def test_a_broker_back_with_an_emptied_disk_records_its_log_recovered_empty(
        tmp_path: Path) -> None:
    """A pod replaced with a new emptyDir: the partition is older than the log the broker
    finds (none), which the history must show; a new topic's logs are no recovery."""
    sim = SimCluster(tmp_path)
    sim.create_topic("orders")
    fill(sim, 3)
    assert [e for e in sim.events() if e["type"] == "log_recovery"] == []
    sim.crash(3)
    shutil.rmtree(tmp_path / "broker-3" / f"{TP.topic}-{TP.partition}")
    mark = len(sim.events())
    sim.start(3)
    sim.advance(3500)  # the crashed incarnation's session expires: the new one registers
    recovered = [e for e in sim.events()[mark:] if e["type"] == "log_recovery"]
    assert [(e["node"], e["broker"], e["log_end_offset"]) for e in recovered] == [
        ("broker-3", 3, 0)]
    assert recovered[0]["detail"].endswith("the disk is new or was emptied")


def test_a_leader_records_the_isr_shrink_by_lag_and_the_rejoin(tmp_path: Path) -> None:
    sim = SimCluster(tmp_path, config={"replica.lag.time.max.ms": "3000"})
    sim.create_topic("orders")
    fill(sim, 2)
    mark = len(sim.events())
    assert sim.produce(TP, ["m2"], acks=1).acknowledged  # broker 3 never fetches it
    advance_with_fetches(sim, 5000, fetchers=[2])
    sim.replicate()
    assert sim.events()[mark:] == [
        partition_event("isr_change", 4.5, "broker-1", leader_epoch=0, broker=1,
                        old_isr=[1, 2, 3], isr=[1, 2], reason="lag",
                        detail="replica 3 is no longer in-sync (last caught up 4500 ms ago)"),
        partition_event("isr_change", 5.0, "broker-1", leader_epoch=0, broker=1,
                        old_isr=[1, 2], isr=[1, 2, 3], reason="caught_up",
                        detail="replica 3 caught up and rejoined ISR"),
    ]


@pytest.mark.parametrize("unclean", [True, False])
def test_the_last_isr_member_fenced_gives_an_unclean_election_or_an_offline_partition(
        tmp_path: Path, unclean: bool) -> None:
    """Broker 3 left the ISR; brokers 1 and 2 crash together. Fencing 1 elects 2 cleanly;
    fencing 2 (the last ISR member, which stays in the ISR) elects 3 uncleanly, or leaves the
    partition offline until 2 is back (Kafka 3.7's rules; test_elr.py has 4.1+'s)."""
    sim = SimCluster(tmp_path, config={**KAFKA_3_7, "replica.lag.time.max.ms": "3000",
                                       "unclean.leader.election.enable": str(unclean).lower()})
    sim.create_topic("orders")
    fill(sim, 2)
    assert sim.produce(TP, ["m2"], acks=1).acknowledged
    advance_with_fetches(sim, 5000, fetchers=[2])
    assert sim.registration(TP).isr == (1, 2)
    mark = len(sim.events())
    sim.crash(1)
    sim.crash(2)
    sim.advance(3500)
    second = ("UNCLEAN leader election: broker 3 becomes leader without being in the ISR [2]; "
              "data may be lost" if unclean else "offline: no live ISR member in [2]")
    expected = [
        fenced(8.0, 1, 1, "session_expired", SESSION_EXPIRED),
        isr_fenced(8.0, 1, 0, [1, 2], [2]),
        election(8.0, 1, 2, 1, "clean", [2], "leader_fenced",
                 f"leader changed from 1 to 2 at epoch 1: leader 1 was fenced because "
                 f"{SESSION_EXPIRED}"),
        fenced(8.0, 2, 3, "session_expired", SESSION_EXPIRED),
        election(8.0, 2, 3 if unclean else -1, 2, "unclean" if unclean else "offline", [2],
                 "leader_fenced", f"{second}: leader 2 was fenced because {SESSION_EXPIRED}"),
        *([{"t": 8.0, "type": "leader_recovery", "topic": "orders", "partition": 0,
            "leader_epoch": 2, "broker": 3, "leader": 3, "leader_recovery_state": "RECOVERING",
            "isr": [3], "node": "controller",
            "detail": "leader 3 was elected uncleanly: RECOVERING, the ISR stays the leader "
                      "alone until the leader says it has recovered"}] if unclean else []),
        leader(8.0, 3, 2, 2, 2, [3]) if unclean else follower(8.0, 3, 2, -1, 2, 2),
    ]
    assert sim.events()[mark:] == expected
    if unclean:
        return
    sim.start(2)
    assert sim.events()[mark + len(expected):] == [
        recovery(8.5, 2, 3, 0),
        follower(8.5, 2, 2, -1, 3, 3),
        unfenced(8.5, 2, sim.broker_epoch(2)),
        election(8.5, 3, 2, -1, "clean", [2], "broker_unfenced",
                 "leader changed from -1 to 2 at epoch 3: broker 2 was unfenced"),
        follower(8.5, 3, 3, 2, 2, 2),
        leader(8.5, 2, 3, 3, 3, [2]),
    ]


def test_a_follower_past_the_log_of_an_uncleanly_elected_leader_truncates_out_of_range(
        tmp_path: Path) -> None:
    """Before KIP-101, broker 2 truncates only to its HW (3), which is past the end of the log
    of broker 3, elected uncleanly with offsets 0-1: its fetch is out of range."""
    sim = SimCluster(tmp_path, config={"replica.lag.time.max.ms": "3000",
                                       "unclean.leader.election.enable": "true",
                                       "replication.truncation.mode": "high-watermark"})
    sim.create_topic("orders")
    fill(sim, 2)
    assert sim.produce(TP, ["m2"], acks=1).acknowledged
    advance_with_fetches(sim, 5000, fetchers=[2])
    sim.fetch_round(2)
    for rm in sim.brokers.values():
        rm.checkpoint_high_watermarks()
    sim.crash(1)
    sim.crash(2)
    sim.advance(3500)
    assert sim.leader_of(TP) == 3
    mark = len(sim.events())
    sim.start(2)
    sim.fetch_round(2)
    assert sim.events()[mark:] == [
        recovery(8.5, 2, 3, 0),
        follower(8.5, 2, 2, 3, 3, 3),
        unfenced(8.5, 2, sim.broker_epoch(2)),
        partition_event("truncation", 8.5, "broker-2", leader_epoch=2, broker=2,
                        from_offset=3, to_offset=2, reason="out_of_range",
                        detail="fetch offset beyond the leader's log end 2"),
    ]


def test_the_auto_leader_rebalance_records_a_preferred_election(tmp_path: Path) -> None:
    sim = SimCluster(tmp_path, config={"leader.imbalance.check.interval.ms": "5000"})
    sim.create_topic("orders")
    fill(sim, 2)
    sim.crash(1)
    sim.advance(3500)
    sim.start(1)
    sim.replicate()
    mark = len(sim.events())
    sim.advance(1500)
    assert sim.events()[mark:] == [
        election(5.0, 2, 1, 2, "preferred", [1, 2, 3], "preferred",
                 "preferred leader election: leader changed from 2 to 1 at epoch 2"),
        follower(5.0, 2, 2, 1, 2, 2),
        follower(5.0, 3, 2, 1, 2, 2),
        leader(5.0, 1, 2, 2, 2, [1, 2, 3]),
    ]


def test_every_event_follows_the_harness_schema_and_names_no_node(tmp_path: Path) -> None:
    """The contract with ``undertow_history.schema.EVENTS``: the same event types,
    only its field names, and no ``node`` (the harness adds it from where it collected)."""
    assert {str(t) for t in EventType} == set(EVENT_TYPES)
    sim = SimCluster(tmp_path, config={"replica.lag.time.max.ms": "3000",
                                       "unclean.leader.election.enable": "true"})
    sim.create_topic("orders")
    fill(sim, 2)
    sim.crash(3, power_loss=True)
    sim.start(3)
    assert sim.produce(TP, ["m2"], acks=1).acknowledged
    advance_with_fetches(sim, 5000, fetchers=[2])
    sim.crash(1)
    sim.crash(2)
    sim.advance(3500)
    sim.start(1)
    sim.replicate()
    groups = SimCluster(tmp_path / "groups", config=GROUP_CONFIG)  # the coordinator's events
    groups.create_topic(OFFSETS_TOPIC)
    groups.scheduler.advance(0)
    leader = groups.leader_of(OFFSETS_TP)
    member_id, _ = join_and_sync(groups, groups.coordinators[leader])
    groups.coordinators[leader].handle_leave_group(GROUP, [(member_id, None)])
    groups.advance(3500, silent=[leader])
    elr = SimCluster(tmp_path / "elr", config={"min.insync.replicas": "2"})  # KIP-966's
    elr.create_topic("orders")
    elr.stop(3)
    elr.stop(2)
    elr.advance(3500)
    run(one_transaction, tmp_path / "txn")  # the transaction coordinator's
    txn_events = list(ReplicationEventLog(tmp_path / "txn").events())
    written = [event for root in (tmp_path, tmp_path / "groups", tmp_path / "elr")
               for node in ("controller", "broker-1", "broker-2", "broker-3")
               for event in ReplicationEventLog(root / node).events()] + txn_events
    assert {e["type"] for e in written} == set(EVENT_TYPES)
    assert len(written) == (len(sim.events()) + len(groups.events()) + len(elr.events())
                            + len(txn_events))
    for event in written:
        assert "node" not in event
        assert set(event) <= set(EVENTS.names), event


async def one_transaction(c: Coordinator) -> None:
    """One committed transaction at a coordinator alone (its `end_txn`)."""
    _, pid, epoch = await c.init()
    await c.coordinator.handle_add_partitions_to_transaction(TXN, pid, epoch,
                                                             frozenset({GONE}), 1)
    await c.coordinator.handle_end_transaction(TXN, pid, epoch, True,
                                               client_transaction_version=1)


# ---- the events log itself ---------------------------------------------------------------


def test_the_log_pages_by_byte_offset_and_keeps_its_id_across_reopenings(
        tmp_path: Path) -> None:
    events = ReplicationEventLog(tmp_path, clock=lambda: 1.5)
    for broker in range(3):
        events.emit(EventType.BROKER_UNFENCED, broker=broker, broker_epoch=broker)
    first = events.read(max_events=2)
    assert first["log_id"] == events.log_id
    assert [e["broker"] for e in first["events"]] == [0, 1]
    rest = events.read(events.log_id, first["next_offset"])
    assert rest["events"] == [{"t": 1.5, "type": "broker_unfenced", "broker": 2,
                               "broker_epoch": 2}]
    reopened = ReplicationEventLog(tmp_path)
    assert reopened.log_id == events.log_id
    assert reopened.read(events.log_id, rest["next_offset"])["events"] == []
    # Another id (the node lost its disk): this log from its start.
    assert len(reopened.read("0" * 32, rest["next_offset"])["events"]) == 3


def test_a_line_torn_by_a_crash_is_cut_and_a_new_disk_gets_a_new_id(tmp_path: Path) -> None:
    events = ReplicationEventLog(tmp_path)
    events.emit(EventType.BROKER_UNFENCED, broker=1, broker_epoch=1)
    end = events.read()["next_offset"]
    with events.path.open("ab") as f:
        f.write(b'{"t":2.0,"type":"broker_fen')
    assert events.read()["next_offset"] == end  # a partial line is never served
    reopened = ReplicationEventLog(tmp_path)
    reopened.emit(EventType.BROKER_UNFENCED, broker=2, broker_epoch=2)
    assert [e["broker"] for e in reopened.read()["events"]] == [1, 2]
    events.path.unlink()
    assert ReplicationEventLog(tmp_path).log_id != events.log_id


def test_a_failing_write_is_logged_once_and_breaks_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    seen: list[dict[str, Any]] = []
    events = ReplicationEventLog(tmp_path, on_event=seen.append)
    events.path.unlink()
    events.path.mkdir()  # every append now fails with IsADirectoryError
    for broker in range(3):
        events.emit(EventType.BROKER_UNFENCED, broker=broker, broker_epoch=broker)
    assert len(seen) == 3
    warnings = [r for r in caplog.records if "Could not write replication events" in r.message]
    assert len(warnings) == 1


@pytest.mark.parametrize(("query", "parameter"), [
    ("offset=abc", "'offset'"), ("offset=-1", "'offset'"), ("offset=1&offset=2", "'offset'"),
    ("log_id=", "'log_id'"), ("since=3", "'since'"),
])
def test_a_malformed_query_names_its_parameter(query: str, parameter: str) -> None:
    with pytest.raises(ValueError, match=parameter):
        parse_events_query(query)


def test_a_query_may_leave_out_both_parameters() -> None:
    assert parse_events_query("") == (None, 0)
    assert parse_events_query("log_id=abc&offset=42") == ("abc", 42)


# ---- /v1/events of a real cluster ------------------------------------------------------------


def get_events(port: int, query: str = "") -> dict[str, Any]:
    url = f"http://127.0.0.1:{port}/v1/events" + (f"?{query}" if query else "")
    with urllib.request.urlopen(url, timeout=2) as response:
        return json.load(response)


def status_of(port: int, query: str) -> tuple[int, str]:
    try:
        get_events(port, query)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)["error"]
    return 200, ""


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    c = ProcessCluster(tmp_path, {"broker.session.timeout.ms": "2000",
                                  "replica.lag.time.max.ms": "4000"})
    try:
        yield c
    finally:
        c.stop()


@pytest.mark.slow
def test_the_endpoint_pages_by_offset_and_log_id_across_a_restart(
        cluster: ProcessCluster) -> None:
    cluster.create_topic()
    reg = cluster.partition()
    broker = next(b for b in reg["replicas"] if b != reg["leader"])
    port = cluster.ports[broker][1]
    wait_for(lambda: get_events(port)["events"], 10, "the follower's first event")
    first = get_events(port)
    assert [e["type"] for e in first["events"]] == ["become_follower"]
    assert first["events"][0]["broker"] == broker and "node" not in first["events"][0]
    assert abs(first["events"][0]["t"] - time.time()) < 60
    log_id, end = first["log_id"], first["next_offset"]
    assert (cluster.root / f"broker-{broker}" / EVENTS_FILE).stat().st_size == end
    assert get_events(port, f"log_id={log_id}&offset={end}") == {
        "log_id": log_id, "events": [], "next_offset": end}

    for query in ("offset=abc", "offset=-1", f"offset={end + 1}", f"offset={end - 1}",
                  f"log_id={log_id}&offset={end}&offset=0"):
        status, error = status_of(port, query)
        assert status == 400 and "'offset'" in error, (query, status, error)
    assert status_of(port, "from=0")[0] == 400

    cluster.kill(broker)
    cluster.start(broker)
    wait_for(lambda: len(get_events(port, f"log_id={log_id}&offset={end}")["events"]) == 2, 30,
             "the restarted broker to follow")
    after = get_events(port, f"log_id={log_id}&offset={end}")
    assert after["log_id"] == log_id and after["next_offset"] > end
    assert [e["type"] for e in after["events"]] == ["log_recovery", "become_follower"]
    # A client holding another log's id (as after a lost disk) gets everything again.
    everything = get_events(port, f"log_id={'0' * 32}&offset={after['next_offset']}")
    assert everything == {"log_id": log_id, "events": first["events"] + after["events"],
                          "next_offset": after["next_offset"]}
    controller = get_events(cluster.controller_http)["events"]
    assert [e["broker"] for e in controller if e["type"] == "broker_fenced"] == [broker]
    assert any(e["type"] == "isr_change" and e["reason"] == "fenced" for e in controller)


@pytest.mark.slow
def test_a_power_loss_on_a_real_broker_records_what_it_took(cluster: ProcessCluster) -> None:
    cluster.create_topic()
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(20):
        producer.produce(TOPIC, f"v{i}".encode(), partition=0)
    assert producer.flush(20) == 0
    reg = cluster.partition()
    broker = next(b for b in reg["replicas"] if b != reg["leader"])
    wait_for(lambda: cluster.broker_state(broker)["partitions"][0]["log_end_offset"] == 20, 10,
             "the follower to hold every record")
    post(cluster.ports[broker][1], "/v1/failpoints/power-loss", {})
    assert cluster.procs[f"broker-{broker}"].wait(10) == 137
    cluster.start(broker)
    port = cluster.ports[broker][1]
    wait_for(lambda: len(get_events(port)["events"]) == 5, 30, "the restarted broker to follow")
    events = get_events(port)["events"]
    assert [e["type"] for e in events] == [
        "become_follower", "power_loss", "log_recovery", "truncation", "become_follower"]
    _, loss, recovered, truncation, _ = events
    assert (loss["log_end_offset"], loss["leader_epoch"]) == (20, 0)
    assert recovered["log_end_offset"] == 0  # nothing was fsynced
    assert (truncation["from_offset"], truncation["to_offset"], truncation["reason"]) == (
        20, 0, "log_recovery")
    # The controller fenced it out of the ISR; the leader records its return.
    wait_for(lambda: get_events(cluster.ports[reg["leader"]][1])["events"][-1].get("reason")
             == "caught_up", 30, "the leader to take the broker back into the ISR")
    rejoined = get_events(cluster.ports[reg["leader"]][1])["events"][-1]
    assert (rejoined["type"], rejoined["isr"]) == ("isr_change", [1, 2, 3])

