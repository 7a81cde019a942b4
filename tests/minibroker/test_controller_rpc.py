"""The controller channel on real sockets: the handshake over the cluster's secret (only a
peer that holds it is served, and the controller proves it holds it too), and the bounds on
what one peer can make the controller hold (connections, requests in flight, line length,
how long a metadata poll waits). The controller runs in this test's event loop; the same
channel between real processes is in ``tests/runner/test_controller_auth_local.py``."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from minibroker.controller.server import ControllerServer
from minibroker.rpc import RpcAuthenticationError, RpcClient, RpcError, RpcLimits, RpcServer
from minibroker.rpc_auth import (
    CLIENT,
    MECHANISM,
    AuthenticationError,
    load_secret,
    new_nonce,
    new_secret,
    proof,
    write_secret_file,
)

pytestmark = pytest.mark.asyncio

SECRET = new_secret().encode()
FOREIGN = ("203.0.113.9", 9092)


@pytest_asyncio.fixture
async def controller(tmp_path: Path) -> AsyncIterator[ControllerServer]:
    server = ControllerServer(tmp_path / "controller", {
        "listener.name.controller.max.connections": "4",
        "listener.name.controller.max.in.flight.requests.per.connection": "8",
        "listener.name.controller.socket.request.max.bytes": "4096",
        "controller.metadata.max.wait.ms": "300",
    }, SECRET)
    await server.start("127.0.0.1", 0, None)
    try:
        yield server
    finally:
        await server.stop()


async def connect(server: ControllerServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter,
                                                    dict[str, Any]]:
    """A raw connection and the controller's first line (its challenge)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.rpc.port)
    first = json.loads(await asyncio.wait_for(reader.readline(), 5))
    return reader, writer, first


