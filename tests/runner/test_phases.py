"""The record of where the time after the workload goes (`undertow.runner.phases`): each
phase from the previous mark, in the order they run, nothing before the workload's end, and
the line printed under the verdict. A real run's record: tests/runner/test_run_local.py."""

from __future__ import annotations

from pathlib import Path

from undertow.runner.phases import PHASES, PhaseClock, read, summary_line, to_verdict, write


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_each_phase_lasts_from_the_previous_mark_and_they_add_up() -> None:
    clock = FakeClock()
    phases = PhaseClock(clock)
    phases.start(100.0)
    for phase, seconds in zip(PHASES, (0.1, 0.0, 2.3, 4.0, 0.2, 0.9, 4.2), strict=True):
        clock.now += seconds
        phases.mark(phase)
    stop_began = clock.now - 4.2
    phases.time_beside("cluster stop", stop_began)
    clock.now += 1.0
    phases.mark("report")  # marked already: the first mark stands

    record = phases.record()
    assert list(record["phases"]) == list(PHASES)
    assert record["phases"] == {"healing": 0.1, "last sends": 0.0, "recovery": 2.3,
                                "drain": 4.0, "history": 0.2, "verdict": 0.9, "report": 4.2}
    assert record["total"] == 11.7
    assert record["beside"] == {"cluster stop": 4.2}
    assert to_verdict(record) == 7.5
    assert summary_line(record) == (
        "time after the workload: healing 0.1 s, last sends 0.0 s, recovery 2.3 s, "
        "drain 4.0 s, history 0.2 s, verdict 0.9 s, report 4.2 s = 11.7 s "
        "(the verdict at 7.5 s; cluster stop 4.2 s, during the report)")


def test_without_the_checkers_verdict_it_comes_with_the_report() -> None:
    """The history checker could not read the history: the Spark report gives the verdict."""
    clock = FakeClock()
    phases = PhaseClock(clock)
    phases.start(100.0)
    for phase in ("healing", "last sends", "recovery", "drain", "history", "report"):
        clock.now += 1.0
        phases.mark(phase)
    record = phases.record()
    assert to_verdict(record) == 6.0
    assert "the verdict at" not in summary_line(record)


def test_the_first_phase_counts_from_the_workloads_end_not_from_the_loops_last_beat() -> None:
    """The loop may end before the workload's nominal end (an abort) or after it: the first
    phase starts at the nominal end, and a negative duration reads as 0."""
    clock = FakeClock()
    phases = PhaseClock(clock)
    phases.start(clock.now + 0.3)  # marked before the nominal end
    phases.mark("healing")
    assert phases.record()["phases"] == {"healing": 0.0}


def test_a_run_stopped_before_its_workloads_end_has_no_phases() -> None:
    phases = PhaseClock(FakeClock())
    phases.mark("history")
    phases.time_beside("cluster stop", 0.0)
    assert not phases.started
    assert phases.record() == {"phases": {}, "total": 0, "beside": {}}


def test_without_an_analysis_the_line_ends_with_the_history(tmp_path: Path) -> None:
    clock = FakeClock()
    phases = PhaseClock(clock)
    phases.start(100.0)
    for phase in ("healing", "last sends", "recovery", "drain", "history"):
        clock.now += 0.5
        phases.mark(phase)
    phases.time_beside("cluster stop", clock.now)
    record = phases.record()
    assert summary_line(record).endswith("history 0.5 s = 2.5 s (cluster stop 0.0 s, after "
                                         "the history)")
    write(tmp_path, record)
    assert read(tmp_path) == record
    assert read(tmp_path / "elsewhere") is None
