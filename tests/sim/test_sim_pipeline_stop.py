"""A pipeline member asked to stop while it initialises (`sim.pipeline.SimPipelineProcess`)
does what `runner.pipeline_member` does: it finishes its InitProducerId, says `ready` (the
pipeline's `recover` line for a kill's replacement), and ends without joining the group; if
its InitProducerId takes over INIT_ATTEMPT_S it exits. The group member and the producer are
stand-ins: what is checked is the process's order of steps, on a clock the test moves."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from undertow.runner.history import HistoryWriter
from undertow.runner.pipeline import PipelineSettings
from undertow.runner.transactional_producer import INIT_ATTEMPT_S
from undertow.sim.pipeline import SimPipelineProcess


class Side:
    """The simulated world as the process sees it: a clock and timers the test fires."""

    def __init__(self) -> None:
        self.t = 0.0
        self.timers: list[tuple[float, Callable[[], None]]] = []

    def now(self) -> float:
        return self.t

    def later(self, _client: str, delay_s: float, action: Callable[[], None]) -> None:
        self.timers.append((self.t + delay_s, action))

    def advance(self, seconds: float) -> None:
        self.t += seconds
        due = [a for at, a in self.timers if at <= self.t]
        self.timers = [(at, a) for at, a in self.timers if at > self.t]
        for action in due:
            action()


class Member:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.closed = False

    def start(self) -> None:
        self.calls.append("start")

    def stop(self) -> None:
        self.calls.append("stop")
        self.closed = True  # never joined: nothing to revoke or leave


class Producer:
    def __init__(self) -> None:
        self.started = self.closed = False

    def start(self) -> None:
        self.started = True

    def close(self) -> None:
        self.closed = True


def process(tmp_path: Path, side: Side) -> tuple[SimPipelineProcess, Member, list[str]]:
    history = HistoryWriter(tmp_path)
    made = SimPipelineProcess("c0", 1, 0, side, "t", 1, PipelineSettings("t-out", None),
                              None, None, 1000, 1000.0,  # type: ignore[arg-type]
                              history, lambda _send: None, lambda _p: None)
    member, producer, events = Member(), Producer(), []

    def make() -> None:
        made.member, made.producer = member, producer  # type: ignore[assignment]

    made._made = make
    made.on_ready = lambda: events.append(f"recover at {side.now()}")
    made.start()
    assert producer.started
    return made, member, events


def test_a_member_stopped_while_initialising_says_ready_and_never_joins(tmp_path: Path) -> None:
    side = Side()
    member_process, member, events = process(tmp_path, side)
    member_process.stop()
    assert not member_process.closed  # still initialising: the workload waits for it
    side.advance(0.5)
    member_process._ready()  # its InitProducerId answered, after the stop
    assert events == ["recover at 0.5"]
    assert member.calls == ["stop"]  # never started, so never joined the group
    assert member_process.closed and member_process.recorder.ready.is_set()
    side.advance(INIT_ATTEMPT_S)
    assert not member_process.exited  # ready in time: no give-up


def test_a_member_stopped_while_its_init_hangs_exits_after_one_attempt(tmp_path: Path) -> None:
    side = Side()
    member_process, member, events = process(tmp_path, side)
    member_process.stop()
    side.advance(INIT_ATTEMPT_S - 0.1)
    assert not member_process.closed
    side.advance(0.1)
    assert member_process.exited and member_process.closed
    member_process._ready()  # a late answer to a dead process does nothing
    assert events == [] and member.calls == []


def test_a_ready_member_stops_by_leaving(tmp_path: Path) -> None:
    side = Side()
    member_process, member, events = process(tmp_path, side)
    member_process._ready()
    assert member.calls == ["start"] and events == ["recover at 0.0"]
    member_process.stop()
    member_process.stop()
    assert member.calls == ["start", "stop"] and member_process.closed
