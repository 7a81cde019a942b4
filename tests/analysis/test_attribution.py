"""Loss attribution on hand-built histories: one per mechanism, each with the exact incident
and sentence the events explain (sends, reads and events.jsonl planted by hand).

Long (about 590 lines): each mechanism needs its own history, a few dozen lines of planted
sends, reads and events, and the mechanisms belong side by side (one attribution, one
table)."""

from __future__ import annotations

from html import escape

import pytest
from history_builder import HistoryBuilder

from undertow_analysis import run_analysis
from undertow_analysis.explain import incident_sentence

C = "controller"


def base(acks: str = "all", healthy: int = 10) -> HistoryBuilder:
    """Broker 1 leads t-0 from the start; `healthy` records at offsets 0.. are acknowledged,
    read and drained."""
    h = HistoryBuilder(expect="loss", acks=acks)
    h.event("become_leader", t=0.1, node="broker-1", broker=1, leader_epoch=0,
            log_end_offset=0, high_watermark=0, isr=[1, 2, 3])
    for i in range(healthy):
        h.record(f"p0-{i}", 0, i, t=1 + i * 0.1)
    return h


def acked_on_broker_1(h: HistoryBuilder, offsets: range, *, t: float = 5.0,
                      drained: bool = False) -> None:
    for i in offsets:
        h.send(f"p1-{i}", t=t, offset=i)
        if drained:
            h.read(f"p1-{i}", 0, i)


def new_records(h: HistoryBuilder, offsets: range, *, t: float) -> None:
    """Records the new leader wrote at the dropped offsets: acknowledged and drained."""
    for i in offsets:
        h.record(f"p2-{i}", 0, i, t=t)


def elected(h: HistoryBuilder, *, t: float, epoch: int, leader: int, previous: int, kind: str,
            reason: str, isr: list[int], end: int) -> None:
    """The controller elects `leader` at `t`, which becomes leader 0.1 s later with its log
    ending at `end`."""
    h.event("leader_election", t=t, node=C, leader_epoch=epoch, leader=leader,
            previous_leader=previous, kind=kind, reason=reason, isr=isr)
    h.event("become_leader", t=t + 0.1, node=f"broker-{leader}", broker=leader,
            leader_epoch=epoch, log_end_offset=end, high_watermark=end, isr=[leader])


def analyse(h: HistoryBuilder, tmp_path) -> dict:
    return run_analysis(str(h.write(tmp_path / "history")), str(tmp_path / "out"))


def only_incident(report: dict) -> dict:
    explained = report["explained"]
    assert explained["events"] and explained["incident_count"] == 1
    return explained["incidents"][0]


def test_acks1_before_replication(spark, tmp_path):
    h = base(acks="1")
    acked_on_broker_1(h, range(10, 13))
    h.event("broker_fenced", t=6.0, node=C, topic=None, partition=None, broker=1,
            broker_epoch=3, reason="session_expired")
    elected(h, t=6.0, epoch=1, leader=2, previous=1, kind="clean",
            reason="leader_fenced", isr=[1, 2, 3], end=10)
    new_records(h, range(10, 13), t=7.0)
    h.event("truncation", t=9.0, node="broker-1", broker=1, leader_epoch=1, from_offset=13,
            to_offset=10, reason="offset_for_leader_epoch")
    report = analyse(h, tmp_path)
    assert report["counts"]["lost"] == 3
    incident = only_incident(report)
    assert (incident["mechanism"], incident["first_offset"], incident["last_offset"],
            incident["lost"], incident["holder"], incident["holder_epoch"],
            incident["dropper"], incident["drop_epoch"], incident["removals"]) == (
        "acks1_before_replication", 10, 12, 3, 1, 0, 2, 1, [1])
    assert incident["sentence"] == (
        "records at offsets 10-12 of t-0 (3 acknowledged records lost) were acknowledged "
        "by broker 1 in epoch 0 with acks=1, before broker 2 had fetched them; at 6.0 s the "
        "controller fenced broker 1 and elected broker 2 from the ISR {1, 2, 3}, whose log "
        "ended at 10, and broker 1 truncated them on becoming its follower "
        "(OffsetForLeaderEpoch, KIP-101).")
    # The truncation cut 3 acknowledged records, all lost; the new leader's records at the
    # same offsets (acknowledged after its epoch began) are not counted as cut.
    (cut,) = report["explained"]["truncations"]
    assert (cut["broker"], cut["acked"], cut["lost"], cut["lost_before"], cut["kept"]) == (
        1, 3, 3, 0, 0)
    assert cut["sentence"] == (
        "at 9.0 s broker 1 truncated t-0 from 13 to 10 to the end of the leader's epoch "
        "(OffsetForLeaderEpoch): it cut 3 records, 3 of them acknowledged: 3 lost for good "
        "(no replica kept them).")
    assert report["explained"]["truncations_lost"] == report["counts"]["lost"] == 3


