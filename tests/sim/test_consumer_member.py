"""The simulated consumer protocol member (KIP-848, librdkafka's model) against the broker's
own consumer group coordinator. The expected behaviour is librdkafka's and Kafka's, read in
their code: the coordinator assigns and each member reconciles at its member epoch
(``rd_kafka_cgrp_consumer_handle_next_assignment``), a member that leaves moves only its own
partitions (incremental, no global barrier), a member cut off keeps its partitions (no
client-side session under this protocol) until an answer fences it, and its commits are
refused once the coordinator expired it (``ConsumerGroup.validateOffsetCommit``)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from library_sims import library_history, shared_root
from test_group_member import World, world

from minibroker.config import ConfigError, check_consumer_group_timeouts
from undertow.platform.base import Link, client_endpoint


def reconciled(w: World) -> bool:
    """Every member in the coordinator's group at the group's assignment epoch, holding
    what the coordinator assigned it, the three partitions shared."""
    try:
        group = w.group_state()
    except (KeyError, ValueError, AssertionError):
        return False
    ids = sorted(m.member_id or "" for m in w.members)
    if group["state"] != "Stable" or sorted(group["members"]) != ids:
        return False
    for m in w.members:
        assigned = sorted(p for ps in group["assignments"][m.member_id].values() for p in ps)
        if m.generation != group["member_epochs"][m.member_id] or m.assignment != assigned:
            return False
    return sorted(p for m in w.members for p in m.assignment) == [0, 1, 2]


def test_members_join_reconcile_and_read_at_their_member_epoch(tmp_path: Path) -> None:
    with world(tmp_path, protocol="consumer") as w:
        w.wait(lambda: reconciled(w), 15, "a reconciled group")
        group = w.group_state()
        assert group["type"] == "consumer"
        assert all(len(m.assignment) == 1 for m in w.members)
        ids = {m.member_id for m in w.members}
        assert len(ids) == 3 and all(len(i or "") == 22 for i in ids)  # their own ids, base64
        w.run_for(4)
        epochs = {m.name: m.generation for m in w.members}
        for r in w.lines.reads:  # the reads carry the member epoch
            assert r["generation"] is not None and r["generation"] <= epochs[r["consumer"]]
        assert len({(r["partition"], r["offset"]) for r in w.lines.reads}) == len(w.lines.reads)
        committed = w.committed()
        for p in range(3):
            ok = [c["offset"] for c in w.lines.of("commit", status="ok", partition=p)]
            assert ok and committed[p] == max(ok)


def test_a_member_leaving_moves_only_its_own_partitions(tmp_path: Path) -> None:
    """No global barrier: the members that stay keep reading what they hold while the
    leaver's partition is added to one of them (the classic eager protocol revokes all)."""
    with world(tmp_path, protocol="consumer") as w:
        w.wait(lambda: reconciled(w), 15, "a reconciled group")
        w.run_for(2)
        leaver, stayers = w.members[0], w.members[1:]
        held = {m.name: list(m.assignment) for m in stayers}
        lines_before = len(w.lines.groups)
        w.among(leaver, leaver.stop)
        w.wait(lambda: leaver.closed, 10, "the member to leave")
        w.wait(lambda: sorted(p for m in stayers for p in m.assignment) == [0, 1, 2]
               and len(w.group_state()["members"]) == 2, 10, "the others to take over")
        changes = [g for g in w.lines.groups[lines_before:] if g["type"] in ("assign", "revoke")]
        assert {g["member"] for g in changes if g["type"] == "revoke"} == {leaver.name}, changes
        assert [g["partition"] for g in changes if g["type"] == "assign"] == leaver_partitions(
            changes, leaver.name)
        for m in stayers:
            assert set(held[m.name]) < set(m.assignment) or held[m.name] == m.assignment
            first = min(g["t"] for g in changes)  # each read on through the handover
            assert any(r["consumer"] == m.name and r["partition"] in held[m.name]
                       and first - 1 < r["t"] < first for r in w.lines.reads)


def leaver_partitions(changes: list[dict[str, object]], leaver: str) -> list[object]:
    return [g["partition"] for g in changes if g["type"] == "revoke" and g["member"] == leaver]


