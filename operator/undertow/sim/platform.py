"""``SimPlatform``: the ``Platform`` primitives over simulated processes and links.

The fault units of ``undertow.faults`` run unchanged on it: a kill exits the node's
``Process`` at once, a restart starts a new incarnation after ``Timing.start_delay_ms`` (a broker
process takes about that long to start), a pause holds every callback of the process, a
partition blocks links of the virtual network, and failpoints act on the broker directly.
A primitive that waits (``await_serving``, ``await_registered``) runs the simulation until
its condition holds, in virtual time; a fault's time limit is a virtual timer.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minibroker.environment import Environment, entered
from undertow.platform.base import (
    CONTROLLER,
    Cancellable,
    Link,
    Platform,
    broker_id_of,
    consumer_endpoint,
)
from undertow.platform.control import EndpointUnreachable
from undertow.platform.errors import PlatformError
from undertow.sim.files import broker_logs
from undertow.sim.loop import SimLoop
from undertow.sim.network import VirtualNetwork
from undertow.sim.nodes import SimBroker, SimController, SimNode
from undertow.sim.timing import NOMINAL, Timing

if TYPE_CHECKING:
    from undertow.runner.world import World

TIMEOUT_S = 60.0
VIRTUAL_EPOCH_S = 1_767_225_600.0
"""Virtual time 0 on the history's clock: 2026-01-01T00:00:00Z."""


def seeded_randomness(seed: int) -> contextlib.AbstractContextManager[None]:
    """The broker code's random draws (``minibroker.environment``: the cluster id, topic ids,
    events log ids and group member ids) come from ``seed`` meanwhile, in this thread only:
    the same in every run."""
    return entered(Environment(rng=random.Random(seed)))


