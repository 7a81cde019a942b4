"""The consumer group's losses explained on hand-built histories: a committed offset lost from
the group's __consumer_offsets partition, one history per cause, each with its exact
sentence; and records the group skipped, explained with the election that made room for
them."""

from __future__ import annotations

from history_builder import HistoryBuilder

from undertow_analysis import run_analysis
from undertow_analysis.report import summary_text

C = "controller"
OFFSETS = "__consumer_offsets"
HELD = ("the committed offset 500 of group g for t-2, acknowledged at 12.0 s by broker 1 "
        "(coordinator, leader of __consumer_offsets-7 in epoch 3), was lost")


def offsets_event(h: HistoryBuilder, type_: str, *, t: float, broker: int,
                  partition: int = 7, **fields: object) -> None:
    """An event of broker `broker` about __consumer_offsets-`partition` (the group's: 7)."""
    h.event(type_, t=t, node=f"broker-{broker}", topic=OFFSETS, partition=partition,
            broker=broker, **fields)


def coordinated() -> HistoryBuilder:
    """Broker 1 leads __consumer_offsets-7, which holds group g, in epoch 3; c1 commits 320,
    then 500 (acknowledged at 12.0 s) for t-2."""
    h = HistoryBuilder(expect="loss")
    offsets_event(h, "become_leader", t=0.1, broker=1, leader_epoch=3, log_end_offset=0,
                  high_watermark=0, isr=[1, 2, 3])
    offsets_event(h, "coordinator_load", t=0.2, broker=1, leader_epoch=3, log_end_offset=0,
                  detail="loaded groups g")
    h.assign("c1", 2, t=1.0, generation=1)
    h.commit("c1", 2, 320, t=10.0, generation=1)
    h.commit("c1", 2, 500, t=12.0, generation=1)
    h.group("c1", "revoke", 2, t=14.0, generation=1)
    return h


def fetched_320(h: HistoryBuilder) -> dict:
    """c0 is assigned t-2 at 15.2 s and the coordinator returns 320 at 15.3 s."""
    h.event("group_rebalance", t=14.0, node="broker-1", topic=None, partition=None, broker=1,
            group="g", generation=1, reason="member_left", member="c1-1")
    h.event("group_stable", t=15.1, node="broker-1", topic=None, partition=None, broker=1,
            group="g", generation=2, members=["c0-2"])
    h.assign("c0", 2, t=15.2, generation=2, committed=320)
    return h


def only_incident(h: HistoryBuilder, tmp_path) -> tuple[dict, dict]:
    report = run_analysis(str(h.write(tmp_path / "history")), str(tmp_path / "out"))
    assert report["counts"]["committed_offsets_lost"] == 1 and report["verdict"] == "loss"
    (incident,) = report["explained"]["incidents"]
    assert (incident["kind"], incident["commits"], incident["group"],
            incident["offsets_partition"]) == ("committed_offsets", 1, "g",
                                               "__consumer_offsets-7")
    return report, incident


def test_a_committed_offset_lost_to_a_power_loss_of_the_coordinator(spark, tmp_path):
    h = coordinated()
    offsets_event(h, "power_loss", t=13.1, broker=1, leader_epoch=3, log_end_offset=45)
    offsets_event(h, "log_recovery", t=14.5, broker=1, log_end_offset=41)
    offsets_event(h, "truncation", t=14.5, broker=1, from_offset=45, to_offset=41,
                  reason="log_recovery")
    offsets_event(h, "become_leader", t=14.8, broker=1, leader_epoch=4, log_end_offset=41,
                  high_watermark=41, isr=[1])
    report, incident = only_incident(fetched_320(h), tmp_path)
    assert (incident["mechanism"], incident["holder"], incident["holder_epoch"]) == (
        "power_loss", 1, 3)
    (cut,) = report["explained"]["truncations"]
    assert cut["sentence"] == (
        "at 14.5 s broker 1 truncated __consumer_offsets-7 from 45 to 41 at restart: the power "
        "loss took its unflushed tail: those offsets held commits of the consumer group g; a "
        "committed offset it took is a loss incident.")
    assert incident["sentence"] == (
        f"{HELD}: broker 1 lost power at 13.1 s before flushing it, and came back with "
        f"__consumer_offsets-7 cut to offset 41; at 15.3 s the coordinator returned 320.")
    assert incident["examples"] == [{"topic": "t", "partition": 2, "committed": 500,
                                     "returned": 320, "t_commit_s": 12.0, "t_fetch_s": 15.3}]


