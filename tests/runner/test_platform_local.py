"""The local platform's lifecycle on real minibroker processes, in both network modes."""

from __future__ import annotations

import ipaddress
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from planned_faults import planned
from processes import ON_SIGTERM, needs_local_minibroker, sigterm_lines

from minibroker.storage.clean_shutdown import CLEAN_SHUTDOWN_FILE
from undertow.faults import Nodes, build_fault
from undertow.platform import netns
from undertow.platform.base import CONTROLLER, Link, PlatformError, broker_id_of, wait_for
from undertow.platform.local import LocalPlatform, LocalPlatformConfig, default_command
from undertow.platform.process import ChildProcess, Spawner
from undertow.platform.procfs import alive

needs_minibroker = needs_local_minibroker()
needs_netns = pytest.mark.skipif(netns.unavailable_reason() is not None,
                                 reason=str(netns.unavailable_reason()))
FAST = {"replica.lag.time.max.ms": "1000", "broker.session.timeout.ms": "1500",
        "broker.heartbeat.interval.ms": "200"}


@pytest.mark.parametrize(("field", "value", "message"), [
    ("brokers", 0, "brokers: must be a positive integer"),
    ("network", "carrier-pigeon", "network: must be one of proxy, netns"),
    ("first_broker_id", -1, "first_broker_id: must be a non-negative integer"),
    ("start_timeout_s", 0, "start_timeout_s: must be positive"),
])
def test_bad_config_names_the_field(tmp_path: Path, field: str, value: object,
                                    message: str) -> None:
    with pytest.raises(PlatformError, match=message):
        LocalPlatformConfig(workdir=tmp_path, **{field: value})


def test_an_unstarted_platform_refuses_politely(tmp_path: Path) -> None:
    platform = LocalPlatform(LocalPlatformConfig(workdir=tmp_path, brokers=2))
    assert platform.nodes == (CONTROLLER, "broker-0", "broker-1")
    assert platform.endpoints[-1] == "client"
    with pytest.raises(PlatformError, match="not started"):
        platform.bootstrap  # noqa: B018
    with pytest.raises(PlatformError, match="unknown node 'broker-7'"):
        platform.kill("broker-7")
    platform.stop()  # safe before start


@pytest.mark.parametrize(("grace_s", "then", "status", "seen"), [
    (60.0, "exit", 0, ["ready", "sigterm"]),  # a clean shutdown, well within the grace
    (1.0, "stay", -signal.SIGKILL, ["ready", "sigterm"]),  # still running after it
    (0.0, "exit", -signal.SIGKILL, ["ready"]),  # no grace: SIGKILL at once
])
def test_kill_with_a_grace_period_sends_sigterm_first(
        tmp_path: Path, grace_s: float, then: str, status: int, seen: list[str]) -> None:
    """The node's process is a stand-in that notes each SIGTERM (the platform is not
    started: the kill is all that runs). It stays down after the kill, as after any."""
    platform = LocalPlatform(LocalPlatformConfig(workdir=tmp_path, brokers=1))
    record, spawner = tmp_path / "sigterm", Spawner()
    process = ChildProcess("broker-0", [sys.executable, "-c", ON_SIGTERM, str(record), then],
                           log_path=tmp_path / "broker-0.log", spawner=spawner)
    platform._processes["broker-0"] = process
    try:
        process.start()
        wait_for(lambda: sigterm_lines(record) == ["ready"], 10, "the SIGTERM handler")
        started = time.monotonic()
        platform.kill("broker-0", grace_period_s=grace_s)
        assert time.monotonic() - started < 30
        assert not platform.is_running("broker-0")
        assert process.returncode == status
        assert sigterm_lines(record) == seen
    finally:
        process.kill()
        spawner.close()


@needs_minibroker
def test_failed_start_reports_the_log_and_leaves_nothing(tmp_path: Path) -> None:
    platform = LocalPlatform(LocalPlatformConfig(
        workdir=tmp_path, brokers=1, broker_config={"no.such.key": "1"}))
    with pytest.raises(PlatformError, match=r"broker-0 exited with status \d+ while starting"
                                            r"(.|\n)*no.such.key"):
        platform.start()
    pid = platform.pid(CONTROLLER)
    assert pid is not None and not alive(pid)
    assert not platform.is_running(CONTROLLER)


@needs_minibroker
def test_stop_ends_processes_proxies_and_guardian(tmp_path: Path) -> None:
    platform = LocalPlatform(LocalPlatformConfig(workdir=tmp_path, brokers=2))
    with platform:
        pids = [platform.pid(node) for node in platform.nodes]
        guardian = platform.guardian_pid
        client_proxy = platform.proxies.address(Link("client", "broker-0"))
        assert platform.bootstrap.split(",")[0] == "{}:{}".format(*client_proxy)
        state = platform.state("broker-0")
        assert state["broker_id"] == 0
        brokers = platform.state(CONTROLLER)["brokers"]
        # Clients learn the client-side proxies, never the brokers' own listeners.
        assert {(b["host"], b["port"]) for b in brokers} == {
            platform.proxies.address(Link("client", node)) for node in platform.brokers}
        assert (tmp_path / "data" / "broker-1").is_dir()
    assert not any(alive(pid) for pid in [*pids, guardian])
    # The brokers stopped before the controller: their controlled shutdowns were answered
    # and each ended cleanly (within the grace period, not SIGKILLed).
    for broker in platform.brokers:
        assert (tmp_path / "data" / broker / CLEAN_SHUTDOWN_FILE).is_file(), broker
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(client_proxy, timeout=2)
    with pytest.raises(PlatformError, match="platform is stopped"):
        platform.restart("broker-0")
    platform.stop()  # idempotent


@needs_minibroker
@needs_netns
def test_netns_mode_partitions_with_iptables(tmp_path: Path) -> None:
    config = LocalPlatformConfig(workdir=tmp_path, brokers=3, network="netns",
                                 broker_config=FAST, controller_config=FAST)
    with LocalPlatform(config) as platform:
        namespaces = platform.namespaces
        bootstrap = platform.bootstrap.split(",")[0]
        assert ipaddress.ip_address(bootstrap.split(":")[0]) in namespaces.subnet
        subprocess.run([*default_command(), "topics", "create", "--bootstrap", bootstrap,
                        "--topic", "t", "--partitions", "1", "--replication-factor", "3"],
                       check=True, capture_output=True, timeout=30)

        def registration() -> dict:
            return platform.state(CONTROLLER)["topics"]["t"]["partitions"]["0"]

        wait_for(lambda: len(registration()["isr"]) == 3, 20, "the full ISR", interval=0.1,
                 ignore=(KeyError,))
        reg = registration()
        follower = next(f"broker-{b}" for b in reg["replicas"] if b != reg["leader"])
        fault = build_fault(planned({"kind": "partition", "target": {"role": "follower"}}),
                            platform, Nodes(follower), time_limit_s=60)
        fault.inject()
        try:
            rules = namespaces.rules(follower)
            controller_ip = namespaces.address(CONTROLLER)
            assert f"-A INPUT -s {controller_ip}/32 -j DROP" in rules
            wait_for(lambda: broker_id_of(follower) not in registration()["isr"], 20,
                     f"{follower} to leave the ISR", interval=0.1)
        finally:
            fault.recover()
        assert "DROP" not in namespaces.rules(follower)
        wait_for(lambda: broker_id_of(follower) in registration()["isr"], 20,
                 f"{follower} to rejoin the ISR", interval=0.1)
        names = [namespaces.namespace(node) for node in platform.nodes]
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in listing for name in names)
