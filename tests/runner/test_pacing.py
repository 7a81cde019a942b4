"""The producers' pacing (runner/pacing.py) on a clock the test moves: the rate is kept
while the client keeps up, a producer more than a second behind does not burst, and a
transaction's end is not made up for."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from undertow.runner import pacing
from undertow.runner.pacing import Pacer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.polls: list[float] = []

    def poll(self, timeout: float) -> None:
        self.polls.append(timeout)
        self.now += timeout


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(pacing, "time", SimpleNamespace(monotonic=lambda: clock.now))
    return clock


def never() -> bool:
    return False


def test_sends_are_spaced_by_the_rate(clock: Clock) -> None:
    pacer = Pacer(rate=10)
    for _ in range(5):
        pacer.wait(clock.poll, never)
    assert clock.now == pytest.approx(100.5)
    assert clock.polls == pytest.approx([0.1] * 5)


def test_a_producer_far_behind_does_not_burst(clock: Clock) -> None:
    pacer = Pacer(rate=10)
    clock.now += 3.0  # a full queue held the producer for three seconds
    pacer.wait(clock.poll, never)
    assert clock.polls == []  # behind: the next send goes at once ...
    pacer.wait(clock.poll, never)
    assert clock.polls == pytest.approx([0.1])  # ... and then the rate again, no catching up


def test_a_producer_a_little_behind_catches_up(clock: Clock) -> None:
    pacer = Pacer(rate=10)
    clock.now += 0.5
    for _ in range(5):
        pacer.wait(clock.poll, never)
    assert clock.polls == []  # within a second: the five sends due are sent back to back


def test_after_a_pause_the_next_send_is_due_now_at_the_earliest(clock: Clock) -> None:
    pacer = Pacer(rate=10)
    pacer.wait(clock.poll, never)
    clock.now += 0.8  # a transaction's end
    pacer.resume()
    pacer.wait(clock.poll, never)
    assert clock.polls == pytest.approx([0.1, 0.1])


def test_stopping_ends_the_wait(clock: Clock) -> None:
    Pacer(rate=0.1).wait(clock.poll, lambda: True)
    assert clock.polls == []


def test_rate_zero_sends_as_fast_as_the_client_takes_them(clock: Clock) -> None:
    pacer = Pacer(rate=0)
    for _ in range(3):
        pacer.wait(clock.poll, never)
    assert clock.polls == [] and clock.now == 100.0
