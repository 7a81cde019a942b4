"""An asyncio event loop whose clock is virtual: the broker's own asyncio code, in simulation.

The simulation is worth what its fidelity is worth, so it should run the broker's own
coroutines (the Kafka listener, the fetcher, the controller's RPC server) with only the
clock, the network, the disk and the randomness swapped, as FoundationDB's and TigerBeetle's
simulators run their production code. This loop swaps the clock: ``loop.time()`` reads a
virtual clock, and where a real loop would block in ``select`` until its next timer is due,
this one moves the clock to that timer at once. ``asyncio.sleep``, ``asyncio.wait_for``,
``call_later`` and every timeout built on them then run unchanged, in virtual time, and as
fast as the code computes.

Nothing real is polled: sockets have no place in it (the network is in memory,
``virtual_streams.VirtualNetwork``), and ``run_in_executor`` runs its function at once on
the loop's thread, so that no thread's timing enters the run. Given the same code and seed,
the callbacks run in the same order, and the run is the same, every time.

The same idea as the ``looptime`` pytest plugin (by kopf's author), which fakes the clock of
asyncio's own loop; here the loop is built for it, so nothing real can wake it either.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import enum
import heapq
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from minibroker.environment import Environment, NodeHalted, environment_in

T = TypeVar("T")


class SimulationStalled(RuntimeError):
    """Every task waits, and on nothing that can come: no callback is ready and no timer
    is set. A real loop would block for ever here; a simulation says so instead."""


class SimulationRunaway(RuntimeError):
    """More timers pending than any run sets (``MAX_PENDING_TIMERS``): something schedules
    timers faster than they fire, and virtual time would crawl for ever. A real process
    would spin on its CPU and memory; a simulation says so instead, and an exploration
    records the schedule as an error rather than never finishing it."""


MAX_PENDING_TIMERS = 250_000
"""Two orders of magnitude above what a library experiment keeps pending."""
MIN_SCHEDULED_TIMER_HANDLES = 100
MIN_CANCELLED_TIMER_HANDLES_FRACTION = 0.5
"""asyncio's thresholds (``base_events``) for sweeping cancelled timers out of the heap."""


class SimulationTimeout(AssertionError):
    """A wait of the simulation did not end within its bound."""


class NodeState(enum.Enum):
    RUNNING = "running"
    PAUSED = "paused"  # SIGSTOP: its callbacks wait, in order, for SIGCONT
    DEAD = "dead"  # SIGKILL: its callbacks never run again


@dataclass
class _Node:
    state: NodeState = NodeState.RUNNING
    held: list[asyncio.Handle] = field(default_factory=list)
    """The handles due while paused, themselves: one cancelled meanwhile (a timeout's
    timer, once the task it guarded finished first) stays cancelled."""


