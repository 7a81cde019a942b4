"""`Pipeline` kills a member at every multiple of `killEvery` from its start, a slot in
turn, as `SimPipeline` does: a kill that takes long (waiting for its member to be
mid-transaction) does not push the ones after it back."""

from __future__ import annotations

import threading
import time

from undertow.runner.abort import Abort
from undertow.runner.pipeline import Pipeline, PipelineSettings

EVERY_S = 1.0


class Slot:
    """A member slot whose kill takes `kill_s`; records when each kill began."""

    def __init__(self, kill_s: float, began: list[tuple[str, float]], name: str) -> None:
        self._kill_s = kill_s
        self._began = began
        self._name = name

    def start(self) -> None:
        pass

    def kill(self, stopped: threading.Event) -> None:
        self._began.append((self._name, time.monotonic()))
        stopped.wait(self._kill_s)

    def request_stop(self) -> None:
        pass

    def wait_stopped(self, deadline: float) -> None:
        pass

    def join_recoveries(self) -> None:
        pass


def test_a_slow_kill_does_not_push_the_next_ones_back() -> None:
    began: list[tuple[str, float]] = []
    slots = [Slot(1.5 * EVERY_S, began, "c0"), Slot(0.0, began, "c1")]
    pipeline = Pipeline(slots, PipelineSettings("out", EVERY_S), Abort(),  # type: ignore[arg-type]
                        stop_timeout_s=1.0)
    start = time.monotonic()
    pipeline.start()
    while len(began) < 3 and time.monotonic() < start + 10 * EVERY_S:
        time.sleep(0.05)
    pipeline.stop()
    at = [(name, t - start) for name, t in began]
    # c0 at 1 s (busy until 2.5 s), c1 due at 2 s so at once after, c0 again at 3 s; kills
    # one after the other would have put c1 at 3.5 s.
    assert [name for name, _ in at] == ["c0", "c1", "c0"], at
    assert at[0][1] >= 0.9 * EVERY_S and at[1][1] < 3.0 * EVERY_S <= at[2][1], at
