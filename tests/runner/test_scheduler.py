"""The runner's schedulers (`undertow.runner.scheduler`): a callback runs once after its delay,
each on its own thread on real platforms, in virtual-time order in simulation; `shutdown`
drops what is not yet due and waits for what runs. (The nemesis and the sampler over them:
test_faults_cluster, tests/sim.)"""

from __future__ import annotations

import threading
import time

import pytest

from undertow.runner.scheduler import ThreadScheduler
from undertow.sim.simulated_world import VirtualScheduler
from undertow.sim.virtual_loop import VirtualTimeLoop


def test_a_thread_callback_runs_after_its_delay_on_a_thread_of_its_own() -> None:
    scheduler = ThreadScheduler()
    ran = threading.Event()
    where: list[tuple[str, float]] = []
    asked = time.monotonic()

    def callback() -> None:
        where.append((threading.current_thread().name, time.monotonic() - asked))
        ran.set()

    scheduler.call_later(0.2, callback, "fault-3")
    assert ran.wait(10)
    ((name, after),) = where
    assert name == "fault-3" and after >= 0.2


def test_a_slow_callback_delays_no_other() -> None:
    scheduler = ThreadScheduler()
    release, fast = threading.Event(), threading.Event()
    scheduler.call_later(0.0, lambda: release.wait(10), "slow")
    scheduler.call_later(0.05, fast.set, "fast")
    assert fast.wait(5) and not release.is_set()
    release.set()
    scheduler.shutdown(10)


def test_shutdown_drops_what_is_not_due_and_waits_for_what_runs() -> None:
    scheduler = ThreadScheduler()
    started, finished, late = threading.Event(), threading.Event(), threading.Event()

    def running() -> None:
        started.set()
        time.sleep(0.3)
        finished.set()

    scheduler.call_later(0.0, running, "running")
    scheduler.call_later(0.5, late.set, "not due")
    assert started.wait(10)
    scheduler.shutdown(10)
    assert finished.is_set()
    scheduler.call_later(0.0, late.set, "after shutdown")
    assert not late.wait(1.0)


def test_a_shutdown_while_a_callback_is_being_scheduled_waits_for_its_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's end (the drain) shut the scheduler down while the nemesis scheduled a
    callback: it joined a timer not yet started ("cannot join thread before it is
    started"). Here the shutdown comes in that window every time."""
    scheduler = ThreadScheduler()
    failures: list[BaseException] = []
    start = threading.Timer.start

    def shutdown() -> None:
        try:
            scheduler.shutdown(5)
        except BaseException as exc:
            failures.append(exc)

    stopping = threading.Thread(target=shutdown)

    def start_late(timer: threading.Timer) -> None:
        stopping.start()
        stopping.join(0.2)  # the shutdown runs now, or waits for the scheduler's lock
        start(timer)

    monkeypatch.setattr(threading.Timer, "start", start_late)
    scheduler.call_later(0.0, lambda: None, "nemesis")
    stopping.join(5)
    assert not stopping.is_alive() and failures == []


def test_the_virtual_scheduler_runs_callbacks_in_virtual_time_order() -> None:
    loop = VirtualTimeLoop()
    scheduler = VirtualScheduler(loop)
    seen: list[tuple[str, float]] = []

    def run_until(t: float) -> None:
        loop.wait_until(lambda: loop.time() >= t, t + 1, f"t={t}")

    try:
        scheduler.call_later(2.0, lambda: seen.append(("b", scheduler.monotonic())), "b")
        scheduler.call_later(0.5, lambda: seen.append(("a", scheduler.monotonic())), "a")
        scheduler.call_later(5.0, lambda: seen.append(("c", scheduler.monotonic())), "c")
        run_until(3.0)
        assert seen == [("a", 0.5), ("b", 2.0)]
        scheduler.shutdown(0)
        run_until(10.0)
        scheduler.call_later(0.0, lambda: seen.append(("d", 0.0)), "d")
        run_until(20.0)
        assert seen == [("a", 0.5), ("b", 2.0)]
    finally:
        loop.close()