class SimPlatform(Platform):
    def __init__(self, root: Path, brokers: int, config: dict[str, str], *,
                 ephemeral_storage: bool, seed: int = 0,
                 loop: SimLoop | None = None, consumers: tuple[str, ...] = (),
                 timing: Timing = NOMINAL) -> None:
        """``seed``: the broker code's random draws while the platform runs
        (``seeded_randomness``); ``consumers``: the workload consumers (``c1``) with links of
        their own, which a partition can isolate (``consumer_endpoints``)."""
        super().__init__()
        self._root = root
        self._seed = seed
        self._consumers = consumers  # consumer groups: the isolated consumers' own links
        self.loop = loop or SimLoop()
        self.timing = timing
        self.network = VirtualNetwork(self.loop, timing.latency_ms)
        self.ephemeral_storage = ephemeral_storage
        args = (self.loop, self.network)
        self._held: list[tuple[str, dict[str, Any]]] = []
        self._event_sink: Callable[[str, dict[str, Any]], None] = (
            lambda node, raw: self._held.append((node, raw)))
        self.controller = SimController(*args, root / CONTROLLER, config, self._on_event,
                                        self.clock)
        self._brokers = {i: SimBroker(i, *args, root / f"broker-{i}", config, self._on_event,
                                      self.clock)
                         for i in range(brokers)}
        self._starting: set[str] = set()
        self._running: contextlib.ExitStack | None = None

    def __enter__(self) -> SimPlatform:
        """The platform starts with the seed's randomness in effect and its nodes' logs
        going to ``nodes.log``, both until it stops."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(seeded_randomness(self._seed))
            stack.enter_context(broker_logs(self._root / "nodes.log", self.clock))
            self.start()
            self._running = stack.pop_all()
        return self

    def __exit__(self, *_exc: object) -> None:
        try:
            self.stop()
        finally:
            if self._running is not None:
                self._running.close()

    def record_events(self, sink: Callable[[str, dict[str, Any]], None]) -> None:
        """From now on each node's event goes to ``sink(node, event)`` as it is logged; those
        logged before (the cluster's start) go first, in their order."""
        held, self._held = self._held, []
        self._event_sink = sink
        for node, raw in held:
            sink(node, raw)

    def _on_event(self, node: str, raw: dict[str, Any]) -> None:
        self._event_sink(node, raw)

    def world(self) -> World:
        """Virtual time on this platform's loop, the client models (`sim.world`)."""
        from undertow.sim.world import SimWorld

        return SimWorld(self)

    def clock(self) -> float:
        """The history's clock: seconds, virtual."""
        return VIRTUAL_EPOCH_S + self.loop.now_ms() / 1000.0

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self.controller.start()
        for broker in self._brokers.values():
            broker.start()
        self.loop.wait_until(self.all_brokers_unfenced, TIMEOUT_S * 1000,
                             "every broker to register, unfenced")

    def stop(self) -> None:
        for node in (*self.brokers, CONTROLLER):
            process = self._node(node).process
            if process is not None:
                process.exit()
        self.network.blocked.clear()

    def metadata_propagated(self) -> bool:
        """Every running broker has applied the controller's latest metadata."""
        controller = self.controller.controller
        return controller is not None and all(
            b.rm.image.metadata_offset == controller.metadata_offset
            for b in self._brokers.values() if b.running and b.rm is not None)

    @property
    def consumer_endpoints(self) -> tuple[str, ...]:
        return tuple(consumer_endpoint(c) for c in self._consumers)

    @property
    def broker_ids(self) -> tuple[int, ...]:
        return tuple(sorted(self._brokers))

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{b.address[0]}:{b.address[1]}" for b in self._brokers.values())

    def bootstrap_addresses(self) -> list[tuple[str, int]]:
        return [b.address for _, b in sorted(self._brokers.items())]

    def admin_url(self, node: str) -> str:
        return f"sim://{self.check_node(node)}"

    def _node(self, node: str) -> SimNode:
        if node == CONTROLLER:
            return self.controller
        return self._brokers[broker_id_of(self.check_node(node))]

    def broker(self, node: str) -> SimBroker:
        return self._brokers[broker_id_of(self.check_broker(node))]

    def _answering(self, node: str) -> SimNode:
        sim = self._node(node)
        if not sim.running:
            raise EndpointUnreachable(f"{node} is not running")
        assert sim.process is not None
        if sim.process.paused:
            raise EndpointUnreachable(f"{node} is paused")
        return sim

    def state(self, node: str) -> dict[str, Any]:
        sim = self._answering(node)
        assert isinstance(sim, SimController | SimBroker)
        return sim.state()

    def events(self, node: str, log_id: str | None, offset: int) -> dict[str, Any]:
        raise PlatformError("in simulation every event goes to the history as it is logged")

    # ---- processes --------------------------------------------------------------------------

    @property
    def timeout_s(self) -> float:
        return TIMEOUT_S

    def kill(self, node: str, grace_period_s: float = 0.0) -> None:
        sim = self._node(node)
        if not sim.running:
            raise PlatformError(f"cannot kill {node}: it is not running")
        if isinstance(sim, SimBroker):
            if grace_period_s > 0:
                sim.stop_cleanly()  # a SIGTERM'd minibroker exits well within any grace
            else:
                sim.crash()
        else:
            assert isinstance(sim, SimController)
            sim.kill()

    def hold_restart(self, node: str, duration_s: float) -> None:
        """Nothing restarts a simulated process but ``release``."""
        self.check_node(node)

    def release(self, node: str) -> None:
        sim = self._node(node)
        if sim.running or node in self._starting:
            return
        self._starting.add(node)

        def start() -> None:
            self._starting.discard(node)
            if not sim.running:
                assert isinstance(sim, SimController | SimBroker)
                sim.start()

        self.loop.call_later(self.timing.start_delay_ms, start)

    def await_serving(self, node: str) -> None:
        sim = self._node(node)
        self.loop.wait_until(lambda: sim.running, TIMEOUT_S * 1000, f"{node} to serve")

    def await_registered(self, node: str) -> None:
        def registered() -> bool:
            try:
                return self.registered_and_unfenced(node)
            except PlatformError:
                return False

        self.loop.wait_until(registered, TIMEOUT_S * 1000,
                             f"{node} to register with the controller, unfenced")

    def await_exit(self, node: str, incarnation: Hashable) -> None:
        self.loop.wait_until(lambda: self.incarnation(node) != incarnation,
                             TIMEOUT_S * 1000, f"{node}'s process to exit")

    def pause(self, node: str) -> None:
        sim = self._node(node)
        if not sim.running:
            raise PlatformError(f"cannot pause {node}: it is not running")
        assert sim.process is not None
        sim.process.pause()

    def resume(self, node: str) -> None:
        process = self._node(node).process
        if process is not None and process.alive:
            process.resume()

    def is_running(self, node: str) -> bool:
        return self._node(node).running

    def is_paused(self, node: str) -> bool:
        process = self._node(node).process
        return process is not None and process.alive and process.paused

    def incarnation(self, node: str) -> Hashable | None:
        sim = self._node(node)
        return sim.incarnations if sim.running else None

    # ---- failpoints -------------------------------------------------------------------------

    @property
    def failpoint_token(self) -> str:
        return "simulation"

    def set_failpoint(self, node: str, name: str, duration_s: float | None = None) -> None:
        self._answering(self.check_broker(node))
        self.broker(node).set_failpoint(name, None if duration_s is None
                                        else duration_s * 1000)

    def clear_failpoint(self, node: str, name: str) -> None:
        self._answering(self.check_broker(node))
        self.broker(node).clear_failpoint(name)

    def delete_pod(self, node: str, grace_period_s: float) -> None:
        broker = self.broker(node)
        if not broker.running:
            raise PlatformError(f"cannot delete the pod of {node}: it is not running")
        if grace_period_s > 0:
            broker.stop_cleanly()
        else:
            broker.crash()
        if self.ephemeral_storage:
            broker.wipe()
        self.release(node)

    # ---- clock and network ---------------------------------------------------------------------

    def start_timer(self, delay_s: float, callback: Callable[[], None], name: str
                    ) -> Cancellable:
        del name
        return self.loop.call_later(delay_s * 1000, callback)

    def _set_link_blocked(self, link: Link, blocked: bool) -> None:
        if blocked:
            self.network.blocked.add((link.src, link.dst))
        else:
            self.network.blocked.discard((link.src, link.dst))
