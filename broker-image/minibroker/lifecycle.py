"""Registration and heartbeats on a thread of their own: Kafka's ``BrokerLifecycleManager``.

Kafka keeps a broker's session with the controller apart from request work: the lifecycle
manager has its own event queue thread and its own controller channel, so neither a slow
request on the request-handler threads nor the metadata publisher delays a heartbeat. The
broker's event loop plays those threads' part in minibroker (the network thread, the request
handlers, the replica fetchers and the metadata publisher all run on it), so the heartbeat
gets a thread, an event loop and a controller connection of its own (``event_queue``'s
``ThreadEventQueue``; in simulation, where every node runs on one virtual-time loop, the
node's loop stands for the thread). Python's interpreter
lock hands the thread a turn every ``sys.getswitchinterval()`` (5 ms) whatever the event
loop is doing; only stopping the whole process (SIGSTOP, a kill) stops the heartbeats, as
it does Kafka's.

The broker epoch and fenced state are written here and read by the event loop (plain
attribute reads); the metadata offset a heartbeat reports is read from the broker's current
image the same way.

``stop`` ends the thread within a bound whatever the controller does (as Kafka's
``BrokerLifecycleManager.close`` shuts its event queue down): the thread's tasks are
cancelled and awaited (``shutdown.end_tasks``), its controller connection closed for good,
its loop stopped and closed, and the thread joined.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from minibroker import environment
from minibroker.rpc import RpcClient, RpcError
from minibroker.shutdown import STOP_TIMEOUT_S, end_tasks

log = logging.getLogger("minibroker.broker")


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
                 session_timeout_ms: int, connect_timeout_s: float,
                 metadata_offset: Callable[[], int]) -> None:
        self._controller = controller
        self._secret = secret
        self._heartbeat_s = heartbeat_ms / 1000
        # Kafka's BrokerServer gives the heartbeat channel (NodeToControllerChannelManager)
        # half the session timeout as its request timeout (KAFKA-14392): a slow controller
        # link costs a heartbeat only when an answer takes that long.
        self._heartbeat_timeout_s = session_timeout_ms / 2000
        self._connect_timeout_s = connect_timeout_s
        self._metadata_offset = metadata_offset
        self.broker_epoch = -1
        """From the controller at registration: the offset of the registration record."""
        self.fenced = True
        self._want_shut_down = False
        """PENDING_CONTROLLED_SHUTDOWN: each heartbeat says wantShutDown."""
        self._wake = asyncio.Event()
        """Set to send the next heartbeat at once (scheduleNextCommunicationImmediately)."""
        self._shutdown_granted = asyncio.Event()
        """The controller answered shouldShutDown (controlledShutdownFuture)."""
        # A thread of its own in a broker process; the node's loop in simulation.
        self._queue = environment.current().event_queue("broker-lifecycle")
        self._client: RpcClient | None = None
        self._tasks: set[asyncio.Task] = set()
        """The tasks on the thread's loop that ``_close`` ends (``_own``)."""

    async def start(self, registration: Registration) -> None:
        """Register (retrying until the controller answers), then heartbeat until ``stop``."""
        self._queue.start()
        await self._queue.submit(self._register_then_heartbeat(registration))

    @property
    def running(self) -> bool:
        return self._queue.running

    async def stop(self) -> None:
        """Stop heartbeating, close the controller connection and end the thread, each within
        a bound, so that a controller that never answers cannot hold the broker's stop; the
        controller fences this broker when its session expires (or at once, after a clean
        shutdown's re-registration). It waits without holding the broker's event loop: the
        loop's other work (the Kafka listener's connections) still runs meanwhile."""
        if not self._queue.running:
            return
        try:
            async with asyncio.timeout(STOP_TIMEOUT_S):
                await self._queue.submit(self._close())
        except TimeoutError:
            log.error("The broker lifecycle manager did not close its tasks and controller "
                      "connection within %.0f s; stopping its queue regardless",
                      STOP_TIMEOUT_S)
        await self._queue.stop()  # at once: its loop has nothing left to run

    async def controlled_shutdown(self, timeout_s: float) -> bool:
        """Kafka's BrokerLifecycleManager.beginControlledShutdown, and BrokerServer.shutdown's
        wait on its controlledShutdownFuture: heartbeat at once with wantShutDown, then again
        until the controller answers shouldShutDown (it has moved this broker's leaderships
        and taken it out of every ISR), for at most ``timeout_s``. True once granted; False
        at the timeout, or at once for a broker that is not registered and unfenced (Kafka
        skips it outside RUNNING)."""
        if not self._queue.running or self.broker_epoch < 0 or self.fenced:
            log.info("Skipping controlled shutdown: the broker is not registered and unfenced")
            return False
        log.info("Beginning controlled shutdown")
        return await self._queue.submit(self._await_shutdown_granted(timeout_s))

    async def _await_shutdown_granted(self, timeout_s: float) -> bool:
        """On the thread's loop: ask, and wait for the leave within the bound."""
        self._want_shut_down = True
        self._wake.set()
        try:
            async with asyncio.timeout(timeout_s):
                await self._shutdown_granted.wait()
        except TimeoutError:
            log.error("Timed out waiting for the controller to approve controlled shutdown "
                      "(%.0f s)", timeout_s)
            return False
        return True

    def _rpc(self) -> RpcClient:
        if self._client is None:  # made on the lifecycle loop, whose connection it is
            self._client = RpcClient(*self._controller, secret=self._secret,
                                     connect_timeout=self._connect_timeout_s)
        return self._client

    def _own(self, task: asyncio.Task | None) -> None:
        """Keep ``task`` until it ends (the loop holds only a weak reference), for ``_close``."""
        assert task is not None
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _register_then_heartbeat(self, registration: Registration) -> None:
        self._own(asyncio.current_task())  # a stop during the start ends the registration
        await self._register(registration)
        self._own(asyncio.get_running_loop().create_task(
            self._heartbeat_loop(registration), name="broker-heartbeat"))

    async def _close(self) -> None:
        """On the thread's loop: end its tasks (the heartbeats, or a registration still
        retrying), then close the controller connection for good. Half the stop's bound
        each: both are bounded, so the stop's own bound is met."""
        await end_tasks(self._tasks, "the broker lifecycle manager", STOP_TIMEOUT_S / 2)
        if self._client is not None:
            await self._client.aclose(STOP_TIMEOUT_S / 2)

    async def _register(self, registration: Registration) -> None:
        """Register, retrying every ``broker.heartbeat.interval.ms`` until the controller
        accepts, as Kafka's BrokerLifecycleManager does after a failure
        (``scheduleNextCommunicationAfterFailure``): among the refusals, a new incarnation's
        while its previous one's session lives (DUPLICATE_BROKER_REGISTRATION)."""
        while True:
            try:
                answer = await self._rpc().call("register_broker", registration.to_params())
            except RpcError as exc:
                log.info("Registration with the controller failed (%s); retrying", exc)
                await asyncio.sleep(self._heartbeat_s)
                continue
            if answer["error"] != "none":
                log.info("The controller refused the registration (%s: %s); retrying",
                         answer["error"], answer.get("message", ""))
                await asyncio.sleep(self._heartbeat_s)
                continue
            self.fenced = True
            self.broker_epoch = answer["broker_epoch"]
            log.info("Registered with broker epoch %d", self.broker_epoch)
            return

    async def _heartbeat_loop(self, registration: Registration) -> None:
        """Kafka's BrokerHeartbeat, every ``broker.heartbeat.interval.ms``; an answer that
        the registration is unknown or stale registers this incarnation again. In a
        controlled shutdown each says wantShutDown, the first at once and the one after the
        first answer 50 ms later (BrokerHeartbeatResponseEvent); the loop ends when the
        controller answers shouldShutDown."""
        delay = self._heartbeat_s
        answered_shutdown = False
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()
            self._wake.clear()
            delay = self._heartbeat_s
            want_shut_down = self._want_shut_down
            try:
                answer = await self._rpc().call("heartbeat", {
                    "broker_id": registration.broker_id, "broker_epoch": self.broker_epoch,
                    "metadata_offset": self._metadata_offset(),
                    "want_shut_down": want_shut_down},
                    timeout=self._heartbeat_timeout_s)
            except RpcError as exc:
                log.debug("Heartbeat failed: %s", exc)
                continue
            if answer["error"] != "none":
                log.warning("Heartbeat rejected (%s): registering again", answer["error"])
                await self._register(registration)
                continue
            if answer["is_fenced"] != self.fenced:
                log.info("The controller %s this broker",
                         "fenced" if answer["is_fenced"] else "unfenced")
                self.fenced = answer["is_fenced"]
            if want_shut_down and answer.get("should_shut_down"):
                log.info("The controller has asked us to exit controlled shutdown")
                self._shutdown_granted.set()
                return
            if want_shut_down and not answered_shutdown:
                answered_shutdown = True
                delay = 0.05
