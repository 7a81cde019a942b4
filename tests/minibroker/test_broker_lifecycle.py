"""A broker's session with the controller does not depend on its event loop: heartbeats run
on the lifecycle thread (Kafka's BrokerLifecycleManager), so a loop held by request or
metadata work for longer than the session timeout does not get the broker fenced.

The controller is a process of its own (an in-process one would be held with the loop); the
broker runs in this test's event loop, which the test then blocks outright.

A stop ends every task and thread the broker started before it returns, within a bound,
whatever the controller does: its connection dropping as the broker stops, or the
controller answering nothing at all."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from ports import free_port

from minibroker.broker import BrokerOptions, BrokerServer
from minibroker.rpc import RpcClient, RpcError
from minibroker.rpc_auth import new_secret
from minibroker.shutdown import STOP_TIMEOUT_S
from undertow.platform.base import Link
from undertow.platform.link_delay import LinkDelay
from undertow.platform.proxy import ProxyNetwork

pytestmark = pytest.mark.asyncio

SESSION_TIMEOUT_MS = 1500
HEARTBEAT_MS = 100
CONTROLLED_SHUTDOWN_TIMEOUT_MS = 1000
SECRET = new_secret()
TO_CONTROLLER = Link("broker-1", "controller")


@pytest.fixture
def controller_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen, int]]:
    """The controller's process and port."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "minibroker", "controller", "--listen", f"127.0.0.1:{port}",
         "--data-dir", str(tmp_path / "controller"),
         "--config", f"broker.session.timeout.ms={SESSION_TIMEOUT_MS}"],
        env={**os.environ, "MINIBROKER_CONTROLLER_SECRET": SECRET},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield process, port
    finally:
        process.send_signal(signal.SIGCONT)  # a test may have stopped it
        process.terminate()
        process.wait(15)


@pytest_asyncio.fixture
async def controller(controller_process: tuple[subprocess.Popen, int]
                     ) -> AsyncIterator[RpcClient]:
    client = RpcClient("127.0.0.1", controller_process[1], secret=SECRET.encode())
    try:
        await _until(lambda: _call(client, "state"), "the controller to answer")
        yield client
    finally:
        await client.aclose()


def _broker(controller: RpcClient, tmp_path: Path,
            via: tuple[str, int] | None = None) -> BrokerServer:
    """Broker 1, dialling the controller at `via` (a proxy) or directly."""
    return BrokerServer(BrokerOptions(
        broker_id=1, listen=("127.0.0.1", 0), controller=via or ("127.0.0.1", controller.port),
        data_dir=tmp_path / "broker-1", controller_secret=SECRET.encode(),
        config={"broker.heartbeat.interval.ms": str(HEARTBEAT_MS),
                "broker.session.timeout.ms": str(SESSION_TIMEOUT_MS),
                "controlled.shutdown.timeout.ms": str(CONTROLLED_SHUTDOWN_TIMEOUT_MS)}))


async def _call(client: RpcClient, method: str) -> dict[str, Any] | None:
    try:
        return await client.call(method, {}, timeout=2)
    except RpcError:
        return None


async def _until(condition: Any, what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := await condition():
            return result
        await asyncio.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout} s waiting for {what}")


