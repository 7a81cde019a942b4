"""The run's one failure path: real threads that raise end the run through its `Abort`, the
first failure is the one kept, and nothing is printed (issue 22: threads died one by one with
tracebacks on the terminal while the run went on)."""

from __future__ import annotations

import threading

import pytest

from undertow.runner.abort import Abort, RunAborted, WorkerFailed


def raising(message: str) -> None:
    raise ValueError(message)


def test_a_thread_that_raises_aborts_the_run_and_prints_no_traceback(
        capfd: pytest.CaptureFixture[str]) -> None:
    abort = Abort()
    before = threading.excepthook
    with abort.catching_thread_exceptions():
        for name in ("p0", "sampler"):  # one after the other: p0 fails first
            thread = threading.Thread(target=raising, args=(f"{name} broke",), name=name)
            thread.start()
            thread.join()
    assert threading.excepthook is before
    assert isinstance(abort.reason, WorkerFailed)
    assert str(abort.reason) == "p0 failed: ValueError: p0 broke"
    assert abort.wait(0)
    with pytest.raises(WorkerFailed, match="p0 broke"):
        abort.raise_if_set()
    assert capfd.readouterr() == ("", "")


def test_until_a_failure_the_abort_waits_and_raises_nothing() -> None:
    abort = Abort()
    assert not abort.wait(0.01) and not abort.is_set()
    abort.raise_if_set()
    abort.fail(RunAborted("first"))
    abort.fail(RunAborted("second, a consequence of the first"))
    assert abort.is_set() and str(abort.reason) == "first"
