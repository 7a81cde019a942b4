"""Every fault unit on a real minibroker cluster, its effect read from the brokers' own state.

One cluster (proxy network) serves the module; before each test it is healed and waits
until topic ``t`` has a leader and its full ISR again.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer

from undertow.faults import Fault, FaultError, build_fault
from undertow.faults.partition import Partition
from undertow.platform.base import CONTROLLER, PlatformError, broker_id_of, broker_node, wait_for
from undertow.platform.local import LocalPlatform, LocalPlatformConfig, default_command
from undertow.platform.process import proc_stat

TOPIC = "t"
FAST = {"replica.lag.time.max.ms": "1000", "broker.session.timeout.ms": "1500",
        "broker.heartbeat.interval.ms": "200"}
EFFECT_TIMEOUT_S = 20

try:
    default_command()
    MISSING = None
except PlatformError as exc:
    MISSING = str(exc)
pytestmark = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlatform]:
    config = LocalPlatformConfig(workdir=tmp_path_factory.mktemp("cluster"), brokers=3,
                                 broker_config=FAST, controller_config=FAST)
    with LocalPlatform(config) as cluster:
        create_topic(cluster, TOPIC, partitions=1, replication_factor=3,
                     config={"min.insync.replicas": "2"})
        yield cluster


@pytest.fixture
def healthy(platform: LocalPlatform) -> LocalPlatform:
    platform.heal()
    wait_for(lambda: full_isr(platform), EFFECT_TIMEOUT_S, "the full ISR before the test",
             interval=0.1)
    return platform


def create_topic(platform: LocalPlatform, topic: str, *, partitions: int,
                 replication_factor: int, config: dict[str, str]) -> None:
    # minibroker's tools take one address, not a Kafka-style list.
    bootstrap = platform.bootstrap.split(",")[0]
    argv = [*default_command(), "topics", "create", "--bootstrap", bootstrap, "--topic", topic,
            "--partitions", str(partitions), "--replication-factor", str(replication_factor)]
    for key, value in config.items():
        argv += ["--config", f"{key}={value}"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0, f"{' '.join(argv)}: {result.stderr}"
    wait_for(lambda: partition(platform)["leader"] >= 0, EFFECT_TIMEOUT_S, "a leader of t-0",
             ignore=(KeyError,))


def partition(platform: LocalPlatform) -> dict[str, Any]:
    """The controller's registration of t-0: leader, leader_epoch, isr, replicas."""
    return platform.state(CONTROLLER)["topics"][TOPIC]["partitions"]["0"]


def full_isr(platform: LocalPlatform) -> bool:
    reg = partition(platform)
    return reg["leader"] >= 0 and sorted(reg["isr"]) == sorted(reg["replicas"])


def leader(platform: LocalPlatform) -> str:
    return broker_node(partition(platform)["leader"])


def a_follower(platform: LocalPlatform) -> str:
    reg = partition(platform)
    return broker_node(next(b for b in reg["replicas"] if b != reg["leader"]))


def wait_out_of_isr(platform: LocalPlatform, node: str) -> None:
    wait_for(lambda: broker_id_of(node) not in partition(platform)["isr"], EFFECT_TIMEOUT_S,
             f"{node} to leave the ISR", interval=0.1)


def wait_back_in_isr(platform: LocalPlatform, node: str) -> None:
    wait_for(lambda: broker_id_of(node) in partition(platform)["isr"], EFFECT_TIMEOUT_S,
             f"{node} to rejoin the ISR", interval=0.1)


def wait_new_leader(platform: LocalPlatform, old: str) -> str:
    def elected() -> str | None:
        reg = partition(platform)
        return broker_node(reg["leader"]) if reg["leader"] not in (-1, broker_id_of(old)) \
            else None
    return wait_for(elected, EFFECT_TIMEOUT_S, f"a leader other than {old}", interval=0.1)


class Recorder:
    """The runner's view: the actions a fault reports, in order."""

    def __init__(self) -> None:
        self.actions: list[tuple[str, str, str]] = []

    def __call__(self, fault: Fault, action: str) -> None:
        self.actions.append((fault.kind, fault.target, action))