def test_acks1_records_a_leader_between_had_fetched(spark, tmp_path):
    """Broker 1 acknowledges 10-12 with acks=1; a preferred election at 5.5 s makes broker 3,
    which had fetched them, leader; broker 3 is killed and fenced at 6.0 s and broker 2,
    which had not, elected. The records are broker 1's (the leader when they were
    acknowledged), the election that dropped them removed broker 3, and the sentence says
    broker 3 had them."""
    h = base(acks="1")
    acked_on_broker_1(h, range(10, 13))
    elected(h, t=5.5, epoch=1, leader=3, previous=1, kind="preferred",
            reason="preferred", isr=[1, 2, 3], end=13)
    h.event("broker_fenced", t=6.0, node=C, topic=None, partition=None, broker=3,
            broker_epoch=3, reason="session_expired")
    elected(h, t=6.0, epoch=2, leader=2, previous=3, kind="clean",
            reason="leader_fenced", isr=[1, 2], end=10)
    new_records(h, range(10, 13), t=7.0)
    h.event("truncation", t=6.5, node="broker-1", broker=1, leader_epoch=2, from_offset=13,
            to_offset=10, reason="offset_for_leader_epoch")
    report = analyse(h, tmp_path)
    incident = only_incident(report)
    assert (incident["mechanism"], incident["holder"], incident["dropper"],
            incident["drop_epoch"], incident["removals"]) == (
        "acks1_before_replication", 1, 2, 2, [1])
    assert incident["sentence"] == (
        "records at offsets 10-12 of t-0 (3 acknowledged records lost) were acknowledged "
        "by broker 1 in epoch 0 with acks=1, before broker 2 had fetched them (broker 3 had, "
        "and led after broker 1); at 6.0 s the controller fenced broker 3 and elected "
        "broker 2 from the ISR {1, 2}, whose log ended at 10, and broker 1 truncated them "
        "on becoming its follower (OffsetForLeaderEpoch, KIP-101).")


def test_records_a_deposed_leader_acknowledged_before_it_learned_of_the_new_epoch(
        spark, tmp_path):
    """Broker 1 (epoch 0), paused past its session timeout, is fenced at 6.0 s and broker 2
    elected (epoch 1, its log ending at 10). Broker 1 resumes at 6.4 s and, still the leader
    of epoch 0 to itself, acknowledges the requests queued meanwhile (acks=1) at offsets
    12-14; at 6.6 s it becomes broker 2's follower and truncates 15 -> 10. The records at
    10-11, acknowledged before the pause, are lost as acks=1 records broker 2 never fetched;
    those at 12-14 were acknowledged after broker 2's election, by the deposed broker 1."""
    h = base(acks="1")
    acked_on_broker_1(h, range(10, 12))
    h.fault("pause", "broker-1", "inject", t=5.2, role="leader of t-0")
    h.event("broker_fenced", t=6.0, node=C, topic=None, partition=None, broker=1,
            broker_epoch=3, reason="session_expired")
    elected(h, t=6.0, epoch=1, leader=2, previous=1, kind="clean",
            reason="leader_fenced", isr=[2, 3], end=10)
    h.fault("pause", "broker-1", "recover", t=6.4)
    acked_on_broker_1(h, range(12, 15), t=6.45)
    h.event("become_follower", t=6.55, node="broker-1", broker=1, leader_epoch=1, leader=2,
            log_end_offset=15, high_watermark=10)
    h.event("truncation", t=6.6, node="broker-1", broker=1, leader_epoch=1, from_offset=15,
            to_offset=10, reason="offset_for_leader_epoch")
    new_records(h, range(10, 15), t=7.0)
    report = analyse(h, tmp_path)
    assert report["counts"]["lost"] == 5 and report["explained"]["unexplained"] == 0
    # The truncation's table row counts the deposed leader's acknowledgements too: it cut
    # all five, though three were acknowledged after the new epoch began.
    (cut,) = report["explained"]["truncations"]
    assert (cut["acked"], cut["lost"], cut["kept"]) == (5, 5, 0)
    by_mechanism = {i["mechanism"]: i for i in report["explained"]["incidents"]}
    assert set(by_mechanism) == {"acks1_before_replication", "deposed_leader"}
    deposed = by_mechanism["deposed_leader"]
    assert (deposed["first_offset"], deposed["last_offset"], deposed["lost"],
            deposed["holder"], deposed["holder_epoch"], deposed["dropper"],
            deposed["drop_epoch"], deposed["dropper_end"], deposed["cause"],
            deposed["removals"], deposed["removal_reason"]) == (
        12, 14, 3, 1, 0, 2, 1, 10, None, [1], "offset_for_leader_epoch")
    assert (deposed["election"]["kind"], deposed["election"]["previous_leader"],
            deposed["election"]["t_s"], deposed["removal_t_s"]) == ("clean", 1, 6.0, 6.6)
    assert deposed["sentence"] == (
        "records at offsets 12-14 of t-0 (3 acknowledged records lost) were acknowledged "
        "by broker 1 in epoch 0 at 6.5 s, after the controller had replaced it and before it "
        "learned of epoch 1 (a deposed leader: a broker learns of a new epoch only from the "
        "metadata log); at 6.0 s, during #1 pause broker-1 (leader of t-0), the controller "
        "fenced broker 1 and elected broker 2 from the ISR {2, 3}, whose log ended at 10, "
        "and broker 1 truncated them on becoming its follower (OffsetForLeaderEpoch, "
        "KIP-101).")
    before = by_mechanism["acks1_before_replication"]
    assert (before["first_offset"], before["last_offset"], before["holder"],
            before["dropper"], before["removals"]) == (10, 11, 1, 2, [1])


