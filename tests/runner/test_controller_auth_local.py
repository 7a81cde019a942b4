"""The controller channel of a real local cluster (the runner's local platform: a controller
and two brokers as processes): a forged registration is refused and moves nobody, the
run's secret opens it, and a flood of 20,000 pipelined metadata polls is refused past the
in-flight cap with the controller's memory bounded and no broker fenced."""

from __future__ import annotations

import asyncio
import json
import math
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from processes import needs_local_minibroker

from minibroker.rpc import RpcAuthenticationError, RpcClient, RpcError
from minibroker.rpc_auth import load_secret, new_secret
from undertow.platform.base import CONTROLLER
from undertow.platform.local import LocalPlatform, LocalPlatformConfig

pytestmark = needs_local_minibroker()

# Heartbeats every 200 ms unfence the brokers soon after they start. Kafka's own session
# timeout (9 s): what these tests hold is the cap, and a 1.5 s session fenced both brokers
# while three test workers, the flood and the controller shared two cores.
CLUSTER_CONFIG = {"broker.session.timeout.ms": "9000", "broker.heartbeat.interval.ms": "200"}
FLOOD = 20_000
CAP = 128  # listener.name.controller.max.in.flight.requests.per.connection's default
MAX_WAIT_S = 2.0  # controller.metadata.max.wait.ms's default: a poll's longest wait
RSS_GROWTH_MAX_KIB = 24 << 10


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlatform]:
    config = LocalPlatformConfig(workdir=tmp_path_factory.mktemp("auth"), brokers=2,
                                 broker_config=CLUSTER_CONFIG,
                                 controller_config=CLUSTER_CONFIG)
    with LocalPlatform(config) as running:
        yield running


def controller_address(platform: LocalPlatform) -> tuple[str, int]:
    """Where the controller itself listens (not a proxy): what a pod next to it would dial."""
    argv = platform._wired().argv[CONTROLLER]
    host, port = argv[argv.index("--listen") + 1].rsplit(":", 1)
    return host, int(port)


def advertised(platform: LocalPlatform) -> dict[int, tuple[str, int, int, bool]]:
    return {b["id"]: (b["host"], b["port"], b["broker_epoch"], b["fenced"])
            for b in platform.state(CONTROLLER)["brokers"]}


def fences(platform: LocalPlatform) -> list[dict[str, Any]]:
    page = platform.events(CONTROLLER, None, 0)
    return [e for e in page["events"] if e["type"] == "broker_fenced"]


def memory_kib(pid: int, field: str) -> int:
    """VmRSS (now) or VmHWM (the peak) of a process, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(field)


def raw_request(address: tuple[str, int], method: str, params: dict[str, Any]) -> Any:
    """One request on a fresh connection, without the handshake; the controller's answer."""
    with socket.create_connection(address, timeout=5) as sock, sock.makefile("rwb") as io:
        assert "challenge" in json.loads(io.readline())
        io.write(json.dumps({"id": 1, "method": method, "params": params}).encode() + b"\n")
        io.flush()
        return json.loads(io.readline())


async def call(address: tuple[str, int], secret: bytes, method: str,
               params: dict[str, Any]) -> Any:
    client = RpcClient(*address, secret=secret)
    try:
        return await client.call(method, params)
    finally:
        client.close()


def test_the_secret_is_in_a_file_of_the_owners_and_on_no_command_line(
        platform: LocalPlatform) -> None:
    path = platform.controller_secret_file
    assert path == platform.config.workdir / "controller.secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    secret = load_secret(path).decode()
    for node in platform.nodes:
        pid = platform.pid(node)
        assert secret not in Path(f"/proc/{pid}/cmdline").read_bytes().decode()


