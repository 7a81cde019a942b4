"""The simulated consumer-group member against the broker's own group coordinator: members
join and split the partitions, their commits land in the coordinator, a coordinator kill
in a rebalance makes them find the new one and rejoin, a member cut off from the brokers
loses its partitions to the others and rejoins once healed. Assertions are on the
coordinator's state and on the history lines the members write."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from minibroker.cluster.types import TopicPartition
from minibroker.coordinator.group_coordinator import GroupCoordinator
from undertow.platform.base import Link, broker_id_of, broker_node, client_endpoint
from undertow.platform.simulated import SimulatedPlatform
from undertow.runner.abort import Abort
from undertow.runner.group_member import POLL_S, GroupSettings
from undertow.runner.run import partitions_healthy
from undertow.runner.workload import WorkloadConfig
from undertow.sim.clients import SimProducer
from undertow.sim.consumer_member import SimConsumerMember
from undertow.sim.group_member import (
    SPARSE_CONNECT_INTERVAL_MS,
    SimGroupMember,
    range_assignment,
)
from undertow.sim.simulated_world import SimulatedWorld
from undertow.spec.experiment import TopicSpec

TOPIC, GROUP = "t", "g"
CONFIG = {"min.insync.replicas": "2", "replica.lag.time.max.ms": "6000",
          "broker.session.timeout.ms": "3000", "offsets.topic.num.partitions": "3"}


CONSUMER_PROTOCOL_CONFIG = {**CONFIG, "group.consumer.session.timeout.ms": "6000",
                            "group.consumer.min.session.timeout.ms": "6000",
                            "group.consumer.heartbeat.interval.ms": "1000",
                            "group.consumer.min.heartbeat.interval.ms": "1000"}
"""The classic members' session and heartbeat, set on the coordinator (KIP-848)."""


def settings(commit: str = "auto", isolation_level: str = "read_uncommitted",
             protocol: str = "classic") -> GroupSettings:
    return GroupSettings(group_id=GROUP, commit=commit, commit_interval_ms=1000,
                         isolation_level=isolation_level, static_membership=False,
                         session_timeout_ms=6000, group_protocol=protocol)


class Lines:
    """What the members write to the history: groups.jsonl's and reads.jsonl's lines."""

    def __init__(self) -> None:
        self.groups: list[dict[str, Any]] = []
        self.reads: list[dict[str, Any]] = []

    def group(self, **line: Any) -> None:
        self.groups.append(line)

    def read(self, **line: Any) -> None:
        self.reads.append(line)

    def of(self, type_: str, **where: Any) -> list[dict[str, Any]]:
        return [g for g in self.groups if g["type"] == type_
                and all(g.get(k) == v for k, v in where.items())]