def leader_killed_twice(h: HistoryBuilder, *, end: int) -> None:
    """Broker 1, leader of epoch 0, is killed at 5.5 s; broker 2, elected at 6.0 s with its log
    ending at 10, is killed in turn, and broker 3 elected at 8.5 s with its log ending at
    `end` (epoch 2)."""
    h.fault("kill", "broker-1", "inject", t=5.5, role="leader of t-0")
    h.event("broker_fenced", t=6.0, node=C, topic=None, partition=None, broker=1,
            broker_epoch=3, reason="session_expired")
    elected(h, t=6.0, epoch=1, leader=2, previous=1, kind="clean",
            reason="leader_fenced", isr=[2, 3], end=10)
    h.fault("kill", "broker-2", "inject", t=7.5, role="leader of t-0")
    h.event("broker_fenced", t=8.5, node=C, topic=None, partition=None, broker=2,
            broker_epoch=4, reason="session_expired")
    elected(h, t=8.5, epoch=2, leader=3, previous=2, kind="clean",
            reason="leader_fenced", isr=[3], end=end)


def returns_and_truncates(h: HistoryBuilder, broker: int, *, t: float, epoch: int,
                          leader: int, from_offset: int, to_offset: int) -> None:
    """`broker` restarts at `t` (its log loaded), follows `leader` in `epoch` and truncates."""
    h.event("log_recovery", t=t, node=f"broker-{broker}", broker=broker,
            log_end_offset=from_offset)
    h.event("become_follower", t=t + 0.1, node=f"broker-{broker}", broker=broker,
            leader_epoch=epoch, leader=leader, log_end_offset=from_offset,
            high_watermark=to_offset)
    h.event("truncation", t=t + 0.2, node=f"broker-{broker}", broker=broker,
            leader_epoch=epoch, from_offset=from_offset, to_offset=to_offset,
            reason="offset_for_leader_epoch")


def test_a_leader_back_after_the_next_election_cut_its_own_records(spark, tmp_path):
    """The common timing of a leader kill: broker 1 acknowledges p1-10..12 (acks=1) and is
    killed; broker 2, elected with its log ending at 10, acknowledges p2-10..14 at the same
    offsets, and is killed in turn before broker 1 is back; broker 3 (epoch 2) has all of
    broker 2's records. Broker 1 returns as broker 3's follower, and its truncation names
    epoch 2: it cut its own epoch-0 records, never broker 2's, which it never had (it missed
    epoch 1) and which are still at those offsets."""
    h = base(acks="1")
    acked_on_broker_1(h, range(10, 13))
    leader_killed_twice(h, end=15)
    new_records(h, range(10, 15), t=7.0)
    returns_and_truncates(h, 1, t=10.5, epoch=2, leader=3, from_offset=13, to_offset=10)
    report = analyse(h, tmp_path)
    assert report["counts"]["lost"] == 3
    incident = only_incident(report)
    assert (incident["mechanism"], incident["holder"], incident["dropper"],
            incident["removals"]) == ("acks1_before_replication", 1, 2, [1])
    (cut,) = report["explained"]["truncations"]
    assert (cut["broker"], cut["acked"], cut["lost"], cut["lost_before"], cut["kept"]) == (
        1, 3, 3, 0, 0)
    assert report["explained"]["truncations_lost"] == report["counts"]["lost"]
    assert cut["sentence"] == (
        "at 10.7 s broker 1 truncated t-0 from 13 to 10 to the end of the leader's epoch "
        "(OffsetForLeaderEpoch): it cut 3 records, 3 of them acknowledged: 3 lost for good "
        "(no replica kept them).")
    html = (tmp_path / "out" / "report.html").read_text()
    assert escape(cut["sentence"]) in html and "none of them acknowledged" not in html