def test_a_member_cut_off_keeps_its_partitions_until_fenced(tmp_path: Path) -> None:
    """librdkafka keeps no session under this protocol: the cut-off member holds its
    partition while the coordinator, after group.consumer.session.timeout.ms (6 s), gives it
    to another member; once healed, its first heartbeat is answered UNKNOWN_MEMBER_ID, it
    loses the partition (no commit) and joins again with the same member id."""
    with world(tmp_path, protocol="consumer", isolated=("c1",)) as w:
        w.wait(lambda: reconciled(w), 15, "a reconciled group")
        w.run_for(2)
        cut = w.members[1]
        [held] = cut.assignment
        member_id = cut.member_id
        endpoint = client_endpoint("c1")
        w.platform.block([link for b in w.platform.brokers
                          for link in (Link(endpoint, b), Link(b, endpoint))], "test")
        w.run_for(10)
        group = w.group_state()
        assert member_id not in group["members"] and len(group["members"]) == 2
        others = sorted(p for m in w.members if m is not cut for p in m.assignment)
        assert others == [0, 1, 2]
        assert cut.assignment == [held]  # still its own, as librdkafka sees it
        assert not w.lines.of("revoke", member="c1")
        healed_at = w.side.now()
        w.platform.unblock("test")
        w.wait(lambda: reconciled(w), 15, "the cut-off member back in the group")
        assert cut.member_id == member_id  # KIP-1082: the member keeps its own id
        [lost] = w.lines.of("revoke", member="c1")
        assert lost["partition"] == held and lost["t"] >= healed_at
        after = [c for c in w.lines.of("commit", member="c1") if c["t"] >= healed_at
                 and c["t"] <= lost["t"]]
        assert all(c["status"] != "ok" for c in after), after  # refused: not a member


def test_the_coordinator_config_bounds_the_session_and_heartbeat_as_kafka() -> None:
    """GroupCoordinatorConfig's rules: a 6 s session needs the minimum lowered too."""
    check_consumer_group_timeouts({})
    for config, message in (
            ({"group.consumer.session.timeout.ms": "6000"},
             "group.consumer.session.timeout.ms must be greater than or equal to "
             "group.consumer.min.session.timeout.ms"),
            ({"group.consumer.heartbeat.interval.ms": "20000"},
             "group.consumer.heartbeat.interval.ms must be less than or equal to "
             "group.consumer.max.heartbeat.interval.ms"),
            ({"group.consumer.min.session.timeout.ms": "5000",
              "group.consumer.session.timeout.ms": "5000"},
             "group.consumer.heartbeat.interval.ms must be less than "
             "group.consumer.session.timeout.ms")):
        try:
            check_consumer_group_timeouts(config)
        except ConfigError as exc:
            assert str(exc) == message
        else:
            raise AssertionError(f"{config} accepted")


def test_a_partition_follows_its_new_leader_at_the_first_metadata_naming_it(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """librdkafka moves a partition to its new leader's broker as soon as metadata names it
    (``rd_kafka_toppar_broker_update``) and asks for metadata when a broker goes down, so a
    member reads on a partition whose leader was killed within the failover (the 3 s broker
    session, then a metadata answer), not at the dead leader's reconnect backoff (which
    doubles to 10 s). In group-coordinator-kill-kip848 (seed 1), no acknowledged record waits
    more than 4 s with no member reading its partition; waiting for the backoff, two waited
    4.9 s and 10.1 s."""
    history = library_history(shared_root(tmp_path_factory), "group-coordinator-kill-kip848")
    waits = unconsumed(history)
    assert waits and max(waits) < 4.0, waits


def unconsumed(history: Path) -> list[float]:
    """The seconds each record waited, acknowledged, with no member reading its partition,
    where 1 s or more: the gaps between first reads of records, from the later of the
    previous read and the next record's acknowledgement (consumption.py's measure, computed
    here from the files alone)."""
    acked: dict[tuple[int, int], float] = {}
    for s in lines(history / "sends.jsonl"):
        if s["status"] == "ok" and s["offset"] is not None:
            key = (s["partition"], s["offset"])
            acked[key] = min(acked.get(key, s["t_complete"]), s["t_complete"])
    first: dict[tuple[int, int, str], float] = {}
    for r in lines(history / "reads.jsonl"):
        if r["phase"] == "run" and r["generation"] is not None:
            key = (r["partition"], r["offset"], r["value"])
            first[key] = min(first.get(key, r["t"]), r["t"])
    waits = []
    for p in sorted({p for p, _, _ in first}):
        reads = sorted((t, o) for (q, o, _), t in first.items() if q == p)
        for (a, _), (b, offset) in itertools.pairwise(reads):
            start = max(a, acked.get((p, offset), a))
            if b - start >= 1.0:
                waits.append(round(b - start, 2))
    return waits


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
