"""The fault agent: signals on a real process, iptables in real network namespaces (root),
deadlines that heal without anyone asking, and its HTTP API's refusals."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kube_helpers import AGENT_TOKEN, RunningAgent, Target, UnprivilegedNetfilter, can_use_netns
from processes import ON_SIGTERM, sigterm_lines

from undertow.kube.agent import (
    AgentClient,
    AgentError,
    FaultAgent,
    Hold,
    Netfilter,
    Processes,
    make_server,
)
from undertow.kube.agent.__main__ import main
from undertow.kube.agent.delays import Delays
from undertow.kube.agent.iptables_backend import choose_backend, iptables_command
from undertow.kube.agent.server import MAX_GRACE_S
from undertow.platform.base import wait_for
from undertow.platform.control import ControlClient, EndpointRefused
from undertow.platform.link_delay import LinkDelay
from undertow.spec.faults import MAX_KILL_GRACE_S

needs_root = pytest.mark.skipif(not can_use_netns(),
                                reason="network namespaces and iptables need root, ip and "
                                       "iptables (apt-get install -y iptables iproute2)")


def request(url: str, method: str, path: str, body: dict[str, Any] | None = None,
            token: str | None = AGENT_TOKEN) -> tuple[int, dict[str, Any]]:
    """The agent's answer as (HTTP status, JSON body), refusals included."""
    try:
        return 200, ControlClient(url, token, timeout_s=5).request(method, path, body)
    except EndpointRefused as refused:
        return refused.status, {"error": refused.detail}


def test_pause_heals_itself_at_its_deadline(target: Target) -> None:
    agent = FaultAgent(UnprivilegedNetfilter(), target.processes())
    agent.start()
    try:
        assert agent.pause(0.3) == [target.process.pid]
        assert target.state() == "T"
        assert agent.faults()["paused"] is True
        wait_for(lambda: target.state() != "T", 5, "the agent to resume at the deadline")
        assert agent.faults() == {"faults": [], "paused": False, "running": True}
    finally:
        agent.close()


def test_a_restarted_agent_resumes_what_its_predecessor_paused(target: Target) -> None:
    first = FaultAgent(UnprivilegedNetfilter(), target.processes())
    first.pause(600)
    assert target.state() == "T"
    second = FaultAgent(UnprivilegedNetfilter(), target.processes())
    second.start()  # the first one's deadlines died with it
    try:
        assert target.state() != "T"
    finally:
        second.close()


def test_the_api_refuses_what_it_cannot_do(agent: RunningAgent) -> None:
    url = agent.url
    assert request(url, "GET", "/healthz", token=None) == (200, {"ok": True})
    assert request(url, "GET", "/v1/faults", token="wrong") == (
        401, {"error": "missing or wrong bearer token"})
    for deadline in (0, -1, "10", True, 3601):
        status, body = request(url, "POST", "/v1/pause", {"deadline_s": deadline})
        assert status == 400 and "deadline_s must be a number" in body["error"], deadline
    assert request(url, "PUT", "/v1/drops/input/not-an-ip", {"deadline_s": 1}) == (
        400, {"error": "'not-an-ip' is not an IP address"})
    assert request(url, "PUT", "/v1/drops/input/fd00::1", {"deadline_s": 1})[0] == 400
    assert request(url, "PUT", "/v1/drops/sideways/10.0.0.1", {"deadline_s": 1})[0] == 404
    assert request(url, "POST", "/v1/nothing", {})[0] == 404
    for grace in (-1, "5", True, None, MAX_GRACE_S + 1):
        status, body = request(url, "POST", "/v1/kill", {"deadline_s": 10, "grace_s": grace})
        assert (status, body) == (400, {"error": f"grace_s must be a number in [0, 300], "
                                                 f"got {grace!r}"}), grace
    assert agent.agent.faults() == {"faults": [], "paused": False, "running": True}