def test_a_forged_registration_is_refused_and_the_address_stays(platform: LocalPlatform) -> None:
    """The issue's reproduction against the running controller: register broker 0 at a
    foreign address (then heartbeat, then an ISR change) with no secret or another one."""
    before = advertised(platform)
    address = controller_address(platform)
    epoch = before[0][2]
    forged = [("register_broker", {"broker_id": 0, "incarnation_id": "forged",
                                   "host": "203.0.113.9", "port": 9092, "listeners": {}}),
              ("heartbeat", {"broker_id": 0, "broker_epoch": epoch + 1,
                             "metadata_offset": 10**9}),
              ("alter_partitions", {"broker_id": 0, "items": [
                  {"topic": "t", "partition": 0, "leader_epoch": 0, "partition_epoch": 0,
                   "new_isr": [0]}]})]
    for method, params in forged:  # no secret: requests as if nobody asked for one
        assert raw_request(address, method, params)["error"].startswith(
            "IllegalSaslStateException")
        with pytest.raises(RpcAuthenticationError, match="SaslAuthenticationException"):
            asyncio.run(call(address, new_secret().encode(), method, params))
    assert advertised(platform) == before
    assert all(not fenced for *_, fenced in before.values())
    log = (platform.config.workdir / "logs" / "controller.log").read_text()
    assert log.count("IllegalSaslStateException") >= len(forged)
    assert log.count("SaslAuthenticationException: authentication failed") >= len(forged)
    assert "'register_broker' on an unauthenticated connection" in log


def test_the_runs_secret_opens_the_channel(platform: LocalPlatform) -> None:
    secret = load_secret(platform.controller_secret_file)
    state = asyncio.run(call(controller_address(platform), secret, "state", {}))
    assert {b["id"] for b in state["brokers"]} == set(platform.broker_ids)


async def flood(address: tuple[str, int], secret: bytes, since: int) -> list[Any]:
    """FLOOD metadata polls pipelined on one connection, each asking to wait a minute. The
    connection and its handshake may take a loaded machine past the client's default 2 s
    (one refusal of a make test read "cannot connect"): what is measured is the cap."""
    client = RpcClient(*address, secret=secret, connect_timeout=60)
    try:
        return await asyncio.gather(*(
            # The answers come in turn, each refusal drained before the next request is read:
            # on two loaded cores the last of 20,000 took over 30 s.
            client.call("fetch_metadata", {"since": since, "wait_ms": 60_000}, timeout=180)
            for _ in range(FLOOD)), return_exceptions=True)
    finally:
        client.close()


def test_a_flood_of_metadata_polls_is_refused_past_the_cap_and_fences_nobody(
        platform: LocalPlatform) -> None:
    pid = platform.pid(CONTROLLER)
    assert pid is not None
    rss_before = memory_kib(pid, "VmRSS")
    before, fenced_before = advertised(platform), len(fences(platform))
    since = platform.state(CONTROLLER)["metadata_offset"]
    started = time.monotonic()
    answers = asyncio.run(flood(controller_address(platform),
                                load_secret(platform.controller_secret_file), since))
    flooded_s = time.monotonic() - started
    served = [a for a in answers if isinstance(a, dict)]
    refused = [a for a in answers if isinstance(a, RpcError)]
    # At most CAP at a time: the first CAP are served; a poll ends after the clamped wait
    # (controller.metadata.max.wait.ms, 2 s), when CAP more may be: on a machine slow to
    # send the flood, a batch every 2 s it took.
    assert len(served) + len(refused) == FLOOD
    batches = math.ceil(flooded_s / MAX_WAIT_S) + 1
    assert CAP <= len(served) <= CAP * batches, (len(served), flooded_s)
    assert refused
    assert {str(e).split(":")[0] for e in refused} == {"TooManyInFlightRequests"}, \
        sorted({str(e) for e in refused})[:5]
    # The peak, not just what is left: the flood never made the controller grow much.
    assert memory_kib(pid, "VmHWM") - rss_before < RSS_GROWTH_MAX_KIB
    assert advertised(platform) == before  # same epochs, none fenced
    assert len(fences(platform)) == fenced_before
    assert platform.state(CONTROLLER)["rpc"]["refused_requests"] >= len(refused)