def test_a_committed_offset_lost_to_a_truncation_of_the_offsets_partition(spark, tmp_path):
    h = coordinated()
    h.fault("kill", "broker-1", "inject", t=12.5, role="coordinator of g")
    h.fault("kill", "broker-1", "recover", t=13.4, role="coordinator of g")
    h.event("leader_election", t=13.0, node=C, topic=OFFSETS, partition=7, leader_epoch=4,
            leader=2, previous_leader=1, kind="clean", reason="leader_fenced", isr=[1, 2, 3])
    offsets_event(h, "become_leader", t=13.1, broker=2, leader_epoch=4, log_end_offset=41,
                  high_watermark=41, isr=[2, 3])
    offsets_event(h, "coordinator_load", t=13.2, broker=2, leader_epoch=4, log_end_offset=41)
    # Another partition of __consumer_offsets truncated on broker 1 explains nothing here.
    offsets_event(h, "truncation", t=13.3, broker=1, partition=3, leader_epoch=4,
                  from_offset=90, to_offset=80, reason="offset_for_leader_epoch")
    offsets_event(h, "truncation", t=13.5, broker=1, leader_epoch=4, from_offset=45,
                  to_offset=41, reason="offset_for_leader_epoch")
    _, incident = only_incident(fetched_320(h), tmp_path)
    assert incident["mechanism"] == "coordinator_truncation"
    assert incident["mechanism_name"] == "a truncation of the group coordinator's log"
    assert incident["sentence"] == (
        f"{HELD}: at 13.1 s broker 2 became leader of __consumer_offsets-7 with its log ending "
        f"at 41, and at 13.5 s, after #1 kill broker-1 (coordinator of g), broker 1 truncated "
        f"__consumer_offsets-7 from 45 to 41 to the end of the leader's epoch "
        f"(OffsetForLeaderEpoch); at 15.3 s the coordinator returned 320.")


def test_a_committed_offset_lost_with_the_coordinators_disk(spark, tmp_path):
    h = coordinated()
    offsets_event(h, "log_recovery", t=14.5, broker=1, log_end_offset=0,
                  detail="no log on disk: the disk is new or was emptied")
    _, incident = only_incident(fetched_320(h), tmp_path)
    assert incident["sentence"] == (
        f"{HELD}: broker 1 came back at 14.5 s with __consumer_offsets-7 empty (its disk was "
        f"lost); at 15.3 s the coordinator returned 320.")


def test_a_committed_offset_no_event_explains_is_unexplained_and_said_first(spark, tmp_path):
    h = coordinated()
    # A power loss of another broker, after which the fetch returns nothing at all.
    offsets_event(h, "power_loss", t=13.1, broker=2, leader_epoch=3, log_end_offset=45)
    h.assign("c0", 2, t=15.2, generation=2, committed=None)
    report, incident = only_incident(h, tmp_path)
    assert incident["mechanism"] == "unexplained" and report["explained"]["unexplained"] == 1
    assert incident["sentence"] == (
        f"UNEXPLAINED: {HELD} (at 15.3 s the coordinator returned no committed offset), and "
        f"no power loss, truncation or unclean election of __consumer_offsets-7 in "
        f"events.jsonl removed it: this is a bug in the broker or in the harness, not a "
        f"property of the configuration.")
    assert "UNEXPLAINED: 1 anomalous records or committed offsets no event explains" in (
        summary_text(report))


def test_records_the_group_skipped_join_the_incident_of_the_election_behind_them(
        spark, tmp_path):
    """c0 reads t-0@10..12 from broker 1 and commits 13; an unclean election makes broker 3,
    whose log ends at 10, leader; new records are written at 10..12 and the group, resuming
    at 13, never reads them."""
    h = HistoryBuilder(expect="loss")
    h.event("become_leader", t=0.1, node="broker-1", broker=1, leader_epoch=0,
            log_end_offset=0, high_watermark=0, isr=[1, 2, 3])
    h.assign("c0", 0, t=0.5, generation=1)
    for i in range(13):
        h.send(f"p1-{i}", t=1.0 + i * 0.1, offset=i)
        h.poll("c0", f"p1-{i}", 0, i, generation=1, t=3.0 + i * 0.01)
        if i < 10:
            h.read(f"p1-{i}", 0, i)
    h.commit("c0", 0, 13, t=6.0, generation=1)
    h.event("leader_election", t=8.0, node=C, leader_epoch=1, leader=3, previous_leader=-1,
            kind="unclean", reason="broker_unfenced", isr=[1])
    h.event("become_leader", t=8.1, node="broker-3", broker=3, leader_epoch=1,
            log_end_offset=10, high_watermark=10, isr=[3])
    for i in range(10, 13):
        h.send(f"p2-{i}", t=9.0, offset=i)
        h.read(f"p2-{i}", 0, i)
    h.event("truncation", t=12.0, node="broker-1", broker=1, leader_epoch=1, from_offset=13,
            to_offset=10, reason="offset_for_leader_epoch")
    report = run_analysis(str(h.write(tmp_path / "history")), str(tmp_path / "out"))
    counts = report["counts"]
    assert (counts["lost"], counts["phantom_reads"], counts["skipped"]) == (3, 3, 3)
    (incident,) = report["explained"]["incidents"]
    assert (incident["mechanism"], incident["records"], incident["skipped"]) == (
        "unclean_election", 6, 3)
    assert incident["sentence"] == (
        "records at offsets 10-12 of t-0 (3 acknowledged records lost; 3 of them read by a "
        "consumer before; 3 records skipped by the consumer group, written there after its "
        "committed offset had passed) were acknowledged by broker 1 in epoch 0; at 8.0 s the "
        "controller elected broker 3 although it was not in the ISR {1} (an unclean "
        "election), whose log ended at 10, and broker 1 truncated them on becoming its "
        "follower (OffsetForLeaderEpoch, KIP-101).")