def test_kill_leader_elects_another_and_recover_restarts_into_the_isr(
        healthy: LocalPlatform) -> None:
    old = leader(healthy)
    old_pid = healthy.pid(old)
    recorder = Recorder()
    fault = build_fault("kill", healthy, old, time_limit_s=60, listener=recorder)
    fault.inject()
    assert not healthy.is_running(old) and proc_stat(old_pid) is None
    new = wait_new_leader(healthy, old)
    assert new != old
    assert fault.recover() is True
    assert healthy.is_running(old) and healthy.pid(old) != old_pid
    wait_back_in_isr(healthy, old)
    assert fault.recover() is False  # idempotent
    assert recorder.actions == [("kill", old, "inject"), ("kill", old, "recover")]
    assert fault.describe() == {"fault": "kill", "target": old}


def test_killed_controller_restarts_from_its_data_and_the_brokers_return(
        healthy: LocalPlatform) -> None:
    before = partition(healthy)
    fault = build_fault("kill", healthy, CONTROLLER, time_limit_s=60)
    fault.inject()
    assert not healthy.is_running(CONTROLLER)
    fault.recover()
    reg = partition(healthy)  # persisted before it answered, so it survives the kill
    assert reg["replicas"] == before["replicas"]
    assert reg["leader_epoch"] >= before["leader_epoch"]

    def brokers_unfenced() -> bool:
        brokers = healthy.state(CONTROLLER)["brokers"]
        return {b["id"] for b in brokers if not b["fenced"]} == set(healthy.broker_ids)

    wait_for(brokers_unfenced, EFFECT_TIMEOUT_S, "every broker unfenced again", interval=0.1)
    wait_for(lambda: full_isr(healthy), EFFECT_TIMEOUT_S, "the full ISR again", interval=0.1)


def test_pause_leader_elects_another_and_resume_returns_it(healthy: LocalPlatform) -> None:
    old = leader(healthy)
    fault = build_fault("pause", healthy, old, time_limit_s=60)
    fault.inject()
    try:
        assert proc_stat(healthy.pid(old))[0] == "T"
        wait_new_leader(healthy, old)
    finally:
        fault.recover()
    assert not healthy.is_paused(old)
    wait_back_in_isr(healthy, old)


def test_paused_follower_leaves_the_isr_and_returns(healthy: LocalPlatform) -> None:
    follower = a_follower(healthy)
    fault = build_fault("pause", healthy, follower, time_limit_s=60)
    fault.inject()
    try:
        wait_out_of_isr(healthy, follower)
    finally:
        fault.recover()
    wait_back_in_isr(healthy, follower)


def test_isolated_follower_leaves_the_isr_and_returns_after_heal(
        healthy: LocalPlatform) -> None:
    follower = a_follower(healthy)
    fault = build_fault("partition", healthy, follower, time_limit_s=60, mode="isolate")
    fault.inject()
    try:
        assert healthy.is_running(follower) and not healthy.is_paused(follower)
        wait_out_of_isr(healthy, follower)
    finally:
        fault.recover()
    assert not healthy.blocked_links
    wait_back_in_isr(healthy, follower)


def test_one_way_follower_to_leader_drop_takes_it_out_of_the_isr(
        healthy: LocalPlatform) -> None:
    follower, lead = a_follower(healthy), leader(healthy)
    # The follower's fetches never reach the leader; the leader's traffic still flows.
    fault = build_fault("partition", healthy, follower, time_limit_s=60, mode="one-way",
                        to=lead)
    assert fault.describe() == {"fault": "partition", "target": f"{follower}->{lead}"}
    fault.inject()
    try:
        # A follower whose LEO equals the leader's counts as caught up (Kafka's rule), so
        # the leader needs a record the follower cannot fetch.
        assert produce(healthy, 10, acks="1") is None
        wait_out_of_isr(healthy, follower)
        assert partition(healthy)["leader"] == broker_id_of(lead)
    finally:
        fault.recover()
    wait_back_in_isr(healthy, follower)