def test_each_returning_leader_cut_the_records_of_its_own_epoch(spark, tmp_path):
    """As above, but broker 3 (epoch 2) had none of broker 2's records either: p1-10..12
    (epoch 0) and p2-10..12 (epoch 1) are all lost. Broker 1, back first, cut only its own
    three, though broker 2's were acknowledged later at the same offsets (and it was not
    there to be a deposed leader: it had restarted); broker 2, back next, cut its three."""
    h = base(acks="1")
    acked_on_broker_1(h, range(10, 13))
    leader_killed_twice(h, end=10)
    for i in range(10, 13):
        h.send(f"p2-{i}", t=7.0, offset=i)
    for i in range(10, 15):
        h.record(f"p3-{i}", 0, i, t=9.5)
    returns_and_truncates(h, 1, t=10.5, epoch=2, leader=3, from_offset=13, to_offset=10)
    returns_and_truncates(h, 2, t=11.5, epoch=2, leader=3, from_offset=13, to_offset=10)
    report = analyse(h, tmp_path)
    assert report["counts"]["lost"] == 6 and report["explained"]["unexplained"] == 0
    assert sorted((i["holder"], i["holder_epoch"], i["lost"])
                  for i in report["explained"]["incidents"]) == [(1, 0, 3), (2, 1, 3)]
    assert [(c["broker"], c["acked"], c["lost"], c["lost_before"], c["kept"])
            for c in report["explained"]["truncations"]] == [(1, 3, 3, 0, 0), (2, 3, 3, 0, 0)]
    assert report["explained"]["truncations_lost"] == report["counts"]["lost"]


def test_unclean_election(spark, tmp_path):
    h = base()
    acked_on_broker_1(h, range(10, 13))
    h.event("leader_election", t=6.0, node=C, leader_epoch=1, leader=-1, previous_leader=1,
            kind="offline", reason="leader_fenced", isr=[1])
    elected(h, t=8.0, epoch=2, leader=3, previous=-1, kind="unclean",
            reason="broker_unfenced", isr=[1], end=10)
    h.event("truncation", t=12.0, node="broker-1", broker=1, leader_epoch=2, from_offset=13,
            to_offset=10, reason="offset_for_leader_epoch")
    h.fault("kill", "broker-1", "inject", t=5.5, role="leader of t-0")
    h.fault("kill", "broker-1", "recover", t=11.0)
    incident = only_incident(analyse(h, tmp_path))
    assert incident["mechanism"] == "unclean_election"
    assert incident["sentence"] == (
        "records at offsets 10-12 of t-0 (3 acknowledged records lost) were acknowledged "
        "by broker 1 in epoch 0; at 8.0 s, during #1 kill broker-1 (leader of t-0), the "
        "controller elected broker 3 although it was not in the ISR {1} (an unclean "
        "election), whose log ended at 10, and broker 1 truncated them on becoming its "
        "follower (OffsetForLeaderEpoch, KIP-101).")


def test_power_loss_of_every_replica(spark, tmp_path):
    h = base()
    acked_on_broker_1(h, range(10, 13))
    for b in (1, 2, 3):
        h.event("power_loss", t=6.0, node=f"broker-{b}", broker=b, leader_epoch=0,
                log_end_offset=13)
        h.event("log_recovery", t=8.0, node=f"broker-{b}", broker=b, log_end_offset=10)
        h.event("truncation", t=8.0, node=f"broker-{b}", broker=b, leader_epoch=0,
                from_offset=13, to_offset=10, reason="log_recovery")
    elected(h, t=9.0, epoch=1, leader=2, previous=-1, kind="clean",
            reason="broker_unfenced", isr=[1, 2, 3], end=10)
    report = analyse(h, tmp_path)
    incident = only_incident(report)
    assert (incident["mechanism"], incident["removals"]) == ("power_loss", [])
    assert incident["sentence"] == (
        "records at offsets 10-12 of t-0 (3 acknowledged records lost) were acknowledged "
        "by broker 1 in epoch 0; broker 2 lost them to a power loss (its log came back ending "
        "at 10 instead of 13: they were never fsynced); at 9.0 s the controller elected broker 2 "
        "from the ISR {1, 2, 3} as it returned, whose log ended at 10.")
    # Each replica cut the same 3 records: lost once, at the first truncation listed.
    assert [(c["broker"], c["acked"], c["lost"], c["lost_before"])
            for c in report["explained"]["truncations"]] == [
        (1, 3, 3, 0), (2, 3, 0, 3), (3, 3, 0, 3)]
    assert report["explained"]["truncations_lost"] == 3