def test_pause_without_a_target_process_is_a_conflict(tmp_path: Path) -> None:
    marker = f"no-such-{uuid.uuid4().hex}"
    pid_file = tmp_path / "broker.pid"
    agent = FaultAgent(UnprivilegedNetfilter(), Processes(marker, pid_file))
    server = make_server(agent, "127.0.0.1", 0, AGENT_TOKEN)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        client = AgentClient(f"http://127.0.0.1:{server.server_address[1]}", AGENT_TOKEN)
        with pytest.raises(EndpointRefused) as caught:
            client.pause(5)
        assert (caught.value.status, caught.value.detail) == (
            409, f"no process matches {marker!r}: {pid_file} does not exist (the broker has "
                 "not started)")
    finally:
        server.shutdown()
        server.server_close()


def test_the_agent_needs_its_token(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("UNDERTOW_AGENT_TOKEN", raising=False)
    assert main(["--listen", "127.0.0.1:0", "--pid-file", str(tmp_path / "pid")]) == 2
    assert "$UNDERTOW_AGENT_TOKEN is not set" in capsys.readouterr().err


# ---- iptables in real network namespaces ----------------------------------------------------


@needs_root
def test_a_delayed_link_holds_real_packets_until_the_deadline(
        two_namespaces: tuple[str, str], target: Target) -> None:
    """200 ms on the packets B receives from A: a connection from A takes 200 ms, within
    20 %, until the deadline heals it; then the rule and the delayer are gone."""
    a, b = two_namespaces
    with agent_beside_server(a, b, 9556, target) as agent:
        agent.delay("input", "10.213.7.1", LinkDelay(0.2), deadline_s=4.0)
        assert any("NFQUEUE" in rule for rule in agent.netfilter.rules())
        assert 0.16 <= connect_s(a, "10.213.7.2", 9556) <= 0.24
        wait_for(lambda: connect_s(a, "10.213.7.2", 9556) < 0.05, 10,
                 "the delay to end at the agent's deadline")
        assert agent.faults()["faults"] == []
        assert agent.netfilter.rules() == ["-N UNDERTOW-INPUT", "-N UNDERTOW-OUTPUT"]


def test_a_delayer_process_loads_nothing_of_undertow_but_the_link_delay() -> None:
    """An isolated node's agent runs a delayer for each of its peers, all within the agent
    container's memory limit (``JobSettings.agent_resources``): each one loads the link
    delay and nothing else of Undertow (the platform's base doubled a delayer's memory and
    got the agent of a 5-broker cluster's leader OOM-killed)."""
    listing = ("import sys, undertow.platform.nfqueue_delay\n"
               "print(*sorted(m for m in sys.modules if m.startswith('undertow')))")
    assert sh(sys.executable, "-c", listing).stdout.split() == [
        "undertow", "undertow.platform", "undertow.platform.link_delay",
        "undertow.platform.nfqueue_delay"]


@contextlib.contextmanager
def agent_beside_server(a: str, b: str, port: int, target: Target) -> Iterator[FaultAgent]:
    """A started fault agent whose rules and delayers are in namespace ``b``, beside a
    server there that accepts (and closes) every connection on ``port``, reachable from
    ``a``."""
    server = subprocess.Popen(
        ["ip", "netns", "exec", b, sys.executable, "-c",
         f"import socket\ns = socket.create_server(('0.0.0.0', {port}))\n"
         "while True: s.accept()[0].close()"])
    agent = FaultAgent(Netfilter(("ip", "netns", "exec", b, "iptables", "-w")),
                       target.processes(), delays=Delays(("ip", "netns", "exec", b)))
    try:
        agent.start()
        wait_for(lambda: connects(a, "10.213.7.2", port), 10, "the server in B")
        yield agent
    finally:
        agent.close()
        server.kill()
        server.wait()


def connect_s(namespace: str, host: str, port: int) -> float:
    """Seconds a connection from ``namespace`` takes to be set up (median of five)."""
    probe = ("import socket,statistics,sys,time\nts=[]\nfor _ in range(5):\n"
             " t=time.monotonic()\n"
             " socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()\n"
             " ts.append(time.monotonic()-t)\nprint(statistics.median(ts))")
    return float(sh("ip", "netns", "exec", namespace, sys.executable, "-c", probe, host,
                    str(port)).stdout)


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check)