def test_isolated_leader_is_replaced(healthy: LocalPlatform) -> None:
    old = leader(healthy)
    fault = Partition.isolate(healthy, old, time_limit_s=60)
    fault.inject()
    try:
        wait_new_leader(healthy, old)  # cut from the controller, it is fenced
    finally:
        fault.recover()
    wait_back_in_isr(healthy, old)


def produce(platform: LocalPlatform, timeout_s: float, acks: str = "all") -> str | None:
    """Produce one record to t-0; None when acknowledged, else the error name."""
    producer = Producer({"bootstrap.servers": platform.bootstrap, "acks": acks,
                         "message.timeout.ms": int(timeout_s * 1000), "log_level": 0})
    outcome: list[str | None] = []
    producer.produce(TOPIC, b"v", partition=0,
                     on_delivery=lambda err, _msg: outcome.append(err and err.name()))
    producer.flush(timeout_s + 5)
    assert outcome, "no delivery report"
    return outcome[0]


def test_disk_stalled_leader_stops_acknowledging_until_cleared(
        healthy: LocalPlatform) -> None:
    lead = leader(healthy)
    assert produce(healthy, 10) is None
    fault = build_fault("disk-stall", healthy, lead, time_limit_s=30)
    fault.inject()
    try:
        assert healthy.state(lead)["disk_stalled"] is True
        assert produce(healthy, 1.5) == "_MSG_TIMED_OUT"
    finally:
        fault.recover()
    assert healthy.state(lead)["disk_stalled"] is False
    assert produce(healthy, 10) is None


def test_power_loss_kills_the_broker_and_recover_restarts_it(healthy: LocalPlatform) -> None:
    follower = a_follower(healthy)
    fault = build_fault("power-loss", healthy, follower, time_limit_s=60)
    fault.inject()
    assert not healthy.is_running(follower)
    assert "Power loss" in healthy.log_path(follower).read_text()
    wait_out_of_isr(healthy, follower)
    fault.recover()
    wait_back_in_isr(healthy, follower)


def test_time_limit_heals_a_fault_on_its_own(healthy: LocalPlatform) -> None:
    follower = a_follower(healthy)
    recorder = Recorder()
    fault = build_fault("pause", healthy, follower, time_limit_s=0.5, listener=recorder)
    fault.inject()
    wait_for(lambda: fault.state == "recovered", 10, "the time limit to resume the follower")
    assert not healthy.is_paused(follower)
    assert recorder.actions == [("pause", follower, "inject"), ("pause", follower, "recover")]
    assert fault.recover() is False


def test_recover_after_a_failed_inject_undoes_what_took_effect(healthy: LocalPlatform) -> None:
    follower = a_follower(healthy)
    healthy.kill(follower)
    fault = build_fault("kill", healthy, follower, time_limit_s=60)
    with pytest.raises(PlatformError, match="not running"):
        fault.inject()
    assert fault.state == "failed"
    assert fault.recover() is True  # restarts the node the failed kill found dead
    assert healthy.is_running(follower)
    with pytest.raises(FaultError, match="already recovered"):
        fault.inject()


@pytest.mark.parametrize(("kind", "target", "options", "message"), [
    ("explode", "broker-0", {}, "unknown fault kind 'explode'"),
    ("kill", "broker-0", {"mode": "split"}, "kill takes no options"),
    ("kill", "broker-9", {}, "unknown node 'broker-9'"),
    ("disk-stall", CONTROLLER, {}, "'controller' is not a broker"),
    ("partition", "broker-0", {"mode": "sideways"}, "partition mode must be one of"),
    ("partition", "broker-0", {"mode": "one-way"}, "needs 'to'"),
    ("partition", None, {"mode": "split", "groups": [["broker-0"]]}, "two non-empty groups"),
    ("partition", None, {"mode": "split", "groups": [["broker-0"], ["broker-0"]]},
     "in two groups"),
    ("partition", "broker-0", {"mode": "isolate", "to": "broker-1"}, "for one-way only"),
    ("pause", "broker-0", {}, "time limit must be positive"),
    ("pod-delete", CONTROLLER, {}, "'controller' is not a broker"),
    ("pod-delete", "broker-0", {"grace_period_s": -1}, "grace period must not be negative"),
    ("pod-delete", "broker-0", {"mode": "isolate"}, "pod-delete: unknown options mode"),
])
def test_bad_fault_requests_are_clear_errors(platform: LocalPlatform, kind: str,
                                             target: str | None, options: dict[str, Any],
                                             message: str) -> None:
    limit = 0 if message.startswith("time limit") else 5
    with pytest.raises((FaultError, PlatformError), match=message):
        build_fault(kind, platform, target, time_limit_s=limit, **options)