def test_truncation_to_the_high_watermark_before_kip_101(spark, tmp_path):
    h = base()
    acked_on_broker_1(h, range(10, 13))
    elected(h, t=6.0, epoch=1, leader=2, previous=1, kind="clean",
            reason="leader_fenced", isr=[1, 2, 3], end=13)
    h.event("truncation", t=6.2, node="broker-3", broker=3, leader_epoch=1, from_offset=13,
            to_offset=10, reason="high_watermark")
    elected(h, t=7.0, epoch=2, leader=3, previous=2, kind="clean",
            reason="leader_fenced", isr=[2, 3], end=10)
    for b in (1, 2):
        h.event("truncation", t=12.0 + b, node=f"broker-{b}", broker=b, leader_epoch=2,
                from_offset=13, to_offset=10, reason="high_watermark")
    incident = only_incident(analyse(h, tmp_path))
    assert (incident["mechanism"], incident["dropper"], incident["removals"]) == (
        "high_watermark_truncation", 3, [1, 2])
    assert incident["sentence"] == (
        "records at offsets 10-12 of t-0 (3 acknowledged records lost) were acknowledged "
        "by broker 1 in epoch 0; at 6.2 s broker 3 truncated its log to its high watermark, 10, on "
        "becoming a follower (the pre-KIP-101 rule), below records every ISR member had; at "
        "7.0 s the controller fenced broker 2 and elected broker 3 from the ISR {2, 3}, whose "
        "log ended at 10, and brokers 1 and 2 truncated them to their high watermark on "
        "becoming its follower (pre-KIP-101).")


def test_log_lost_with_its_disk(spark, tmp_path):
    h = base(healthy=0)
    acked_on_broker_1(h, range(0, 5), t=2.0)
    h.event("log_recovery", t=9.0, node="broker-2", broker=2, log_end_offset=0)
    elected(h, t=9.5, epoch=1, leader=2, previous=-1, kind="clean",
            reason="broker_unfenced", isr=[2], end=0)
    h.event("truncation", t=11.0, node="broker-1", broker=1, leader_epoch=1, from_offset=5,
            to_offset=0, reason="offset_for_leader_epoch")
    incident = only_incident(analyse(h, tmp_path))
    assert (incident["mechanism"], incident["first_offset"], incident["last_offset"]) == (
        "disk_lost", 0, 4)
    assert "broker 2, an ISR member that had them, came back from a restart without them (its " \
        "disk was lost)" in incident["sentence"]


def test_a_loss_no_event_explains_is_unexplained_and_said_first(spark, tmp_path):
    h = base()
    acked_on_broker_1(h, range(10, 13))
    report = analyse(h, tmp_path)
    incident = only_incident(report)
    assert incident["mechanism"] == "unexplained"
    assert report["explained"]["unexplained"] == 3
    assert incident["sentence"].startswith(
        "UNEXPLAINED: records at offsets 10-12 of t-0 (3 acknowledged records lost) were "
        "acknowledged by broker 1 in epoch 0, and no election or truncation")


def test_an_unexplained_loss_past_an_incomplete_drain_says_the_drain_stopped(spark, tmp_path):
    """The cluster did not heal: the drain read p0 only to offset 10, so records at 10-12
    that no event removed may still be on a broker, and the report says so."""
    h = base()
    acked_on_broker_1(h, range(10, 13))
    h.drain = {"0": {"end": 13, "read_to": 10}}
    report = analyse(h, tmp_path)
    assert report["drain_short"] == [{"topic": "t", "partition": 0, "end": 13, "read_to": 10}]
    incident = only_incident(report)
    assert incident["mechanism"] == "unexplained"
    assert incident["sentence"].endswith(
        "and no election or truncation in events.jsonl removed them; the drain did not read "
        "them (t-0: read to offset 10 of 13): the cluster did not heal, and they may still be "
        "on a broker.")
    html = (tmp_path / "out" / "report.html").read_text()
    assert 'id="drain-short"' in html and "t-0: read to offset 10 of 13" in html


