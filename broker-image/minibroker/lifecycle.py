"""Registration and heartbeats on a thread of their own: Kafka's ``BrokerLifecycleManager``.

Kafka keeps a broker's session with the controller apart from request work: the lifecycle
manager has its own event queue thread and its own controller channel, so neither a slow
request on the request-handler threads nor the metadata publisher delays a heartbeat. The
broker's event loop plays those threads' part in minibroker (the network thread, the request
handlers, the replica fetchers and the metadata publisher all run on it), so the heartbeat
gets a thread, an event loop and a controller connection of its own. Python's interpreter
lock hands the thread a turn every ``sys.getswitchinterval()`` (5 ms) whatever the event
loop is doing; only stopping the whole process (SIGSTOP, a kill) stops the heartbeats, as
it does Kafka's.

The broker epoch and fenced state are written here and read by the event loop (plain
attribute reads); the metadata offset a heartbeat reports is read from the broker's current
image the same way.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from minibroker.rpc import RpcClient, RpcError

log = logging.getLogger("minibroker.broker")

REGISTRATION_RETRY_S = 0.2
STOP_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Registration:
    """What a BrokerRegistration request carries (KIP-631), fixed for an incarnation."""

    broker_id: int
    incarnation_id: str
    host: str
    port: int
    listeners: dict[str, tuple[str, int]]
    previous_broker_epoch: int
    """From a clean shutdown's marker (KAFKA-15582), else -1."""

    def to_params(self) -> dict[str, Any]:
        return {"broker_id": self.broker_id, "incarnation_id": self.incarnation_id,
                "host": self.host, "port": self.port,
                "previous_broker_epoch": self.previous_broker_epoch,
                "listeners": {name: list(address) for name, address in self.listeners.items()}}


class BrokerLifecycleManager:
    def __init__(self, controller: tuple[str, int], *, secret: bytes, heartbeat_ms: int,
                 metadata_offset: Callable[[], int]) -> None:
        self._controller = controller
        self._secret = secret
        self._heartbeat_s = heartbeat_ms / 1000
        self._metadata_offset = metadata_offset
        self.broker_epoch = -1
        """From the controller at registration: the offset of the registration record."""
        self.fenced = True
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever,
                                        name="broker-lifecycle", daemon=True)
        self._client: RpcClient | None = None
        self._heartbeats: asyncio.Task | None = None

    async def start(self, registration: Registration) -> None:
        """Register (retrying until the controller answers), then heartbeat until ``stop``."""
        self._thread.start()
        await asyncio.wrap_future(self._submit(self._register(registration)))
        self._submit(self._start_heartbeats(registration)).result(STOP_TIMEOUT_S)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """Stop heartbeating and close the controller connection; the controller fences this
        broker when its session expires (or at once, after a clean shutdown's re-registration)."""
        if not self._thread.is_alive():
            return
        with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
            self._submit(self._close()).result(STOP_TIMEOUT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(STOP_TIMEOUT_S)

    def _submit(self, coroutine: Any) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def _rpc(self) -> RpcClient:
        if self._client is None:  # made on the lifecycle loop, whose connection it is
            self._client = RpcClient(*self._controller, secret=self._secret)
        return self._client

    async def _start_heartbeats(self, registration: Registration) -> None:
        self._heartbeats = asyncio.get_running_loop().create_task(
            self._heartbeat_loop(registration))

    async def _close(self) -> None:
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeats
        if self._client is not None:
            self._client.close()

    async def _register(self, registration: Registration) -> None:
        while True:
            try:
                answer = await self._rpc().call("register_broker", registration.to_params())
            except RpcError as exc:
                log.info("Registration with the controller failed (%s); retrying", exc)
                await asyncio.sleep(REGISTRATION_RETRY_S)
                continue
            self.fenced = True
            self.broker_epoch = answer["broker_epoch"]
            log.info("Registered with broker epoch %d", self.broker_epoch)
            return

    async def _heartbeat_loop(self, registration: Registration) -> None:
        """Kafka's BrokerHeartbeat, every ``broker.heartbeat.interval.ms``; an answer that
        the registration is unknown or stale registers this incarnation again."""
        while True:
            await asyncio.sleep(self._heartbeat_s)
            try:
                answer = await self._rpc().call("heartbeat", {
                    "broker_id": registration.broker_id, "broker_epoch": self.broker_epoch,
                    "metadata_offset": self._metadata_offset()},
                    timeout=self._heartbeat_s * 4)
            except RpcError as exc:
                log.debug("Heartbeat failed: %s", exc)
                continue
            if answer["error"] != "none":
                log.warning("Heartbeat rejected (%s): registering again", answer["error"])
                await self._register(registration)
            elif answer["is_fenced"] != self.fenced:
                log.info("The controller %s this broker",
                         "fenced" if answer["is_fenced"] else "unfenced")
                self.fenced = answer["is_fenced"]