def test_split_cuts_links_between_groups_only(platform: LocalPlatform) -> None:
    b0, b1, b2 = platform.brokers
    fault = build_fault("partition", platform, None, time_limit_s=5, mode="split",
                        groups=[[b0, CONTROLLER], [b1, b2]])
    assert fault.describe()["target"] == f"{b0},{CONTROLLER}|{b1},{b2}"
    pairs = {(link.src, link.dst) for link in fault.links}
    assert (b0, b1) in pairs and (b2, CONTROLLER) in pairs
    assert (b1, b2) not in pairs and (b0, CONTROLLER) not in pairs
    assert not any("client" in pair for pair in pairs)


def test_overlapping_partitions_heal_independently(healthy: LocalPlatform) -> None:
    follower, lead = a_follower(healthy), leader(healthy)
    wide = Partition.isolate(healthy, follower, time_limit_s=60)
    narrow = Partition.one_way(healthy, follower, lead, time_limit_s=60)
    wide.inject()
    narrow.inject()
    wide.recover()
    assert healthy.blocked_links == narrow.links  # still cut by the other fault
    narrow.recover()
    assert not healthy.blocked_links



@pytest.mark.parametrize("storage", ["ephemeral", "persistent"])
def test_pod_delete_replaces_the_broker_at_a_new_address_with_its_emptydir_wiped(
        tmp_path_factory: pytest.TempPathFactory, storage: str) -> None:
    """Chaos Mesh's pod-kill, emulated: the process dies, the replacement starts at once as
    a new incarnation (a new broker epoch) on a new port behind the same proxies (a new pod
    IP behind the same Service name), with an empty data directory when storage is
    ephemeral; it counts as recovered once registered and unfenced, then catches up."""
    workdir = tmp_path_factory.mktemp(f"pod-delete-{storage}")
    config = LocalPlatformConfig(workdir=workdir, brokers=3, broker_config=FAST,
                                 controller_config=FAST,
                                 ephemeral_storage=storage == "ephemeral")
    with LocalPlatform(config) as cluster:
        create_topic(cluster, TOPIC, partitions=1, replication_factor=3,
                     config={"min.insync.replicas": "2"})
        for _ in range(3):
            assert produce(cluster, 10) is None
        victim = leader(cluster)
        marker = workdir / "data" / victim / "marker"
        marker.write_text("kept only by a persistent volume")
        epoch = cluster.state(victim)["broker_epoch"]
        listen = cluster._process(victim).argv.index("--listen") + 1
        address = cluster._process(victim).argv[listen]

        fault = build_fault("pod-delete", cluster, victim, time_limit_s=30, grace_period_s=0)
        fault.inject()
        assert marker.exists() is (storage == "persistent")
        assert cluster._process(victim).argv[listen] != address
        fault.recover()
        assert cluster.registered_and_unfenced(victim)
        assert cluster.state(victim)["broker_epoch"] > epoch
        assert leader(cluster) != victim  # the old incarnation was fenced out
        wait_for(lambda: full_isr(cluster), EFFECT_TIMEOUT_S, "the replacement in the ISR",
                 interval=0.1)
        assert produce(cluster, 10) is None
        (replica,) = cluster.state(victim)["partitions"]
        assert replica["log_end_offset"] == 4  # caught up from the others
