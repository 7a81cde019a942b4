"""``sim.clients.Wakeup``: however often a client model asks to be woken, it has at most one
timer pending, at the earliest time asked for, and runs once per wake."""

from __future__ import annotations

from collections.abc import Callable

from undertow.sim.clients import Wakeup


class Timers:
    """An endpoint's ``later`` and ``now_ms`` on a clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.pending: list[tuple[float, Callable[[], None]]] = []

    def now_ms(self) -> float:
        return self.now

    def later(self, delay_ms: float, callback: Callable[[], None]) -> None:
        self.pending.append((self.now + delay_ms, callback))

    def run_until(self, t: float) -> None:
        while due := sorted((p for p in self.pending if p[0] <= t), key=lambda p: p[0]):
            self.pending.remove(due[0])
            self.now = due[0][0]
            due[0][1]()
        self.now = t


def test_many_asks_one_wake_at_the_earliest() -> None:
    timers, woken = Timers(), []
    wake = Wakeup(timers, lambda: woken.append(timers.now))  # type: ignore[arg-type]
    for at in (1500.0, 1200.0, 1200.0, 1800.0):
        wake.at(at)
    timers.run_until(2000.0)
    assert woken == [1200.0]


def test_a_wake_that_asks_again_is_woken_again() -> None:
    timers, woken = Timers(), []

    def pump() -> None:  # three partitions whose leader stays unreachable
        woken.append(timers.now)
        for _ in range(3):
            wake.at(timers.now + 100.0)

    wake = Wakeup(timers, pump)  # type: ignore[arg-type]
    wake.at(1100.0)
    timers.run_until(2000.0)
    assert woken == [1100.0 + 100.0 * i for i in range(10)]  # once per wake, not 3 ** n
    assert len(timers.pending) <= 3
