"""The fault protocol: inject, recover, describe, and a time limit after which it heals.

A unit is built from its fault's spec as the planner gives it (a ``PlannedFault``, validated
when the experiment was loaded, so a unit checks nothing the spec models check) and the
nodes its selectors resolved to at injection; what only the live cluster can say (a node
that is not a broker, a split whose groups overlap) is a runtime error here.

A fault is injected once. ``inject()`` returns when the fault has taken effect;
``recover()`` undoes it, is idempotent, and is safe after a failed inject (it undoes
whatever part took effect). The time limit arms a timer at injection that recovers the
fault on its own, so a fault whose recover the runner never reaches still ends. The
listener hears ``inject``, ``heal`` and ``recover`` in that order, exactly once each,
whoever recovered: ``inject`` once the fault took effect, ``heal`` when its undoing begins
(the time limit ran out, or the run stopped), ``recover`` when the undoing finished (a
killed node restarted and serving, a link passing again). The runner writes its
``faults.jsonl`` lines from it.

A unit is Chaos Mesh's ``chaosimpl/<kind>``: its Apply (``_inject``) and Recover
(``_recover``) compose the platform's primitives, once for every platform. ``clear``
is its third half, for whoever heals a cluster without the unit that injected the fault
(``faults.heal``: the runner's last resort, the operator after a runner died).
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Literal, TypeVar

from undertow.platform.base import Cancellable, Platform
from undertow.spec.faults import FaultKind
from undertow.spec.schedule import PlannedFault

log = logging.getLogger("undertow.faults")

Action = Literal["inject", "heal", "recover"]
"""What a listener hears: the fault took effect, its undoing began, its undoing finished."""
Listener = Callable[["Fault", Action], None]
U = TypeVar("U", bound="type[Fault]")
State = Literal["pending", "injected", "failed", "recovered"]


UNITS: dict[FaultKind, type[Fault]] = {}
"""Every unit, by kind, as ``fault_unit`` registered it (``registry`` reads it)."""


def fault_unit(unit: U) -> U:
    """Register a unit under its kind: its module is then all a new kind needs here."""
    if unit.kind in UNITS:
        raise TypeError(f"two fault units for {unit.kind!r}: {UNITS[unit.kind].__name__} "
                        f"and {unit.__name__}")
    UNITS[unit.kind] = unit
    return unit


class FaultError(ValueError):
    """A fault cannot be built on the nodes it resolved to, or was used out of order."""


@dataclass(frozen=True)
class Nodes:
    """A fault's selectors resolved to node names at injection: the spec names roles (who
    leads *now*), a unit acts on nodes. One unit per ``target`` node; the far side of a
    partition is resolved once and shared by the units of one planned fault."""

    target: str | None
    """The node the unit hits; None only for a split partition, whose groups say who is cut."""
    to: tuple[str, ...] = ()
    """one-way partitions: the far side, which the target's packets no longer reach."""
    groups: tuple[tuple[str, ...], ...] = ()
    """split partitions: the nodes of each group."""