async def send(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    writer.write(json.dumps(message).encode() + b"\n")
    await writer.drain()


async def answer(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next line as JSON; None once the controller closed the connection."""
    line = await asyncio.wait_for(reader.readline(), 5)
    return json.loads(line) if line else None


async def authenticated(server: ControllerServer) -> tuple[asyncio.StreamReader,
                                                           asyncio.StreamWriter]:
    reader, writer, first = await connect(server)
    server_nonce, client_nonce = first["challenge"]["nonce"], new_nonce()
    await send(writer, {"id": 0, "method": "authenticate", "params": {
        "mechanism": MECHANISM, "nonce": client_nonce,
        "proof": proof(SECRET, CLIENT, server_nonce, client_nonce)}})
    assert "result" in await answer(reader)
    return reader, writer


def register(broker_id: int, host: str, port: int) -> dict[str, Any]:
    return {"broker_id": broker_id, "incarnation_id": f"inc-{broker_id}-{host}", "host": host,
            "port": port, "listeners": {}}


def registrations(server: ControllerServer) -> dict[int, tuple[str, int, bool]]:
    return {b["id"]: (b["host"], b["port"], b["fenced"]) for b in server.state()["brokers"]}


async def test_a_broker_with_the_secret_registers_and_heartbeats(
        controller: ControllerServer) -> None:
    client = RpcClient("127.0.0.1", controller.rpc.port, secret=SECRET)
    try:
        epoch = (await client.call("register_broker", register(2, "127.0.0.1", 9092)))[
            "broker_epoch"]
        beat = await client.call("heartbeat", {"broker_id": 2, "broker_epoch": epoch,
                                               "metadata_offset": 10**9})
        assert beat == {"error": "none", "is_fenced": False, "should_shut_down": False}
    finally:
        client.close()
    assert registrations(controller) == {2: ("127.0.0.1", 9092, False)}


@pytest.mark.parametrize("secret", [None, new_secret().encode()], ids=["none", "wrong"])
async def test_a_forged_registration_is_refused_logged_and_changes_nothing(
        controller: ControllerServer, caplog: pytest.LogCaptureFixture,
        secret: bytes | None) -> None:
    """The issue's reproduction: register_broker for broker 2 at a foreign address, then a
    heartbeat. Without the secret, or with another, neither gets an answer but a refusal,
    and the controller still advertises broker 2 where it registered itself."""
    genuine = RpcClient("127.0.0.1", controller.rpc.port, secret=SECRET)
    epoch = (await genuine.call("register_broker", register(2, "127.0.0.1", 9092)))[
        "broker_epoch"]
    await genuine.call("heartbeat", {"broker_id": 2, "broker_epoch": epoch,
                                     "metadata_offset": 10**9})
    before = registrations(controller)
    caplog.set_level(logging.WARNING, "minibroker.rpc")
    if secret is None:  # a peer that sends its requests as if nobody asked
        reader, writer, first = await connect(controller)
        assert first["challenge"]["mechanism"] == MECHANISM
        await send(writer, {"id": 1, "method": "register_broker",
                            "params": register(2, *FOREIGN)})
        await send(writer, {"id": 2, "method": "heartbeat", "params": {
            "broker_id": 2, "broker_epoch": epoch + 1, "metadata_offset": 10**9}})
        refusal = await answer(reader)
        assert refusal["id"] == 1 and refusal["error"].startswith("IllegalSaslStateException")
        assert await answer(reader) is None  # closed: the heartbeat was never read
        writer.close()
    else:
        forger = RpcClient("127.0.0.1", controller.rpc.port, secret=secret)
        for method, params in (("register_broker", register(2, *FOREIGN)),
                               ("alter_partitions", {"broker_id": 2, "items": []})):
            with pytest.raises(RpcAuthenticationError, match="SaslAuthenticationException"):
                await forger.call(method, params)
        forger.close()
    assert registrations(controller) == before == {2: ("127.0.0.1", 9092, False)}
    refused = [r.getMessage() for r in caplog.records if "Refused a request" in r.getMessage()]
    assert refused and all("127.0.0.1" in line for line in refused)
    assert ("'register_broker' on an unauthenticated connection" in refused[0]) == \
        (secret is None)
    assert controller.state()["rpc"]["failed_authentications"] == len(refused)
    genuine.close()


async def test_a_recorded_proof_does_not_open_another_connection(
        controller: ControllerServer) -> None:
    """The server's nonce differs on every connection: a proof seen on the wire once is
    useless to whoever replays it."""
    reader, writer, first = await connect(controller)
    client_nonce = new_nonce()
    recorded = {"id": 0, "method": "authenticate", "params": {
        "mechanism": MECHANISM, "nonce": client_nonce,
        "proof": proof(SECRET, CLIENT, first["challenge"]["nonce"], client_nonce)}}
    await send(writer, recorded)
    assert "result" in await answer(reader)
    writer.close()
    reader, writer, second = await connect(controller)
    assert second["challenge"]["nonce"] != first["challenge"]["nonce"]
    await send(writer, recorded)
    assert (await answer(reader))["error"].startswith("SaslAuthenticationException")
    writer.close()


async def test_a_client_trusts_only_a_controller_that_proves_it_holds_the_secret() -> None:
    """A stand-in controller that accepts any proof, as one without the secret must, cannot
    prove it holds the secret: the broker's client refuses it before sending anything."""
    received: list[bytes] = []

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(json.dumps({"challenge": {"mechanism": MECHANISM,
                                               "nonce": new_nonce()}}).encode() + b"\n")
        received.append(await reader.readline())
        writer.write(json.dumps({"id": 0, "result": {"proof": "00" * 32}}).encode() + b"\n")
        received.append(await reader.readline())
        writer.close()

    server = await asyncio.start_server(impostor, "127.0.0.1", 0)
    client = RpcClient("127.0.0.1", server.sockets[0].getsockname()[1], secret=SECRET)
    try:
        with pytest.raises(RpcAuthenticationError, match="did not prove"):
            await client.call("fetch_metadata", {})
    finally:
        client.close()
        server.close()
    assert json.loads(received[0])["method"] == "authenticate"
    assert SECRET.decode() not in received[0].decode()  # the secret never crosses the wire
    assert received[1:] in ([], [b""])  # and nothing after the handshake


async def test_requests_past_the_in_flight_cap_are_refused_at_once(tmp_path: Path) -> None:
    """2,000 pipelined metadata polls on one connection: 8 (the cap) wait, every other one is
    refused at once with an error; the connection stays usable. The polls may wait a minute,
    so the 8 end only when the metadata changes, whatever the machine's speed: none ends by
    its wait while the rest are still being read (which would free a slot)."""
    server = ControllerServer(tmp_path / "controller", {
        "listener.name.controller.max.in.flight.requests.per.connection": "8",
        "controller.metadata.max.wait.ms": "60000",
    }, SECRET)
    await server.start("127.0.0.1", 0, None)
    try:
        reader, writer = await authenticated(server)
        since = server.controller.metadata_offset
        writer.write(b"".join(json.dumps({"id": i, "method": "fetch_metadata", "params": {
            "since": since, "wait_ms": 60_000}}).encode() + b"\n" for i in range(2000)))
        await writer.drain()
        refused = [await answer(reader) for _ in range(1992)]
        assert all(a["error"].startswith("TooManyInFlightRequests") for a in refused)
        assert server.state()["rpc"]["refused_requests"] == 1992
        server.controller.register_broker(1, "inc-1", "127.0.0.1", 9001)
        served = [await answer(reader) for _ in range(8)]
        assert all("result" in a for a in served)
        await send(writer, {"id": "again", "method": "state"})
        assert (await answer(reader))["result"]["rpc"]["connections"] == 1
        writer.close()
    finally:
        await server.stop()


async def test_a_metadata_poll_waits_no_longer_than_the_bound(
        controller: ControllerServer) -> None:
    client = RpcClient("127.0.0.1", controller.rpc.port, secret=SECRET)
    loop = asyncio.get_running_loop()
    try:
        since = controller.controller.metadata_offset
        started = loop.time()
        image = await client.call("fetch_metadata", {"since": since, "wait_ms": 3_600_000},
                                  timeout=10)
        waited = loop.time() - started
        assert image["metadata_offset"] == since
        assert 0.25 <= waited < 3  # controller.metadata.max.wait.ms=300, not an hour
        with pytest.raises(RpcError, match="wait_ms: expected an integer"):
            await client.call("fetch_metadata", {"since": since, "wait_ms": "forever"})
    finally:
        client.close()


async def test_a_call_cancelled_as_its_connection_drops_ends_cancelled() -> None:
    """The caller is cancelled in the same turn of the loop as its connection drops (a
    broker's stop cancelling its metadata poll as the controller connection goes). The call
    ends cancelled, not with the lost connection's ``RpcError``: the broker's metadata loop
    and heartbeats retry on that error, and would carry on after their stop."""
    asked = asyncio.Event()

    async def never_answers(_params: dict[str, Any]) -> None:
        asked.set()
        await asyncio.Event().wait()

    server = RpcServer({"hold": never_answers}, secret=SECRET, limits=RpcLimits(
        max_connections=4, max_in_flight_per_connection=4, max_request_bytes=4096))
    await server.start("127.0.0.1", 0)
    client = RpcClient("127.0.0.1", server.port, secret=SECRET)
    try:
        call = asyncio.create_task(client.call("hold", timeout=60))
        await asyncio.wait_for(asked.wait(), 5)
        client.close()
        call.cancel()
        await asyncio.wait([call], timeout=5)
        assert call.cancelled(), call
    finally:
        await client.aclose()
        await server.stop()


async def test_a_closed_client_fails_its_calls_instead_of_connecting_again(
        controller: ControllerServer) -> None:
    client = RpcClient("127.0.0.1", controller.rpc.port, secret=SECRET)
    assert "brokers" in await client.call("state")
    await client.aclose()
    with pytest.raises(RpcError, match="is closed"):
        await client.call("state")


async def test_a_controller_too_slow_to_greet_is_named_with_the_timeout() -> None:
    """A connection whose handshake does not come within the connect timeout says so (the
    message once ended in an empty string: a TimeoutError prints as nothing)."""
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = RpcClient("127.0.0.1", port, secret=SECRET, connect_timeout=0.2)
    try:
        with pytest.raises(RpcError, match=rf"^cannot connect to 127.0.0.1:{port}: TimeoutError$"):
            await client.call("state")
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()


async def test_connections_past_the_cap_are_refused(controller: ControllerServer) -> None:
    held = [await connect(controller) for _ in range(4)]
    reader, writer = await asyncio.open_connection("127.0.0.1", controller.rpc.port)
    refusal = await answer(reader)
    assert refusal["error"].startswith("TooManyConnections")
    assert await answer(reader) is None
    writer.close()
    for _, held_writer, _ in held:
        held_writer.close()
    assert controller.state()["rpc"]["refused_connections"] == 1


@pytest.mark.parametrize("authenticate", [False, True], ids=["handshake", "request"])
async def test_a_line_over_the_limit_closes_the_connection(controller: ControllerServer,
                                                           authenticate: bool) -> None:
    if authenticate:
        reader, writer = await authenticated(controller)
    else:
        reader, writer, _ = await connect(controller)
    writer.write(b'{"id": 1, "method": "state", "params": {"pad": "' + b"x" * 8192 + b'"}}\n')
    await writer.drain()
    last = await answer(reader)
    while last is not None and not authenticate:  # the handshake's refusal, then the end
        assert last["error"].startswith("InvalidRequestException")
        last = await answer(reader)
    assert last is None
    writer.close()


async def test_a_silent_peer_is_closed_after_the_authentication_timeout() -> None:
    server = RpcServer({}, secret=SECRET, limits=RpcLimits(
        max_connections=4, max_in_flight_per_connection=4, max_request_bytes=4096,
        authentication_timeout_s=0.2))
    await server.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        assert "challenge" in json.loads(await reader.readline())
        assert await asyncio.wait_for(reader.readline(), 5) == b""
        writer.close()
    finally:
        await server.stop()


async def test_the_secret_file_is_the_owners_alone_and_short_secrets_are_refused(
        tmp_path: Path) -> None:
    path = write_secret_file(tmp_path / "run" / "controller.secret")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_secret(path) == path.read_text().strip().encode()
    assert len(load_secret(path)) == 64
    assert load_secret(None, {"MINIBROKER_CONTROLLER_SECRET_FILE": str(path)}) == \
        load_secret(path)
    with pytest.raises(AuthenticationError, match="no controller secret"):
        load_secret(None, {})
    with pytest.raises(AuthenticationError, match="at least 32"):
        load_secret(None, {"MINIBROKER_CONTROLLER_SECRET": "hunter2"})


@pytest.mark.parametrize("role", ["controller", "broker"])
async def test_neither_process_starts_without_a_secret(tmp_path: Path, role: str) -> None:
    args = {"controller": ["controller", "--listen", "127.0.0.1:0"],
            "broker": ["broker", "--id", "1", "--listen", "127.0.0.1:0",
                       "--controller", "127.0.0.1:9"]}[role]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MINIBROKER_CONTROLLER_SECRET")}
    result = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "minibroker", *args, "--data-dir",
                         str(tmp_path)], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2
    assert "no controller secret" in result.stderr