class World:
    def __init__(self, platform: SimulatedPlatform, side: SimulatedWorld,
                 members: list[SimGroupMember], lines: Lines, producer: SimProducer) -> None:
        self.platform, self.side, self.loop = platform, side, platform.loop
        self.members, self.lines, self.producer = members, lines, producer

    def run_for(self, seconds: float) -> None:
        until = self.loop.time() + seconds
        self.loop.wait_until(lambda: self.loop.time() >= until, seconds + 1, "time to pass")

    def among(self, member: SimGroupMember, action: Callable[[], None]) -> None:
        """Run ``action`` as ``member``'s code, on its host (it runs with the loop)."""
        self.side.among(member.name, action)

    def wait(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        self.loop.wait_until(condition, timeout_s, what)

    def coordinator_node(self) -> str:
        return broker_node(self.platform.cluster_view().group_partition(GROUP).leader)

    def coordinator(self) -> GroupCoordinator:
        return self.platform.cluster.brokers[
            broker_id_of(self.coordinator_node())].group_coordinator

    def group_state(self) -> dict[str, Any]:
        [group] = [g for g in self.coordinator().state()["groups"] if g["group"] == GROUP]
        return group

    def committed(self) -> dict[int, int]:
        """The coordinator's committed offsets of the group (OffsetFetch)."""
        _error, offsets = self.coordinator().handle_fetch_offsets(
            GROUP, False, [TopicPartition(TOPIC, p) for p in range(3)])
        return {tp.partition: o.offset for tp, o in offsets.items()}

    def stable(self) -> bool:
        try:
            group = self.group_state()
        except (KeyError, ValueError, AssertionError):
            return False
        ids = sorted(m.member_id or "" for m in self.members)
        return group["state"] == "Stable" and sorted(group["members"]) == ids and all(
            m.generation == group["generation"] and m.assignment for m in self.members)


@contextmanager
def world(tmp_path: Path, members: int = 3, *, commit: str = "auto",
          isolated: tuple[str, ...] = (), protocol: str = "classic") -> Iterator[World]:
    """Three brokers, topic ``t`` (3 partitions, RF 3), one producer at 100 records/s and
    ``members`` members of group ``g`` speaking ``protocol``, started, each client with
    connections of its own to the brokers' listeners; ``isolated`` members on hosts of their
    own."""
    member = SimConsumerMember if protocol == "consumer" else SimGroupMember
    config = CONSUMER_PROTOCOL_CONFIG if protocol == "consumer" else CONFIG
    platform = SimulatedPlatform(tmp_path / "cluster", 3, config, ephemeral_storage=False,
                                 clients=isolated, seed=7)
    with platform:
        side = SimulatedWorld(platform)
        side.create(TopicSpec.model_validate(
            {"name": TOPIC, "partitions": 3, "replicationFactor": 3}), Abort())
        platform.loop.wait_until(lambda: partitions_healthy(platform, TOPIC, 3), 30, "topic")
        lines = Lines()
        history: Any = lines  # what a HistoryWriter offers the members
        clients: dict[str, Any] = {}

        def start(name: str, client: Callable[[], Any]) -> None:
            clients[name] = client()  # among its own code: its connections are its own
            clients[name].start()

        side.among("p0", lambda: start("p0", lambda: SimProducer(
            0, side.endpoint("p0"), WorkloadConfig(TOPIC, 3, rate=100, retries=3),
            lambda _send: None, side.now)))
        for i in range(members):
            side.among(f"c{i}", lambda i=i: start(f"c{i}", lambda: member(
                f"c{i}", side.endpoint(f"c{i}"), TOPIC, settings(commit, protocol=protocol),
                history, side.now, first=i)))
        platform.loop.wait_until(lambda: len(clients) == members + 1, 1, "the clients")
        producer = clients.pop("p0")
        group = [clients[f"c{i}"] for i in range(members)]
        yield World(platform, side, group, lines, producer)


def test_the_range_assignor_splits_partitions_in_member_order() -> None:
    subscribed = b'{"topics": ["t"]}'
    members = [("m-b", None, subscribed), ("m-a", None, subscribed), ("m-c", None, b"")]
    assert range_assignment(members, "t", 5) == {"m-a": [0, 1, 2], "m-b": [3, 4], "m-c": []}
    static = [("x", "i-2", subscribed), ("y", "i-1", subscribed)]
    assert range_assignment(static, "t", 2) == {"y": [0], "x": [1]}


def test_members_join_split_the_partitions_and_commit(tmp_path: Path) -> None:
    with world(tmp_path) as w:
        w.wait(w.stable, 10, "a stable group")
        group = w.group_state()
        assert group["protocol"] == "range" and group["leader"] in group["members"]
        assignments = [m.assignment for m in w.members]
        assert sorted(p for a in assignments for p in a) == [0, 1, 2]
        assert all(len(a) == 1 for a in assignments)
        for m in w.members:  # the history says the same, with the coordinator's ids
            [assign] = w.lines.of("assign", member=m.name)
            assert (assign["partition"], assign["member_id"], assign["generation"]) == (
                m.assignment[0], m.member_id, group["generation"])
        w.run_for(5)
        for m in w.members:
            [committed] = w.lines.of("committed", member=m.name)
            assert committed["offset"] is None  # nothing committed yet: the log start
        reads = {(r["partition"], r["offset"]) for r in w.lines.reads}
        assert len(reads) == len(w.lines.reads) > 300  # each record once
        assert {r["generation"] for r in w.lines.reads} == {group["generation"]}
        committed = w.committed()
        ok = w.lines.of("commit", status="ok")
        assert ok and all(c["t_invoke"] is None for c in ok)  # auto commits
        for p in range(3):
            last = max(c["offset"] for c in ok if c["partition"] == p)
            assert committed[p] == last > 0
            assert last <= 1 + max(o for q, o in reads if q == p)


def test_a_coordinator_killed_in_a_rebalance_moves_the_group_and_it_rejoins(
        tmp_path: Path) -> None:
    with world(tmp_path) as w:
        w.wait(w.stable, 10, "a stable group")
        w.run_for(3)
        before = w.group_state()["generation"]
        old = w.coordinator_node()
        committed_before = w.committed()
        w.among(w.members[0], w.members[0].rejoin)  # the group rebalances ...
        w.run_for(0.05)
        w.platform.kill(old)  # ... and its coordinator dies meanwhile
        w.run_for(1)
        w.platform.release(old)
        w.wait(lambda: w.coordinator_node() != old and w.stable(), 30,
               "the group stable at a new coordinator")
        assert w.group_state()["generation"] > before
        assert sorted(p for m in w.members for p in m.assignment) == [0, 1, 2]
        after = w.group_state()["generation"]
        for m in w.members:  # each was assigned its partitions again, from committed offsets
            assert w.lines.of("assign", member=m.name, generation=after)
            for line in w.lines.of("committed", member=m.name, generation=after):
                assert line["offset"] >= committed_before[line["partition"]]
        w.run_for(3)
        committed = w.committed()
        assert all(committed[p] > committed_before[p] for p in range(3))
        for p in range(3):  # no record returned twice by a member after a commit passed it
            seen: dict[int, str] = {}
            for r in (r for r in w.lines.reads if r["partition"] == p):
                assert r["offset"] not in seen or r["offset"] >= committed_before[p], r
                seen[r["offset"]] = r["consumer"]


def test_a_rejoining_member_leaves_between_polls_and_its_new_consumer_starts_as_librdkafka(
        tmp_path: Path) -> None:
    """The workload's loop sees the rebalancer's rejoin only when its poll returns (up to
    ``POLL_S`` later), and the new consumer's JoinGroup reaches the coordinator no sooner
    than librdkafka's sparse connect interval after it starts (its bootstrap connection
    dropped, its first connection to a named broker suppressed until then): about 50-60 ms
    on local processes, where a consumer that joined at once would beat the others' rejoin
    into the same rebalance."""
    with world(tmp_path) as w:
        w.wait(w.stable, 10, "a stable group")
        w.run_for(1.03)
        leaving = w.members[0]
        old_id, others = leaving.member_id, {m.member_id for m in w.members[1:]}
        asked, asked_clock = w.loop.time(), w.side.now()
        w.among(leaving, leaving.rejoin)
        w.wait(lambda: old_id not in w.group_state()["members"], 5, "the member to leave")
        left = w.loop.time()
        w.wait(lambda: set(w.group_state()["members"]) - others - {old_id}, 5,
               "its new consumer to join")
        joined = w.loop.time()
        revoked = max(g["t"] for g in w.lines.of("revoke", member=leaving.name))
        assert 0 < revoked - asked_clock <= POLL_S, (asked_clock, revoked)  # its poll first
        assert left - asked <= POLL_S + 0.01
        assert SPARSE_CONNECT_INTERVAL_MS / 1000 <= joined - left < 0.1, (left, joined)


def test_a_member_cut_off_loses_its_partitions_and_rejoins_once_healed(tmp_path: Path) -> None:
    with world(tmp_path, isolated=("c1",)) as w:
        w.wait(w.stable, 10, "a stable group")
        w.run_for(3)
        cut = w.members[1]
        [held] = cut.assignment
        endpoint = client_endpoint("c1")
        blocked_at = w.side.now()
        w.platform.block([link for b in w.platform.brokers
                          for link in (Link(endpoint, b), Link(b, endpoint))], "test")
        w.run_for(10)  # past the 6 s session: the coordinator removes it, the others take over
        group = w.group_state()
        assert cut.member_id not in group["members"] and len(group["members"]) == 2
        others = sorted(p for m in w.members if m is not cut for p in m.assignment)
        assert others == [0, 1, 2] and cut.assignment == []
        # It gave them up itself, when its session ran out: 6 s after the last heartbeat
        # answered (one already on the wire at the cut still lands, a link latency later),
        # as librdkafka checks on each turn of its main loop, not at its next heartbeat.
        [lost] = w.lines.of("revoke", member="c1", partition=held)
        assert blocked_at + 5 < lost["t"] <= blocked_at + 6.01, (blocked_at, lost["t"])
        [taken] = [g for g in w.lines.of("committed", partition=held) if g["member"] != "c1"]
        assert taken["offset"] == w.lines.of("commit", member="c1", status="ok")[-1]["offset"]
        w.platform.unblock("test")
        # It joins only once a metadata answer is back (its cache expired while cut off), so
        # no JoinGroup of its was held on the cut link: a held one would reach the
        # coordinator at the heal as a pending member (KIP-394) that the rebalance waits
        # for until its session expires, 6 s, where librdkafka's rebalance takes well
        # under one.
        w.wait(w.stable, 1.5, "the cut-off member back in the group")
        assert len(w.group_state()["members"]) == 3 and cut.assignment


def test_manual_commits_land_before_the_revoke_and_a_stop_leaves(tmp_path: Path) -> None:
    with world(tmp_path, members=2, commit="manual") as w:
        w.wait(w.stable, 10, "a stable group")
        w.run_for(2.5)
        leaving = w.members[0]
        w.among(leaving, leaving.stop)
        w.wait(lambda: leaving.closed, 10, "the member to leave")
        stayed = w.members[1]
        w.wait(lambda: len(w.group_state()["members"]) == 1
               and len(stayed.assignment) == 3, 10, "a rebalance")
        w.run_for(0.1)
        actions = [(g["type"], g.get("status")) for g in w.lines.groups if g["member"] == "c0"]
        last_revoke = max(i for i, a in enumerate(actions) if a[0] == "revoke")
        assert ("commit", "ok") in actions[:last_revoke]  # the revoke's commit first
        commits = w.lines.of("commit", member="c0")
        assert commits and all(c["t_invoke"] is not None for c in commits)
        assert sorted(stayed.assignment) == [0, 1, 2]
        committed = w.committed()
        for p in range(3):
            positions = [c["offset"] for c in commits if c["partition"] == p]
            if positions:  # the new owner resumed from c0's last commit
                resumed = w.lines.of("committed", member="c1", partition=p)[-1]["offset"]
                assert resumed == max(positions) <= committed[p]