class Fault(ABC):
    """One fault on one target, with a symmetric inject/recover pair.

    Every kind is built the same way, ``Unit(platform, spec, nodes, time_limit_s=...,
    listener=...)``, so the registry needs nothing per kind; a unit says what it hits by
    overriding ``_aim``.
    """

    kind: ClassVar[FaultKind]
    brokers_only: ClassVar[bool] = False
    """The kind acts through a broker's failpoint or pod, so its target must be a broker."""
    restored: ClassVar[str]
    """What recovering did, for the platform's announcement (a Kubernetes Event)."""
    cleared_first: ClassVar[bool] = False
    """``faults.clear`` undoes this kind before the others on a node (a paused process
    answers nothing, so it must run before a failpoint can be cleared)."""
    needs_answer: ClassVar[bool] = False
    """The kind is injected by asking the node (a failpoint, SIGSTOP's wait for the stop),
    so a paused node cannot take it."""
    hits_client_processes: ClassVar[bool] = False
    """The kind can hit a workload client's own process (``Platform.client_processes``:
    a paused producer), so ``faults.clear`` undoes it on those too."""

    @classmethod
    def unable(cls, platform: Platform, node: str) -> str | None:
        """Why ``node`` cannot take a fault of this kind now (another fault holds it down
        or frozen), or None: the role resolution passes over such a node, as Chaos Mesh
        selects only running pods."""
        if not platform.is_running(node):
            return "is not running"
        if cls.needs_answer and platform.is_paused(node):
            return "is paused"
        return None

    def __init__(self, platform: Platform, spec: PlannedFault, nodes: Nodes, *,
                 time_limit_s: float, listener: Listener | None = None) -> None:
        self.platform = platform
        self.spec = spec
        self.target = self._aim(nodes)
        if not time_limit_s > 0:
            raise FaultError(f"{self.kind} {self.target}: time limit must be positive, "
                             f"got {time_limit_s!r}")
        self.time_limit_s = time_limit_s
        self._listener = listener
        self._state: State = "pending"
        self._healing = False  # `heal` was heard: a retried recover does not say it twice
        self._timer: Cancellable | None = None
        self._lock = threading.RLock()

    def _aim(self, nodes: Nodes) -> str:
        """Check the resolved nodes against the platform before anything is injected, and
        name the target as ``faults.jsonl`` does: here, the one node hit."""
        assert nodes.target is not None, f"the spec gives every {self.kind} a target"
        if self.brokers_only:
            return self.platform.check_broker(nodes.target)
        return self.platform.check_node(nodes.target)

    @property
    def state(self) -> State:
        return self._state

    def describe(self) -> dict[str, str]:
        """The ``{"fault", "target"}`` part of a ``faults.jsonl`` line."""
        return {"fault": self.kind, "target": self.target}

    def inject(self) -> None:
        """Apply the fault; return once it has taken effect."""
        with self._lock:
            if self._state != "pending":
                raise FaultError(f"{self}: already {self._state}; a fault is injected once")
            try:
                self._inject()
            except BaseException:
                self._state = "failed"
                raise
            self._state = "injected"
            self.platform.announce("FaultInjected", f"{self}: {self.effect()}")
            self._timer = self.platform.start_timer(self.time_limit_s, self._expire,
                                                    f"fault-limit {self}")
            self._notify("inject")

    def recover(self) -> bool:
        """Undo the fault; True when this call did, False when there was nothing to undo.

        On an error the fault stays injected (or failed) so that a later call can retry.
        """
        with self._lock:
            if self._state in ("pending", "recovered"):
                return False
            if self._timer is not None:
                self._timer.cancel()
            was_injected = self._state == "injected"
            if was_injected and not self._healing:
                self._healing = True
                self._notify("heal")
            self._recover()
            self._state = "recovered"
            if was_injected:
                self.platform.announce("FaultRecovered", f"{self}: {self.restored}")
                self._notify("recover")
            return True

    def _expire(self) -> None:
        try:
            self.recover()
        except Exception:
            # The timer thread has no caller to raise to; the runner's stop() retries.
            log.exception("%s: recovery at the end of its %gs time limit failed", self,
                          self.time_limit_s)

    def _notify(self, action: Action) -> None:
        if self._listener is not None:
            self._listener(self, action)

    @abstractmethod
    def _inject(self) -> None:
        """Make the fault take effect (the platform call returns once it has)."""

    @abstractmethod
    def _recover(self) -> None:
        """Undo the fault; must be a no-op for any part that is not in effect."""

    @abstractmethod
    def effect(self) -> str:
        """What injecting did, for the platform's announcement (a Kubernetes Event)."""

    @classmethod
    @abstractmethod
    def clear(cls, platform: Platform, node: str) -> None:
        """Undo whatever a fault of this kind may have left on ``node``, injected by a unit
        this process may never have seen; return without waiting for the node to serve.
        An ``EndpointUnreachable`` means the node is gone, and what it held with it."""

    def __str__(self) -> str:
        return f"{self.kind} {self.target}"