def test_phantom_read_dropped_by_an_unclean_election(spark, tmp_path):
    h = base()
    h.send("p1-10", "fail", t=5.0, error="NOT_ENOUGH_REPLICAS_AFTER_APPEND")
    h.read("p1-10", 0, 10, phase="run", t=5.5)
    elected(h, t=8.0, epoch=1, leader=2, previous=-1, kind="unclean",
            reason="broker_unfenced", isr=[1], end=10)
    incident = only_incident(analyse(h, tmp_path))
    assert (incident["mechanism"], incident["phantom_read"], incident["lost"]) == (
        "unclean_election", 1, 0)
    assert incident["sentence"].startswith(
        "records at offset 10 of t-0 (1 unacknowledged record read by a consumer, then gone) "
        "were read from broker 1 in epoch 0; "
        "at 8.0 s the controller elected broker 2 although it was not in the ISR {1}")


def test_a_clean_run_lists_its_truncations_and_what_they_cut(spark, tmp_path):
    h = base()
    h.expect = "clean"
    elected(h, t=6.0, epoch=1, leader=2, previous=1, kind="clean",
            reason="leader_fenced", isr=[1, 2, 3], end=10)
    new_records(h, range(10, 12), t=7.0)
    # Broker 1 had two unacknowledged records at 10-11 when it was fenced.
    h.event("truncation", t=9.0, node="broker-1", broker=1, leader_epoch=1, from_offset=12,
            to_offset=10, reason="offset_for_leader_epoch")
    report = analyse(h, tmp_path)
    assert report["verdict"] == "clean"
    assert report["explained"]["incidents"] == []
    (cut,) = report["explained"]["truncations"]
    assert (cut["acked"], cut["lost"]) == (0, 0)
    assert cut["sentence"].endswith(
        "it cut 2 records, none of them acknowledged (whatever was acknowledged at those "
        "offsets was written there by a later leader and is still there).")


@pytest.mark.parametrize("with_events", [False, True])
def test_a_history_without_events_analyses_as_before(spark, tmp_path, with_events):
    h = base()
    acked_on_broker_1(h, range(10, 13))
    if not with_events:
        h.events = None
    report = analyse(h, tmp_path)
    assert report["counts"]["lost"] == 3 and report["verdict"] == "loss"
    assert report["explained"]["events"] is with_events
    assert len(report["explained"]["incidents"]) == (1 if with_events else 0)


def duplicated(h: HistoryBuilder, value: str, offsets: tuple[int, int], *, t: float,
               latency: float) -> None:
    """`value` sent at `t`, acknowledged `latency` later at the first offset, and drained at
    both: a retry written twice."""
    h.send(value, t=t, offset=offsets[0], latency=latency)
    for offset in offsets:
        h.read(value, 0, offset)


def test_duplicates_retried_across_a_leader_change(spark, tmp_path):
    h = base()
    h.expect = "clean"
    duplicated(h, "p1-10", (10, 11), t=5.0, latency=3.0)
    duplicated(h, "p1-11", (12, 13), t=5.2, latency=3.0)
    elected(h, t=6.0, epoch=1, leader=2, previous=1, kind="clean", reason="leader_fenced",
            isr=[1, 2, 3], end=10)
    report = analyse(h, tmp_path)
    assert report["verdict"] == "clean" and report["counts"]["duplicates"] == 2
    (group,) = report["explained"]["duplicates"]
    assert (group["mechanism"], group["duplicates"], group["holder"], group["new_leader"],
            group["new_epoch"]) == ("retry_across_election", 2, 1, 2, 1)
    assert group["sentence"] == (
        "2 records of t-0 acknowledged at offsets 10-12 were written twice: their sends began "
        "while broker 1 led epoch 0, broker 2 became leader in epoch 1 at 6.1 s before the "
        "acknowledgement, and the producer retried them there; the first attempt had been "
        "written and kept, its answer never came, and without enable.idempotence the broker "
        "cannot tell a retry from a new record (KIP-98).")
    assert report["explained"]["unexplained"] == 0


def test_a_duplicate_without_a_leader_change_is_a_retry_after_a_timeout(spark, tmp_path):
    h = base()
    h.expect = "clean"
    duplicated(h, "p1-10", (10, 11), t=5.0, latency=6.0)
    (group,) = analyse(h, tmp_path)["explained"]["duplicates"]
    assert group["mechanism"] == "retry_after_timeout"
    assert group["sentence"] == (
        "1 record of t-0 acknowledged at offset 10 was written twice while broker 1 led "
        "epoch 0: the producer retried a request whose answer came too late "
        "(request.timeout.ms), and without enable.idempotence the broker cannot tell a retry "
        "from a new record (KIP-98).")