class VirtualTimeLoop(asyncio.BaseEventLoop):
    """An event loop on a virtual clock, in seconds from ``start``, and the process of each
    simulated node on it.

    A node is the ``minibroker.environment`` its code runs in: every callback the loop runs
    (a task's step, a timer, a future's done callback) runs in the context it was scheduled
    from, which carries the environment of the node that scheduled it. So pausing a node
    holds its callbacks until it resumes (they then run in their order, late, as a
    SIGSTOPped process's timers fire after SIGCONT), and killing it drops them: its tasks
    stop where they stand, running no ``finally``, as a killed process runs none."""

    def __init__(self, start: float = 0.0) -> None:
        super().__init__()
        self._nodes: dict[int, _Node] = {}  # by id() of the node's Environment
        self._node_environments: list[Environment] = []  # their ids stay theirs
        self._now = float(start)
        self._live_tasks: set[asyncio.Task[Any]] = set()
        """Every task not yet done. asyncio keeps its tasks weakly: a killed node's task,
        waiting on its node's futures, is cyclic garbage once its node is unreferenced,
        and would be closed by the garbage collector on a later loop instead of ending in
        ``wind_down``."""
        self.set_task_factory(_task_factory)
        self._timers: list[tuple[float, int, asyncio.TimerHandle]] = []
        """The timers (``call_at``), in place of asyncio's ``_scheduled``."""
        self._timer_order = 0
        # Timers due within this of the clock run in the same iteration (asyncio's default is
        # the real clock's resolution); far below a millisecond, and above float rounding.
        self._clock_resolution = 1e-7

    def time(self) -> float:
        return self._now

    # -- the nodes' processes ----------------------------------------------------------------

    def add_node(self, node: Environment) -> None:
        """Run the callbacks scheduled in ``node``'s environment under its process state."""
        self._node_environments.append(node)
        self._nodes[id(node)] = _Node()

    def pause(self, node: Environment) -> None:
        state = self._nodes[id(node)]
        if state.state is NodeState.RUNNING:
            state.state = NodeState.PAUSED

    def resume(self, node: Environment) -> None:
        """SIGCONT: what the node's code was due to run while paused runs now, in order."""
        state = self._nodes[id(node)]
        if state.state is not NodeState.PAUSED:
            return
        state.state = NodeState.RUNNING
        held, state.held = state.held, []
        self._ready.extend(handle for handle in held if not handle._cancelled)

    def kill(self, node: Environment) -> None:
        """SIGKILL: the node's callbacks, held or to come, never run."""
        state = self._nodes[id(node)]
        state.state = NodeState.DEAD
        state.held.clear()

    def node_state(self, node: Environment) -> NodeState:
        return self._nodes[id(node)].state

    def wind_down(self, bound_s: float = 60.0) -> None:
        """After the run: every task left is cancelled and given ``bound_s`` of virtual time
        to end (tasks started meanwhile, a server answering what it had read, in turn).
        A killed node's tasks cannot end so: the wake-up of what they waited on was dropped
        with the node. Their coroutines are closed here, with every node dead so that
        nothing they schedule runs, instead of by the garbage collector on a closed or
        another loop. What the run found is already known."""
        for node in self._nodes.values():
            node.state, node.held = NodeState.RUNNING, []
        deadline = self.time() + bound_s
        with contextlib.suppress(SimulationRunaway):  # the run ended so: no winding down
            while (left := [task for task in self._live_tasks if not task.done()]) \
                    and self.time() < deadline:
                for task in left:
                    if not task.cancelling():  # a second cancel would cut its cleanup short
                        task.cancel()
                self.run_until_complete(asyncio.wait(left, timeout=deadline - self.time()))
        for node in self._nodes.values():
            node.state = NodeState.DEAD
        stuck, self._live_tasks = self._live_tasks, set()
        quiet = logging.root.manager.disable
        logging.disable(logging.CRITICAL)  # a killed node's finally blocks say nothing
        try:
            for task in stuck:
                with contextlib.suppress(RuntimeError):  # it awaited in its finally
                    task.get_coro().close()
        finally:
            logging.disable(quiet)

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any,
                context: contextvars.Context | None = None) -> asyncio.TimerHandle:
        """asyncio's ``call_at``, on a heap of (when, order, timer): timers due at the same
        instant run in the order they were set (asyncio's heap compares their times only,
        and leaves such ties in no set order), and the heap compares tuples in C, not
        ``TimerHandle.__lt__`` in Python (a fifth of the loop's own time)."""
        self._check_closed()
        timer = asyncio.TimerHandle(when, callback, args, self, context)
        self._timer_order += 1
        heapq.heappush(self._timers, (when, self._timer_order, timer))
        timer._scheduled = True
        return timer

    # -- blocking waits -----------------------------------------------------------------

    def wait_until(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Run the loop until ``condition()`` holds, checked after every iteration; raise
        ``SimulationTimeout`` once ``timeout_s`` of virtual time pass first.

        Callable from outside the loop and from inside one of its plain callbacks (not a
        task: a task awaits). The latter is what a platform's blocking primitive needs when
        a fault unit, a plain function called at its planned time, waits for a node to
        serve: on a real platform it blocks its thread while the cluster runs on; here the
        loop runs on, nested, until the wait is over (as ``nest_asyncio`` does, which is why
        ``_run_once`` below tolerates a nested iteration that emptied its queue). Nested
        waits end last-in first-out: a wait returns only once every wait that began inside
        it has, so a condition must not depend on a wait that began after it."""
        deadline = self.time() + timeout_s
        if not self.is_running():
            done = self.create_future()

            def nested() -> None:
                try:
                    self._run_until(condition, deadline, timeout_s, what)
                except BaseException as error:  # the caller's, as it would be raised there
                    done.set_exception(error)
                else:
                    done.set_result(None)

            self.call_soon(nested, context=contextvars.Context())
            self.run_until_complete(done)
            return
        if asyncio.current_task(self) is not None:
            raise RuntimeError(f"wait_until({what!r}) in a task: await the condition instead")
        self._run_until(condition, deadline, timeout_s, what)

    def _run_until(self, condition: Callable[[], bool], deadline: float, timeout_s: float,
                   what: str) -> None:
        wake = self.call_at(deadline, _at_deadline, context=contextvars.Context())
        run_once = self._run_once
        try:  # the clock stops at the deadline, not at whatever timer comes after it
            while not condition():
                if self._now >= deadline:
                    raise SimulationTimeout(f"not within {timeout_s:g} s (virtual): {what}")
                run_once()
        finally:
            wake.cancel()

    def _run_once(self) -> None:
        """asyncio's ``BaseEventLoop._run_once`` (3.11), re-entrant: a callback that waits
        (``wait_until``) runs iterations of its own, which may run callbacks this one
        counted as ready."""
        timers = self._timers
        count = len(timers)
        if count > MIN_SCHEDULED_TIMER_HANDLES and \
                self._timer_cancelled_count / count > MIN_CANCELLED_TIMER_HANDLES_FRACTION:
            for _, _, handle in timers:  # mostly cancelled: rebuild the heap without them
                if handle._cancelled:
                    handle._scheduled = False
            timers = self._timers = [t for t in timers if not t[2]._cancelled]
            heapq.heapify(timers)
            self._timer_cancelled_count = 0
        while timers and timers[0][2]._cancelled:
            self._timer_cancelled_count -= 1
            heapq.heappop(timers)[2]._scheduled = False
        if count > MAX_PENDING_TIMERS:
            raise SimulationRunaway(
                f"at t={self._now:.6f} s (virtual) {count} timers are pending (more than "
                f"{MAX_PENDING_TIMERS}): something schedules timers faster than they fire")
        # Where a real loop would select() until its next timer, the clock moves to it.
        if not self._ready and not self._stopping:
            if not timers:
                raise SimulationStalled(
                    f"at t={self._now:.6f} s (virtual) no callback is ready and no timer is "
                    f"set: every task waits on something that never comes")
            self._now = max(self._now, timers[0][0])
        end_time = self._now + self._clock_resolution
        while timers and timers[0][0] < end_time:
            handle = heapq.heappop(timers)[2]
            handle._scheduled = False
            self._ready.append(handle)
        # Each callback runs unless the node it was scheduled from (its context's
        # environment, so ``environment.current()`` is that node's when it runs) is paused
        # (then the handle itself is held until SIGCONT) or dead (then it is dropped).
        nodes = self._nodes
        ready = self._ready
        for _ in range(len(ready)):
            if not ready:  # a nested wait ran them
                break
            handle = ready.popleft()
            if handle._cancelled:
                continue
            node = nodes.get(id(environment_in(handle._context)))
            if node is None or node.state is NodeState.RUNNING:
                handle._run()
            elif node.state is NodeState.PAUSED:
                node.held.append(handle)

    # -- asyncio's hooks -----------------------------------------------------------------

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        """A node that halted itself (``minibroker.environment.halt``) ended the callback or
        task that called it, as its process ended: no error of the run. Nor is an interrupt
        of the simulating process (Ctrl-C, or the SIGHUP that stops an exploration's
        worker): it lands in whichever node's task runs, asyncio reports that task as
        failed, and the interrupt goes on out of the loop to whoever stops the run."""
        if not isinstance(context.get("exception"), (NodeHalted, KeyboardInterrupt)):
            super().call_exception_handler(context)

    def _process_events(self, event_list: list[Any]) -> None:
        """No real events: the in-memory network schedules its deliveries as callbacks."""

    def _write_to_self(self) -> None:
        """``call_soon_threadsafe`` wakes a real loop blocked in select; this one never
        blocks."""

    def close(self) -> None:
        super().close()
        self._timers.clear()

    def run_in_executor(self, executor: concurrent.futures.Executor | None,
                        func: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Run ``func`` now, on the loop's thread, and return its settled future: disk I/O
        and other blocking calls take no virtual time, and no thread's timing enters the
        run (``asyncio.to_thread`` comes here too)."""
        self._check_closed()
        future = self.create_future()
        try:
            future.set_result(contextvars.copy_context().run(func, *args))
        except Exception as error:  # the caller awaits it, as it would from a thread
            future.set_exception(error)
        return future


def _at_deadline() -> None:
    """A wait's own timer: it only wakes the loop."""


def run_simulation(main: Coroutine[Any, Any, T], start: float = 0.0) -> T:
    """Run ``main`` on a new virtual loop, wind its nodes down and close it."""
    loop = VirtualTimeLoop(start)
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            loop.wind_down()
        finally:
            loop.close()


def _task_factory(loop: VirtualTimeLoop, coro: Any,
                  context: contextvars.Context | None = None) -> asyncio.Task[Any]:
    """asyncio's task, which does not warn when garbage-collected pending: a killed node's
    tasks stay pending for ever, as a killed process's work stays undone."""
    task = asyncio.Task(coro, loop=loop, context=context)
    task._log_destroy_pending = False  # asyncio's own switch for this warning
    loop._live_tasks.add(task)
    task.add_done_callback(loop._live_tasks.discard)
    return task