@pytest.fixture
def two_namespaces() -> Iterator[tuple[str, str]]:
    """Namespaces A (10.213.7.1) and B (10.213.7.2) joined by a veth pair, nothing else."""
    tag = uuid.uuid4().hex[:6]
    a, b = f"ut-a-{tag}", f"ut-b-{tag}"
    sh("ip", "netns", "add", a)
    sh("ip", "netns", "add", b)
    try:
        sh("ip", "-n", a, "link", "add", "va", "type", "veth", "peer", "name", "vb",
           "netns", b)
        for ns, dev, address in ((a, "va", "10.213.7.1/24"), (b, "vb", "10.213.7.2/24")):
            sh("ip", "-n", ns, "addr", "add", address, "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        yield a, b
    finally:
        sh("ip", "netns", "delete", a, check=False)
        sh("ip", "netns", "delete", b, check=False)


def connects(namespace: str, host: str, port: int) -> bool:
    probe = ("import socket,sys\ntry:\n socket.create_connection((sys.argv[1], int(sys.argv[2])),"
             " timeout=0.5).close()\nexcept OSError:\n sys.exit(1)")
    return sh("ip", "netns", "exec", namespace, sys.executable, "-c", probe, host, str(port),
              check=False).returncode == 0


@needs_root
def test_netfilter_rules_live_in_the_agents_own_chains(netns: str) -> None:
    netfilter = Netfilter(("ip", "netns", "exec", netns, "iptables", "-w"))
    netfilter.setup()
    netfilter.setup()  # idempotent: one jump per chain, not two
    listing = sh("ip", "netns", "exec", netns, "iptables", "-w", "-S").stdout
    assert listing.count("-A INPUT -j UNDERTOW-INPUT") == 1
    assert listing.count("-A OUTPUT -j UNDERTOW-OUTPUT") == 1
    netfilter.drop("input", "10.1.2.3")
    netfilter.drop("input", "10.1.2.3")
    netfilter.drop("output", "10.1.2.4")
    assert netfilter.rules() == ["-N UNDERTOW-INPUT",
                                 "-A UNDERTOW-INPUT -s 10.1.2.3/32 -j DROP",
                                 "-N UNDERTOW-OUTPUT",
                                 "-A UNDERTOW-OUTPUT -d 10.1.2.4/32 -j DROP"]
    netfilter.undrop("input", "10.1.2.3")
    netfilter.undrop("input", "10.1.2.3")  # already gone: fine
    assert netfilter.rules() == ["-N UNDERTOW-INPUT", "-N UNDERTOW-OUTPUT",
                                 "-A UNDERTOW-OUTPUT -d 10.1.2.4/32 -j DROP"]
    netfilter.flush()
    assert netfilter.rules() == ["-N UNDERTOW-INPUT", "-N UNDERTOW-OUTPUT"]


@needs_root
def test_a_dropped_link_cuts_real_packets_until_the_deadline(
        two_namespaces: tuple[str, str], target: Target) -> None:
    a, b = two_namespaces
    with agent_beside_server(a, b, 9555, target) as agent:
        agent.drop("input", "10.213.7.1", deadline_s=2.0)
        started = time.monotonic()
        assert not connects(a, "10.213.7.2", 9555)
        wait_for(lambda: connects(a, "10.213.7.2", 9555), 10,
                 "the link to heal at the agent's deadline")
        assert time.monotonic() - started >= 1.0
        assert agent.faults()["faults"] == []
        assert agent.netfilter.rules() == ["-N UNDERTOW-INPUT", "-N UNDERTOW-OUTPUT"]


def test_the_iptables_back_end_follows_the_rules_already_there() -> None:
    assert choose_backend({"nft": 0, "legacy": 0}) == "nft"
    assert choose_backend({"nft": 2, "legacy": 5}) == "legacy"
    assert choose_backend({"nft": 5, "legacy": 5}) == "nft"
    assert choose_backend({"nft": None, "legacy": 0}) == "legacy"
    assert choose_backend({"nft": 0, "legacy": None}) == "nft"
    assert choose_backend({"nft": 9, "legacy": None}, override="legacy") == "legacy"
    with pytest.raises(AgentError, match="neither iptables-nft nor iptables-legacy works"):
        choose_backend({"nft": None, "legacy": None})
    with pytest.raises(AgentError, match=r"\$UNDERTOW_IPTABLES='ipfw': expected nft or legacy"):
        choose_backend({"nft": 0, "legacy": 0}, override="ipfw")
    assert iptables_command({}, {"iptables-nft": 0, "iptables-legacy": 3}.get) == (
        "iptables-legacy", "-w", "5")  # waits for the xtables lock, 5 s at most


@needs_root
def test_the_iptables_back_end_is_read_from_a_real_network_namespace(netns: str) -> None:
    """A namespace whose rules are in the legacy tables makes the agent use legacy too."""
    probe = [sys.executable, "-c",
             "from undertow.kube.agent import iptables_command as c; print(c()[0])"]
    for tool in ("iptables-legacy", "iptables-nft"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    empty = subprocess.run(["ip", "netns", "exec", netns, *probe], capture_output=True,
                           text=True, check=True)
    assert empty.stdout.strip() == "iptables-nft"
    subprocess.run(["ip", "netns", "exec", netns, "iptables-legacy", "-A", "INPUT",
                    "-s", "192.0.2.1/32", "-j", "DROP"], check=True)
    try:
        legacy = subprocess.run(["ip", "netns", "exec", netns, *probe], capture_output=True,
                                text=True, check=True)
        assert legacy.stdout.strip() == "iptables-legacy"
    finally:
        subprocess.run(["ip", "netns", "exec", netns, "iptables-legacy", "-F", "INPUT"],
                       check=False)


def test_a_kill_holds_the_target_down_until_release_or_its_deadline(target: Target,
                                                                    tmp_path: Path) -> None:
    """SIGKILL in place; the hold file tells the container's launcher to wait, and goes
    away on release, at the deadline, or when a new agent starts."""
    hold_file = tmp_path / "hold"
    agent = FaultAgent(UnprivilegedNetfilter(), target.processes(), Hold(hold_file))
    agent.start()
    try:
        assert agent.kill(30) == [target.process.pid]
        assert target.process.wait(5) == -signal.SIGKILL
        assert Hold(hold_file).active()
        assert int(hold_file.read_text()) >= time.time() + 29
        assert agent.faults()["running"] is False
        assert [f["kind"] for f in agent.faults()["faults"]] == ["kill"]
        agent.release()
        assert not hold_file.exists() and agent.faults()["faults"] == []

        second = Target()
        try:
            agent.processes = second.processes()
            agent.kill(0.3)
            wait_for(lambda: not hold_file.exists(), 5, "the hold to end at its deadline")
        finally:
            second.close()
        with pytest.raises(AgentError, match="no process matches") as refused:
            agent.kill(30)
        assert refused.value.status == 409 and not hold_file.exists()
    finally:
        agent.close()


def sigterm_target(record: Path, then: str) -> Target:
    """A target that notes each SIGTERM in ``record``, then exits cleanly (``exit``) or
    goes on (``stay``); returned once its handler is in place."""
    target = Target(ON_SIGTERM, str(record), then)
    try:
        wait_for(lambda: sigterm_lines(record) == ["ready"], 10, "the SIGTERM handler")
    except BaseException:
        target.close()
        raise
    return target


def test_a_kill_with_a_grace_period_is_sigterm_then_a_clean_exit(tmp_path: Path) -> None:
    """SIGTERM first; a target that exits on it is not SIGKILLed, and the kill answers as
    soon as it is gone, not at the end of the grace period."""
    record = tmp_path / "sigterm"
    target = sigterm_target(record, "exit")
    try:
        started = time.monotonic()
        assert target.processes().kill(grace_s=60) == [target.process.pid]
        assert time.monotonic() - started < 30
        assert target.process.wait(5) == 0
        assert sigterm_lines(record) == ["ready", "sigterm"]
    finally:
        target.close()


def test_a_kill_with_a_grace_period_sigkills_a_target_still_running_after_it(
        tmp_path: Path) -> None:
    record = tmp_path / "sigterm"
    target = sigterm_target(record, "stay")
    try:
        assert target.processes().kill(grace_s=1) == [target.process.pid]
        assert target.process.wait(5) == -signal.SIGKILL
        assert sigterm_lines(record) == ["ready", "sigterm"]
    finally:
        target.close()


def test_a_kill_without_a_grace_period_is_sigkill_at_once(tmp_path: Path) -> None:
    record = tmp_path / "sigterm"
    target = sigterm_target(record, "exit")
    try:
        target.processes().kill()
        assert target.process.wait(5) == -signal.SIGKILL
        assert sigterm_lines(record) == ["ready"]
    finally:
        target.close()


def test_a_kill_through_the_api_takes_its_grace_period_and_holds_the_target_down(
        tmp_path: Path) -> None:
    record, hold_file = tmp_path / "sigterm", tmp_path / "hold"
    target = sigterm_target(record, "exit")
    agent = FaultAgent(UnprivilegedNetfilter(), target.processes(), Hold(hold_file))
    server = make_server(agent, "127.0.0.1", 0, AGENT_TOKEN)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        client = AgentClient(f"http://127.0.0.1:{server.server_address[1]}", AGENT_TOKEN)
        client.kill(30, grace_s=20)
        assert target.process.wait(5) == 0
        assert sigterm_lines(record) == ["ready", "sigterm"]
        assert Hold(hold_file).active()
        assert [f["kind"] for f in agent.faults()["faults"]] == ["kill"]
        client.release()
        assert not hold_file.exists() and agent.faults()["faults"] == []
    finally:
        server.shutdown()
        server.server_close()
        agent.close()
        target.close()


def test_the_agent_bounds_a_kills_grace_period_as_the_spec_does() -> None:
    assert MAX_GRACE_S == MAX_KILL_GRACE_S


def sleeping_children(pid: int) -> set[int]:
    """The pids of ``pid``'s ``sleep`` children, from /proc: the launcher's wait loop runs
    one ``sleep 0.2`` per look at its hold file."""
    found: set[int] = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            raw = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        comm = raw[raw.index("(") + 1:raw.rindex(")")]
        if comm == "sleep" and int(raw[raw.rindex(")") + 2:].split()[1]) == pid:
            found.add(int(stat.parent.name))
    return found


def test_the_launcher_waits_on_the_hold_file_and_its_deadline(tmp_path: Path) -> None:
    """The broker container's own launcher (``cluster_objects._LAUNCHER``) run by a real sh.
    Its waiting is seen in /proc (two rounds of its wait loop: it looked at the hold again
    and kept waiting) under a hold far longer than the test; the deadline is checked
    against the deadline written in the hold file, not against a guess of how long
    anything takes."""
    from undertow.kube.cluster_objects import _LAUNCHER

    hold_file, config = tmp_path / "hold", tmp_path / "config"
    config.mkdir()
    (config / "server.properties").write_text("min.insync.replicas=2\n")
    script = _LAUNCHER.format(hold_file=hold_file, config_dir=config,
                              pid_file=tmp_path / "broker.pid", role="--version")
    script = script.replace("exec minibroker", "exec echo started")
    hold = Hold(hold_file)
    hold.set(600)
    seen: set[int] = set()
    with subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, text=True) as held:

        def waited_twice() -> bool:
            seen.update(sleeping_children(held.pid))
            return len(seen) >= 2

        try:
            wait_for(waited_twice, 30, "the launcher to go round its wait loop twice")
            assert held.poll() is None  # still waiting
            hold.clear()
            out, _ = held.communicate(timeout=30)
        finally:
            held.kill()
    assert out.split() == ["started", "--version", "--config", "min.insync.replicas=2"]

    hold.set(1)  # a hold nobody releases ends at its deadline
    deadline = int(hold_file.read_text())
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True,
                         timeout=30).stdout
    assert out.startswith("started")
    assert time.time() >= deadline and hold_file.exists()


def test_a_held_restart_leaves_the_target_running_until_it_halts(target: Target,
                                                                  tmp_path: Path) -> None:
    """disk-full: the restart is held without a kill (the broker halts by itself on its
    failed log directory); the hold ends on release or at its deadline."""
    hold_file = tmp_path / "hold"
    agent = FaultAgent(UnprivilegedNetfilter(), target.processes(), Hold(hold_file))
    agent.start()
    try:
        agent.hold_restart(30)
        assert Hold(hold_file).active() and agent.faults()["running"] is True
        assert [f["kind"] for f in agent.faults()["faults"]] == ["hold"]
        agent.release()
        assert not hold_file.exists() and agent.faults()["faults"] == []
        agent.hold_restart(0.3)
        wait_for(lambda: not hold_file.exists(), 5, "the hold to end at its deadline")
        assert target.process.poll() is None
    finally:
        agent.close()