def test_a_duplicate_of_an_idempotent_producer_is_unexplained(spark, tmp_path):
    h = base()
    h.idempotent = True
    duplicated(h, "p1-10", (10, 11), t=5.0, latency=6.0)
    report = analyse(h, tmp_path)
    (group,) = report["explained"]["duplicates"]
    assert group["mechanism"] == "unexplained" and report["explained"]["unexplained"] == 1
    assert group["sentence"].startswith(
        "UNEXPLAINED: 1 record of t-0 acknowledged at offset 10 was written twice although "
        "the producer was idempotent (KIP-98)")


# ---- KIP-966: elections from the eligible leader replicas and of the last known leader ----


def lost_on_broker_1(h: HistoryBuilder, partition: int, offsets: range, *, t: float) -> None:
    """Records of t-`partition` acknowledged by broker 1, leader since 0.1 s in epoch 0,
    that no replica kept."""
    h.event("become_leader", t=0.1, node="broker-1", partition=partition, broker=1,
            leader_epoch=0, log_end_offset=0, high_watermark=0, isr=[1, 2, 3])
    for i in offsets:
        h.send(f"p{3 + partition}-{i}", t=t, partition=partition, offset=i)


def test_elections_from_the_elr_and_of_the_last_known_leader(spark, tmp_path):
    """t-0: ELR member 2 lost its unflushed tail to a power loss, then was elected from the
    ELR (a power loss still). t-1: broker 3, elected as the last known leader, never had the
    records (an unclean election, as Kafka counts it). t-2: broker 1, the last known leader,
    came back without its disk (its disk lost, though Kafka counts the election unclean)."""
    h = base()
    acked_on_broker_1(h, range(10, 13))
    h.event("isr_change", t=5.5, node="broker-1", broker=1, leader_epoch=0, isr=[1],
            old_isr=[1, 2], reason="lag")
    h.event("elr_change", t=5.9, node=C, leader_epoch=0, broker=2, elr=[2], old_elr=[],
            last_known_elr=[], reason="isr_below_min", detail="2 left an ISR below min")
    h.event("power_loss", t=6.0, node="broker-2", broker=2, leader_epoch=0, log_end_offset=13)
    h.event("log_recovery", t=8.0, node="broker-2", broker=2, log_end_offset=10)
    h.event("truncation", t=8.0, node="broker-2", broker=2, leader_epoch=0, from_offset=13,
            to_offset=10, reason="log_recovery")
    elected(h, t=9.0, epoch=1, leader=2, previous=-1, kind="elr", reason="broker_unfenced",
            isr=[], end=10)
    h.event("elr_change", t=9.0, node=C, leader_epoch=1, broker=2, elr=[], old_elr=[2],
            last_known_elr=[], reason="elected")
    h.event("truncation", t=12.0, node="broker-1", broker=1, leader_epoch=1, from_offset=13,
            to_offset=10, reason="offset_for_leader_epoch")
    h.sample(t=8.5, partition=0, leader=-1, isr=[], elr=[2])

    lost_on_broker_1(h, 1, range(0, 3), t=5.0)
    h.event("leader_election", t=8.0, node=C, partition=1, leader_epoch=1, leader=3,
            previous_leader=-1, kind="last_known_leader", reason="broker_unfenced", isr=[])
    h.event("become_leader", t=8.1, node="broker-3", partition=1, broker=3, leader_epoch=1,
            log_end_offset=0, high_watermark=0, isr=[3])
    # KIP-704: RECOVERING from the election until broker 3's first ISR change (a RECOVERED of
    # epoch 0 is another election's, and does not count).
    for t, state, epoch in ((8.0, "RECOVERING", 1), (4.0, "RECOVERED", 0),
                            (12.5, "RECOVERED", 1)):
        h.event("leader_recovery", t=t, node=C, partition=1, broker=3, leader=3,
                leader_epoch=epoch, leader_recovery_state=state)
    h.event("truncation", t=12.0, node="broker-1", partition=1, broker=1, leader_epoch=1,
            from_offset=3, to_offset=0, reason="offset_for_leader_epoch")

    lost_on_broker_1(h, 2, range(0, 5), t=2.0)
    h.event("log_recovery", t=9.0, node="broker-1", partition=2, broker=1, log_end_offset=0)
    h.event("leader_election", t=9.5, node=C, partition=2, leader_epoch=1, leader=1,
            previous_leader=-1, kind="last_known_leader", reason="broker_unfenced", isr=[])
    h.event("become_leader", t=9.6, node="broker-1", partition=2, broker=1, leader_epoch=1,
            log_end_offset=0, high_watermark=0, isr=[1])
    h.event("leader_recovery", t=9.5, node=C, partition=2, broker=1, leader=1, leader_epoch=1,
            leader_recovery_state="RECOVERING")

    report = analyse(h, tmp_path)
    assert report["malformed"]["skipped"] == 0 and report["counts"]["lost"] == 11
    by_partition = {i["partition"]: i for i in report["explained"]["incidents"]}
    assert {p: (i["mechanism"], i["election"]["kind"], i["lost"])
            for p, i in by_partition.items()} == {
        0: ("power_loss", "elr", 3), 1: ("unclean_election", "last_known_leader", 3),
        2: ("disk_lost", "last_known_leader", 5)}
    assert by_partition[0]["sentence"] == (
        "records at offsets 10-12 of t-0 (3 acknowledged records lost) were acknowledged "
        "by broker 1 in epoch 0; broker 2 lost them to a power loss (its log came back ending "
        "at 10 instead of 13: they were never fsynced); at 9.0 s the controller elected "
        "broker 2 from the eligible leader replicas (KIP-966) with an empty ISR as it "
        "returned, whose log ended at 10, and broker 1 truncated them on becoming its "
        "follower (OffsetForLeaderEpoch, KIP-101).")
    assert by_partition[1]["sentence"] == (
        "records at offsets 0-2 of t-1 (3 acknowledged records lost) were acknowledged by "
        "broker 1 in epoch 0; broker 3 never had them; at 8.0 s the controller elected "
        "broker 3 as the partition's last known leader once unfenced, with the ISR and the "
        "ELR empty (KIP-966, Kafka 4.1+), whose log ended at 0 (RECOVERING, KIP-704, until "
        "12.5 s, when its ISR first grew), and broker 1 truncated them on becoming its "
        "follower (OffsetForLeaderEpoch, KIP-101).")
    assert by_partition[2]["sentence"] == (
        "records at offsets 0-4 of t-2 (5 acknowledged records lost) were acknowledged by "
        "broker 1 in epoch 0; broker 1, an ISR member that had them, came back from a restart "
        "without them (its disk was lost); at 9.5 s the controller elected broker 1 as the "
        "partition's last known leader once unfenced, with the ISR and the ELR empty "
        "(KIP-966, Kafka 4.1+), whose log ended at 0 (RECOVERING, KIP-704, to the end of the "
        "run: its ISR never grew).")
    page = (tmp_path / "out" / "report.html").read_text()
    assert escape(by_partition[1]["sentence"]) in page


