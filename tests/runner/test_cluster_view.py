"""The one typed view of the cluster: parsed once with explicit defaults from minibroker's
``/v1/state`` documents, and the same answers from the Kafka protocol on a real cluster."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from rich.console import Console

from undertow.cli import main
from undertow.cluster_view import ClusterView, StateDocumentError, view_from_states
from undertow.cluster_view.kafka import KafkaAdminError, admin_client, create_topic, view_from_admin
from undertow.cluster_view.table import render
from undertow.platform.base import wait_for
from undertow.platform.local import LocalPlatform, LocalPlatformConfig
from undertow.runner import progress
from undertow.runner.sampler import to_sample
from undertow_history.schema import CLUSTER

CONTROLLER = {
    "brokers": [{"id": 0, "fenced": False, "broker_epoch": 7}, {"id": 1, "fenced": True},
                {"id": 2}],
    "topics": {"t": {"config": {"min.insync.replicas": "2"}, "partitions": {
        "1": {"leader": 1, "isr": [1, 0], "replicas": [1, 0, 2], "leader_epoch": 4},
        "0": {"leader": -1, "isr": [2], "replicas": [2, 0, 1], "leader_epoch": 5},
    }}},
}


def replica(topic: str, index: int, *, leader: int, role: str, hw: int, leo: int) -> dict:
    return {"topic": topic, "partition": index, "role": role, "leader": leader,
            "leader_epoch": 4, "isr": [1, 0], "high_watermark": hw, "log_end_offset": leo}


BROKERS = {
    0: {"broker_id": 0, "broker_epoch": 7,
        "partitions": [replica("t", 1, leader=1, role="follower", hw=8, leo=10)]},
    1: {"broker_id": 1, "broker_epoch": 3,
        "partitions": [replica("t", 1, leader=1, role="leader", hw=10, leo=12)]},
}


def test_a_registration_that_does_not_say_unfenced_is_not_live() -> None:
    view = view_from_states(CONTROLLER)
    assert view.live_brokers == {0}
    assert view.brokers[0].broker_epoch == 7
    assert view.brokers[2].fenced and view.brokers[2].broker_epoch is None


def test_partitions_merge_the_controllers_registration_with_the_replicas_reports() -> None:
    view = view_from_states(CONTROLLER, BROKERS)
    assert [p.partition for p in view.topic_partitions("t")] == [0, 1]
    p1 = view.partition("t", 1)
    # The high watermark is the controller's leader's, never a follower's lagging copy.
    assert (p1.leader, p1.leader_epoch, p1.isr, p1.high_watermark) == (1, 4, (1, 0), 10)
    assert p1.log_end_offsets == {0: 10, 1: 12}
    offline = view.partition("t", 0)
    assert not offline.has_leader and offline.high_watermark is None
    assert not view.healthy("t", 3)
    assert view.min_insync_replicas("t", 1) == 2 and view.min_insync_replicas("u", 1) == 1
    assert view.led_by_reports()[("t", 1)].isr == (1, 0)


def test_the_controllers_half_alone_has_no_high_watermarks() -> None:
    view = view_from_states(CONTROLLER)
    assert view.partition("t", 1).high_watermark is None and not view.reports


# KIP-966: the controller's registrations carry the eligible leader replicas and the last
# known ELR; t-0 lost its ISR (min.insync.replicas 2): 2 and 0 are eligible, t-1 is healthy.
ELR_CONTROLLER = {
    "eligible_leader_replicas_version": 1,
    "brokers": [{"id": 0, "fenced": True}, {"id": 1, "fenced": False},
                {"id": 2, "fenced": True}],
    "topics": {"t": {"config": {"min.insync.replicas": "2"}, "partitions": {
        "0": {"leader": -1, "isr": [], "replicas": [2, 0, 1], "leader_epoch": 6,
              "partition_epoch": 9, "elr": [2, 0], "last_known_elr": [2]},
        "1": {"leader": 1, "isr": [1], "replicas": [1, 0, 2], "leader_epoch": 4,
              "partition_epoch": 5, "elr": [], "last_known_elr": [],
              "leader_recovery_state": "RECOVERING"},
    }}},
}


def test_the_eligible_leader_replicas_come_from_the_controllers_registration() -> None:
    view = view_from_states(ELR_CONTROLLER)
    p0, p1 = view.topic_partitions("t")
    assert (p0.leader, p0.isr, p0.elr, p0.last_known_elr) == (-1, (), (2, 0), (2,))
    assert (p1.elr, p1.last_known_elr) == ((), ())
    # A controller from before KIP-966 says nothing of them: none.
    old = view_from_states(CONTROLLER).partition("t", 1)
    assert (old.elr, old.last_known_elr) == ((), ())


def test_every_sample_carries_the_elr_and_the_table_shows_it_when_there_is_one() -> None:
    view = view_from_states(ELR_CONTROLLER, {1: {
        "broker_id": 1, "partitions": [replica("t", 1, leader=1, role="leader", hw=10,
                                               leo=12)]}})
    samples = [to_sample(p, 100.0) for p in view.topic_partitions("t")]
    assert samples[0] == {"t": 100.0, "topic": "t", "partition": 0, "leader": -1,
                          "leader_epoch": 6, "isr": [], "high_watermark": None,
                          "log_end_offsets": {}, "elr": [2, 0], "last_known_elr": [2],
                          "leader_recovery_state": None, "last_stable_offset": None}
    assert (samples[1]["elr"], samples[1]["last_known_elr"]) == ([], [])
    assert samples[1]["leader_recovery_state"] == "RECOVERING"  # KIP-704
    for sample in [*samples, to_sample(view_from_states(CONTROLLER).partition("t", 0), 1.0)]:
        assert CLUSTER.problems(sample) == [], sample
    assert render(view).splitlines() == [
        "brokers: 0 (fenced), 1, 2 (fenced); controller: unknown",
        "partition  leader          epoch  ISR  ELR  replicas  HW",
        "t-0        offline         6      -    2,0  2,0,1     ?",
        "t-1        1 (recovering)  4      1    -    1,0,2     10",
    ]
    # Without an ELR anywhere the table is as before KIP-966.
    assert render(view_from_states(CONTROLLER)).splitlines()[1].split() == [
        "partition", "leader", "epoch", "ISR", "replicas", "HW"]
    # The run's progress line names a partition's ELR only while it has one.
    update = {"phase": "faults", "elapsed": 3.0, "total": 60, "acks_per_second": 10.0,
              "counts": {"ok": 5, "fail": 0, "info": 1}, "active_faults": [], "errors": {},
              "partitions": samples}
    assert progress.line(update).endswith(" t-0:L-1/isr=/elr=2,0 t-1:L1/isr=1")
    console = Console(width=120, record=True, file=io.StringIO())
    console.print(progress.render(update))
    rows = [line.split() for line in console.export_text().splitlines()[2:]]
    assert rows == [["partition", "leader", "epoch", "ISR", "ELR", "HW", "LEO", "per", "broker"],
                    ["t-0", "offline", "6", "2,0", "None"],
                    ["t-1", "1", "(recovering)", "4", "1", "-", "10", "1:12"]]


def test_a_document_missing_a_field_every_minibroker_writes_is_named() -> None:
    broken = {1: {"broker_id": 1, "partitions": [{"topic": "t", "partition": 1}]}}
    with pytest.raises(StateDocumentError, match="broker state: KeyError\\('role'\\)"):
        view_from_states(CONTROLLER, broken)
    with pytest.raises(KeyError, match="partition t-9 is not in the cluster's metadata"):
        view_from_states(CONTROLLER).partition("t", 9)


# ---- a real cluster: both sources agree ---------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlatform]:
    with LocalPlatform(LocalPlatformConfig(workdir=tmp_path_factory.mktemp("view"),
                                           brokers=3)) as platform:
        yield platform


def settled(platform: LocalPlatform, topic: str) -> ClusterView | None:
    """The minibroker view once every replica holds every record (HW = every LEO)."""
    view = platform.cluster_view(replicas=True)
    partitions = view.topic_partitions(topic)
    done = partitions and all(
        p.has_leader and len(p.log_end_offsets) == len(p.replicas)
        and set(p.log_end_offsets.values()) == {p.high_watermark} for p in partitions)
    return view if done else None


def the_kafka_half(view: ClusterView) -> dict:
    return {key: (p.leader, p.leader_epoch, sorted(p.isr), p.replicas, p.high_watermark)
            for key, p in view.partitions.items()}


def test_the_kafka_protocol_and_minibroker_state_give_the_same_view(
        cluster: LocalPlatform, capsys: pytest.CaptureFixture[str]) -> None:
    admin = admin_client(cluster.bootstrap)
    create_topic(admin, "v", 2, 3, {"min.insync.replicas": "2"})
    create_topic(admin, "v", 2, 3, {"min.insync.replicas": "2"})  # a retry: already there
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(50):
        producer.produce("v", value=b"%d" % i, partition=i % 2)
    assert producer.flush(30) == 0

    ours = wait_for(lambda: settled(cluster, "v"), 30, "every replica to hold every record")
    theirs = view_from_admin(admin, ["v"])
    assert the_kafka_half(theirs) == the_kafka_half(ours)
    assert sum(p.high_watermark or 0 for p in theirs.partitions.values()) == 50
    assert theirs.live_brokers == ours.live_brokers == {0, 1, 2}

    # `undertow describe` prints that view for any Kafka.
    assert main(["describe", "--bootstrap", cluster.bootstrap]) == 0
    p0 = theirs.partition("v", 0)
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("v-0"))
    assert row.split() == ["v-0", str(p0.leader), str(p0.leader_epoch),
                           ",".join(map(str, p0.isr)), ",".join(map(str, p0.replicas)),
                           str(p0.high_watermark)]

    # After a leader change both sources name the new leader and its epoch.
    old = ours.partition("v", 0).leader
    cluster.kill(f"broker-{old}")
    try:
        def moved() -> ClusterView | None:
            view = cluster.cluster_view(replicas=True)
            p = view.partition("v", 0)
            return view if p.has_leader and p.leader != old and old not in p.isr \
                and old not in view.live_brokers else None

        ours = wait_for(moved, 30, "a new leader of v-0", ignore=(Exception,))
        theirs = wait_for(lambda: view_from_admin(admin, ["v"], timeout_s=5), 40,
                          "the Kafka view", ignore=(KafkaAdminError,))
        assert theirs.partition("v", 0).leader == ours.partition("v", 0).leader
        assert theirs.partition("v", 0).leader_epoch == ours.partition("v", 0).leader_epoch >= 1
        assert theirs.live_brokers == ours.live_brokers == {0, 1, 2} - {old}
    finally:
        cluster.restart(f"broker-{old}")
        wait_for(cluster.all_brokers_unfenced, 30, "the broker back", ignore=(Exception,))
