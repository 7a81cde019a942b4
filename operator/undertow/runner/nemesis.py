"""The nemesis: runs the planned fault schedule against a platform, recording every action.

Each planned fault waits for its start (an offset from the workload's start, or an event of
the fault it follows in a sequence), resolves its targets from the controller's live
metadata (waiting, up to TARGET_WAIT_S, while no node of its role can take it: the leader
another fault killed, until the controller elects the next), injects one fault unit per
target and lets the unit's time limit recover it (the unit heals itself even if the runner
is gone). ``stop()`` recovers whatever is still
in effect; it is called on every way out of a run.

The waiting is callbacks on a `Scheduler` (threads on real platforms, the virtual loop in
simulation), so that one nemesis serves every platform: the schedule a simulation explores
is run by the code that runs it against real brokers.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from undertow.faults.base import Action, Fault, Nodes
from undertow.faults.registry import FAULT_UNITS, build_fault
from undertow.platform.base import CONTROLLER, Platform, broker_id_of
from undertow.runner.history import HistoryWriter
from undertow.runner.scheduler import Scheduler, ThreadScheduler
from undertow.runner.targets import TargetError, resolve, role_label
from undertow.spec.schedule import PlannedFault

log = logging.getLogger("undertow.nemesis")
ACTION_WORDS: dict[Action, str] = {"inject": "Injected", "heal": "Healing",
                                   "recover": "Recovered"}

EVENT_POLL_S = 0.05
TARGET_WAIT_S = 15.0
"""How long a due fault waits for a node of its role that can take it. A killed leader
stays the leader in the metadata until the controller fences it, one
``broker.session.timeout.ms`` (Kafka's default: 9 s) after its last heartbeat, and the
next leader is elected then; a fault aimed at the leader meanwhile hits that one."""
STOP_WAIT_S = 30.0
"""How long `stop` waits for injections under way before it recovers every unit."""


@dataclass
class FaultRun:
    """What happened to one planned fault: its units and the time of each event."""

    planned: PlannedFault
    units: list[Fault] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)
    role: str = ""
    injected: threading.Event = field(default_factory=threading.Event)
    recovered: threading.Event = field(default_factory=threading.Event)
    skipped: str | None = None
    waiting: str | None = None
    """Why no node of its role can take it yet, while it waits for one (TARGET_WAIT_S)."""


class Nemesis:
    def __init__(self, platform: Platform, plan: list[PlannedFault], topic: str,
                 history: HistoryWriter, seed: int, group_id: str | None = None,
                 clock: Callable[[], float] = time.time,
                 scheduler: Scheduler | None = None) -> None:
        """``clock``: the time of the history's ``faults.jsonl`` lines, ``scheduler``: when
        the waits end (both virtual in simulation)."""
        self._platform = platform
        self._clock = clock
        self._scheduler = scheduler or ThreadScheduler()
        self._topic = topic
        self._group_id = group_id
        self._history = history
        self._seed = seed
        self._runs = [FaultRun(p) for p in plan]
        self._stop = threading.Event()
        self.start_time = 0.0
        self._lock = threading.Lock()

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self, start_time: float) -> None:
        """Schedule every planned fault from the workload's start, `start_time` (`clock`'s
        reading)."""
        self.start_time = start_time
        for run in self._runs:
            planned = run.planned
            name = f"fault-{planned.index}"
            if planned.trigger is None:
                assert planned.at is not None
                delay = planned.at - (self._clock() - start_time)
                self._scheduler.call_later(delay, lambda r=run: self._inject(r), name)
            else:
                deadline = self._scheduler.monotonic() + planned.trigger.timeout
                self._scheduler.call_later(
                    0.0, lambda r=run, d=deadline: self._await_trigger(r, d), name)

    def stop(self, *, aborting: bool = False) -> None:
        """Stop scheduling, let injections under way finish (at most STOP_WAIT_S), and
        recover every fault still in effect (idempotent).

        ``aborting``: the run is stopping on a failure (its disk full, say), and the
        platform is stopped next, which ends every fault anyway; a recovery that fails then
        (a broker that cannot restart on that disk) is expected, and logged quietly.
        """
        self._stop.set()
        self._scheduler.shutdown(STOP_WAIT_S)
        for run in self._runs:
            if run.waiting is not None and run.skipped is None and not run.injected.is_set():
                run.skipped = f"the run ended while it waited: {run.waiting}"
        for run in self._runs:
            for unit in run.units:
                try:
                    unit.recover()
                except Exception:
                    log.log(logging.INFO if aborting else logging.ERROR,
                            "Recovering %s failed", unit, exc_info=True)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def active(self) -> list[str]:
        """``kill broker-2`` for each unit in effect now (for the progress line)."""
        return [str(u) for run in self._runs for u in run.units if u.state == "injected"]

    @property
    def runs(self) -> list[FaultRun]:
        return self._runs

    # ---- one planned fault ----------------------------------------------------------------

    def _await_trigger(self, run: FaultRun, deadline: float) -> None:
        """A sequence step: inject `run` its delay after the event of the fault it follows,
        checked every EVENT_POLL_S until `deadline` (`scheduler.monotonic`)."""
        trigger = run.planned.trigger
        assert trigger is not None
        previous = self._runs[trigger.of]
        name = f"fault-{run.planned.index}"
        if self.stopped:
            return
        if previous.skipped is not None:
            run.skipped = f"fault {trigger.of} was skipped"
        elif self.event_check(trigger.event, previous)():
            self._scheduler.call_later(trigger.delay, lambda: self._inject(run), name)
        elif self._scheduler.monotonic() > deadline:
            run.skipped = f"{trigger.event} of fault {trigger.of} did not come in time"
            log.info("Fault %d skipped: %s", run.planned.index, run.skipped)
        else:
            self._scheduler.call_later(EVENT_POLL_S,
                                       lambda: self._await_trigger(run, deadline), name)

    def _inject(self, run: FaultRun, deadline: float | None = None) -> None:
        """Inject `run` now, or as soon as a node of its role can take it, until `deadline`
        (`scheduler.monotonic`; TARGET_WAIT_S from now on the first call)."""
        if self.stopped:
            return
        planned = run.planned
        if deadline is None:
            deadline = self._scheduler.monotonic() + TARGET_WAIT_S
        try:
            self.inject(run)
        except TargetError as exc:
            if self._scheduler.monotonic() < deadline:
                if run.waiting is None:
                    log.info("Fault %d (%s) waits: %s", planned.index, planned.kind, exc)
                run.waiting = str(exc)
                self._scheduler.call_later(EVENT_POLL_S, lambda: self._inject(run, deadline),
                                           f"fault-{planned.index}")
                return
            run.skipped = f"TargetError: {exc} (waited {TARGET_WAIT_S:g} s)"
            log.warning("Fault %d (%s) not injected: %s", planned.index, planned.kind,
                        run.skipped)
            return
        except Exception as exc:
            run.skipped = f"{type(exc).__name__}: {exc}"
            log.warning("Fault %d (%s) not injected: %s", planned.index, planned.kind, exc)
            return
        self._watch_recovery(run)

    def _watch_recovery(self, run: FaultRun) -> None:
        if all(u.state in ("recovered", "failed") for u in run.units):
            run.recovered.set()
        elif not self.stopped:
            self._scheduler.call_later(EVENT_POLL_S, lambda: self._watch_recovery(run),
                                       f"fault-{run.planned.index}")

    def event_check(self, event: str, previous: FaultRun) -> Callable[[], bool]:
        """Whether `event` of the fault `previous` has come (a sequence step's trigger)."""
        if event == "injected":
            return previous.injected.is_set
        if event == "recovered":
            return lambda: previous.recovered.is_set() and self._serving(previous.targets)
        if event == "in-sync":
            # Back in the ISR: after the fault was recovered, not while it has not yet taken
            # its targets out (a stalled follower stays in the ISR for the lag time).
            return lambda: previous.recovered.is_set() and self._isr_membership(previous, True)
        return lambda: previous.injected.is_set() and self._isr_membership(previous, False)

    def inject(self, run: FaultRun) -> None:
        """Resolve the targets of `run` now and inject one unit per target."""
        planned = run.planned
        controller = self._platform.cluster_view()
        rng = random.Random(self._seed * 1_000_003 + planned.index)
        # The far side of a partition before the targets: the order of the seeded picks.
        network = planned.network
        to: tuple[str, ...] = ()
        groups: tuple[tuple[str, ...], ...] = ()
        if network is not None and network.to is not None:
            to = tuple(resolve(network.to, controller, self._topic, rng, self._group_id))
        if network is not None and network.groups is not None:
            groups = tuple(
                tuple(sorted({n for s in group for n in resolve(s, controller, self._topic, rng,
                                                 self._group_id)}))
                for group in network.groups)
        if planned.target is None:
            targets: list[str | None] = [None]
            run.role = "split"
        else:
            kind = FAULT_UNITS[planned.kind]
            targets = list(resolve(planned.target, controller, self._topic, rng,
                                   self._group_id,
                                   lambda node: kind.unable(self._platform, node)))
            run.role = role_label(planned.target, self._topic)
        for target in targets:
            unit = build_fault(planned, self._platform, Nodes(target, to, groups),
                               time_limit_s=planned.duration, listener=self._record(run))
            with self._lock:
                run.units.append(unit)
            unit.inject()
            run.targets.append(unit.target)
        run.injected.set()

    def _record(self, run: FaultRun) -> Callable[[Fault, Action], None]:
        def listener(unit: Fault, action: Action) -> None:
            described = unit.describe()
            now = self._clock()
            self._history.fault(fault=described["fault"], target=described["target"],
                                role=run.role, action=action, t=now)
            # In seconds since the workload's start: the zero of the progress lines and of
            # every time in the report.
            log.info("%s %s (%s) at %.1f s", ACTION_WORDS[action],
                     unit, run.role, now - self.start_time)

        return listener

    # ---- events ------------------------------------------------------------------------

    def _serving(self, targets: list[str]) -> bool:
        """Recovered processes are back and registered, unfenced, with the controller."""
        try:
            live = self._platform.cluster_view().live_brokers
        except Exception:
            return False
        brokers = [broker_id_of(t) for t in targets if t != CONTROLLER and t.startswith("broker-")]
        return all(b in live for b in brokers)

    def _isr_membership(self, run: FaultRun, in_sync: bool) -> bool:
        """All broker targets of ``run`` are in (``in_sync``) or all are out of the ISR."""
        try:
            view = self._platform.cluster_view()
        except Exception:
            return False
        partition = (run.planned.target.partition if run.planned.target else None) or 0
        isr = view.partition(self._topic, partition).isr
        brokers = [broker_id_of(t) for t in run.targets if t.startswith("broker-")]
        return bool(brokers) and all((b in isr) == in_sync for b in brokers)


__all__ = ["FaultRun", "Nemesis", "TargetError"]