def incident(election: dict) -> dict:
    """An acks=1 incident of t-0 dropped by broker 2's election at 6.0 s."""
    return {"topic": "t", "partition": 0, "first_offset": 10, "last_offset": 12, "lost": 3,
            "misplaced": 0, "phantom_read": 0, "phantom_only": 0, "holder": 1,
            "holder_epoch": 0, "mechanism": "acks1_before_replication", "cause": None,
            "dropper": 2, "drop_t": 1006.1, "drop_epoch": 1, "dropper_end": 10,
            "removals": [], "fault": None, "election": {"t": 1006.0, **election}}


@pytest.mark.parametrize(("election", "words"), [
    ({"kind": "elr", "reason": "leader_fenced", "previous_leader": 1, "isr": []},
     "the controller fenced broker 1 and elected broker 2 from the eligible leader replicas "
     "(KIP-966) with an empty ISR"),
    ({"kind": "elr", "reason": "unclean_shutdown", "previous_leader": 1, "isr": []},
     "the controller removed broker 1, registered again after an unclean shutdown, from the "
     "ISR and the ELR and elected broker 2 from the eligible leader replicas (KIP-966) with "
     "an empty ISR"),
    ({"kind": "elr", "reason": "broker_unfenced", "previous_leader": -1, "isr": []},
     "the controller elected broker 2 from the eligible leader replicas (KIP-966) with an "
     "empty ISR as it returned"),
    ({"kind": "last_known_leader", "reason": "broker_unfenced", "previous_leader": -1,
      "isr": []},
     "the controller elected broker 2 as the partition's last known leader once unfenced, "
     "with the ISR and the ELR empty (KIP-966, Kafka 4.1+)"),
    ({"kind": "clean", "reason": "unclean_shutdown", "previous_leader": 1, "isr": [2, 3]},
     "the controller removed broker 1, registered again after an unclean shutdown, from the "
     "ISR and elected broker 2 from the ISR {2, 3}"),
])
def test_the_sentence_names_how_the_controller_chose_the_leader(election, words):
    assert incident_sentence(incident(election), 1000.0) == (
        "records at offsets 10-12 of t-0 (3 acknowledged records lost) were acknowledged by "
        "broker 1 in epoch 0 with acks=1, before broker 2 had fetched them; at 6.0 s "
        f"{words}, whose log ended at 10.")