async def _stays(condition: Any, what: str, seconds: float) -> None:
    """Watch ``condition`` for ``seconds``: it holds at every look (every 50 ms)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not await condition():
            raise AssertionError(f"{what} no longer held, "
                                 f"{seconds - (deadline - time.monotonic()):.1f} s in")
        await asyncio.sleep(0.05)


def _hold_the_event_loop(seconds: float) -> None:
    """The fault under test, not a wait: the broker's event loop (this test's) does nothing
    else for ``seconds``, as a slow request or a large metadata change would hold it. A
    heartbeat sent from the loop would be that late, and the controller would fence the
    broker; what happened meanwhile is read afterwards from the controller's own record
    (the longest gap between two heartbeats), not guessed from the time slept."""
    time.sleep(seconds)  # hold: the fault under test, the event loop blocked


async def _broker_entry(controller: RpcClient) -> dict[str, Any] | None:
    state = await _call(controller, "state")
    return next((b for b in state["brokers"] if b["id"] == 1), None) if state else None


async def test_a_loop_held_past_the_session_timeout_does_not_fence_the_broker(
        controller: RpcClient, tmp_path: Path) -> None:
    broker = _broker(controller, tmp_path)
    await broker.start()
    try:
        await _until(lambda: _unfenced_entry(controller), "the broker to be unfenced")
        await _until(lambda: _true(not broker.fenced), "the broker to learn it")
        _hold_the_event_loop(2 * SESSION_TIMEOUT_MS / 1000)
        entry = await _broker_entry(controller)
        assert entry is not None and not entry["fenced"]
        assert entry["max_heartbeat_gap_ms"] < SESSION_TIMEOUT_MS / 2, entry
        assert not broker.fenced
    finally:
        await broker.stop()


@contextlib.contextmanager
def _slow_link_to(controller: RpcClient, seconds: float) -> Iterator[tuple[str, int]]:
    """A proxy to the controller whose every byte takes `seconds` each way: the address
    broker 1 dials."""
    network = ProxyNetwork()
    try:
        via = network.add_link(TO_CONTROLLER, ("127.0.0.1", controller.port))
        network.set_delay(TO_CONTROLLER, LinkDelay(seconds))
        network.set_delay(Link("controller", "broker-1"), LinkDelay(seconds))
        yield via
    finally:
        network.close()


async def test_a_slow_controller_link_does_not_fence_the_broker(controller: RpcClient,
                                                               tmp_path: Path) -> None:
    """Every byte between the broker and the controller takes 250 ms each way, from the
    start (registration and the connection's handshake included): a heartbeat's answer
    comes after half a second, more than four heartbeat intervals but less than half the
    session timeout, which Kafka's heartbeat channel waits (KAFKA-14392). The broker stays
    registered and unfenced, its heartbeats never further apart than the session allows."""
    with _slow_link_to(controller, 0.25) as via:
        broker = _broker(controller, tmp_path, via)
        await broker.start()
        try:
            await _until(lambda: _unfenced_entry(controller), "the broker to be unfenced")
            await _until(lambda: _true(not broker.fenced), "the broker to learn it")
            epoch = broker.lifecycle.broker_epoch
            await _stays(lambda: _unfenced_entry(controller), "the broker unfenced",
                         3 * SESSION_TIMEOUT_MS / 1000)
            entry = await _broker_entry(controller)
            assert entry is not None and entry["max_heartbeat_gap_ms"] < SESSION_TIMEOUT_MS, \
                entry
            assert (broker.lifecycle.broker_epoch, broker.fenced) == (epoch, False)
        finally:
            await broker.stop()


async def test_a_connection_whose_handshake_takes_seconds_is_set_up(controller: RpcClient,
                                                                    tmp_path: Path) -> None:
    """800 ms each way: the controller connection's handshake (challenge, proof, answer)
    takes 2.4 s, within socket.connection.setup.timeout.ms (Kafka's 10 s), and the broker
    registers (its heartbeats then time out: that is the test above's limit)."""
    with _slow_link_to(controller, 0.8) as via:
        broker = _broker(controller, tmp_path, via)
        try:
            async with asyncio.timeout(30):  # the start waits for the registration
                await broker.start()
            assert await _broker_entry(controller)
        finally:
            await broker.stop()


async def test_a_stopped_broker_stops_heartbeating(controller: RpcClient,
                                                  tmp_path: Path) -> None:
    broker = _broker(controller, tmp_path)
    await broker.start()
    await _until(lambda: _unfenced_entry(controller), "the broker to be unfenced")
    await broker.stop()
    assert not broker.lifecycle.running

    async def fenced() -> bool:
        entry = await _broker_entry(controller)
        return entry is not None and entry["fenced"]

    await _until(fenced, "the controller to fence the stopped broker",
                 timeout=3 * SESSION_TIMEOUT_MS / 1000)


async def test_a_restarted_broker_registers_once_its_previous_session_has_expired(
        controller: RpcClient, tmp_path: Path) -> None:
    """Kafka 4.2's registerBroker refuses a new incarnation while the previous one's session
    is valid (DUPLICATE_BROKER_REGISTRATION); the restarted broker retries every heartbeat
    interval, so it registers between one session timeout after the previous incarnation's
    last heartbeat and one retry later. Its start waits for the registration."""
    first = _broker(controller, tmp_path)
    await first.start()
    await _until(lambda: _unfenced_entry(controller), "the broker to be unfenced")
    await first.stop()
    stopped = time.monotonic()  # its last heartbeat was at most one interval before this
    second = _broker(controller, tmp_path)
    async with asyncio.timeout(3 * SESSION_TIMEOUT_MS / 1000):
        await second.start()
    waited = time.monotonic() - stopped
    try:
        entry = await _broker_entry(controller)
        assert entry is not None and entry["broker_epoch"] == second.broker_epoch
        assert second.broker_epoch > first.broker_epoch
        assert waited >= (SESSION_TIMEOUT_MS - HEARTBEAT_MS) / 1000, waited
        assert waited <= (SESSION_TIMEOUT_MS + 2 * HEARTBEAT_MS) / 1000 + 1.0, waited
    finally:
        await second.stop()


async def test_a_stop_ends_the_brokers_tasks_when_the_controller_connection_drops_with_it(
        controller: RpcClient, tmp_path: Path) -> None:
    """The broker's controller connection drops in the same turn of the loop as its stop
    begins (a controller failing over as the broker shuts down). The metadata loop's
    cancellation then arrives together with the ``RpcError`` of its long poll; with
    ``asyncio.wait_for`` (before Python 3.12) the error won, the loop took it for a failed fetch
    and kept polling, and the stop returned with it still running (then the test's event
    loop could not close)."""
    before = asyncio.all_tasks()
    broker = _broker(controller, tmp_path)
    await broker.start()
    await _until(lambda: _unfenced_entry(controller), "the broker to be unfenced")
    broker.controller.close()
    await broker.stop()
    assert not _tasks_left(before)
    assert not broker.tasks
    assert not broker.lifecycle.running


async def test_a_stop_is_bounded_when_the_controller_never_answers(
        controller_process: tuple[subprocess.Popen, int], controller: RpcClient,
        tmp_path: Path) -> None:
    """The controller is stopped (SIGSTOP): its connections stay open and nothing on them is
    ever answered. The controlled shutdown gives up after ``controlled.shutdown.timeout.ms``
    (as Kafka's at its shutdown's deadline); the heartbeat and the metadata poll in flight
    are cancelled, not waited out, and the lifecycle thread ends."""
    before = asyncio.all_tasks()
    broker = _broker(controller, tmp_path)
    await broker.start()
    await _until(lambda: _unfenced_entry(controller), "the broker to be unfenced")
    await _until(lambda: _true(not broker.fenced), "the broker to know it is unfenced")
    controller_process[0].send_signal(signal.SIGSTOP)
    async with asyncio.timeout(STOP_TIMEOUT_S + CONTROLLED_SHUTDOWN_TIMEOUT_MS / 1000):
        await broker.stop()
    assert not _tasks_left(before)
    assert not broker.lifecycle.running


def _tasks_left(before: set[asyncio.Task]) -> list[str]:
    """The tasks started since ``before`` that are still running, with where they stand."""
    return [f"{task.get_name()} at {task.get_stack(limit=1)}"
            for task in asyncio.all_tasks() - before - {asyncio.current_task()}]


async def _unfenced_entry(controller: RpcClient) -> bool:
    entry = await _broker_entry(controller)
    return entry is not None and not entry["fenced"]


async def _true(value: bool) -> bool:
    return value
