"""Every fault unit on a real minibroker cluster, its effect read from the brokers' own state.

One cluster (proxy network) serves the module; before each test it is healed and waits
until topic ``t`` has a leader and its full ISR again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from fault_checks import check_kind_heals, leftovers
from planned_faults import experiment, planned
from processes import needs_local_minibroker

from undertow import faults
from undertow.faults import FAULT_UNITS, Fault, FaultError, Nodes, build_fault
from undertow.platform.base import CONTROLLER, PlatformError, broker_id_of, broker_node, wait_for
from undertow.platform.local import LocalPlatform, LocalPlatformConfig, default_command
from undertow.platform.procfs import proc_stat
from undertow.runner.history import HistoryWriter
from undertow.runner.nemesis import Nemesis
from undertow.spec import plan

TOPIC = "t"
FAST = {"replica.lag.time.max.ms": "1000", "broker.session.timeout.ms": "1500",
        "broker.heartbeat.interval.ms": "200"}
EFFECT_TIMEOUT_S = 20
LEADER = {"role": "leader"}
FOLLOWER = {"role": "follower"}

pytestmark = needs_local_minibroker()


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
    faults.heal(platform)
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


@pytest.mark.parametrize("heal", ["faults.heal", "time limit"])
@pytest.mark.parametrize("kind", list(FAULT_UNITS))
def test_every_kind_of_the_registry_heals_and_leaves_nothing_behind(
        healthy: LocalPlatform, kind: str, heal: str) -> None:
    follower = a_follower(healthy)
    check_kind_heals(healthy, kind, heal, follower,
                     lambda condition, timeout, what: wait_for(condition, timeout, what),
                     lambda: wait_back_in_isr(healthy, follower), EFFECT_TIMEOUT_S)


@pytest.mark.parametrize("heal", ["recover", "faults.heal", "time limit"])
def test_a_paused_producer_process_is_stopped_and_every_heal_path_resumes_it(
        healthy: LocalPlatform, tmp_path: Path, heal: str) -> None:
    """A producer a schedule pauses runs as a process of its own (`Platform.start_client`):
    its pause is SIGSTOP, state T in /proc until its unit recovers it, the cluster-wide
    heal (which knows no unit) or its time limit sends SIGCONT."""
    process = healthy.start_client("p0", [sys.executable, "-c", "import sys; sys.stdin.read()"],
                                   env=os.environ, log_path=tmp_path / "p0.log")
    try:
        assert healthy.client_processes == ("client-p0",)
        recorder = Recorder()
        fault = build_fault(planned({"kind": "pause", "target": {"producer": 0}}), healthy,
                            Nodes("client-p0"), time_limit_s=1.5 if heal == "time limit" else 60,
                            listener=recorder)
        assert FAULT_UNITS["pause"].unable(healthy, "client-p0") is None
        fault.inject()
        assert proc_stat(process.pid)[0] == "T"
        assert leftovers(healthy) == ["client-p0 paused"]
        assert FAULT_UNITS["pause"].unable(healthy, "client-p0") == "is paused"
        if heal == "recover":
            fault.recover()
        elif heal == "faults.heal":
            faults.heal(healthy)
        else:
            wait_for(lambda: fault.state == "recovered", 10, "the time limit to resume p0")
        assert proc_stat(process.pid)[0] != "T" and leftovers(healthy) == []
        fault.recover()  # after faults.heal: nothing left to undo, no error
        assert recorder.actions == [("pause", "client-p0", action)
                                    for action in ("inject", "heal", "recover")]
    finally:
        process.kill()
    assert FAULT_UNITS["pause"].unable(healthy, "client-p0") == "is not running"


def test_kill_leader_elects_another_and_recover_restarts_into_the_isr(
        healthy: LocalPlatform) -> None:
    old = leader(healthy)
    old_pid = healthy.pid(old)
    recorder = Recorder()
    fault = build_fault(planned({"kind": "kill", "target": LEADER}), healthy, Nodes(old),
                        time_limit_s=60, listener=recorder)
    fault.inject()
    assert not healthy.is_running(old) and proc_stat(old_pid) is None
    new = wait_new_leader(healthy, old)
    assert new != old
    assert fault.recover() is True
    assert healthy.is_running(old) and healthy.pid(old) != old_pid
    wait_back_in_isr(healthy, old)
    assert fault.recover() is False  # idempotent
    assert recorder.actions == [("kill", old, action) for action in ("inject", "heal", "recover")]
    assert fault.describe() == {"fault": "kill", "target": old}


def test_kill_with_a_grace_period_stops_the_broker_cleanly_and_holds_it_down(
        healthy: LocalPlatform) -> None:
    """SIGTERM first: the broker shuts down on its own (status 0, not SIGKILLed), stays
    down until recovered, as after any kill, then restarts into the ISR."""
    follower = a_follower(healthy)
    fault = build_fault(planned({"kind": "kill", "target": FOLLOWER, "gracePeriod": "20s"}),
                        healthy, Nodes(follower), time_limit_s=60)
    fault.inject()
    assert not healthy.is_running(follower)
    assert healthy._process(follower).returncode == 0
    wait_out_of_isr(healthy, follower)
    assert not healthy.is_running(follower)
    fault.recover()
    wait_back_in_isr(healthy, follower)


def test_killed_controller_restarts_from_its_data_and_the_brokers_return(
        healthy: LocalPlatform) -> None:
    before = partition(healthy)
    fault = build_fault(planned({"kind": "kill", "target": {"role": "controller"}}), healthy,
                        Nodes(CONTROLLER), time_limit_s=60)
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
    fault = build_fault(planned({"kind": "pause", "target": LEADER}), healthy, Nodes(old),
                        time_limit_s=60)
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
    fault = build_fault(planned({"kind": "pause", "target": FOLLOWER}), healthy,
                        Nodes(follower), time_limit_s=60)
    fault.inject()
    try:
        wait_out_of_isr(healthy, follower)
    finally:
        fault.recover()
    wait_back_in_isr(healthy, follower)


def test_isolated_follower_leaves_the_isr_and_returns_after_heal(
        healthy: LocalPlatform) -> None:
    follower = a_follower(healthy)
    fault = build_fault(planned({"kind": "partition", "target": FOLLOWER}), healthy,
                        Nodes(follower), time_limit_s=60)
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
    spec = planned({"kind": "partition", "target": FOLLOWER,
                    "network": {"mode": "one-way", "to": LEADER}})
    fault = build_fault(spec, healthy, Nodes(follower, to=(lead,)), time_limit_s=60)
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
    fault = build_fault(planned({"kind": "partition", "target": LEADER}), healthy, Nodes(old),
                        time_limit_s=60)
    fault.inject()
    try:
        wait_new_leader(healthy, old)  # cut from the controller, it is fenced
    finally:
        fault.recover()
    wait_back_in_isr(healthy, old)


def produce(platform: LocalPlatform, timeout_s: float, acks: str = "all",
            retries: int | None = None) -> str | None:
    """Produce one record to t-0; None when acknowledged, else the error name."""
    config = {"bootstrap.servers": platform.bootstrap, "acks": acks,
              "message.timeout.ms": int(timeout_s * 1000), "log_level": 0}
    if retries is not None:
        config["retries"] = retries
    producer = Producer(config)
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
    fault = build_fault(planned({"kind": "disk-stall", "target": LEADER}), healthy, Nodes(lead),
                        time_limit_s=30)
    fault.inject()
    try:
        assert healthy.state(lead)["disk_stalled"] is True
        assert produce(healthy, 1.5) == "_MSG_TIMED_OUT"
    finally:
        fault.recover()
    assert healthy.state(lead)["disk_stalled"] is False
    assert produce(healthy, 10) is None


def test_a_full_disk_fails_the_leaders_log_dir_and_it_halts_until_freed(
        healthy: LocalPlatform) -> None:
    """KIP-112 with one log directory: the append that hits ENOSPC is not acknowledged, the
    broker halts (Kafka's Exit.halt(1)), the controller elects another ISR member and
    fences it out of the ISR; it comes back only by the restart that recovery does."""
    lead = leader(healthy)
    assert produce(healthy, 10) is None
    fault = build_fault(planned({"kind": "disk-full", "target": LEADER}), healthy, Nodes(lead),
                        time_limit_s=60)
    fault.inject()
    try:
        assert healthy.state(lead)["disk_full"] is True
        # The append that hits ENOSPC is answered, not acknowledged (Kafka's
        # ReplicaManager.appendToLocalLog): a producer without retries sees the error.
        assert produce(healthy, 10, acks="1", retries=0) == "KAFKA_STORAGE_ERROR"
        wait_for(lambda: not healthy.is_running(lead), 10, f"{lead} to halt")
        log_text = healthy.log_path(lead).read_text()
        assert "No space left on device" in log_text
        assert "Shutdown broker because all log dirs" in log_text
        new = wait_new_leader(healthy, lead)
        assert new != lead
        wait_out_of_isr(healthy, lead)
        assert produce(healthy, 10) is None
    finally:
        fault.recover()
    assert healthy.is_running(lead) and healthy.state(lead)["disk_full"] is False
    wait_back_in_isr(healthy, lead)


def test_power_loss_kills_the_broker_and_recover_restarts_it(healthy: LocalPlatform) -> None:
    follower = a_follower(healthy)
    fault = build_fault(planned({"kind": "power-loss", "target": FOLLOWER}), healthy,
                        Nodes(follower), time_limit_s=60)
    fault.inject()
    assert not healthy.is_running(follower)
    assert "Power loss" in healthy.log_path(follower).read_text()
    wait_out_of_isr(healthy, follower)
    fault.recover()
    wait_back_in_isr(healthy, follower)


def test_time_limit_heals_a_fault_on_its_own(healthy: LocalPlatform) -> None:
    follower = a_follower(healthy)
    recorder = Recorder()
    fault = build_fault(planned({"kind": "pause", "target": FOLLOWER}), healthy,
                        Nodes(follower), time_limit_s=0.5, listener=recorder)
    fault.inject()
    wait_for(lambda: fault.state == "recovered", 10, "the time limit to resume the follower")
    assert not healthy.is_paused(follower)
    assert recorder.actions == [("pause", follower, action)
                                for action in ("inject", "heal", "recover")]
    assert fault.recover() is False


def test_recover_after_a_failed_inject_undoes_what_took_effect(healthy: LocalPlatform) -> None:
    follower = a_follower(healthy)
    healthy.kill(follower)
    fault = build_fault(planned({"kind": "kill", "target": FOLLOWER}), healthy,
                        Nodes(follower), time_limit_s=60)
    with pytest.raises(PlatformError, match="not running"):
        fault.inject()
    assert fault.state == "failed"
    assert fault.recover() is True  # restarts the node the failed kill found dead
    assert healthy.is_running(follower)
    with pytest.raises(FaultError, match="already recovered"):
        fault.inject()


def test_overlapping_partitions_heal_independently(healthy: LocalPlatform) -> None:
    follower, lead = a_follower(healthy), leader(healthy)
    wide = build_fault(planned({"kind": "partition", "target": FOLLOWER}), healthy,
                       Nodes(follower), time_limit_s=60)
    narrow = build_fault(planned({"kind": "partition", "target": FOLLOWER,
                                  "network": {"mode": "one-way", "to": LEADER}}),
                         healthy, Nodes(follower, to=(lead,)), time_limit_s=60)
    wide.inject()
    narrow.inject()
    wide.recover()
    assert healthy.blocked_links == narrow.links  # still cut by the other fault
    narrow.recover()
    assert not healthy.blocked_links



def through_the_nemesis(platform: LocalPlatform, fault: dict[str, Any],
                        directory: Path) -> list[tuple[str, str, str, str]]:
    """Run one 1s fault as a run does (resolved from live metadata when it starts) and
    return its faults.jsonl lines: (fault, target, role, action)."""
    history = HistoryWriter(directory)
    schedule = plan(experiment({"duration": "1s", **fault}, topic=TOPIC), seed=0)
    nemesis = Nemesis(platform, schedule, TOPIC, history, seed=0)
    nemesis.start(time.time())
    try:
        (run,) = nemesis.runs
        wait_for(lambda: run.recovered.is_set() or run.skipped, EFFECT_TIMEOUT_S,
                 "the fault to run and recover")
        assert run.skipped is None
    finally:
        nemesis.stop()
        history.close()
    lines = [json.loads(line) for line in (directory / "faults.jsonl").read_text().splitlines()]
    return [(line["fault"], line["target"], line["role"], line["action"]) for line in lines]


def test_the_nemesis_cuts_each_follower_it_resolved_one_way_to_the_leader(
        healthy: LocalPlatform, tmp_path: Path) -> None:
    lead = leader(healthy)
    followers = sorted(broker_node(b) for b in partition(healthy)["replicas"]
                       if b != broker_id_of(lead))
    lines = through_the_nemesis(healthy, {
        "kind": "partition", "target": {"role": "follower", "mode": "all"},
        "network": {"mode": "one-way", "to": LEADER}}, tmp_path)
    role = f"all followers of {TOPIC}-0"
    injected = [("partition", f"{f}->{lead}", role, "inject") for f in followers]
    assert lines[:2] == injected
    assert sorted(lines[2:]) == sorted((*line[:3], action) for line in injected
                                       for action in ("heal", "recover"))
    assert not healthy.blocked_links


def test_the_nemesis_splits_the_groups_it_resolved(healthy: LocalPlatform,
                                                    tmp_path: Path) -> None:
    lead = leader(healthy)
    others = ",".join(sorted([*(b for b in healthy.brokers if b != lead), CONTROLLER]))
    lines = through_the_nemesis(healthy, {"kind": "partition", "network": {
        "mode": "split",
        "groups": [[LEADER], [{"role": "follower", "mode": "all"}, {"role": "controller"}]]}},
        tmp_path)
    assert lines == [("partition", f"{lead}|{others}", "split", action)
                     for action in ("inject", "heal", "recover")]
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

        fault = build_fault(planned({"kind": "pod-delete", "target": LEADER}), cluster,
                            Nodes(victim), time_limit_s=30)
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
